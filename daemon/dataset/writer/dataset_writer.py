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

Video is encoded in one worker process per camera at the lowest CPU priority (``video_encoder=
"process"``, the default for libsvtav1: fed through shared memory, with a bounded on-disk spill
while it is behind; see :mod:`.backlog`, :mod:`.encoder_process` and :mod:`.spill`) or in line on
one thread per camera (``"thread"``, the default for the other codecs); ``HILREC_VIDEO_ENCODER``
chooses too. :meth:`DatasetWriter.video_backlog_s` says how far behind it is,
:meth:`DatasetWriter.spill_problem` whether a new take may start.

An episode that is open (frames added, not saved) when the process dies keeps what its last
checkpoint made durable, about a second behind (:mod:`.checkpoint`): ``hilrec repair`` saves
that much of it, marked ``ended_by: crash`` (:mod:`.crashed`); reopening a root drops it.

One writer per root: ``create`` and ``open`` take the root's exclusive lock
(:class:`~.rootlock.RootLock`) before they touch anything in it, and the writer holds it until
``finalize``/``close`` (or the exit hook). A second writer, in this process or another, is refused
with :class:`DatasetLockedError` naming the holder's pid and command, so it cannot delete the
first one's open episode or commit over its episodes. Readers (``hilrec check``) take no lock.

A full disk never costs an acknowledged episode, nor the next take:

- :meth:`DatasetWriter.space_problem` says, before a take and while one runs, whether the file
  system has room for one more take;
- a commit that fails with an OS error keeps the episode (staged videos, encoded rows) and commits
  it again, in order, as soon as it can (see :mod:`.commit`): the next take records normally;
  :meth:`DatasetWriter.retry_failed` retries at once, :attr:`DatasetWriter.failed_saves` lists
  them, and only ``finalize`` gives up on one (its error names it as lost);
- a merge that fails leaves LeRobot's files as they were and the journal whole, and is retried
  (see :class:`~.consolidate.BackgroundMerger`); :meth:`DatasetWriter.problems` reports it, with
  the episode indices, until it succeeds.
