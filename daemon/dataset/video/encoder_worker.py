"""The encoder worker process: one camera's episodes from the writer's shared-memory ring to mp4s.

Started by :class:`~.encoder_process.EncoderProcess` (``python -m
hilrec.daemon.dataset.video.encoder_process FD SEGMENT``), which this module's :func:`worker_main`
serves: commands arrive on the socket ``FD`` (``begin``, ``frame``, ``end``, ``abort``), frames in
the ring of the shared-memory segment, and events go back on the socket (``ready``, ``cut``,
``done``, ``error``, ``fatal``). See :mod:`.encoder_process` for the protocol and for when an
episode is cut and teed into its spill.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import signal
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, Final

import numpy as np

from hilrec.daemon.atomic import fsync_file
from hilrec.daemon.dataset.video.codec_threads import thread_ids
from hilrec.daemon.dataset.video.spill import ENCODE_PREFIX, pwrite_all
from hilrec.daemon.errors import VideoEncodingError

HEADER_BYTES: Final[int] = 64  # int64 [slots released, frames encoded, cut request, ...]
HEADER_RELEASED: Final[int] = 0  # written by the worker
HEADER_FRAMES_ENCODED: Final[int] = 1  # written by the worker
HEADER_CUT_REQUEST: Final[int] = 2  # written by the writer: the job to cut now
# Written by the worker after each frame: a job and the frames in its mp4 in the episode's
# directory (fragmented: readable to there once fsynced; after a cut, the closed first part).
HEADER_MUXED_JOB: Final[int] = 3
HEADER_MUXED: Final[int] = 4
# Starts the error of a job whose spill lacks a frame from its cut on: its take cannot be saved.
SPILL_HOLES: Final[str] = "frames missing from the spill"
SHM_DIR: Final[str] = "/dev/shm"  # where Linux's shm_open puts the segments


def segment_path(name: str) -> str:
    """The file of shared-memory segment ``name`` (as ``SharedMemory.name`` spells it)."""
    return f"{SHM_DIR}/{name.lstrip('/')}"


def attach_segment(name: str) -> mmap.mmap:
    """The parent's shared-memory segment ``name``, mapped here.

    Not through ``SharedMemory``: before Python 3.13 it registers a segment it attaches with a
    resource tracker, which started one more interpreter beside every worker, only for the
    worker to unregister it (the parent created the segment and is the one that unlinks it)."""
    fd = os.open(segment_path(name), os.O_RDWR | os.O_CLOEXEC)
    try:
        return mmap.mmap(fd, 0)
    finally:
        os.close(fd)


def lowest_priority() -> str:
    """Put this process at the lowest CPU priority; say which.

    Every thread of it, not only the caller: a policy belongs to a thread, and imports have
    already started some (numpy's pool), which stayed SCHED_OTHER beside the idle encoder."""
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except (OSError, AttributeError):
        pass
    else:
        for tid in thread_ids():  # none without /proc: the threads of imports stay as they are
            with contextlib.suppress(OSError):  # a thread that has just ended
                os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))
        return "SCHED_IDLE"
    try:
        os.nice(19 - os.nice(0))
    except OSError as exc:
        return f"normal ({exc})"
    return "nice 19"


