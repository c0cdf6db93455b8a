"""The native LeRobot v3.0 writer: frames in, a dataset LeRobot loads on disk, no saved episode lost.

Lifecycle::

    with DatasetWriter.create(root, fps=25, features=so101_features({"front": (480, 640)}),
                              robot_type="so_follower") as writer:
        for frame in frames:
            writer.add_frame(frame)          # validated, video frames enqueued to the encoder
        writer.save_episode(sidecar={...})   # durable when it returns

``add_frame`` validates the frame (see :mod:`features`), copies the numeric values into the episode
buffer and hands camera frames to one background encoder per camera.

``save_episode`` finishes the encoders, writes the episode's rows and metadata into the journal and
commits it (see :mod:`journal`): when it returns the episode survives SIGKILL or power loss. Merging
it into LeRobot's shared files happens right after on a background thread; ``finalize`` waits for
that. If the process dies first, :meth:`DatasetWriter.open` or ``hilrec repair`` finishes the merge.

An episode that is open (frames added, not saved) when the process dies is dropped: its frames
were never committed. ``hilrec repair`` reports it.
"""

from __future__ import annotations

import atexit
import logging
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np
import pyarrow.parquet as pq

from hilrec.daemon.dataset import journal
from hilrec.daemon.dataset.atomic import fsync_dir
from hilrec.daemon.dataset.consolidate import ConsolidatedState, Hook, consolidate
from hilrec.daemon.dataset.features import (
    DEFAULT_FEATURES, FrameValidator, is_video, validate_features, video_keys,
)
from hilrec.daemon.dataset.layout import (
    DEFAULT_CHUNK_SIZE, DEFAULT_DATA_FILE_SIZE_IN_MB, DEFAULT_VIDEO_FILE_SIZE_IN_MB,
    PARQUET_OPTIONS, data_schema, empty_info, episode_data_table, write_info,
)
from hilrec.daemon.dataset.sidecar import update_dataset_sidecar, write_episode_sidecar
from hilrec.daemon.dataset.stats import (
    ImageSampler, compute_episode_stats, stats_to_json,
)
from hilrec.daemon.dataset.video import (
    DEFAULT_MAX_QUEUE_BYTES, EpisodeVideoEncoder, VideoSettings, probe_video,
)
from hilrec.daemon.errors import DatasetError, DatasetStateError, VideoEncodingError

log = logging.getLogger(__name__)

WRITER_NAME = "hilrec.native"
EXIT_MERGE_TIMEOUT_S = 120.0


class _OpenEpisode:
    """Frames of the episode being recorded."""

    def __init__(self, index: int, directory: Path, numeric_keys: list[str]) -> None:
        self.index = index
        self.directory = directory
        self.values: dict[str, list[np.ndarray]] = {key: [] for key in numeric_keys}
        self.tasks: list[str] = []
        self.encoders: dict[str, EpisodeVideoEncoder] = {}
        self.samplers: dict[str, ImageSampler] = {}
        # Set once the encoders are closed (by a save attempt): no frame may be added after that.
        self.videos: dict[str, dict[str, Any]] | None = None

    @property
    def length(self) -> int:
        return len(self.tasks)