"""

from __future__ import annotations

import atexit
import logging
from collections.abc import Mapping
from concurrent.futures import Future
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final

import numpy as np

from hilrec.daemon.dataset.format.features import (
    DEFAULT_FEATURES,
    FrameValidator,
    is_video,
    validate_features,
)
from hilrec.daemon.dataset.format.layout import (
    DEFAULT_CHUNK_SIZE,
    DEFAULT_DATA_FILE_SIZE_IN_MB,
    DEFAULT_VIDEO_FILE_SIZE_IN_MB,
)
from hilrec.daemon.dataset.store.consolidate import BackgroundMerger, ConsolidatedState
from hilrec.daemon.dataset.store.journal import Hook
from hilrec.daemon.dataset.store.rootlock import RootLock
from hilrec.daemon.dataset.video.codec import DEFAULT_MAX_QUEUE_BYTES, VideoSettings
from hilrec.daemon.dataset.writer.backlog import (
    DEFAULT_SPILL_BYTES_LIMIT,
    ENCODER_ENV,
    VIDEO_ENCODERS,
    VideoBacklog,
    encoder_mode,
)
from hilrec.daemon.dataset.writer.checkpoint import CHECKPOINT_EVERY_S
from hilrec.daemon.dataset.writer.commit import Committer, PendingSave
from hilrec.daemon.dataset.writer.encode import EpisodeEncoder, Numbering
from hilrec.daemon.dataset.writer.episode import OpenEpisode
from hilrec.daemon.dataset.writer.health import WriterHealth, lost_message
from hilrec.daemon.dataset.writer.opening import (
    check_layout_args,
    lock_dataset_root,
    lock_empty_root,
    provenance,
    settle_reopened_root,
    write_new_root,
)
from hilrec.daemon.dataset.writer.space import (
    MIN_FREE_BYTES,
    RECENT_EPISODES,
    TakeSizes,
)
from hilrec.daemon.errors import (
    DatasetError,
    DatasetStateError,
    VideoEncodingError,
)

if TYPE_CHECKING:
    from hilrec.daemon.dataset.video.encoder_process import EncoderProcess

log = logging.getLogger(__name__)

# Names other code imports from here since before the writer was split.
__all__ = [
    "DEFAULT_SPILL_BYTES_LIMIT",
    "ENCODER_ENV",
    "MIN_FREE_BYTES",
    "VIDEO_ENCODERS",
    "WRITER_NAME",
    "DatasetWriter",
]

WRITER_NAME: Final[str] = "hilrec.native"
EXIT_MERGE_TIMEOUT_S: Final[float] = 120.0
# finalize()'s wait for the video backlog: hours of it at most (the spill's bound holds about
# 6 minutes of two cameras' raw frames by default); past it the encoder is taken as hung.
VIDEO_WAIT_S: Final[float] = 4 * 3600.0


class DatasetWriter(WriterHealth):
    """Writes a LeRobot v3.0 dataset. Implements :class:`hilrec.daemon.dataset.format.sink.FrameSink`."""

    def __init__(
        self,
        root: Path,
        state: ConsolidatedState,
        *,
        settings: VideoSettings,
        max_video_queue_bytes: int,
        hook: Hook,
        lock: RootLock,
        merge_interval_s: float = 0.0,
        video_encoder: str = "thread",
        spill_bytes_limit: int | None = None,
        realtime: bool = True,
    ) -> None:
        self.root = root
        self._lock = lock
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
        # (frames, bytes on disk) of the episodes encoded lately: what space_problem() sizes from.
        self._sizes = TakeSizes(
            root,
            fps=self.fps,
            features=self.features,
            lengths=(int(row["length"]) for row in state.episodes[-RECENT_EPISODES:]),
        )
        self._merger = BackgroundMerger(state, hook=hook, interval_s=merge_interval_s)
        self.video_encoder = video_encoder
        self.realtime = realtime
        self._backlog = VideoBacklog(
            root,
            fps=self.fps,
            features=self.features,
            settings=settings,
            hook=hook,
            merge=self._merger.add,
            next_merge=len(state.episodes),
            spill_bytes_limit=spill_bytes_limit,
        )
        if video_encoder == "process" and self._backlog.video_keys:
            try:
                self._backlog.start()
            except VideoEncodingError as exc:
                # A refusal (no room for the ring) must not stop the recording: the thread
                # encoder needs no shared memory.
                log.warning("%s: %s; encoding in threads of this process instead", root, exc)
                self.video_encoder = "thread"
        self._committer = Committer(
            root,
            episodes=len(state.episodes),
            frames=state.total_frames,
            hook=hook,
            on_committed=self._backlog.on_committed,
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
        lock_command: str | None = None,
        video_encoder: str | None = None,
        spill_bytes_limit: int | None = None,
        realtime: bool = True,
    ) -> DatasetWriter:
        """Start a new dataset at ``root`` (which must not exist or be empty).

        ``merge_interval_s`` > 0 merges saved episodes into LeRobot's files at most that often
        (and at finalize), instead of after every save: for a producer of many episodes a second.
        The root's lock is taken first (``lock_command`` is what a refused second writer is told
        holds it; default ``hilrec <sub-command>``): :class:`DatasetLockedError` if another
        writer has it. ``realtime=False``, for a producer no clock paces: a lagging encoder is
        waited for, never spilled or cut (:meth:`.episode.OpenEpisode.catch_up`).
        """
        root = Path(root)
        check_layout_args(
            root,
            fps=fps,
            chunks_size=chunks_size,
            data_files_size_in_mb=data_files_size_in_mb,
            video_files_size_in_mb=video_files_size_in_mb,
            merge_interval_s=merge_interval_s,
        )
        full = validate_features(features)
        settings = VideoSettings(codec=video_codec)
        mode = encoder_mode(video_encoder, root, settings.codec)
        lock = lock_empty_root(root, lock_command)
        try:
            info = write_new_root(
                root,
                provenance(WRITER_NAME, settings),
                fps=fps,
                features=full,
                robot_type=robot_type,
                chunks_size=chunks_size,
                data_files_size_in_mb=data_files_size_in_mb,
                video_files_size_in_mb=video_files_size_in_mb,
            )
            return cls(
                root,
                ConsolidatedState(root=root, info=info, tasks=[], episodes=[]),
                settings=settings,
                max_video_queue_bytes=max_video_queue_bytes,
                hook=hook,
                lock=lock,
                merge_interval_s=merge_interval_s,
                video_encoder=mode,
                spill_bytes_limit=spill_bytes_limit,
                realtime=realtime,
            )
        except BaseException:
            lock.release()
            raise

    @classmethod
    def open(
        cls,
        root: str | Path,
        *,
        video_codec: str = "libsvtav1",
        max_video_queue_bytes: int = DEFAULT_MAX_QUEUE_BYTES,
        hook: Hook = None,
        merge_interval_s: float = 0.0,
        lock_command: str | None = None,
        video_encoder: str | None = None,
        spill_bytes_limit: int | None = None,
        realtime: bool = True,
    ) -> DatasetWriter:
        """Reopen an existing dataset to add episodes; finishes any merge a crash interrupted.

        The root's lock is taken before anything in it is touched (see :meth:`create`): a root
        another writer holds is refused with :class:`DatasetLockedError`, its open episode left
        alone. An episode that was open (never saved) when the previous writer died is dropped.
        """
        root = Path(root)
        settings = VideoSettings(codec=video_codec)
        mode = encoder_mode(video_encoder, root, settings.codec)
        lock = lock_dataset_root(root, lock_command)
        try:
            settle_reopened_root(root, provenance(WRITER_NAME, settings), hook)
            return cls(
                root,
                ConsolidatedState.load(root),
                settings=settings,
                max_video_queue_bytes=max_video_queue_bytes,
                hook=hook,
                lock=lock,
                merge_interval_s=merge_interval_s,
                video_encoder=mode,
                spill_bytes_limit=spill_bytes_limit,
                realtime=realtime,
            )
        except BaseException:
            lock.release()
            raise

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
        if self._backlog.workers:
            self._backlog.check_room(self._episode, self._numbering.next_index)
        episode = self._episode or self._open_episode()
        episode.check_room()
        episode.add(values, task)
        if episode.length - episode.checkpointed >= max(1, round(self.fps * CHECKPOINT_EVERY_S)):
            try:
                episode.checkpoint()
            except OSError as exc:
                # The take goes on (its save does not need the checkpoint); a crash now would
                # cost more than a second of it, which the log says.
                log.warning("%s: episode %d: checkpoint failed: %s", self.root, episode.index, exc)

    @property
    def durable_frames(self) -> int:
        """Frames of the open take a crash now would keep (see :mod:`.checkpoint`); 0 when no
        take is open. Safe from any thread."""
        episode = self._episode
        return episode.durable_frames if episode is not None else 0

    def save_episode(
        self, *, sidecar: Mapping[str, Any] | None = None, arrays: Mapping[str, np.ndarray] | None = None
    ) -> int:
        """Make the open episode durable and return its episode_index.

        If writing fails with an OS error (a full disk), the episode is kept, with the index it
        was given, and saved as soon as it can be (see :mod:`.commit`): the error raised says
        so, :attr:`failed_saves` lists it, and the next episode can be recorded at once. If its
        video is broken (:class:`VideoEncodingError`) or the commit fails otherwise, the episode
        is discarded and the error raised. Episodes saved before are unaffected either way.
        """
        save = self._encode_and_submit(sidecar, arrays, waited=True)
        try:
            return save.future.result()
        except Exception:
            if not save.future.done() or save.skipped or save.held:
                raise
            # Deleted, and nothing was queued after it (this call waited): give its numbers back.
            self._numbering.give_back(save.episode, save.encoded.new_tasks)
            self._committer.error = None
            raise

    def save_episode_nowait(
        self, *, sidecar: Mapping[str, Any] | None = None, arrays: Mapping[str, np.ndarray] | None = None
    ) -> Future[int]:
        """Encode the open episode now and commit it on the writer's commit thread.

        Returns at once with a future of the episode_index that resolves when the episode is
        durable; the next episode can be recorded meanwhile. Errors found while encoding (a
        broken video) are raised here, as by :meth:`save_episode`. If the commit fails with an
        OS error (a full disk), the future raises but the episode is kept and saved later, as
        by :meth:`save_episode`. If it fails otherwise, the future raises, the episode is lost,
        and every later call of this writer raises until :meth:`finalize`, which still merges
        the episodes saved before. At most :data:`~.commit.MAX_SAVES_IN_FLIGHT` saves wait for
        the commit thread; more wait here.
        """
        return self._encode_and_submit(sidecar, arrays, waited=False).future

    def discard_episode(self) -> None:
        episode = self._episode
        if episode is None:
            return
        self._episode = None
        episode.discard()

    def finalize(self) -> None:
        """Wait until every saved episode is durable and in LeRobot's files, then release the
        root. Refuses while an episode is open.

        Episodes whose save failed are tried a last time; one that still fails is lost (the error
        raised names it). A merge that still fails leaves its episodes safe in the journal for
        the next :meth:`open` or ``hilrec repair``, and its error is raised. Either way the
        writer is finished and the root's lock released; a failed commit that stopped the
        writer is raised after merging the episodes before it.
        """
        if self._finalized:
            return
        if self._episode is not None:
            raise DatasetStateError(
                f"{self.root}: finalize() with episode {self._episode.index} open "
                f"({self._episode.length} frames); save_episode() or discard_episode() first"
            )
        merge_error: DatasetError | None = None
        self._committer.stop()  # commits what is queued, retries what is held
        # The encode backlog: a progress bar; Ctrl-C leaves it safe in the spills and this call
        # (or the next open, or hilrec repair) resumes it.
        if not self.wait_videos(VIDEO_WAIT_S, progress=True):
            waiting = self._backlog.pending_episodes()
            self._backlog.errors.append(
                f"{self.root}: episodes {waiting}: their video was not encoded within {VIDEO_WAIT_S:.0f} s "
                "of the finalize; their spills stay in the journal and the next open or hilrec "
                "repair finishes them"
            )
        try:
            try:
                self._merger.wait()  # retries a failed merge once more
            except DatasetError as exc:
                merge_error = exc
        finally:
            self._merger.close()
            self._finalized = True
            self._backlog.stop()
            atexit.unregister(self._merge_at_exit)
            self._lock.release()
        if self._committer.lost:
            error = DatasetError(lost_message(self.root, self._committer.lost, self.num_episodes))
            if merge_error is not None:
                error.add_note(str(merge_error))
            raise error from merge_error
        if self._committer.error is not None:
            raise self._committer.error
        if merge_error is not None:
            raise merge_error
        if self._backlog.errors:
            raise VideoEncodingError("; ".join(self._backlog.errors))

    def close(self) -> None:
        """Discard the open episode (if any) and :meth:`finalize`; the root's lock is released
        even when that raises."""
        self.discard_episode()
        self.finalize()

    def wait_consolidated(self, timeout: float | None = None, *, retry: bool = True) -> None:
        """Block until every episode saved so far is durable and merged; raise a merge's error.

        A merge that failed before is retried at once (``retry=False``: at its next attempt on
        the merger's own schedule)."""
        self._committer.wait()
        self.wait_videos(timeout)
        self._merger.wait(timeout, retry=retry)

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

    # --- the video backlog ------------------------------------------------------------------------

    @property
    def _workers(self) -> dict[str, EncoderProcess]:
        # Tests kill a worker through this handle.
        return self._backlog.workers

    def video_backlog_s(self) -> float:
        """Seconds of video handed to the encoder processes and not encoded yet (the slowest
        camera): the open episode's frames and the saved episodes still being encoded. 0.0 with
        the in-process encoder. Cheap, safe from any thread."""
        return self._backlog.backlog_s()

    @property
    def spill_bytes_limit(self) -> int:
        return self._backlog.spill_bytes_limit

    @property
    def spill_bytes(self) -> int:
        """Bytes of raw frames in spills: the open episode's and the saved ones' still encoding."""
        return self._backlog.spill_bytes(self._episode)

    def spill_problem(self) -> str | None:
        """Why a new take may not start because of the video backlog, or None.

        The daemon calls this before it starts a take (with :meth:`space_problem`) and refuses
        the take when it says something: the spill is not empty and, with one more take of the
        longest recent length, would pass ``spill_bytes_limit``; or an encoder process died."""
        return self._backlog.spill_problem(list(self._sizes.lengths), self._episode)

    def wait_videos(self, timeout: float | None = None, *, progress: bool = False) -> bool:
        """Block until every saved episode's mp4 is encoded and placed; True if it happened
        within ``timeout``. ``progress``: a tqdm bar of the frames left (on stderr)."""
        return self._backlog.wait(timeout, progress=progress)

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
            workers=self._backlog.workers or None,
            realtime=self.realtime,
        )
        self._episode = episode
        return episode

    def _encode_and_submit(
        self,
        sidecar: Mapping[str, Any] | None,
        arrays: Mapping[str, np.ndarray] | None,
        *,
        waited: bool,
    ) -> PendingSave:
        self._check_usable()
        episode = self._episode
        if episode is None or episode.length == 0:
            raise DatasetStateError(f"{self.root}: save_episode() with no frames added")
        try:
            episode.release_reserve()
            episode.finish_videos()
            if self._hook is not None:
                self._hook("videos-finished")
                if episode.pending:
                    self._hook("spill-synced")
            encoded = self._encoder.encode(episode, self._numbering, sidecar=sidecar, arrays=arrays)
        except BaseException:
            self.discard_episode()
            raise
        episode.release_frames()
        self._remember_size(episode, encoded)
        save = PendingSave(episode, encoded, waited=waited)
        if episode.pending:
            self._backlog.track(episode, save)
        self._committer.submit(save)
        self._episode = None
        self._numbering.advance(episode, encoded.new_tasks)
        return save

    def _merge_at_exit(self) -> None:
        if self._finalized:
            return
        try:
            self._committer.stop()
            self._backlog.stop()  # what is still encoding is finished from its spill by open/repair
            for index, frames, why in self._committer.lost:
                log.error("%s: episode %d (%d frames) lost at exit: %s", self.root, index, frames, why)
            self._merger.wait(timeout=EXIT_MERGE_TIMEOUT_S)
        except DatasetError:
            log.exception("%s: saved episodes not merged at exit; 'hilrec repair' merges them", self.root)
        finally:
            self._lock.release()
