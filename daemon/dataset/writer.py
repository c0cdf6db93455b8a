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

Video is encoded in one worker process per camera at the lowest CPU priority
(:mod:`.encoder_process`, ``video_encoder="process"``, opt-in while it misses the loop's
deadlines on a loaded 2-core machine; ``"thread"``, the default, keeps the in-process encoder
threads; the environment variable ``HILREC_VIDEO_ENCODER`` chooses too).
Frames reach it through shared memory and wait, when it falls behind, in a bounded on-disk spill
(:mod:`.spill`), never in RAM, never dropped. ``save_episode`` is durable once the spill is
fsynced; the encode catches up afterwards, and an episode is merged once its mp4 is done.
:meth:`video_backlog_s` says how far behind it is, :meth:`spill_problem` whether a new take may
start, and a frame that would pass ``spill_bytes_limit`` raises :class:`SpillFullError`.
``finalize`` waits for the backlog (a progress bar); interrupted, it can be called again, or the
next :meth:`open` (or ``hilrec repair`` via :func:`.spill.finish_spilled_encodes`) finishes the
encode from the spill.

An episode that is open (frames added, not saved) when the process dies is dropped: its frames
were never committed. ``hilrec repair`` reports it.

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
import contextlib
import logging
import os
import sys
import threading
import time
from collections import deque
from collections.abc import Mapping
from concurrent.futures import Future
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final

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
    MB,
    empty_info,
    row_bytes,
    write_info,
)
from hilrec.daemon.dataset.paths import (
    INFO_PATH,
    META_DIR,
    data_path,
    data_ref,
    episodes_path,
    episodes_ref,
    video_path,
    video_ref,
)
from hilrec.daemon.dataset.rootlock import LOCK_NAME, RootLock, lock_path
from hilrec.daemon.dataset.sidecar import update_dataset_sidecar
from hilrec.daemon.dataset.spill import encode_from_spill, finish_spilled_encodes, release_spill
from hilrec.daemon.dataset.video import DEFAULT_MAX_QUEUE_BYTES, VideoSettings
from hilrec.daemon.errors import (
    CorruptDatasetError,
    DatasetError,
    DatasetStateError,
    SpillFullError,
    VideoEncodingError,
)

if TYPE_CHECKING:
    from hilrec.daemon.dataset.encoder_process import EncoderProcess

log = logging.getLogger(__name__)

WRITER_NAME: Final[str] = "hilrec.native"
EXIT_MERGE_TIMEOUT_S: Final[float] = 120.0
# space_problem(): never ask for less than this, whatever the estimate says.
MIN_FREE_BYTES: Final[int] = 64 * MB
# Until an episode is measured: a take of this long, video at this many bits per pixel (AV1 at
# LeRobot's crf 30 stays well below it on camera images; noise needs more, and is measured then).
DEFAULT_TAKE_S: Final[float] = 60.0
VIDEO_BITS_PER_PIXEL: Final[float] = 0.5
# The recent episodes space_problem() sizes the next take from.
RECENT_EPISODES: Final[int] = 20
# The spill's disk bound by default (raw 640x480 frames: 0.9 MB each; 2 cameras at 25 Hz fill
# this in about 6 minutes of backlog).
DEFAULT_SPILL_BYTES_LIMIT: Final[int] = 16 * 1024**3
VIDEO_ENCODERS: Final[tuple[str, ...]] = ("process", "thread")
ENCODER_ENV: Final[str] = "HILREC_VIDEO_ENCODER"


