"""Video encoding in a worker process per camera, at the lowest CPU priority, fed through shared memory.

The encoder must never take the CPU the control loop needs. Each camera gets one worker process
for the writer's lifetime (spawned, not forked: the daemon is multi-threaded), which puts itself
under ``SCHED_IDLE`` (else ``nice 19``) before it imports the codec, so it and every thread the
codec starts only get CPU nobody else wants.

Frames are not pickled. The parent owns a :class:`multiprocessing.shared_memory.SharedMemory`
ring of ``slots`` fixed-size slots (one ``H x W x 3`` frame each) plus a small header the worker
writes (slots released, frames encoded). :meth:`EncoderProcess.put` copies a frame into the next
free slot and sends ``(episode, frame_index, slot)`` on a queue (a feeder thread writes the pipe,
so ``put`` never waits on the worker). When the ring is full the frame is not kept in RAM: the
worker reads it from the episode's spill file (:mod:`.spill`; the parent appended it there) and
the message says ``slot = -1``. Slots are used and released in FIFO order, so a slot is free when
``slots_used - slots_released < slots``.

The worker writes each episode's mp4 to the path it is given, fsyncs it, and answers
``("done", episode, frames)`` (or ``("error", episode, text)``) on its event queue; the parent's
event thread resolves that episode's future. The bytes are those of the in-process encoder: both
run :class:`~.video.StreamEncoder` with the same settings.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import socket
import subprocess
import sys
import threading
from concurrent.futures import Future
from multiprocessing import shared_memory
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, Final

import numpy as np

from hilrec.daemon.errors import VideoEncodingError

log = logging.getLogger(__name__)

HEADER_BYTES: Final[int] = 64  # int64 [slots released, frames encoded, ...]
HEADER_FRAMES_ENCODED: Final[int] = 1  # the int64 index of the encoded-frames counter
DEFAULT_RING_BYTES: Final[int] = 64 * 1024 * 1024
START_TIMEOUT_S: Final[float] = 60.0


def lowest_priority() -> str:
    """Put the calling process (all its future threads) at the lowest CPU priority; say which."""
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
        return "SCHED_IDLE"
    except (OSError, AttributeError):
        pass
    try:
        os.nice(19 - os.nice(0))
    except OSError as exc:
        return f"normal ({exc})"
    return "nice 19"


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
        ring_bytes: int = DEFAULT_RING_BYTES,
    ) -> None:
        self.key = key
        self.fps = fps
        self.height = height
        self.width = width
        self.frame_bytes = height * width * 3
        self.slots = max(2, ring_bytes // self.frame_bytes)
        self._shm = shared_memory.SharedMemory(create=True, size=HEADER_BYTES + self.slots * self.frame_bytes)
        self._header: np.ndarray[Any, Any] = np.ndarray(
            (HEADER_BYTES // 8,), dtype=np.int64, buffer=self._shm.buf
        )
        self._header[:] = 0
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
        self.error: str | None = None
        self.priority = "starting"
        # A fresh interpreter (not fork: the daemon has threads; not multiprocessing's spawn: it
        # re-runs the parent's main script), talking over a socket pair: small pickled tuples.
        ours, theirs = socket.socketpair()
        self._process = subprocess.Popen(
            # The segment's name is on the command line too, for tools that watch the progress
            # (bench_daemon reads frames encoded from the header); the worker reads the socket.
            [
                sys.executable,
                "-m",
                "hilrec.daemon.dataset.encoder_process",
                str(theirs.fileno()),
                self._shm.name,
            ],
            pass_fds=(theirs.fileno(),),
            stdin=subprocess.DEVNULL,
            close_fds=True,
        )
        theirs.close()
        self._conn = Connection(ours.detach())
        self._conn.send((self._shm.name, self.slots, height, width, fps, settings.to_json()))
        # The sender thread writes the socket, so put() never waits on the worker.
        self._commands: queue.SimpleQueue[tuple[Any, ...] | None] = queue.SimpleQueue()
        self._sender = threading.Thread(target=self._send_commands, name=f"encode-send-{key}", daemon=True)
        self._sender.start()
        self._reader = threading.Thread(target=self._read_events, name=f"encode-events-{key}", daemon=True)
        self._reader.start()

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
        self._commands.put(("begin", job, str(path), str(spill_path), str(moved_to or path.parent)))
        return future

    def put(self, episode: int, frame_index: int, image: np.ndarray, *, spilled: bool = True) -> bool:
        """Hand frame ``frame_index`` over (its copy in the spill is already written). True when
        it went through the ring, False when the worker will read it from the spill."""
        if not spilled and (
            self.error is not None or self._closed or self._slots_used - int(self._header[0]) >= self.slots
        ):
            return False  # not in the spill and no slot: the caller must not lose it silently
        self.frames_put += 1
        if self.error is not None or self._closed:
            # The worker is gone: the frame is in the spill, and the writer encodes the episode
            # from there (spill_problem() refuses the next take meanwhile).
            self._lost += 1
            return False
        slot = -1
        if self._slots_used - int(self._header[0]) < self.slots:
            slot = self._slots_used % self.slots
            self._ring[slot] = image
            self._slots_used += 1
        self._commands.put(("frame", self._job_of[episode], frame_index, slot))
        return slot >= 0

    def end(self, episode: int, frames: int) -> None:
        self._commands.put(("end", self._job_of[episode], frames))

    def abort(self, episode: int) -> None:
        self._commands.put(("abort", self._job_of[episode]))

    @property
    def frames_encoded(self) -> int:
        if self._closed or self.error is not None:
            return self.frames_put  # nothing more will be encoded here: the spill has the rest
        return int(self._header[1])

    @property
    def backlog_frames(self) -> int:
        return self.frames_put - self.frames_encoded

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
        try:
            self._process.wait(timeout)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait(5)
        self._reader.join(5)
        with self._lock:
            for future in self._futures.values():
                if not future.done():
                    future.set_exception(VideoEncodingError(f"video '{self.key}': encoder process stopped"))
            self._futures.clear()
        with contextlib.suppress(OSError):
            self._conn.close()
        with contextlib.suppress(Exception):
            self._shm.close()
            self._shm.unlink()

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
            if kind == "fatal":
                self.error = event[1]
                log.error("video '%s': encoder process failed: %s", self.key, event[1])
                break
            with self._lock:
                future = self._futures.pop(event[1], None)
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


# --- the worker process ----------------------------------------------------------------------------


def worker_main(fd: int) -> None:
    """The worker process: ``python -m hilrec.daemon.dataset.encoder_process FD``."""
    _die_with_parent()
    priority = lowest_priority()
    conn = Connection(fd)
    try:
        shm_name, slots, height, width, fps, settings_json = conn.recv()
        _serve(shm_name, slots, height, width, fps, settings_json, conn, priority)
    except EOFError:
        pass  # the writer is gone: what is unfinished stays in its spill
    except BaseException as exc:  # noqa: BLE001 - told to the parent, which raises it
        with contextlib.suppress(OSError):
            conn.send(("fatal", f"{type(exc).__name__}: {exc}"))
    finally:
        with contextlib.suppress(OSError):
            conn.send(None)
        conn.close()


def _serve(
    shm_name: str,
    slots: int,
    height: int,
    width: int,
    fps: int,
    settings_json: dict[str, Any],
    conn: Connection,
    priority: str,
) -> None:
    from hilrec.daemon.dataset.video import StreamEncoder, VideoSettings

    settings = VideoSettings.from_json(settings_json)
    shm = shared_memory.SharedMemory(name=shm_name)
    # The parent created (and unlinks) the segment; this process must not track it too.
    with contextlib.suppress(Exception):
        from multiprocessing import resource_tracker

        resource_tracker.unregister(shm._name, "shared_memory")  # type: ignore[attr-defined]
    header: np.ndarray[Any, Any] = np.ndarray((HEADER_BYTES // 8,), dtype=np.int64, buffer=shm.buf)
    ring: np.ndarray[Any, Any] = np.ndarray(
        (slots, height, width, 3), dtype=np.uint8, buffer=shm.buf, offset=HEADER_BYTES
    )
    frame_bytes = height * width * 3
    events = _Events(conn)
    events.put(("ready", priority))
    current: dict[int, tuple[StreamEncoder | None, Any, str | None]] = {}
    try:
        while True:
            command = conn.recv()
            if command is None:
                break
            kind, episode = command[0], command[1]
            if kind == "begin":
                try:
                    encoder, spill_file = _open_job(command, fps, height, width, settings)
                    current[episode] = (encoder, spill_file, None)
                except Exception as exc:  # noqa: BLE001 - the episode fails, the worker goes on
                    current[episode] = (None, None, f"{type(exc).__name__}: {exc}")
            elif kind == "frame":
                frame_index, slot = command[2], command[3]
                encoder, spill, error = current.get(episode, (None, None, "not begun"))
                try:
                    if slot >= 0:
                        image = ring[slot]
                    elif spill is not None:
                        data = os.pread(spill.fileno(), frame_bytes, frame_index * frame_bytes)
                        if len(data) != frame_bytes:
                            raise VideoEncodingError(f"frame {frame_index} is not in the spill")
                        image = np.frombuffer(data, dtype=np.uint8).reshape(height, width, 3)
                    else:
                        raise VideoEncodingError("no spill")
                    if encoder is not None and error is None:
                        encoder.encode(image)
                except Exception as exc:  # noqa: BLE001
                    if encoder is not None:
                        encoder.abort()
                    current[episode] = (None, spill, f"{type(exc).__name__}: {exc}")
                finally:
                    if slot >= 0:
                        header[0] += 1  # from_ndarray copied it: the slot is free
                    header[1] += 1
            elif kind == "end":
                encoder, spill, error = current.pop(episode, (None, None, "not begun"))
                if spill is not None:
                    spill.close()
                if error is None and encoder is not None:
                    try:
                        frames = encoder.close()
                        if frames != command[2]:
                            raise VideoEncodingError(f"encoded {frames} frames of {command[2]}")
                        events.put(("done", episode, frames))
                        continue
                    except Exception as exc:  # noqa: BLE001
                        error = f"{type(exc).__name__}: {exc}"
                events.put(("error", episode, error))
            elif kind == "abort":
                encoder, spill, _error = current.pop(episode, (None, None, None))
                if spill is not None:
                    spill.close()
                if encoder is not None:
                    encoder.abort()
                    Path(encoder.path).unlink(missing_ok=True)
                events.put(("error", episode, "aborted"))
    finally:
        for encoder, _spill, _error in current.values():
            if encoder is not None:
                encoder.abort()
        del header, ring
        shm.close()


def _open_job(command: tuple[Any, ...], fps: int, height: int, width: int, settings: Any) -> tuple[Any, Any]:
    """The mp4 encoder and the spill of a ``begin``, in the open directory or, if the commit
    renamed it already, in the committed one (tried in turn: the rename can come in between)."""
    from hilrec.daemon.dataset.video import StreamEncoder

    path, spill, moved = Path(command[2]), Path(command[3]), Path(command[4])
    last: Exception | None = None
    for directory in (path.parent, moved, path.parent, moved):
        try:
            spill_file = open(directory / spill.name, "rb", buffering=0)  # noqa: SIM115 - kept open
        except FileNotFoundError as exc:
            last = exc
            continue
        try:
            out = open(directory / path.name, "w+b")  # noqa: SIM115 - the encoder closes it
        except FileNotFoundError as exc:
            spill_file.close()
            last = exc
            continue
        try:
            encoder = StreamEncoder(
                directory / path.name,
                file=out,
                fps=fps,
                height=height,
                width=width,
                settings=settings,
                make_dirs=False,
            )
        except Exception as exc:  # noqa: BLE001 - tried in the other directory
            spill_file.close()
            last = exc
            continue
        return encoder, spill_file
    raise VideoEncodingError(f"{path}: neither it nor {moved} can be opened: {last}")


def _die_with_parent() -> None:
    """SIGKILL this worker when the writer dies: a reopened writer (or repair) finishes the
    encode from the spill, and must not find this one still writing the same file."""
    parent = os.getppid()
    with contextlib.suppress(Exception):
        import ctypes
        import signal

        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
    if os.getppid() != parent:
        os._exit(0)


class _Events:
    def __init__(self, conn: Connection) -> None:
        self._conn = conn

    def put(self, event: tuple[Any, ...]) -> None:
        self._conn.send(event)


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


if __name__ == "__main__":
    worker_main(int(sys.argv[1]))