class DatasetWriter:
    """Writes a LeRobot v3.0 dataset. Implements :class:`hilrec.daemon.dataset.sink.FrameSink`."""

    def __init__(self, root: Path, state: ConsolidatedState, *, settings: VideoSettings,
                 max_video_queue_bytes: int, hook: Hook) -> None:
        self.root = root
        self.fps = int(state.info["fps"])
        self.features: dict[str, Any] = state.info["features"]
        self.robot_type = state.info.get("robot_type")
        self.video_settings = settings
        self._max_video_queue_bytes = max_video_queue_bytes
        self._hook = hook
        user = {k: v for k, v in self.features.items() if k not in DEFAULT_FEATURES}
        self._validator = FrameValidator(validate_features(user))
        self._numeric_keys = [k for k in self._validator.expected if not is_video(self.features[k])]
        self._video_keys = video_keys(self.features)
        self._schema = data_schema(self.features)
        self._episode: _OpenEpisode | None = None
        self._tasks: list[str] = list(state.tasks)
        self._num_episodes = len(state.episodes)
        self._num_frames = state.total_frames
        self._finalized = False
        self._state = state
        self._pending: list[int] = []
        self._cond = threading.Condition()
        self._consolidating = False
        self._consolidation_error: BaseException | None = None
        self._stop = False
        self._thread = threading.Thread(target=self._consolidate_loop, name="consolidate",
                                        daemon=True)
        self._thread.start()
        # A forgotten finalize() still leaves a dataset that loads without repair.
        atexit.register(self._merge_at_exit)

    # --- construction ----------------------------------------------------------------------------

    @classmethod
    def create(cls, root: str | Path, *, fps: int, features: Mapping[str, Any],
               robot_type: str | None, video_codec: str = "libsvtav1",
               chunks_size: int = DEFAULT_CHUNK_SIZE,
               data_files_size_in_mb: float = DEFAULT_DATA_FILE_SIZE_IN_MB,
               video_files_size_in_mb: float = DEFAULT_VIDEO_FILE_SIZE_IN_MB,
               max_video_queue_bytes: int = DEFAULT_MAX_QUEUE_BYTES, hook: Hook = None,
               ) -> DatasetWriter:
        """Start a new dataset at ``root`` (which must not exist or be empty)."""
        root = Path(root)
        if not isinstance(fps, int) or isinstance(fps, bool) or fps <= 0:
            raise DatasetError(f"{root}: fps must be a positive int, got {fps!r}")
        for name, value in (("chunks_size", chunks_size), ("data_files_size_in_mb", data_files_size_in_mb),
                            ("video_files_size_in_mb", video_files_size_in_mb)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0 or (
                    name == "chunks_size" and not isinstance(value, int)):
                raise DatasetError(f"{root}: {name} must be positive, got {value!r}")
        full = validate_features(features)
        settings = VideoSettings(codec=video_codec)
        if root.exists() and any(root.iterdir()):
            raise DatasetStateError(f"{root}: already exists and is not empty; "
                                    "use DatasetWriter.open() to add episodes to it")
        root.mkdir(parents=True, exist_ok=True)
        info = empty_info(fps=fps, features=full, robot_type=robot_type, chunks_size=chunks_size,
                          data_files_size_in_mb=data_files_size_in_mb,
                          video_files_size_in_mb=video_files_size_in_mb)
        journal.journal_dir(root).mkdir(parents=True, exist_ok=True)
        update_dataset_sidecar(root, {"writer": cls._provenance(settings)})
        write_info(root, info)
        for directory in (journal.journal_dir(root).parent, root, root.parent):
            fsync_dir(directory)
        state = ConsolidatedState(root=root, info=info, tasks=[], episodes=[])
        return cls(root, state, settings=settings, max_video_queue_bytes=max_video_queue_bytes,
                   hook=hook)

    @classmethod
    def open(cls, root: str | Path, *, video_codec: str = "libsvtav1",
             max_video_queue_bytes: int = DEFAULT_MAX_QUEUE_BYTES, hook: Hook = None,
             ) -> DatasetWriter:
        """Reopen an existing dataset to add episodes; finishes any merge a crash interrupted.

        An episode that was open (never saved) when the previous writer died is dropped.
        """
        from hilrec.daemon.dataset.repair import recover

        root = Path(root)
        report = recover(root)
        if report.dropped:
            log.warning("%s: dropped on reopen: %s", root, report.dropped)
        settings = VideoSettings(codec=video_codec)
        update_dataset_sidecar(root, {"writer": cls._provenance(settings)})
        return cls(root, ConsolidatedState.load(root), settings=settings,
                   max_video_queue_bytes=max_video_queue_bytes, hook=hook)

    @staticmethod
    def _provenance(settings: VideoSettings) -> dict[str, Any]:
        from importlib.metadata import PackageNotFoundError, version

        try:
            hilrec_version = version("hilrec")
        except PackageNotFoundError:
            hilrec_version = "unknown"
        return {"name": WRITER_NAME, "hilrec_version": hilrec_version,
                "video": settings.provenance(), "journal_format": journal.JOURNAL_FORMAT}

    # --- FrameSink ----------------------------------------------------------------------------------

    @property
    def episode_open(self) -> bool:
        return self._episode is not None

    @property
    def num_episodes(self) -> int:
        """Episodes saved (durable), whether or not they are merged into LeRobot's files yet."""
        return self._num_episodes

    @property
    def num_frames(self) -> int:
        return self._num_frames

    def add_frame(self, frame: Mapping[str, Any]) -> None:
        self._check_usable()
        values, task = self._validator.validate(frame)
        episode = self._episode or self._open_episode()
        if episode.videos is not None:
            raise DatasetStateError(f"{self.root}: episode {episode.index} is being saved (a save "
                                    "failed); call save_episode() again or discard_episode()")
        for encoder in episode.encoders.values():
            encoder._raise_if_failed()
        for key in self._numeric_keys:
            episode.values[key].append(np.array(values[key], copy=True))
        for key in self._video_keys:
            episode.encoders[key].put(values[key])
            episode.samplers[key].add(values[key])
        episode.tasks.append(task)

    def save_episode(self, *, sidecar: Mapping[str, Any] | None = None,
                     arrays: Mapping[str, np.ndarray] | None = None) -> int:
        """Make the open episode durable and return its episode_index.

        If writing fails with an OS error (a full disk), the episode stays open with all its
        frames: free space and call save_episode() again, or discard_episode(). If its video is
        broken (:class:`VideoEncodingError`), the episode is discarded and the error raised.
        Episodes saved before are unaffected either way.
        """
        self._check_usable()
        episode = self._episode
        if episode is None or episode.length == 0:
            raise DatasetStateError(f"{self.root}: save_episode() with no frames added")
        try:
            meta = self._write_episode(episode)
            if sidecar is not None or arrays:
                write_episode_sidecar(self.root, episode.index, sidecar, arrays)
                fsync_dir(self.root / "hilrec")  # the episodes/ folder entry itself
            journal.commit_episode(self.root, episode.index)
        except OSError as exc:
            for name in (journal.EPISODE_DATA, journal.EPISODE_META):
                (episode.directory / name).unlink(missing_ok=True)
            raise DatasetError(
                f"{self.root}: saving episode {episode.index} failed ({exc}); it is still open "
                f"with its {episode.length} frames: call save_episode() again once the cause is "
                "fixed, or discard_episode()") from exc
        except BaseException:
            self.discard_episode()
            raise
        self._hook_call("committed")
        self._episode = None
        self._tasks.extend(meta["new_tasks"])
        self._num_episodes += 1
        self._num_frames += episode.length
        with self._cond:
            self._pending.append(episode.index)
            self._consolidation_error = None  # a new save is also a retry of a failed merge
            self._cond.notify_all()
        return episode.index

    def discard_episode(self) -> None:
        episode = self._episode
        if episode is None:
            return
        self._episode = None
        for encoder in episode.encoders.values():
            encoder.abort()
        journal.remove_dir(episode.directory)

    def finalize(self) -> None:
        """Wait until every saved episode is in LeRobot's files. Refuses while an episode is open."""
        if self._finalized:
            return
        atexit.unregister(self._merge_at_exit)
        if self._episode is not None:
            raise DatasetStateError(
                f"{self.root}: finalize() with episode {self._episode.index} open "
                f"({self._episode.length} frames); save_episode() or discard_episode() first")
        with self._cond:
            self._consolidation_error = None  # one more attempt if a merge failed before
            self._cond.notify_all()
        self.wait_consolidated()
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        self._thread.join()
        self._finalized = True

    def wait_consolidated(self, timeout: float | None = None) -> None:
        """Block until the background merge has caught up; raise its error if it failed."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while (self._pending or self._consolidating) and self._consolidation_error is None:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise DatasetError(f"{self.root}: merge not done within {timeout} s")
                self._cond.wait(remaining)
            if self._consolidation_error is not None:
                raise DatasetError(
                    f"{self.root}: merging saved episodes into LeRobot's files failed "
                    f"({self._consolidation_error}); they are safe in {journal.JOURNAL_DIR}, "
                    "run 'hilrec repair'") from self._consolidation_error

    def __enter__(self) -> DatasetWriter:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if exc_type is not None:
            self.discard_episode()
            try:
                self.finalize()
            except DatasetError:
                log.exception("%s: finalize after %s failed", self.root, exc_type.__name__)
            return
        if self._episode is not None:
            # Saved episodes are merged first, so leaving the block loses only the unsaved one's
            # decision, never data.
            self.wait_consolidated()
        self.finalize()

    # --- internals ---------------------------------------------------------------------------------

    def _check_usable(self) -> None:
        if self._finalized:
            raise DatasetStateError(f"{self.root}: the writer is finalized")

    def _hook_call(self, name: str) -> None:
        if self._hook is not None:
            self._hook(name)

    def _open_episode(self) -> _OpenEpisode:
        index = self._num_episodes
        directory = journal.open_episode_dir(self.root, index)
        if directory.exists():
            journal.remove_dir(directory)
        directory.mkdir(parents=True)
        episode = _OpenEpisode(index, directory, self._numeric_keys)
        try:
            for key in self._video_keys:
                height, width, _ = self.features[key]["shape"]
                episode.encoders[key] = EpisodeVideoEncoder(
                    directory / journal.video_file_name(key), key=key, episode_index=index,
                    fps=self.fps, height=height, width=width, settings=self.video_settings,
                    max_queue_bytes=self._max_video_queue_bytes)
                episode.samplers[key] = ImageSampler()
        except BaseException:
            for encoder in episode.encoders.values():
                encoder.abort()
            journal.remove_dir(directory)
            raise
        self._episode = episode
        return episode

    def _write_episode(self, episode: _OpenEpisode) -> dict[str, Any]:
        """Finish the videos, write data.parquet and episode.json into the open directory."""
        n = episode.length
        if episode.videos is None:
            videos: dict[str, dict[str, Any]] = {}
            for key, encoder in episode.encoders.items():
                encoded = encoder.finish()
                probe = probe_video(encoder.path)
                if encoded != n or probe.frames != n:
                    raise VideoEncodingError(f"video '{key}' episode {episode.index}: "
                                             f"{probe.frames} frames in {encoder.path} for {n} rows")
                videos[key] = {"frames": probe.frames, "duration_s": probe.duration_s}
            episode.videos = videos
        videos = episode.videos
        self._hook_call("videos-finished")
        new_tasks: list[str] = []
        known = {task: i for i, task in enumerate(self._tasks)}
        for task in episode.tasks:
            if task not in known:
                known[task] = len(known)
                new_tasks.append(task)
        frame_index = np.arange(n, dtype=np.int64)
        columns: dict[str, np.ndarray] = {key: np.stack(episode.values[key])
                                          for key in self._numeric_keys}
        columns.update({
            "timestamp": (frame_index / self.fps).astype(np.float32),
            "frame_index": frame_index,
            "episode_index": np.full(n, episode.index, dtype=np.int64),
            "index": np.arange(self._num_frames, self._num_frames + n, dtype=np.int64),
            "task_index": np.array([known[t] for t in episode.tasks], dtype=np.int64),
        })
        table = episode_data_table(columns, self._schema)
        data_file = episode.directory / journal.EPISODE_DATA
        pq.write_table(table, data_file, **PARQUET_OPTIONS)
        stats = compute_episode_stats(columns, self.features)
        for key, sampler in episode.samplers.items():
            stats[key] = sampler.stats()
        ordered = {key: stats[key] for key in self.features if key in stats}
        meta = {
            "episode_index": episode.index,
            "length": n,
            "tasks": list(dict.fromkeys(episode.tasks)),
            "new_tasks": new_tasks,
            "dataset_from_index": self._num_frames,
            "data_bytes": data_file.stat().st_size,
            "videos": videos,
            "stats": stats_to_json(ordered),
            "saved_unix_s": time.time(),
        }
        journal.write_episode_meta(episode.directory, meta)
        self._hook_call("episode-written")
        return meta

    def _consolidate_loop(self) -> None:
        while True:
            with self._cond:
                # After a failure, wait until a save or finalize asks for another attempt.
                while (not self._pending or self._consolidation_error is not None) and not self._stop:
                    self._cond.wait()
                if self._stop and (not self._pending or self._consolidation_error is not None):
                    return
                batch = list(self._pending)
                self._consolidating = True
            try:
                self._state = consolidate(self._state, batch, hook=self._hook)
            except BaseException as exc:  # noqa: BLE001 - reported by wait_consolidated/finalize
                log.exception("%s: merging episodes %s failed; they stay in the journal",
                              self.root, batch)
                self._undo_failed_merge()
                with self._cond:
                    self._consolidation_error = exc
                    self._consolidating = False
                    self._cond.notify_all()
                continue
            with self._cond:
                del self._pending[:len(batch)]
                self._consolidating = False
                self._cond.notify_all()

    def _merge_at_exit(self) -> None:
        if self._finalized:
            return
        try:
            self.wait_consolidated(timeout=EXIT_MERGE_TIMEOUT_S)
        except DatasetError:
            log.exception("%s: saved episodes not merged at exit; 'hilrec repair' merges them",
                          self.root)

    def _undo_failed_merge(self) -> None:
        """Put LeRobot's files back as they were before the failed batch (best effort)."""
        try:
            journal.recover_intent(self.root)
            for path in journal.orphan_files(self.root):
                if path.name.endswith(journal.NEW_SUFFIX):
                    path.unlink()
        except OSError:
            log.exception("%s: cleaning up after a failed merge", self.root)