def _encoder_mode(video_encoder: str | None, root: Path) -> str:
    mode = video_encoder or os.environ.get(ENCODER_ENV) or "thread"
    if mode not in VIDEO_ENCODERS:
        raise DatasetError(f"{root}: video_encoder must be one of {VIDEO_ENCODERS}, got {mode!r}")
    return mode


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
        lock: RootLock,
        merge_interval_s: float = 0.0,
        video_encoder: str = "thread",
        spill_bytes_limit: int = DEFAULT_SPILL_BYTES_LIMIT,
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
        self._recent: deque[tuple[int, int]] = deque(maxlen=RECENT_EPISODES)
        self._recent_lengths: deque[int] = deque(
            (int(row["length"]) for row in state.episodes[-RECENT_EPISODES:]), maxlen=RECENT_EPISODES
        )
        self._merger = BackgroundMerger(state, hook=hook, interval_s=merge_interval_s)
        self.video_encoder = video_encoder
        self.spill_bytes_limit = int(spill_bytes_limit)
        self._workers: dict[str, EncoderProcess] = {}
        self._video_keys = [k for k, spec in self.features.items() if is_video(spec)]
        # Episodes committed but not merged yet because an mp4 is still being encoded: the merge
        # follows commit order, so a later episode waits behind an earlier pending one.
        self._gate = threading.Condition()
        self._next_merge = len(state.episodes)
        self._committed: set[int] = set()
        self._pending_videos: dict[int, int] = {}  # episode -> spill bytes still waiting
        self._finisher: threading.Thread | None = None
        self._finish_queue: deque[tuple[OpenEpisode, PendingSave]] = deque()
        self._finish_errors: list[str] = []
        if video_encoder == "process" and self._video_keys:
            self._start_workers()
        self._committer = Committer(
            root,
            episodes=len(state.episodes),
            frames=state.total_frames,
            hook=hook,
            on_committed=self._on_committed,
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
        spill_bytes_limit: int = DEFAULT_SPILL_BYTES_LIMIT,
    ) -> DatasetWriter:
        """Start a new dataset at ``root`` (which must not exist or be empty).

        ``merge_interval_s`` > 0 merges saved episodes into LeRobot's files at most that often
        (and at finalize), instead of after every save: for a producer of many episodes a second.
        The root's lock is taken first (``lock_command`` is what a refused second writer is told
        holds it; default ``hilrec <sub-command>``): :class:`DatasetLockedError` if another
        writer has it.
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
        mode = _encoder_mode(video_encoder, root)
        lock = _lock_empty_root(root, lock_command)
        try:
            return cls._create_locked(
                root,
                lock,
                fps=fps,
                features=full,
                robot_type=robot_type,
                settings=settings,
                chunks_size=chunks_size,
                data_files_size_in_mb=data_files_size_in_mb,
                video_files_size_in_mb=video_files_size_in_mb,
                max_video_queue_bytes=max_video_queue_bytes,
                hook=hook,
                merge_interval_s=merge_interval_s,
                video_encoder=mode,
                spill_bytes_limit=spill_bytes_limit,
            )
        except BaseException:
            lock.release()
            raise

    @classmethod
    def _create_locked(
        cls,
        root: Path,
        lock: RootLock,
        *,
        fps: int,
        features: dict[str, Any],
        robot_type: str | None,
        settings: VideoSettings,
        chunks_size: int,
        data_files_size_in_mb: float,
        video_files_size_in_mb: float,
        max_video_queue_bytes: int,
        hook: Hook,
        merge_interval_s: float,
        video_encoder: str = "thread",
        spill_bytes_limit: int = DEFAULT_SPILL_BYTES_LIMIT,
    ) -> DatasetWriter:
        full = features
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
            lock=lock,
            merge_interval_s=merge_interval_s,
            video_encoder=video_encoder,
            spill_bytes_limit=spill_bytes_limit,
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
        lock_command: str | None = None,
        video_encoder: str | None = None,
        spill_bytes_limit: int = DEFAULT_SPILL_BYTES_LIMIT,
    ) -> DatasetWriter:
        """Reopen an existing dataset to add episodes; finishes any merge a crash interrupted.

        The root's lock is taken before anything in it is touched (see :meth:`create`): a root
        another writer holds is refused with :class:`DatasetLockedError`, its open episode left
        alone. An episode that was open (never saved) when the previous writer died is dropped.
        """
        from hilrec.daemon.dataset.repair import recover

        root = Path(root)
        settings = VideoSettings(codec=video_codec)
        mode = _encoder_mode(video_encoder, root)
        if not ((root / META_DIR).is_dir() or journal.journal_dir(root).is_dir()):
            # Not a dataset: refused before a lock file is put into it.
            raise CorruptDatasetError(str(root / INFO_PATH), "missing: not a LeRobot dataset root")
        lock = RootLock(root, lock_command).acquire()
        try:
            # Saved episodes whose encode a crash interrupted get their mp4 from their spill
            # first: the recovery then merges them like any other.
            for action in finish_spilled_encodes(root):
                log.warning("%s: %s", root, action)
            report = recover(root)
            if report.dropped:
                log.warning("%s: dropped on reopen: %s", root, report.dropped)
            update_dataset_sidecar(root, {"writer": cls._provenance(settings)})
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
            )
        except BaseException:
            lock.release()
            raise

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
        if self._workers:
            self._check_spill_room()
        episode = self._episode or self._open_episode()
        episode.add(values, task)

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
        self.wait_videos(progress=True)
        try:
            try:
                self._merger.wait()  # retries a failed merge once more
            except DatasetError as exc:
                merge_error = exc
        finally:
            self._merger.close()
            self._finalized = True
            self._stop_workers()
            atexit.unregister(self._merge_at_exit)
            self._lock.release()
        if self._committer.lost:
            error = DatasetError(_lost_message(self.root, self._committer.lost, self.num_episodes))
            if merge_error is not None:
                error.add_note(str(merge_error))
            raise error from merge_error
        if self._committer.error is not None:
            raise self._committer.error
        if merge_error is not None:
            raise merge_error
        if self._finish_errors:
            raise VideoEncodingError("; ".join(self._finish_errors))

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

    def video_backlog_s(self) -> float:
        """Seconds of video handed to the encoder processes and not encoded yet (the slowest
        camera): the open episode's frames and the saved episodes still being encoded. 0.0 with
        the in-process encoder. Cheap, safe from any thread."""
        if not self._workers:
            return 0.0
        return max(worker.backlog_frames for worker in self._workers.values()) / self.fps

    @property
    def spill_bytes(self) -> int:
        """Bytes of raw frames in spills: the open episode's and the saved ones' still encoding."""
        with self._gate:
            waiting = sum(self._pending_videos.values())
        episode = self._episode
        return waiting + (episode.spill_bytes if episode is not None else 0)

    def spill_problem(self) -> str | None:
        """Why a new take may not start because of the video backlog, or None.

        The daemon calls this before it starts a take (with :meth:`space_problem`) and refuses
        the take when it says something: the spill, with one more take of the longest recent
        length, would pass ``spill_bytes_limit``, or an encoder process has died."""
        for key, worker in self._workers.items():
            if worker.error is not None or not worker.alive:
                return (
                    f"{self.root}: the encoder process of '{key}' is not running ({worker.error or 'exited'})"
                )
        if not self._workers:
            return None
        frames = max([*self._recent_lengths, 0]) or round(self.fps * DEFAULT_TAKE_S)
        take = frames * self._frame_bytes_all()
        used = self.spill_bytes
        if used + take <= self.spill_bytes_limit:
            return None
        return (
            f"{self.root}: the video spill holds {_size(used)} ({self.video_backlog_s():.0f} s of "
            f"video not encoded yet); one more take of {frames} frames needs {_size(take)} and the "
            f"bound (spill_bytes_limit) is {_size(self.spill_bytes_limit)}: wait for the encoder"
        )

    def wait_videos(self, timeout: float | None = None, *, progress: bool = False) -> bool:
        """Block until every saved episode's mp4 is encoded and placed; True if it happened
        within ``timeout``. ``progress``: a tqdm bar of the frames left (on stderr)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        bar = None
        try:
            while True:
                with self._gate:
                    busy = bool(self._finish_queue) or bool(self._pending_videos)
                if not busy:
                    return True
                left = max((w.backlog_frames for w in self._workers.values()), default=0)
                if progress and bar is None and left > 0:
                    from tqdm import tqdm

                    bar = tqdm(total=left, desc="encoding video backlog", unit="frame", file=sys.stderr)
                if bar is not None:
                    bar.n = max(0, bar.total - left)
                    bar.refresh()
                if deadline is not None and time.monotonic() >= deadline:
                    return False
                with self._gate:
                    self._gate.wait(0.5)
        finally:
            if bar is not None:
                bar.close()

    def _frame_bytes_all(self) -> int:
        return sum(self.features[k]["shape"][0] * self.features[k]["shape"][1] * 3 for k in self._video_keys)

    def _check_spill_room(self) -> None:
        need = self._frame_bytes_all()
        used = self.spill_bytes
        if used + need > self.spill_bytes_limit:
            episode = self._episode
            raise SpillFullError(
                f"{self.root}: the video spill is full ({_size(used)} of spill_bytes_limit "
                f"{_size(self.spill_bytes_limit)}; {self.video_backlog_s():.0f} s of video wait "
                f"for the encoder): frame {episode.length if episode else 0} of episode "
                f"{episode.index if episode else self._numbering.next_index} is refused, not dropped; "
                "save or discard the take and wait for the encoder to catch up"
            )

    def _start_workers(self) -> None:
        from hilrec.daemon.dataset.encoder_process import EncoderProcess

        try:
            for key in self._video_keys:
                height, width, _ = self.features[key]["shape"]
                self._workers[key] = EncoderProcess(
                    key, fps=self.fps, height=height, width=width, settings=self.video_settings
                )
        except BaseException:
            self._stop_workers()
            raise
        self._finisher = threading.Thread(target=self._finish_loop, name="video-finish", daemon=True)
        self._finisher.start()

    def _stop_workers(self) -> None:
        workers, self._workers = self._workers, {}
        for worker in workers.values():
            worker.close()

    def _on_committed(self, index: int) -> None:
        """The commit thread's callback: merge in order, but not past an mp4 still encoding."""
        with self._gate:
            self._committed.add(index)
            self._release_merges()
            self._gate.notify_all()

    def _release_merges(self) -> None:
        while self._next_merge in self._committed and self._next_merge not in self._pending_videos:
            self._committed.discard(self._next_merge)
            self._merger.add(self._next_merge)
            self._next_merge += 1

    def _finish_loop(self) -> None:
        """Places each saved episode's mp4 once its encoder process is done (in save order)."""
        with contextlib.suppress(OSError):  # this thread only waits and renames; be polite anyway
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
        while True:
            with self._gate:
                while not self._finish_queue:
                    self._gate.wait()
                episode, save = self._finish_queue[0]
            try:
                self._finish_episode(episode, save)
            except BaseException as exc:  # noqa: BLE001 - reported; the spill stays for repair
                message = f"{self.root}: episode {episode.index}: its video could not be finished: {exc}"
                log.error("%s", message)
                self._finish_errors.append(message)
            with self._gate:
                self._finish_queue.popleft()
                self._pending_videos.pop(episode.index, None)
                self._release_merges()
                self._gate.notify_all()

    def _finish_episode(self, episode: OpenEpisode, save: PendingSave) -> None:
        index = episode.index
        for key, (future, out) in episode.pending.items():
            try:
                future.result()
                ok = True
            except VideoEncodingError as exc:
                log.error("%s: episode %d '%s': %s; encoding it from its spill", self.root, index, key, exc)
                ok = False
            # The mp4 goes into the committed directory: wait for the commit.
            while not self._is_committed(index):
                if save.future.done() and save.future.exception() is not None and not save.held:
                    out.unlink(missing_ok=True)
                    return  # the save failed and the episode is gone: nothing to place
                with self._gate:
                    self._gate.wait(0.5)
            if ok:
                release_spill(journal.episode_dir(self.root, index), key)
            else:
                encode_from_spill(self.root, index, key)
            if self._hook is not None:
                self._hook("video-placed")

    def _is_committed(self, index: int) -> bool:
        with self._gate:
            if index in self._committed or index < self._next_merge:
                return True
        return (
            journal.episode_dir(self.root, index).is_dir()
            and not journal.open_episode_dir(self.root, index).exists()
        )

    # --- failures and free space -------------------------------------------------------------------

    @property
    def failed_saves(self) -> list[int]:
        """Episodes whose save failed with an OS error and that wait for a retry, in order."""
        return [index for index, _frames, _why in self._committer.held]

    def retry_failed(self, timeout: float | None = None) -> list[int]:
        """Save the episodes whose save failed (:attr:`failed_saves`) now, in order, and retry a
        failed merge. Returns the episode indices saved by this call; raises
        :class:`DatasetError` if one still cannot be saved (it stays kept for a later retry).

        They are also retried on their own every few seconds once the file system has room, at
        the next save and at :meth:`finalize`: calling this is only needed to know at once.
        """
        if self._finalized:
            raise DatasetStateError(f"{self.root}: the writer is finalized")
        try:
            return self._committer.retry().result(timeout)
        finally:
            self._merger.retry()

    def problems(self) -> list[str]:
        """What keeps saved or acknowledged episodes from being where they belong, one sentence
        each (empty when all is well): saves waiting for a retry, a failing merge (with the
        episode indices), a failure that stopped the writer, episodes lost at finalize. Safe to
        call from any thread; the daemon reports it in its status."""
        found = [
            f"{self.root}: episode {index} ({frames} frames) is not saved yet, kept for a retry: {why}"
            for index, frames, why in self._committer.held
        ]
        merge = self._merger.problem
        if merge is not None:
            found.append(merge)
        if self._committer.error is not None:
            found.append(f"{self.root}: saving stopped: {self._committer.error}")
        if self._committer.lost:
            found.append(_lost_message(self.root, self._committer.lost, self.num_episodes))
        return found

    def space_problem(self, need_bytes: int | None = None) -> str | None:
        """Why the file system of the root may not hold one more take, or None when it has room.

        Free is what an unprivileged writer may use (``statvfs``: ``f_bavail * f_frsize``).
        ``need_bytes`` defaults to :meth:`space_needed`. The sentence names both, in bytes. The
        daemon calls this before a take starts (to refuse or warn) and every few seconds while
        one runs (to stop it before its video cannot be written any more); it is cheap (one
        ``statvfs`` and a few ``stat`` calls) and safe from any thread.
        """
        try:
            stat = os.statvfs(self.root)
        except OSError as exc:
            return f"{self.root}: its free space cannot be read ({exc.strerror})"
        free = stat.f_bavail * stat.f_frsize
        if need_bytes is None:
            need, how = self._space_estimate()
        else:
            need, how = int(need_bytes), "as asked"
        if free >= need:
            return None
        return (
            f"{self.root}: {_size(free)} free ({free} bytes) but one more take needs "
            f"{_size(need)} ({need} bytes; {how}); free disk space or record to another disk"
        )

    def space_needed(self) -> int:
        """Bytes one more take needs on the root's file system (see :meth:`space_problem`).

        Frames: the longest of the recent episodes (and of the one being recorded; a minute
        before any). Bytes per frame: measured on the recent episodes (their rows and staged
        videos) and on the files the next merge appends to; before any, a parquet row plus
        :data:`VIDEO_BITS_PER_PIXEL` per camera pixel. A take is on disk twice while it is merged
        (staged, and in the new LeRobot files), and the merge rewrites the files it appends to
        beside the old ones; saves waiting for a retry add their bytes. At least
        :data:`MIN_FREE_BYTES`.
        """
        return self._space_estimate()[0]

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
            workers=self._workers or None,
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
            with self._gate:
                self._pending_videos[episode.index] = sum(
                    episode.spills[key].bytes for key in episode.pending
                )
                self._finish_queue.append((episode, save))
                self._gate.notify_all()
        self._committer.submit(save)
        self._episode = None
        self._numbering.advance(episode, encoded.new_tasks)
        return save

    def _remember_size(self, episode: OpenEpisode, encoded: Any) -> None:
        staged = _dir_bytes(episode.directory)
        written = sum(map(len, encoded.files.values())) + sum(map(len, encoded.beside.values()))
        self._recent.append((episode.length, staged + written))
        self._recent_lengths.append(episode.length)

    def _space_estimate(self) -> tuple[int, str]:
        open_episode = self._episode
        recent = list(self._recent)
        frames = max([*self._recent_lengths, open_episode.length if open_episode else 0])
        if frames == 0:
            frames = round(self.fps * DEFAULT_TAKE_S)
        merged_per_frame, copy = self._merged_files()
        measured = [size / length for length, size in recent if length] + merged_per_frame
        if measured:
            per_frame, source = max(measured), "measured"
        else:
            per_frame = row_bytes(self.features) + sum(
                spec["shape"][0] * spec["shape"][1] * VIDEO_BITS_PER_PIXEL / 8
                for spec in self.features.values()
                if is_video(spec)
            )
            source = "estimated"
        take = round(frames * per_frame)
        held = self._committer.held_bytes
        staged = _dir_bytes(open_episode.directory) if open_episode is not None else 0
        need = max(MIN_FREE_BYTES, 2 * take + copy + held - staged)
        how = (
            f"{frames} frames x {per_frame:.0f} bytes per frame ({source}), twice while it is "
            f"merged, plus {copy} bytes for the merge's copy of the files it appends to"
        )
        if held:
            how += f" and {held} bytes of saves waiting for a retry"
        if need == MIN_FREE_BYTES:
            how += f"; at least {_size(MIN_FREE_BYTES)}"
        return need, how

    def _merged_files(self) -> tuple[list[float], int]:
        """Bytes per frame of the files the last merged episode is in, and their total size."""
        state = self._merger.state
        if not state.episodes:
            return [], 0
        last = state.episodes[-1]
        files: list[tuple[Path, Any]] = [(data_path(self.root, data_ref(last)), data_ref)]
        for key, spec in self.features.items():
            if is_video(spec):
                files.append((video_path(self.root, key, video_ref(last, key)), _video_ref_of(key)))
        per_frame = 0.0
        total = 0
        for path, ref_of in files:
            try:
                size = path.stat().st_size
            except OSError:
                continue
            ref = ref_of(last)
            frames = sum(int(row["length"]) for row in state.episodes if ref_of(row) == ref)
            per_frame += size / max(1, frames)
            total += size
        with contextlib.suppress(OSError):
            total += episodes_path(self.root, episodes_ref(last)).stat().st_size
        return [per_frame], total

    def _merge_at_exit(self) -> None:
        if self._finalized:
            return
        try:
            self._committer.stop()
            self._stop_workers()  # what is still encoding is finished from its spill by open/repair
            for index, frames, why in self._committer.lost:
                log.error("%s: episode %d (%d frames) lost at exit: %s", self.root, index, frames, why)
            self._merger.wait(timeout=EXIT_MERGE_TIMEOUT_S)
        except DatasetError:
            log.exception("%s: saved episodes not merged at exit; 'hilrec repair' merges them", self.root)
        finally:
            self._lock.release()


