"""The video backlog: the encoder processes, their spill, and the episodes whose mp4 is still coming.

With ``video_encoder="process"`` (:mod:`.encoder_process`) every camera has one worker process
for the writer's lifetime. A saved episode whose encoder has not finished is committed with its
spill (:mod:`.spill`) and its mp4 is placed later, in save order, by the backlog's finisher
thread; the episode is merged only then, because the merge follows commit order and a later
episode waits behind an earlier one still encoding. :class:`VideoBacklog` keeps that account:

- :meth:`VideoBacklog.backlog_s` is the seconds of video handed over and not encoded yet (the
  slowest camera);
- :meth:`VideoBacklog.spill_problem` says whether a new take may start (the spill bound
  ``spill_bytes_limit``, or an encoder process that died), and :meth:`VideoBacklog.check_room`
  refuses a frame that would pass the bound with :class:`SpillFullError`;
- :meth:`VideoBacklog.wait` waits for the mp4s (``finalize``'s progress bar); interrupted, the
  spills stay in the journal and the next ``open`` or ``hilrec repair`` finishes them.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import TimeoutError as FutureTimeout
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from hilrec.daemon.dataset.format.features import is_video
from hilrec.daemon.dataset.store import journal
from hilrec.daemon.dataset.store.journal import Hook
from hilrec.daemon.dataset.store.spilled import encode_from_spill
from hilrec.daemon.dataset.video.codec import VideoSettings
from hilrec.daemon.dataset.video.spill import release_spill
from hilrec.daemon.dataset.writer.commit import PendingSave
from hilrec.daemon.dataset.writer.episode import OpenEpisode
from hilrec.daemon.dataset.writer.space import DEFAULT_TAKE_S, MIN_FREE_BYTES, size_text
from hilrec.daemon.errors import DatasetError, DiskFullError, SpillFullError, VideoEncodingError

if TYPE_CHECKING:
    from hilrec.daemon.dataset.video.encoder_process import EncoderProcess

log = logging.getLogger(__name__)

# The spill's disk bound by default (raw 640x480 frames: 0.9 MB each; 2 cameras at 25 Hz fill
# this in about 6 minutes of backlog).
DEFAULT_SPILL_BYTES_LIMIT: Final[int] = 16 * 1024**3
# The longest one camera's mp4 of one episode may take to finish once saved (the encoder at
# SCHED_IDLE on a busy machine is slow, not this slow: past it the worker is taken as hung and
# the episode is left to its spill, which the next open or hilrec repair encodes).
VIDEO_FINISH_TIMEOUT_S: Final[float] = 3600.0
FINISHER_JOIN_S: Final[float] = 30.0  # a rename or two after the workers are closed
# A wait for the encoders shorter than this shows no progress bar.
PROGRESS_AFTER_S: Final[float] = 0.5
_WAIT_SLICE_S: Final[float] = 0.5  # between looks at the backlog, when nothing wakes the wait


class VideoEncoder(StrEnum):
    """Where a writer encodes its videos (the ``video_encoder`` setting)."""

    PROCESS = "process"  # worker processes at SCHED_IDLE, frames through shared memory
    THREAD = "thread"  # threads of the writer's own process


VIDEO_ENCODERS: Final[tuple[str, ...]] = tuple(VideoEncoder)
ENCODER_ENV: Final[str] = "HILREC_VIDEO_ENCODER"
# Overrides the default spill bound (bytes) where the caller gives none: the daemon's.
SPILL_LIMIT_ENV: Final[str] = "HILREC_SPILL_BYTES_LIMIT"


def encoder_mode(video_encoder: str | None, root: Path, codec: str) -> str:
    """The encoder the writer runs: the argument, else ``HILREC_VIDEO_ENCODER``, else the
    default for ``codec`` (see :func:`default_encoder`)."""
    mode = video_encoder or os.environ.get(ENCODER_ENV) or default_encoder(codec)
    if mode not in VIDEO_ENCODERS:
        raise DatasetError(f"{root}: video_encoder must be one of {VIDEO_ENCODERS}, got {mode!r}")
    return mode


def spill_limit(spill_bytes_limit: int | None, root: Path) -> int:
    """The spill bound: the argument, else ``HILREC_SPILL_BYTES_LIMIT``, else the default."""
    if spill_bytes_limit is not None:
        return int(spill_bytes_limit)
    text = os.environ.get(SPILL_LIMIT_ENV)
    if not text:
        return DEFAULT_SPILL_BYTES_LIMIT
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value <= 0:
        raise DatasetError(f"{root}: {SPILL_LIMIT_ENV} must be a positive number of bytes, got {text!r}")
    return value


def default_encoder(codec: str) -> str:
    """``process`` for libsvtav1, ``thread`` for the others.

    LeRobot's libsvtav1 needs most of a core per 640x480 camera at 25 Hz: in the daemon's
    process it takes the CPU the loop needs (bench_daemon, 2 cameras, 60 s, 2 shared cores:
    the daemon at ~100 % of a core in process against ~16 % with the encoders at SCHED_IDLE,
    missed deadlines 2 and 12 in process against 10 and 3 with the workers, the later run of
    each pair on the busier machine). x264 and x265 keep up in process at a fraction of that."""
    return "process" if codec == "libsvtav1" else "thread"


class VideoBacklog:
    """The encoder processes of one writer and the saved episodes still being encoded."""

    def __init__(
        self,
        root: Path,
        *,
        fps: int,
        features: dict[str, Any],
        settings: VideoSettings,
        hook: Hook,
        merge: Callable[[int], None],
        next_merge: int,
        spill_bytes_limit: int | None,
    ) -> None:
        self.root = root
        self.fps = fps
        self.features = features
        self.settings = settings
        self.spill_bytes_limit = spill_limit(spill_bytes_limit, root)
        self._hook = hook
        self._merge = merge
        self.workers: dict[str, EncoderProcess] = {}
        self.video_keys = [k for k, spec in features.items() if is_video(spec)]
        # Episodes committed but not merged yet because an mp4 is still being encoded.
        self._gate = threading.Condition()
        self._next_merge = next_merge
        self._committed: set[int] = set()
        self._pending_videos: dict[int, int] = {}  # episode -> spill bytes still waiting
        self._finisher: threading.Thread | None = None
        self._finish_queue: deque[tuple[OpenEpisode, PendingSave]] = deque()
        self._stopping = False
        self.errors: list[str] = []

    # --- the workers ---------------------------------------------------------------------------

    def start(self) -> None:
        from hilrec.daemon.dataset.video.encoder_process import EncoderProcess

        try:
            for key in self.video_keys:
                height, width, _ = self.features[key]["shape"]
                self.workers[key] = EncoderProcess(
                    key, fps=self.fps, height=height, width=width, settings=self.settings
                )
        except BaseException:
            self.stop()
            raise
        self._finisher = threading.Thread(target=self._finish_loop, name="video-finish", daemon=True)
        self._finisher.start()

    def stop(self) -> None:
        """Close the workers and end the finisher; what is still encoding stays in its spill."""
        with self._gate:
            self._stopping = True
            self._gate.notify_all()
        workers, self.workers = self.workers, {}
        for worker in workers.values():
            worker.close()
        if self._finisher is not None:
            self._finisher.join(FINISHER_JOIN_S)

    # --- commits and merges --------------------------------------------------------------------

    def on_committed(self, index: int) -> None:
        """The commit thread's callback: merge in order, but not past an mp4 still encoding."""
        with self._gate:
            self._committed.add(index)
            self._release_merges()
            self._gate.notify_all()

    def track(self, episode: OpenEpisode, save: PendingSave) -> None:
        """``episode`` is submitted with mp4s still being encoded: place them once they are."""
        with self._gate:
            self._pending_videos[episode.index] = sum(episode.spills[key].bytes for key in episode.pending)
            self._finish_queue.append((episode, save))
            self._gate.notify_all()

    def _release_merges(self) -> None:
        while self._next_merge in self._committed and self._next_merge not in self._pending_videos:
            self._committed.discard(self._next_merge)
            self._merge(self._next_merge)
            self._next_merge += 1

    def _finish_loop(self) -> None:
        """Places each saved episode's mp4 once its encoder process is done (in save order)."""
        with contextlib.suppress(OSError):  # this thread only waits and renames; be polite anyway
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
        while True:
            with self._gate:
                while not self._finish_queue and not self._stopping:
                    self._gate.wait(FINISHER_JOIN_S)
                if self._stopping:
                    return  # the spills of what is queued stay: open or repair finishes them
                episode, save = self._finish_queue[0]
            try:
                self._finish_episode(episode, save)
            except BaseException as exc:  # noqa: BLE001 - reported; the spill stays for repair
                message = f"{self.root}: episode {episode.index}: its video could not be finished: {exc}"
                log.error("%s", message)
                self.errors.append(message)
            with self._gate:
                if self._stopping:
                    return  # unmerged, maybe unplaced: the next open or hilrec repair sees to it
                self._finish_queue.popleft()
                self._pending_videos.pop(episode.index, None)
                self._release_merges()
                self._gate.notify_all()

    def _finish_episode(self, episode: OpenEpisode, save: PendingSave) -> None:
        index = episode.index
        for key, (future, out) in episode.pending.items():
            try:
                future.result(VIDEO_FINISH_TIMEOUT_S)
                ok = True
            except FutureTimeout as exc:
                raise VideoEncodingError(
                    f"episode {index} '{key}': its encoder process did not finish the mp4 within "
                    f"{VIDEO_FINISH_TIMEOUT_S:.0f} s; its spill stays for the next open or hilrec repair"
                ) from exc
            except VideoEncodingError as exc:
                if self._stopping:
                    return  # closed under it: the spill stays for the next open or hilrec repair
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

    # --- the account ---------------------------------------------------------------------------

    def backlog_frames(self) -> int:
        return max((worker.backlog_frames for worker in self.workers.values()), default=0)

    def backlog_s(self) -> float:
        """Seconds of video handed to the encoder processes and not encoded yet (the slowest
        camera). 0.0 without workers. Cheap, safe from any thread."""
        return self.backlog_frames() / self.fps

    def spill_bytes(self, episode: OpenEpisode | None) -> int:
        """Bytes of raw frames in spills: the open episode's and the saved ones' still encoding."""
        with self._gate:
            waiting = sum(self._pending_videos.values())
        return waiting + (episode.spill_bytes if episode is not None else 0)

    def frame_bytes(self) -> int:
        """Raw bytes of one frame of every camera."""
        return sum(self.features[k]["shape"][0] * self.features[k]["shape"][1] * 3 for k in self.video_keys)

    def spill_problem(self, recent_lengths: Sequence[int], episode: OpenEpisode | None) -> str | None:
        """Why a new take may not start because of the video backlog, or None (see the writer's
        :meth:`~.writer.DatasetWriter.spill_problem`)."""
        for key, worker in self.workers.items():
            if worker.error is not None or not worker.alive:
                return (
                    f"{self.root}: the encoder process of '{key}' is not running ({worker.error or 'exited'})"
                )
        if not self.workers:
            return None
        frames = max([*recent_lengths, 0]) or round(self.fps * DEFAULT_TAKE_S)
        take = frames * self.frame_bytes()
        used = self.spill_bytes(episode)
        # An empty spill never refuses: frames spill only while the encoder is behind, and a
        # take that does reach the bound is stopped there (SpillFullError), not lost.
        if used == 0:
            return None
        room = self.disk_room()
        if take > room:
            return (
                f"{self.root}: the video spill holds {size_text(used)} ({self.backlog_s():.0f} s of "
                f"video not encoded yet); one more take of {frames} frames needs {size_text(take)} "
                f"and the disk has {size_text(max(0, room))} left above the "
                f"{size_text(MIN_FREE_BYTES)} kept free: wait for the encoder or free disk space"
            )
        if used + take <= self.spill_bytes_limit:
            return None
        return (
            f"{self.root}: the video spill holds {size_text(used)} ({self.backlog_s():.0f} s of "
            f"video not encoded yet); one more take of {frames} frames needs {size_text(take)} and "
            f"the bound (spill_bytes_limit) is {size_text(self.spill_bytes_limit)}: wait for the encoder"
        )

    def disk_room(self) -> int:
        """Bytes the spill may still take on the root's disk: free (``statvfs``) minus the
        writer's :data:`~.space.MIN_FREE_BYTES`. Unreadable: no bound from the disk."""
        try:
            stat = os.statvfs(self.root)
        except OSError:
            return sys.maxsize
        return stat.f_bavail * stat.f_frsize - MIN_FREE_BYTES

    def pending_episodes(self) -> list[int]:
        """The saved episodes whose mp4 is still being encoded or placed."""
        with self._gate:
            return sorted({episode.index for episode, _ in self._finish_queue} | set(self._pending_videos))

    def check_room(self, episode: OpenEpisode | None, next_index: int) -> None:
        """Raise :class:`SpillFullError` if one more frame could pass the spill's bound."""
        need = self.frame_bytes()
        used = self.spill_bytes(episode)
        room = self.disk_room()
        if need > room:
            raise DiskFullError(
                f"{self.root}: the disk is nearly full for the video spill ({size_text(max(0, room))} "
                f"left above the {size_text(MIN_FREE_BYTES)} kept free; {self.backlog_s():.0f} s of "
                f"video wait for the encoder): {_ends_at(episode, next_index)}; "
                "free disk space or wait for the encoder before the next take"
            )
        if used + need > self.spill_bytes_limit:
            raise SpillFullError(
                f"{self.root}: the video spill is full ({size_text(used)} of spill_bytes_limit "
                f"{size_text(self.spill_bytes_limit)}; {self.backlog_s():.0f} s of video wait "
                f"for the encoder): {_ends_at(episode, next_index)}; "
                "wait for the encoder to catch up before the next take"
            )

    def wait(self, timeout: float | None = None, *, progress: bool = False) -> bool:
        """Block until every saved episode's mp4 is encoded and placed; True if it happened
        within ``timeout``. ``progress``: a tqdm bar of the frames left (on stderr)."""
        began = time.monotonic()
        deadline = None if timeout is None else began + timeout
        bar = None
        try:
            while True:
                with self._gate:
                    busy = bool(self._finish_queue) or bool(self._pending_videos)
                if not busy:
                    return True
                now = time.monotonic()
                if deadline is not None and now >= deadline:
                    return False
                left = self.backlog_frames()
                # A bar only for a wait worth one: every `record --sim --workers` episode ends
                # with a finalize whose last frame or two take milliseconds.
                if progress and bar is None and left > 0 and now - began >= PROGRESS_AFTER_S:
                    from tqdm import tqdm

                    bar = tqdm(total=left, desc="encoding video backlog", unit="frame", file=sys.stderr)
                if bar is not None:
                    bar.n = max(0, bar.total - left)
                    bar.refresh()
                with self._gate:
                    self._gate.wait(_WAIT_SLICE_S if deadline is None else min(_WAIT_SLICE_S, deadline - now))
        finally:
            if bar is not None:
                bar.close()


def _ends_at(episode: OpenEpisode | None, next_index: int) -> str:
    """Where a take the spill cannot go on with ends, and what it keeps (true for every caller:
    the frames before are whole, and a save keeps them)."""
    length = episode.length if episode is not None else 0
    index = episode.index if episode is not None else next_index
    if length == 0:
        return f"episode {index} ends at frame 0, with no frame to save"
    return f"episode {index} ends at frame {length}: saving it keeps its {length} frames"
