"""Video encoding in a worker process per camera, at the lowest CPU priority, fed through shared memory.

The encoder must never take the CPU the control loop needs. Each camera gets one worker process
for the writer's lifetime (a fresh interpreter, not a fork: the daemon is multi-threaded), which
puts itself under ``SCHED_IDLE`` (else ``nice 19``) before it imports the codec, so it and every
thread the codec starts only get CPU nobody else wants. It runs in a process group of its own
and ignores SIGINT: Ctrl-C is the writer's to handle, and a worker that died of it would cost the
take its frames (and print SVT-AV1's "deinit called without sending EOS!").

It stays in the daemon's *session*. Linux groups a session's threads for the scheduler (the
autogroup, on by default), and ``SCHED_IDLE`` only yields inside that group: a worker in a
session of its own got a full session's share against everything outside it, kernel workers
included. The kernel worker that moves a pty's bytes then ran late, and a request took up to
86 ms to reach an emulated arm (25-46 ticks with a bus retry and 3-8 missed ticks in 500, at
libsvtav1 with two cameras; in the daemon's session: 0-2 retry ticks and 0 missed).

Frames are not pickled. The parent owns a :class:`multiprocessing.shared_memory.SharedMemory`
ring of ``slots`` fixed-size slots (one ``H x W x 3`` frame each) plus a small header.
:meth:`EncoderProcess.offer` copies a frame into the next free slot and sends ``(job,
frame_index, slot)`` on a queue (a sender thread writes the socket, so the writer never waits on
the worker). Slots are used and released in FIFO order; a released slot keeps its frame until the
writer reuses it (:meth:`EncoderProcess.ring_frame`).

**Spill only while behind.** When the ring is full the writer writes the frame into the
episode's spill (:mod:`.spill`, frame ``i`` at offset ``i*H*W*3``) and sends ``slot = -1``; the
worker reads it from there, in order. From the first such frame (or when the writer asks, at a
save that cannot wait: :meth:`EncoderProcess.request_cut`) the episode is *cut*: the worker closes
and fsyncs the mp4 of the frames it has encoded so far (``<key>.mp4``, frames ``[0, c)``), tells
the writer ``c``, encodes the rest into ``<key>.b.mp4`` and writes every later ring frame into the
spill too before it releases the slot. So from ``c`` on every frame is on disk, and a saved
episode is durable as ``<key>.mp4`` (``c`` frames) plus its spill (frames from ``c``). At the end
the worker joins the two parts by packet copy (:func:`~.video.concat_segments`) into ``<key>.mp4``.
An episode that is never behind is never spilled and its mp4 is byte for byte the in-process
encoder's.

The worker works in the episode's directory through a directory fd, so the commit's rename of
that directory under it changes nothing. It answers ``("done", job, frames)`` once the mp4 is
closed and fsynced (or ``("error", job, text)``); ``("cut", job, c)`` once the first part is.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future
from multiprocessing import shared_memory
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, Final

import numpy as np

from hilrec.daemon import procs
from hilrec.daemon.dataset.video.encoder_worker import (
    HEADER_BYTES,
    HEADER_CUT_REQUEST,
    HEADER_FRAMES_ENCODED,
    HEADER_MUXED,
    HEADER_MUXED_JOB,
    HEADER_RELEASED,
    SHM_DIR,
    segment_path,
)
from hilrec.daemon.errors import VideoEncodingError

log = logging.getLogger(__name__)

DEFAULT_RING_BYTES: Final[int] = 64 * 1024 * 1024
# Overrides the ring's size (bytes): for tests and benchmarks that want the encoder behind.
RING_ENV: Final[str] = "HILREC_ENCODER_RING_BYTES"
START_TIMEOUT_S: Final[float] = 60.0


def _set_policy(threads: list[int], policy: int) -> None:
    for tid in threads:
        with contextlib.suppress(OSError):  # gone, or not permitted: it keeps its priority
            os.sched_setscheduler(tid, policy, os.sched_param(0))


def _reserved_segment(key: str, size: int) -> shared_memory.SharedMemory:
    """A new shared-memory segment of ``size`` bytes with every page reserved.

    ``SharedMemory`` only ftruncates: on a small /dev/shm (Docker's 64 MB) the first write to a
    page tmpfs cannot back is a SIGBUS that kills the daemon. Reserved now, a lack of room is an
    error the writer can answer (with the thread encoder) before any frame is at stake."""
    shm = shared_memory.SharedMemory(create=True, size=size)
    try:
        fd = os.open(segment_path(shm.name), os.O_RDWR | os.O_CLOEXEC)
        try:
            os.posix_fallocate(fd, 0, size)
        finally:
            os.close(fd)
    except OSError as exc:
        shm.close()
        with contextlib.suppress(FileNotFoundError):
            shm.unlink()
        try:
            stat = os.statvfs(SHM_DIR)
            free = f"{stat.f_bavail * stat.f_frsize / 1e6:.0f} MB free"
        except OSError:
            free = "free space unknown"
        raise VideoEncodingError(
            f"video '{key}': the encoder's shared-memory ring of {size / 1e6:.0f} MB cannot be "
            f"reserved in {SHM_DIR} ({free}): {exc}"
        ) from exc
    return shm


class EncoderProcess:
    """The parent's handle on one camera's worker process (see the module docstring)."""

    def __init__(
        self,
        key: str,
        *,
        fps: int,
        height: int,
        width: int,
        settings: Any,
        ring_bytes: int | None = None,
    ) -> None:
        if ring_bytes is None:
            ring_bytes = int(os.environ.get(RING_ENV) or DEFAULT_RING_BYTES)
        self.key = key
        self.fps = fps
        self.height = height
        self.width = width
        self.frame_bytes = height * width * 3
        self.slots = max(2, ring_bytes // self.frame_bytes)
        self._shm = _reserved_segment(key, HEADER_BYTES + self.slots * self.frame_bytes)
        self._header: np.ndarray[Any, Any] = np.ndarray(
            (HEADER_BYTES // 8,), dtype=np.int64, buffer=self._shm.buf
        )
        self._header[:] = 0
        self._header[HEADER_CUT_REQUEST] = -1
        self._header[HEADER_MUXED_JOB] = -1
        self._ring: np.ndarray[Any, Any] = np.ndarray(
            (self.slots, height, width, 3), dtype=np.uint8, buffer=self._shm.buf, offset=HEADER_BYTES
        )
        self._slots_used = 0
        self.frames_put = 0
        self._lost = 0
        self._closed = False
        self._futures: dict[int, Future[int]] = {}  # by job
        self._job_of: dict[int, int] = {}  # episode -> its current job
        self._next_job = 0
        self._lock = threading.Lock()
        self._cut_done = threading.Condition(self._lock)
        self._cuts: dict[int, int] = {}  # job -> the frame it was cut at
        self.error: str | None = None
        self.priority = "starting"
        try:
            self._process, self._conn = self._spawn(settings)
        except BaseException:
            self._release_segment()
            raise
        # The sender thread writes the socket, so put() never waits on the worker.
        self._commands: queue.SimpleQueue[tuple[Any, ...] | None] = queue.SimpleQueue()
        self._sender = threading.Thread(target=self._send_commands, name=f"encode-send-{key}", daemon=True)
        self._sender.start()
        self._reader = threading.Thread(target=self._read_events, name=f"encode-events-{key}", daemon=True)
        self._reader.start()

    def _spawn(self, settings: Any) -> tuple[subprocess.Popen[bytes], Connection]:
        # A fresh interpreter (not fork: the daemon has threads; not multiprocessing's spawn: it
        # re-runs the parent's main script), talking over a socket pair: small pickled tuples.
        ours, theirs = socket.socketpair()
        try:
            # SIGKILL when the writer dies: a reopened writer (or repair) finishes the encode
            # from the spill, and must not find this one still writing the same file.
            process = procs.start(
                # The segment's name is on the command line too, for tools that watch the progress
                # (bench_daemon reads frames encoded from the header); the worker reads the socket.
                [
                    sys.executable,
                    "-m",
                    "hilrec.daemon.dataset.video.encoder_process",
                    str(theirs.fileno()),
                    self._shm.name,
                ],
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL,
                close_fds=True,
                # Out of the terminal's process group (Ctrl-C is the writer's to handle), but in
                # the daemon's session, so that SCHED_IDLE yields to it (see the docstring).
                process_group=0,
                death_signal=signal.SIGKILL,
            )
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        conn = Connection(ours.detach())
        try:
            conn.send((self._shm.name, self.slots, self.height, self.width, self.fps, settings.to_json()))
        except BaseException:
            conn.close()
            process.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(5)
            raise
        return process, conn

    def _release_segment(self) -> None:
        # The numpy views hold exports of shm.buf: close() raises BufferError while they live.
        # The header's last values stay readable (the loop's status may be reading it now).
        self._header = self._header.copy()
        self._ring = np.zeros((0, self.height, self.width, 3), dtype=np.uint8)
        with contextlib.suppress(BufferError, OSError):
            self._shm.close()
        with contextlib.suppress(FileNotFoundError):
            self._shm.unlink()

    # --- the writer thread's side ------------------------------------------------------------------

    def begin(self, episode: int, path: Path, spill_path: Path, moved_to: Path | None = None) -> Future[int]:
        """Start episode ``episode``'s mp4 at ``path``; frames missing from the ring are read from
        ``spill_path``. The future resolves to the frames encoded once the file is closed and fsynced."""
        future: Future[int] = Future()
        with self._lock:
            # A job per begin: a discarded episode's index is given again to the next one, and
            # its late answer must not resolve the new one's future.
            self._next_job += 1
            job = self._next_job
            self._job_of[episode] = job
            self._futures[job] = future
        # moved_to: the directory the episode's is renamed to at its commit, which may come
        # before the worker reads this (it opens both files once, in whichever is there).
        self._commands.put(("begin", job, str(path), str(spill_path), str(moved_to or path.parent), episode))
        return future

    def offer(self, episode: int, frame_index: int, image: np.ndarray) -> int:
        """Put frame ``frame_index`` into the ring and send it; returns its ring sequence number
        (for :meth:`ring_frame`), or -1 when no slot is free or the worker is gone: then the
        caller writes it into the spill and calls :meth:`send_spilled`."""
        if self.error is not None or self._closed:
            return -1
        if self._slots_used - int(self._header[HEADER_RELEASED]) >= self.slots:
            return -1
        sequence = self._slots_used
        slot = sequence % self.slots
        self._ring[slot] = image
        self._slots_used += 1
        self.frames_put += 1
        self._commands.put(("frame", self._job_of[episode], frame_index, slot))
        return sequence

    def send_spilled(self, episode: int, frame_index: int) -> None:
        """Frame ``frame_index`` is in the spill (written by the caller): the worker reads it
        there. The first one of an episode cuts it (see the module docstring)."""
        self.frames_put += 1
        job = self._job_of[episode]
        if self._closed:  # the segment is released
            self._lost += 1
            return
        self._header[HEADER_CUT_REQUEST] = job
        if self.error is not None:
            self._lost += 1
            return
        self._commands.put(("frame", job, frame_index, -1))

    def ring_frame(self, sequence: int) -> np.ndarray | None:
        """The frame of ring sequence number ``sequence`` if its slot was not reused since."""
        if self._closed or sequence < 0 or sequence < self._slots_used - self.slots:
            return None
        return self._ring[sequence % self.slots]

    def request_cut(self, episode: int) -> None:
        """Ask the worker to cut ``episode`` before its next frame (see the module docstring)."""
        job = self._job_of.get(episode)
        if job is not None and not self._closed:
            self._header[HEADER_CUT_REQUEST] = job

    @contextlib.contextmanager
    def hurried(self) -> Iterator[None]:
        """The worker at normal priority meanwhile (every thread of it: the codec's too): a
        save waits on it, and at SCHED_IDLE a busy machine may give it no CPU at all. The
        loop, at real-time priority, still comes first."""
        threads = self._threads()
        _set_policy(threads, os.SCHED_OTHER)
        try:
            yield
        finally:
            _set_policy(self._threads(), os.SCHED_IDLE)

    def _threads(self) -> list[int]:
        try:
            return [int(tid) for tid in os.listdir(f"/proc/{self.pid}/task")]
        except OSError:
            return []

    def cut_of(self, episode: int, timeout: float = 0.0) -> int | None:
        """The frame the worker cut ``episode`` at, waiting up to ``timeout``; None if it has
        not (yet), or if the episode's mp4 is done or failed first."""
        deadline = time.monotonic() + timeout
        with self._cut_done:
            while True:
                job = self._job_of.get(episode)
                if job is None:
                    return None
                cut = self._cuts.get(job)
                future = self._futures.get(job)
                if cut is not None or future is None or future.done() or self.error is not None:
                    return cut
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._cut_done.wait(left)

    def end(self, episode: int, frames: int) -> None:
        self._commands.put(("end", self._job_of[episode], frames))

    def abort(self, episode: int) -> None:
        self._commands.put(("abort", self._job_of[episode]))

    def muxed_of(self, episode: int) -> int | None:
        """Frames of ``episode`` in its mp4 in the episode's directory (see the worker's
        HEADER_MUXED), or None when the worker's last frame was another episode's."""
        job = self._job_of.get(episode)
        if job is None or self._closed:
            return None
        before = int(self._header[HEADER_MUXED_JOB])
        muxed = int(self._header[HEADER_MUXED])
        if before != job or int(self._header[HEADER_MUXED_JOB]) != job:
            return None
        return muxed

    @property
    def frames_encoded(self) -> int:
        if self._closed or self.error is not None:
            return self.frames_put  # nothing more will be encoded here: the spill has the rest
        return int(self._header[HEADER_FRAMES_ENCODED])

    @property
    def backlog_frames(self) -> int:
        return self.frames_put - self.frames_encoded

    @property
    def free_slots(self) -> int:
        """Ring slots :meth:`offer` may fill now."""
        if self._closed:
            return 0
        return self.slots - (self._slots_used - int(self._header[HEADER_RELEASED]))

    @property
    def alive(self) -> bool:
        return self._process.poll() is None

    @property
    def pid(self) -> int:
        return self._process.pid

    def close(self, timeout: float = 30.0) -> None:
        """Stop the worker (after what is queued if it ends in ``timeout``, else killed)."""
        if self._closed:
            return
        self._closed = True
        self._commands.put(None)
        self._sender.join(timeout)
        # Killed after ``timeout``; one unkillable for now (stuck in the kernel) is left, so the
        # other cameras' workers are still closed.
        procs.stop(self._process, timeout, signum=None)
        self._reader.join(5)
        with self._lock:
            for future in self._futures.values():
                if not future.done():
                    future.set_exception(VideoEncodingError(f"video '{self.key}': encoder process stopped"))
            self._futures.clear()
        with contextlib.suppress(OSError):
            self._conn.close()
        self._release_segment()

    def _send_commands(self) -> None:
        while True:
            command = self._commands.get()
            try:
                self._conn.send(command)
            except (OSError, ValueError):
                return  # the worker is gone: the reader reports it
            if command is None:
                return

    def _read_events(self) -> None:
        while True:
            try:
                event = self._conn.recv()
            except (EOFError, OSError):
                event = None
            if event is None:
                if self.error is None and not self._closed:
                    self.error = f"worker process exited (code {self._process.poll()})"
                break
            kind = event[0]
            if kind == "ready":
                self.priority = event[1]
                continue
            if kind == "cut":
                with self._cut_done:
                    self._cuts[event[1]] = int(event[2])
                    self._cut_done.notify_all()
                continue
            if kind == "fatal":
                self.error = event[1]
                log.error("video '%s': encoder process failed: %s", self.key, event[1])
                break
            with self._lock:
                future = self._futures.pop(event[1], None)
                self._cut_done.notify_all()
            if future is None:
                continue
            if kind == "done":
                future.set_result(int(event[2]))
            else:
                future.set_exception(VideoEncodingError(f"video '{self.key}' (job {event[1]}): {event[2]}"))
        with self._lock:
            for future in self._futures.values():
                if not future.done():
                    future.set_exception(
                        VideoEncodingError(
                            f"video '{self.key}': encoder process ended ({self.error or 'exit'})"
                        )
                    )
            self._futures.clear()
            self._cut_done.notify_all()


if __name__ == "__main__":
    # The command line the parent starts (tools find the workers by it): the worker's code.
    from hilrec.daemon.dataset.video.encoder_worker import worker_main

    worker_main(int(sys.argv[1]))