def _lock_empty_root(root: Path, command: str | None) -> RootLock:
    """The lock of a root that is missing or empty (but for a lock file left by an earlier
    writer). A non-empty root is refused; one being written names its writer."""
    lock = RootLock(root, command)
    if _has_entries(root):
        if lock_path(root).exists():
            lock.acquire()  # DatasetLockedError, naming the writer, if one holds it
            lock.release()
        raise DatasetStateError(
            f"{root}: already exists and is not empty; use DatasetWriter.open() to add episodes to it"
        )
    lock.acquire()
    if _has_entries(root):  # filled between the look and the lock
        lock.release()
        raise DatasetStateError(
            f"{root}: already exists and is not empty; use DatasetWriter.open() to add episodes to it"
        )
    return lock


def _has_entries(root: Path) -> bool:
    if not root.is_dir():
        return False  # missing: created; not a directory: RootLock says so
    return any(child.name != LOCK_NAME for child in root.iterdir())


def _video_ref_of(key: str) -> Any:
    return lambda row: video_ref(row, key)


def _dir_bytes(directory: Path) -> int:
    total = 0
    try:
        for child in directory.iterdir():
            total += child.stat().st_size
    except OSError:
        pass
    return total


def _size(n: int) -> str:
    return f"{n / MB:.1f} MiB"


def _lost_message(root: Path, lost: list[tuple[int, int, str]], saved: int) -> str:
    names = ", ".join(f"{index} ({frames} frames)" for index, frames, _ in lost)
    return (
        f"{root}: episode(s) {names} could not be saved before the writer closed "
        f"({lost[0][2]}); their frames are lost. The {saved} episodes saved before are kept"
    )
