"""The native LeRobot v3.0 writer: frames in, a dataset LeRobot loads on disk, no saved episode lost.

Lifecycle::

    with DatasetWriter.create(root, fps=25, features=so101_features({"front": (480, 640)}),
                              robot_type="so_follower") as writer:
        for frame in frames:
            writer.add_frame(frame)          # validated, video frames enqueued to the encoder
        writer.save_episode(sidecar={...})   # durable when it returns

``add_frame`` validates the frame (see :mod:`features`), copies the numeric values into the episode
buffer and hands camera frames to one background encoder per camera.

``save_episode`` finishes the encoders, encodes the episode's rows, metadata and sidecar, writes them
into the journal and commits it (see :mod:`journal`): when it returns the episode survives SIGKILL
or power loss. ``save_episode_nowait`` does the encoding in line and leaves the writing and its
fsyncs to the writer's commit thread, so the caller can record the next episode meanwhile: the
episode is saved (durable) when the returned future resolves, not before. Merging saved episodes
into LeRobot's shared files happens on a background thread (:class:`BackgroundMerger`), after
each save or at most every ``merge_interval_s``; ``finalize`` waits for it. If the process dies
first, :meth:`DatasetWriter.open` or ``hilrec repair`` finishes the merge.

An episode that is open (frames added, not saved) when the process dies is dropped: its frames
were never committed. ``hilrec repair`` reports it.
"""

from __future__ import annotations

import atexit
import logging
import queue
import threading
import time
from collections.abc import Mapping
from concurrent.futures import Future
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from hilrec.daemon.atomic import fsync_dir
from hilrec.daemon.dataset import journal
from hilrec.daemon.dataset.consolidate import BackgroundMerger, ConsolidatedState, Hook
from hilrec.daemon.dataset.features import (
    DEFAULT_FEATURES,
    FrameValidator,
    is_video,
    validate_features,
    video_keys,
)
from hilrec.daemon.dataset.layout import (
    DEFAULT_CHUNK_SIZE,
    DEFAULT_DATA_FILE_SIZE_IN_MB,
    DEFAULT_VIDEO_FILE_SIZE_IN_MB,
    PARQUET_OPTIONS,
    data_schema,
    empty_info,
    episode_data_table,
    write_info,
)
from hilrec.daemon.dataset.sidecar import episode_sidecar_files, update_dataset_sidecar
from hilrec.daemon.dataset.stats import (
    ImageSampler,
    compute_episode_stats,
    stats_to_json,
)
from hilrec.daemon.dataset.video import (
    DEFAULT_MAX_QUEUE_BYTES,
    EpisodeVideoEncoder,
    VideoSettings,
    probe_video,
)
from hilrec.daemon.errors import DatasetError, DatasetStateError, VideoEncodingError

log = logging.getLogger(__name__)

WRITER_NAME = "hilrec.native"
EXIT_MERGE_TIMEOUT_S = 120.0
# Episodes encoded but not yet durable before save_episode_nowait() waits for the commit thread.
MAX_SAVES_IN_FLIGHT = 4


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


class _Save:
    """An encoded episode on its way to the commit thread."""

    def __init__(
        self,
        episode: _OpenEpisode,
        files: dict[str, bytes],
        beside: dict[Path, bytes],
        new_tasks: list[str],
        *,
        keep_on_failure: bool,
    ) -> None:
        self.episode = episode
        self.files = files
        self.beside = beside
        self.new_tasks = new_tasks
        # save_episode() keeps a failed episode open for a retry; save_episode_nowait() cannot.
        self.keep_on_failure = keep_on_failure
        self.kept = False
        self.skipped = False  # not attempted: an earlier save had failed
        self.future: Future[int] = Future()


_STOP = object()


