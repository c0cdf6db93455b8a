"""The native LeRobot v3.0 writer: frames in, a dataset LeRobot loads on disk, no saved episode lost.

Lifecycle::

    with DatasetWriter.create(root, fps=25, features=so101_features({"front": (480, 640)}),
                              robot_type="so_follower") as writer:
        for frame in frames:
            writer.add_frame(frame)          # validated, video frames enqueued to the encoder
        writer.save_episode(sidecar={...})   # durable when it returns

``add_frame`` validates the frame (see :mod:`.features`) and appends it to the open episode
(:mod:`.episode`): the numeric values into its buffer, camera frames into one background encoder
per camera.

``save_episode`` finishes the encoders, encodes the episode's rows, metadata and sidecar
(:mod:`.encode`), writes them into the journal and commits it (:mod:`.commit`, :mod:`.journal`):
when it returns the episode survives SIGKILL or power loss. ``save_episode_nowait`` does the
encoding in line and leaves the writing and its fsyncs to the writer's commit thread, so the
caller can record the next episode meanwhile: the episode is saved (durable) when the returned
future resolves, not before. Merging saved episodes into LeRobot's shared files happens on a
background thread (:class:`~.consolidate.BackgroundMerger`), after each save or at most every
``merge_interval_s``; ``finalize`` waits for it, and so does an exit hook if the caller forgets
``finalize``. If the process dies first, :meth:`DatasetWriter.open` or ``hilrec repair`` finishes
the merge.

An episode that is open (frames added, not saved) when the process dies is dropped: its frames
were never committed. ``hilrec repair`` reports it.
"""

from __future__ import annotations

import atexit
import logging
from collections.abc import Mapping
from concurrent.futures import Future
from pathlib import Path
from types import TracebackType
from typing import Any, Final

import numpy as np

from hilrec.daemon.atomic import fsync_dir
from hilrec.daemon.dataset import journal
from hilrec.daemon.dataset.commit import Committer, PendingSave
from hilrec.daemon.dataset.consolidate import BackgroundMerger, ConsolidatedState
from hilrec.daemon.dataset.encode import EpisodeEncoder, Numbering
from hilrec.daemon.dataset.episode import OpenEpisode
from hilrec.daemon.dataset.features import DEFAULT_FEATURES, FrameValidator, is_video, validate_features
from hilrec.daemon.dataset.journal import Hook
from hilrec.daemon.dataset.layout import (
    DEFAULT_CHUNK_SIZE,
    DEFAULT_DATA_FILE_SIZE_IN_MB,
    DEFAULT_VIDEO_FILE_SIZE_IN_MB,
    empty_info,
    write_info,
)
from hilrec.daemon.dataset.sidecar import update_dataset_sidecar
from hilrec.daemon.dataset.video import DEFAULT_MAX_QUEUE_BYTES, VideoSettings
from hilrec.daemon.errors import DatasetError, DatasetStateError

log = logging.getLogger(__name__)

WRITER_NAME: Final[str] = "hilrec.native"
EXIT_MERGE_TIMEOUT_S: Final[float] = 120.0


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
        self.robot_type: str | None = state.info.get("robot_type")
        self.video_settings = settings
        self._max_video_queue_bytes = max_video_queue_bytes
        self._hook = hook
        user = {k: v for k, v in self.features.items() if k not in DEFAULT_FEATURES}
        self._validator = FrameValidator(validate_features(user))
        self._numeric_keys = [k for k in self._validator.expected if not is_video(self.features[k])]
        self._encoder = EpisodeEncoder(root, fps=self.fps, features=self.features)
        self._episode: OpenEpisode | None = None
        # What the episodes encoded so far make: ahead of the durable counts (the committer's) by
        # the saves still in flight on the commit thread.
        self._numbering = Numbering(
            episodes=len(state.episodes), frames=state.total_frames, tasks=state.tasks
        )
        self._finalized = False
        self._merger = BackgroundMerger(state, hook=hook, interval_s=merge_interval_s)
        self._committer = Committer(
            root,
            episodes=len(state.episodes),
            frames=state.total_frames,
            hook=hook,
            on_committed=self._merger.add,
        )
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
        return self._committer.num_episodes

    @property
    def num_frames(self) -> int:
        return self._committer.num_frames

    def add_frame(self, frame: Mapping[str, Any]) -> None:
        self._check_usable()
        values, task = self._validator.validate(frame)
        episode = self._episode or self._open_episode()
        if episode.finished:
            raise DatasetStateError(
                f"{self.root}: episode {episode.index} is being saved (a save "
                "failed); call save_episode() again or discard_episode()"
            )
        episode.add(values, task)

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
            self._numbering.give_back(save.episode, save.encoded.new_tasks)
            if save.kept:
                self._episode = save.episode
            self._committer.error = None
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
        At most :data:`~.commit.MAX_SAVES_IN_FLIGHT` saves wait for the commit thread; more wait
        here.
        """
        return self._encode_and_submit(sidecar, arrays, keep_on_failure=False).future

    def discard_episode(self) -> None:
        episode = self._episode
        if episode is None:
            return
        self._episode = None
        episode.discard()

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
        self._committer.stop()
        self._merger.retry()  # one more attempt if a merge failed before
        self._merger.wait()
        self._merger.close()
        self._finalized = True
        if self._committer.error is not None:
            raise self._committer.error

    def wait_consolidated(self, timeout: float | None = None) -> None:
        """Block until every episode saved so far is durable and merged; raise a merge's error."""
        self._committer.wait()
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
        if self._committer.error is not None:
            raise DatasetError(
                f"{self.root}: an earlier save failed ({self._committer.error}); "
                "finalize() keeps the episodes saved before it"
            )

    def _open_episode(self) -> OpenEpisode:
        episode = OpenEpisode.start(
            self.root,
            self._numbering.next_index,
            features=self.features,
            numeric_keys=self._numeric_keys,
            fps=self.fps,
            settings=self.video_settings,
            max_queue_bytes=self._max_video_queue_bytes,
        )
        self._episode = episode
        return episode

    def _encode_and_submit(
        self,
        sidecar: Mapping[str, Any] | None,
        arrays: Mapping[str, np.ndarray] | None,
        *,
        keep_on_failure: bool,
    ) -> PendingSave:
        self._check_usable()
        episode = self._episode
        if episode is None or episode.length == 0:
            raise DatasetStateError(f"{self.root}: save_episode() with no frames added")
        try:
            episode.finish_videos()
            if self._hook is not None:
                self._hook("videos-finished")
            encoded = self._encoder.encode(episode, self._numbering, sidecar=sidecar, arrays=arrays)
        except BaseException:
            self.discard_episode()
            raise
        save = PendingSave(episode, encoded, keep_on_failure=keep_on_failure)
        self._committer.submit(save)
        self._episode = None
        self._numbering.advance(episode, encoded.new_tasks)
        return save

    def _merge_at_exit(self) -> None:
        if self._finalized:
            return
        try:
            self._committer.stop()
            self._merger.wait(timeout=EXIT_MERGE_TIMEOUT_S)
        except DatasetError:
            log.exception("%s: saved episodes not merged at exit; 'hilrec repair' merges them", self.root)