def worker_main(fd: int) -> None:
    """The worker process: ``python -m hilrec.daemon.dataset.video.encoder_process FD``."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
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


class _Job:
    """One episode of one camera, in the worker: its directory, spill and encoder(s)."""

    def __init__(self, command: tuple[Any, ...], fps: int, height: int, width: int, settings: Any) -> None:
        path, spill, moved, index = Path(command[2]), Path(command[3]), Path(command[4]), int(command[5])
        self.name = path.name
        self.spill_name = spill.name
        # Part b and the join are written beside the episode's directory, in the journal, so the
        # commit (which fsyncs every file in the directory) never sees a file come or go; the
        # join replaces <key>.mp4 in one rename. A crash leaves them as stray .encode-* files.
        stem = path.name[: -len(path.suffix)] if path.suffix else path.name
        self.part_b = f"{ENCODE_PREFIX}{index:06d}-{stem}.b.mp4"
        self.joined = f"{ENCODE_PREFIX}{index:06d}-{stem}.w.mp4"
        self.fps, self.height, self.width, self.settings = fps, height, width, settings
        self.frame_bytes = height * width * 3
        self.dir_fd = _open_dir(path.parent, moved)
        self.journal_fd = -1
        self.spill_fd: int | None = None
        self.cut: int | None = None
        self.frames = 0  # encoded into the current part
        self.encoder: Any = None
        # Why the encode failed after the cut (the spill still gets every frame), or None.
        self.error: str | None = None
        try:
            self.journal_fd = os.open("..", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=self.dir_fd)
            self.spill_fd = os.open(self.spill_name, os.O_RDWR | os.O_CLOEXEC, dir_fd=self.dir_fd)
            self.encoder = self._encoder(self.here(self.name))
        except BaseException:
            self.close_files()
            raise

    def here(self, name: str) -> Path:
        # The directory fd follows the commit's rename: /proc names the directory wherever it is.
        return Path(f"/proc/self/fd/{self.dir_fd}") / name

    def beside(self, name: str) -> Path:
        return Path(f"/proc/self/fd/{self.journal_fd}") / name

    def _encoder(self, path: Path) -> Any:
        from hilrec.daemon.dataset.video.codec import StreamEncoder

        # Unbuffered: each fragment goes to the file at once, for the writer's fsync to find.
        out = open(path, "w+b", buffering=0)  # noqa: SIM115 - the encoder closes it
        try:
            return StreamEncoder(
                path,
                file=out,
                fps=self.fps,
                height=self.height,
                width=self.width,
                settings=self.settings,
                make_dirs=False,
                fragmented=True,
            )
        except BaseException:
            out.close()
            raise

    def cut_now(self) -> int:
        """Close the part encoded so far (durable) and go on into part b, teeing (see the module
        docstring). A cut before the first frame leaves ``<key>.mp4`` empty until the join
        replaces it: nothing in the episode's directory is deleted under the commit."""
        cut = self.frames
        if cut > 0:
            self.encoder.close()
        else:
            self.encoder.abort()
        self.cut = cut
        self.encoder = self._encoder(self.beside(self.part_b))
        return cut

    def tee(self, frame_index: int, image: np.ndarray) -> None:
        """Write a ring frame into the spill: from the cut on every frame is on disk before its
        slot is released (a job that failed after its cut goes on teeing until its end)."""
        if self.spill_fd is None:
            raise VideoEncodingError("no spill")
        pwrite_all(self.spill_fd, image, frame_index * self.frame_bytes)

    def encode(self, image: np.ndarray) -> None:
        self.encoder.encode(image)
        self.frames += 1

    @property
    def muxed_here(self) -> int:
        """Frames in ``<key>.mp4`` in the episode's directory (see HEADER_MUXED)."""
        if self.cut is not None:
            return self.cut
        return int(self.encoder.in_file) if self.encoder is not None else 0

    def read_spilled(self, frame_index: int) -> np.ndarray:
        if self.spill_fd is None:
            raise VideoEncodingError("no spill")
        data = os.pread(self.spill_fd, self.frame_bytes, frame_index * self.frame_bytes)
        if len(data) != self.frame_bytes:
            raise VideoEncodingError(f"frame {frame_index} is not in the spill")
        return np.frombuffer(data, dtype=np.uint8).reshape(self.height, self.width, 3)

    def finish(self) -> int:
        """Close the mp4 (joining the parts if it was cut), fsynced; the frames it holds."""
        from hilrec.daemon.dataset.video.codec import Segment, concat_segments

        if self.cut is None:
            return int(self.encoder.close())
        frames_b = int(self.encoder.close())
        self.encoder = None
        if self.cut > 0:
            concat_segments(
                self.beside(self.joined),
                [Segment(self.here(self.name)), Segment(self.beside(self.part_b))],
                fps=self.fps,
            )
            fsync_file(self.beside(self.joined))
            os.replace(self.joined, self.name, src_dir_fd=self.journal_fd, dst_dir_fd=self.dir_fd)
            os.unlink(self.part_b, dir_fd=self.journal_fd)
        else:
            os.replace(self.part_b, self.name, src_dir_fd=self.journal_fd, dst_dir_fd=self.dir_fd)
        return self.cut + frames_b

    def abort(self) -> None:
        # <key>.mp4 stays: the writer deletes the episode's directory or encodes it from its
        # spill, and a file vanishing under a commit would fail it.
        if self.encoder is not None:
            self.encoder.abort()
            self.encoder = None
        for name in (self.part_b, self.joined):
            with contextlib.suppress(OSError):
                os.unlink(name, dir_fd=self.journal_fd)

    def close_files(self) -> None:
        if self.spill_fd is not None:
            os.close(self.spill_fd)
            self.spill_fd = None
        for fd in (self.dir_fd, self.journal_fd):
            if fd >= 0:
                os.close(fd)
        self.dir_fd = self.journal_fd = -1


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
    from hilrec.daemon.dataset.video.codec import VideoSettings

    settings = VideoSettings.from_json(settings_json)
    shm = attach_segment(shm_name)
    header: np.ndarray[Any, Any] = np.ndarray((HEADER_BYTES // 8,), dtype=np.int64, buffer=shm)
    ring: np.ndarray[Any, Any] = np.ndarray(
        (slots, height, width, 3), dtype=np.uint8, buffer=shm, offset=HEADER_BYTES
    )
    events = _Events(conn)
    events.put(("ready", priority))
    jobs: dict[int, _Job] = {}
    failed: dict[int, str] = {}
    try:
        while True:
            command = conn.recv()
            if command is None:
                break
            kind, number = command[0], command[1]
            if kind == "begin":
                try:
                    jobs[number] = _Job(command, fps, height, width, settings)
                except Exception as exc:  # noqa: BLE001 - the episode fails, the worker goes on
                    failed[number] = f"{type(exc).__name__}: {exc}"
            elif kind == "frame":
                _frame(command, jobs, failed, header, ring, events)
            elif kind == "end":
                _end(command, jobs, failed, events)
            elif kind == "abort":
                job = jobs.pop(number, None)
                failed.pop(number, None)
                if job is not None:
                    job.abort()
                    job.close_files()
                events.put(("error", number, "aborted"))
    finally:
        for job in jobs.values():
            if job.encoder is not None:
                job.encoder.abort()
        del header, ring
        shm.close()


def _frame(
    command: tuple[Any, ...],
    jobs: dict[int, _Job],
    failed: dict[int, str],
    header: np.ndarray[Any, Any],
    ring: np.ndarray[Any, Any],
    events: _Events,
) -> None:
    """Encode (and tee into the spill, once cut) one frame, from its ring slot or the spill; a
    failure fails that episode only, and the slot is released whatever happens."""
    number, frame_index, slot = command[1], command[2], command[3]
    job = jobs.get(number)
    teeing = False
    try:
        if job is None:
            raise VideoEncodingError(failed.get(number, "not begun"))
        cut_asked = slot < 0 or int(header[HEADER_CUT_REQUEST]) == number
        if job.error is None and job.cut is None and cut_asked:
            events.put(("cut", number, job.cut_now()))
        if slot >= 0 and job.cut is not None:
            teeing = True
            job.tee(frame_index, ring[slot])
            teeing = False
        if job.error is None:
            job.encode(ring[slot] if slot >= 0 else job.read_spilled(frame_index))
            header[HEADER_MUXED_JOB] = number
            header[HEADER_MUXED] = job.muxed_here
    except Exception as exc:  # noqa: BLE001
        text = f"{type(exc).__name__}: {exc}"
        if job is not None:
            job.abort()
            if job.cut is not None and not teeing:
                job.error = text  # the spill must still get every later frame
            else:
                job.close_files()
                jobs.pop(number, None)
        if teeing:
            failed[number] = f"{SPILL_HOLES} from frame {frame_index} on ({text})"
        else:
            failed.setdefault(number, text)
    finally:
        if slot >= 0:
            header[HEADER_RELEASED] += 1  # encoded (and teed): the slot is free
        header[HEADER_FRAMES_ENCODED] += 1


def _end(command: tuple[Any, ...], jobs: dict[int, _Job], failed: dict[int, str], events: _Events) -> None:
    number = command[1]
    job = jobs.pop(number, None)
    if job is None or job.error is not None:
        if job is not None:
            job.close_files()
        events.put(("error", number, failed.pop(number, "not begun")))
        return
    try:
        frames = job.finish()
        if frames != command[2]:
            raise VideoEncodingError(f"encoded {frames} frames of {command[2]}")
        events.put(("done", number, frames))
    except Exception as exc:  # noqa: BLE001
        job.abort()
        events.put(("error", number, f"{type(exc).__name__}: {exc}"))
    finally:
        job.close_files()


def _open_dir(path: Path, moved: Path) -> int:
    """A directory fd on the episode's open directory or, if the commit renamed it already, the
    committed one (tried in turn: the rename can come in between)."""
    last: OSError | None = None
    for directory in (path, moved, path, moved):
        try:
            return os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except FileNotFoundError as exc:
            last = exc
    raise VideoEncodingError(f"{path}: neither it nor {moved} can be opened: {last}")


class _Events:
    def __init__(self, conn: Connection) -> None:
        self._conn = conn

    def put(self, event: tuple[Any, ...]) -> None:
        self._conn.send(event)