class DatasetWriter:
    """Writes a LeRobot v3.0 dataset. Implements :class:`hilrec.daemon.dataset.sink.FrameSink`."""

    def __init__(
        self,
        root: Path,
        state: ConsolidatedState,
        *,
        settings: VideoSettings,
        max_video_queue_bytes: int,
        hook: Hook,
        merge_interval_s: float = 0.0,
    ) -> None:
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
        # Durable counts, and the counts the episodes encoded so far will make (ahead of them by
        # the saves still in flight on the commit thread).
        self._num_episodes = len(state.episodes)
        self._num_frames = state.total_frames
        self._next_index = self._num_episodes
        self._next_frame = self._num_frames
        self._tasks: list[str] = list(state.tasks)
        self._finalized = False
        self._saves: queue.Queue[Any] = queue.Queue()
        self._in_flight = threading.BoundedSemaphore(MAX_SAVES_IN_FLIGHT)
        self._save_error: BaseException | None = None
        self._committer = threading.Thread(target=self._commit_loop, name="episode-commit", daemon=True)
        self._committer.start()
        self._merger = BackgroundMerger(state, hook=hook, interval_s=merge_interval_s)
        # A forgotten finalize() still leaves a dataset that loads without repair.
        atexit.register(self._merge_at_exit)

    # --- construction ----------------------------------------------------------------------------

    @classmethod
    def create(
        cls,
        root: str | Path,
        *,
        fps: int,
        features: Mapping[str, Any],
        robot_type: str | None,
        video_codec: str = "libsvtav1",
        chunks_size: int = DEFAULT_CHUNK_SIZE,
        data_files_size_in_mb: float = DEFAULT_DATA_FILE_SIZE_IN_MB,
        video_files_size_in_mb: float = DEFAULT_VIDEO_FILE_SIZE_IN_MB,
        max_video_queue_bytes: int = DEFAULT_MAX_QUEUE_BYTES,
        hook: Hook = None,
        merge_interval_s: float = 0.0,
    ) -> DatasetWriter:
        """Start a new dataset at ``root`` (which must not exist or be empty).

        ``merge_interval_s`` > 0 merges saved episodes into LeRobot's files at most that often
        (and at finalize), instead of after every save: for a producer of many episodes a second.
        """
        root = Path(root)
        if not isinstance(fps, int) or isinstance(fps, bool) or fps <= 0:
            raise DatasetError(f"{root}: fps must be a positive int, got {fps!r}")
        for name, value in (
            ("chunks_size", chunks_size),
            ("data_files_size_in_mb", data_files_size_in_mb),
            ("video_files_size_in_mb", video_files_size_in_mb),
        ):
            if (
                isinstance(value, bool)
                or not isinstance(value, (int, float))
                or value <= 0
                or (name == "chunks_size" and not isinstance(value, int))
            ):
                raise DatasetError(f"{root}: {name} must be positive, got {value!r}")
        if not merge_interval_s >= 0:
            raise DatasetError(f"{root}: merge_interval_s must be >= 0, got {merge_interval_s!r}")
        full = validate_features(features)
        settings = VideoSettings(codec=video_codec)
        if root.exists() and any(root.iterdir()):
            raise DatasetStateError(
                f"{root}: already exists and is not empty; use DatasetWriter.open() to add episodes to it"
            )
        root.mkdir(parents=True, exist_ok=True)
        info = empty_info(
            fps=fps,
            features=full,
            robot_type=robot_type,
            chunks_size=chunks_size,
            data_files_size_in_mb=data_files_size_in_mb,
            video_files_size_in_mb=video_files_size_in_mb,
        )
        journal.journal_dir(root).mkdir(parents=True, exist_ok=True)
        update_dataset_sidecar(root, {"writer": cls._provenance(settings)})
        write_info(root, info)
        for directory in (journal.journal_dir(root).parent, root, root.parent):
            fsync_dir(directory)
        state = ConsolidatedState(root=root, info=info, tasks=[], episodes=[])
        return cls(
            root,
            state,
            settings=settings,
            max_video_queue_bytes=max_video_queue_bytes,
            hook=hook,
            merge_interval_s=merge_interval_s,
        )

    @classmethod
    def open(
        cls,
        root: str | Path,
        *,
        video_codec: str = "libsvtav1",
        max_video_queue_bytes: int = DEFAULT_MAX_QUEUE_BYTES,
        hook: Hook = None,
        merge_interval_s: float = 0.0,
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
        return cls(
            root,
            ConsolidatedState.load(root),
            settings=settings,
            max_video_queue_bytes=max_video_queue_bytes,
            hook=hook,
            merge_interval_s=merge_interval_s,
        )

    @staticmethod
    def _provenance(settings: VideoSettings) -> dict[str, Any]:
        from importlib.metadata import PackageNotFoundError, version

        try:
            hilrec_version = version("hilrec")
        except PackageNotFoundError:
            hilrec_version = "unknown"
        return {
            "name": WRITER_NAME,
            "hilrec_version": hilrec_version,
            "video": settings.provenance(),
            "journal_format": journal.JOURNAL_FORMAT,
        }

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
            raise DatasetStateError(
                f"{self.root}: episode {episode.index} is being saved (a save "
                "failed); call save_episode() again or discard_episode()"
            )
        for encoder in episode.encoders.values():
            encoder._raise_if_failed()
        for key in self._numeric_keys:
            episode.values[key].append(np.array(values[key], copy=True))
        for key in self._video_keys:
            episode.encoders[key].put(values[key])
            episode.samplers[key].add(values[key])
        episode.tasks.append(task)

    def save_episode(
        self, *, sidecar: Mapping[str, Any] | None = None, arrays: Mapping[str, np.ndarray] | None = None
    ) -> int:
        """Make the open episode durable and return its episode_index.

        If writing fails with an OS error (a full disk), the episode stays open with all its
        frames: free space and call save_episode() again, or discard_episode(). If its video is
        broken (:class:`VideoEncodingError`), the episode is discarded and the error raised.
        Episodes saved before are unaffected either way.
        """
        save = self._encode_and_submit(sidecar, arrays, keep_on_failure=True)
        try:
            return save.future.result()
        except Exception:
            if not save.future.done() or save.skipped:
                raise
            # Nothing was queued after it (this call waited): undo its place in the counts, and
            # take the episode back if its frames are to be kept for a retry.
            self._next_index = save.episode.index
            self._next_frame -= save.episode.length
            del self._tasks[len(self._tasks) - len(save.new_tasks) :]
            if save.kept:
                self._episode = save.episode
            self._save_error = None
            raise

    def save_episode_nowait(
        self, *, sidecar: Mapping[str, Any] | None = None, arrays: Mapping[str, np.ndarray] | None = None
    ) -> Future[int]:
        """Encode the open episode now and commit it on the writer's commit thread.

        Returns at once with a future of the episode_index that resolves when the episode is
        durable; the next episode can be recorded meanwhile. Errors found while encoding (a
        broken video) are raised here, as by :meth:`save_episode`. If the commit fails, the
        future raises, the episode is lost (its frames are not kept), and every later call of
        this writer raises until :meth:`finalize`, which still merges the episodes saved before.
        At most ``MAX_SAVES_IN_FLIGHT`` saves wait for the commit thread; more wait here.
        """
        return self._encode_and_submit(sidecar, arrays, keep_on_failure=False).future

    def discard_episode(self) -> None:
        episode = self._episode
        if episode is None:
            return
        self._episode = None
        for encoder in episode.encoders.values():
            encoder.abort()
        journal.remove_dir(episode.directory)

    def finalize(self) -> None:
        """Wait until every saved episode is durable and in LeRobot's files. Refuses while an
        episode is open. Raises a failed commit's error after merging the episodes before it."""
        if self._finalized:
            return
        if self._episode is not None:
            raise DatasetStateError(
                f"{self.root}: finalize() with episode {self._episode.index} open "
                f"({self._episode.length} frames); save_episode() or discard_episode() first"
            )
        atexit.unregister(self._merge_at_exit)
        self._stop_committer()
        self._merger.retry()  # one more attempt if a merge failed before
        self._merger.wait()
        self._merger.close()
        self._finalized = True
        if self._save_error is not None:
            raise self._save_error

    def wait_consolidated(self, timeout: float | None = None) -> None:
        """Block until every episode saved so far is durable and merged; raise a merge's error."""
        self._wait_for_commits()
        self._merger.wait(timeout)

    def __enter__(self) -> DatasetWriter:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
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
        if self._save_error is not None:
            raise DatasetError(
                f"{self.root}: an earlier save failed ({self._save_error}); "
                "finalize() keeps the episodes saved before it"
            )

    def _hook_call(self, name: str) -> None:
        if self._hook is not None:
            self._hook(name)

    def _open_episode(self) -> _OpenEpisode:
        index = self._next_index
        directory = journal.open_episode_dir(self.root, index)
        if directory.exists():
            journal.remove_dir(directory)
        directory.mkdir(parents=True)
        episode = _OpenEpisode(index, directory, self._numeric_keys)
        try:
            for key in self._video_keys:
                height, width, _ = self.features[key]["shape"]
                episode.encoders[key] = EpisodeVideoEncoder(
                    directory / journal.video_file_name(key),
                    key=key,
                    episode_index=index,
                    fps=self.fps,
                    height=height,
                    width=width,
                    settings=self.video_settings,
                    max_queue_bytes=self._max_video_queue_bytes,
                )
                episode.samplers[key] = ImageSampler()
        except BaseException:
            for encoder in episode.encoders.values():
                encoder.abort()
            journal.remove_dir(directory)
            raise
        self._episode = episode
        return episode

    def _encode_and_submit(
        self,
        sidecar: Mapping[str, Any] | None,
        arrays: Mapping[str, np.ndarray] | None,
        *,
        keep_on_failure: bool,
    ) -> _Save:
        self._check_usable()
        episode = self._episode
        if episode is None or episode.length == 0:
            raise DatasetStateError(f"{self.root}: save_episode() with no frames added")
        try:
            save = self._encode(episode, sidecar, arrays, keep_on_failure=keep_on_failure)
        except BaseException:
            self.discard_episode()
            raise
        self._in_flight.acquire()
        self._episode = None
        self._next_index = episode.index + 1
        self._next_frame += episode.length
        self._tasks.extend(save.new_tasks)
        self._saves.put(save)
        return save

    def _encode(
        self,
        episode: _OpenEpisode,
        sidecar: Mapping[str, Any] | None,
        arrays: Mapping[str, np.ndarray] | None,
        *,
        keep_on_failure: bool,
    ) -> _Save:
        """Finish the videos; the bytes of data.parquet, episode.json and the sidecar files."""
        n = episode.length
        if episode.videos is None:
            videos: dict[str, dict[str, Any]] = {}
            for key, encoder in episode.encoders.items():
                encoded = encoder.finish()
                probe = probe_video(encoder.path)
                if encoded != n or probe.frames != n:
                    raise VideoEncodingError(
                        f"video '{key}' episode {episode.index}: "
                        f"{probe.frames} frames in {encoder.path} for {n} rows"
                    )
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
        columns: dict[str, np.ndarray] = {key: np.stack(episode.values[key]) for key in self._numeric_keys}
        columns.update(
            {
                "timestamp": (frame_index / self.fps).astype(np.float32),
                "frame_index": frame_index,
                "episode_index": np.full(n, episode.index, dtype=np.int64),
                "index": np.arange(self._next_frame, self._next_frame + n, dtype=np.int64),
                "task_index": np.array([known[t] for t in episode.tasks], dtype=np.int64),
            }
        )
        stream = pa.BufferOutputStream()
        pq.write_table(episode_data_table(columns, self._schema), stream, **PARQUET_OPTIONS)
        data = stream.getvalue().to_pybytes()
        stats = compute_episode_stats(columns, self.features)
        for key, sampler in episode.samplers.items():
            stats[key] = sampler.stats()
        ordered = {key: stats[key] for key in self.features if key in stats}
        meta = {
            "episode_index": episode.index,
            "length": n,
            "tasks": list(dict.fromkeys(episode.tasks)),
            "new_tasks": new_tasks,
            "dataset_from_index": self._next_frame,
            "data_bytes": len(data),
            "videos": videos,
            "stats": stats_to_json(ordered),
            "saved_unix_s": time.time(),
        }
        beside = (
            episode_sidecar_files(self.root, episode.index, sidecar, arrays)
            if sidecar is not None or arrays
            else {}
        )
        files = {journal.EPISODE_DATA: data, journal.EPISODE_META: journal.episode_meta_bytes(meta)}
        return _Save(episode, files, beside, new_tasks, keep_on_failure=keep_on_failure)

    def _commit_loop(self) -> None:
        """The commit thread: writes and fsyncs each encoded episode, in order, and commits it."""
        while True:
            save = self._saves.get()
            try:
                if save is _STOP:
                    return
                self._commit(save)
            finally:
                if save is not _STOP:
                    self._in_flight.release()
                self._saves.task_done()

    def _commit(self, save: _Save) -> None:
        episode = save.episode
        if self._save_error is not None:  # never commit past a failed episode: no gaps
            journal.remove_dir(episode.directory)
            save.skipped = True
            save.future.set_exception(self._save_error)
            return
        try:
            journal.commit_episode(
                self.root, episode.index, files=save.files, beside=save.beside, hook=self._hook
            )
        except BaseException as exc:  # noqa: BLE001 - handed to the caller through the future
            for name in save.files:
                (episode.directory / name).unlink(missing_ok=True)
            if save.keep_on_failure and isinstance(exc, OSError):
                save.kept = True
                error: BaseException = DatasetError(
                    f"{self.root}: saving episode {episode.index} failed ({exc}); it is still "
                    f"open with its {episode.length} frames: call save_episode() again once the "
                    "cause is fixed, or discard_episode()"
                )
                error.__cause__ = exc
            else:
                journal.remove_dir(episode.directory)
                error = exc
                if not save.keep_on_failure:
                    error = DatasetError(
                        f"{self.root}: saving episode {episode.index} failed "
                        f"({exc}); its frames are lost, the episodes saved "
                        "before it are kept"
                    )
                    error.__cause__ = exc
            self._save_error = error
            save.future.set_exception(error)
            return
        self._hook_call("committed")
        self._num_episodes += 1
        self._num_frames += episode.length
        self._merger.add(episode.index)
        save.future.set_result(episode.index)

    def _wait_for_commits(self) -> None:
        self._saves.join()

    def _stop_committer(self) -> None:
        if self._committer.is_alive():
            self._saves.put(_STOP)
            self._committer.join()

    def _merge_at_exit(self) -> None:
        if self._finalized:
            return
        try:
            self._stop_committer()
            self._merger.wait(timeout=EXIT_MERGE_TIMEOUT_S)
        except DatasetError:
            log.exception("%s: saved episodes not merged at exit; 'hilrec repair' merges them", self.root)
