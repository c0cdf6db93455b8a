"""The writer thread: the loop hands frames over without waiting for the disk or the encoder.

Every call on the :class:`~hilrec.daemon.dataset.format.sink.FrameSink` happens on one thread, in the
order the loop asked for it, so the sink needs no locking and a save can never overtake the frames
it saves. The loop side never drops anything: :meth:`Recorder.add_frame` puts into a bounded queue
and, if the writer has fallen that far behind, waits (the tick is then recorded as late) up to
``stall_s`` before it raises :class:`WriterStalledError`. Saves, discards and the finalize return
futures so the control thread can answer at once and report the outcome later.

A frame the sink refuses, or a failed save, is kept as an error with the episode it belongs to
(``errors``) and published by the daemon; the episode is then discarded rather than saved short.
One refusal is different: :class:`TakeEndedError` (the video spill at its bound,
:class:`SpillFullError`, or the disk full, :class:`DiskFullError`) ends the take at that frame.
The frames before it are kept, every later one of the episode is refused too (a gap would be a
dropped frame), :meth:`Recorder.take_ended` says why for the session to raise a fault, and the
save keeps the frames the writer took, its sidecar arrays cut to match.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any, Final

import numpy as np

from hilrec.daemon.control.clock import SKEW_ARRAYS, TIMING_ARRAYS
from hilrec.daemon.control.faults import FaultKind
from hilrec.daemon.dataset import FrameSink, finishing
from hilrec.daemon.errors import DatasetStateError, DiskFullError, TakeEndedError, WriterStalledError

log = logging.getLogger(__name__)

# How often start() looks at what the opening writer thread is doing.
START_POLL_S: Final[float] = 0.2

# The sidecar arrays with one row per frame (see control/episode.py); the others (a sim
# episode's start state) are the episode's whatever its length.
PER_FRAME_ARRAYS: Final[frozenset[str]] = frozenset(
    {*TIMING_ARRAYS, *SKEW_ARRAYS, "frame_flags", "leader", "twin_state"}
)


class WriterOp(StrEnum):
    """What the loop and the control thread ask of the writer thread (named in its errors)."""

    FRAME = "frame"
    SAVE = "save"
    DISCARD = "discard"
    FINALIZE = "finalize"
    SIDECAR = "sidecar"
    EPISODE_SIDECAR = "episode_sidecar"
    STOP = "stop"


@dataclass
class _Op:
    kind: WriterOp
    frame: Mapping[str, Any] | None = None
    sidecar: Mapping[str, Any] | None = None
    arrays: Mapping[str, np.ndarray] | None = None
    future: Future[Any] | None = None
    episode_index: int | None = None


@dataclass
class RecorderStats:
    frames_written: int = 0
    episodes_saved: int = 0
    episodes_discarded: int = 0
    saving: int = 0  # saves queued or running
    finalized: bool = False
    last_saved_index: int | None = None
    errors: list[str] = field(default_factory=list)


class Recorder:
    """Owns a sink and the one thread that calls it. Lifecycle: start() ... close()."""

    def __init__(
        self,
        sink_factory: Callable[[], FrameSink],
        *,
        queue_frames: int,
        stall_s: float,
    ) -> None:
        self._sink_factory = sink_factory
        self._queue: queue.Queue[_Op] = queue.Queue(maxsize=queue_frames)
        self._stall_s = stall_s
        self._lock = threading.Lock()
        self._stats = RecorderStats()
        self._episode_error: str | None = None  # first refusal in the open episode
        self._episode_frames = 0  # frames of the open episode the sink took
        # (episode ordinal, fault kind, why) when the spill's bound or a full disk ended a take,
        # set on the writer thread.
        # Ordinals count the saves and discards before an episode, on the loop's side as they
        # are asked for and on the writer's as they are done: so the loop can tell its open take
        # from the one before, whose frames the writer may still be taking.
        self._take_ended: tuple[int, FaultKind, str] | None = None
        self._truncated_at: int | None = None
        self._closes_asked = 0
        self._closes_done = 0
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="hilrec-writer", daemon=True)
        self._sink: FrameSink | None = None
        self._start_error: BaseException | None = None
        self.initial_episodes = 0

    # --- lifecycle ---------------------------------------------------------------------------

    def start(self, timeout_s: float = 60.0) -> None:
        """Create the sink on the writer thread and wait until it is ready (or failed)."""
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        noted: str | None = None
        while not self._ready.wait(max(0.0, min(START_POLL_S, deadline - time.monotonic()))):
            doing = finishing(self._thread.ident)
            if doing is not None:
                # Video a crash left, encoded before the open returns: its length is not the
                # open's fault, so the timeout counts from when it is done.
                if doing != noted:
                    log.warning("dataset writer: %s before it opens", doing)
                    noted = doing
                deadline = time.monotonic() + timeout_s
            elif time.monotonic() >= deadline:
                after = f" (after {noted})" if noted is not None else ""
                raise DatasetStateError(f"dataset writer did not open within {timeout_s:.0f} s{after}")
        if self._start_error is not None:
            raise self._start_error

    def close(self, timeout_s: float) -> bool:
        """Stop the thread after everything queued so far; True if it ended in time."""
        if not self._thread.is_alive():
            return True
        self._put_control(_Op(WriterOp.STOP), timeout_s)
        self._thread.join(timeout_s)
        return not self._thread.is_alive()

    # --- loop side (never blocks while the writer keeps up) ------------------------------------

    def add_frame(self, frame: Mapping[str, Any]) -> None:
        if not self._thread.is_alive():
            raise WriterStalledError(f"dataset writer for {self._root()} is not running")
        try:
            self._queue.put(_Op(WriterOp.FRAME, frame=frame), timeout=self._stall_s)
        except queue.Full:
            raise WriterStalledError(
                f"dataset writer for {self._root()} took no frame for {self._stall_s:.1f} s "
                f"({self._queue.maxsize} frames queued)"
            ) from None

    def save(self, *, sidecar: Mapping[str, Any], arrays: Mapping[str, np.ndarray]) -> Future[int]:
        with self._lock:
            self._stats.saving += 1
        future = self._submit(_Op(WriterOp.SAVE, sidecar=sidecar, arrays=arrays))
        self._closes_asked += 1
        return future

    def discard(self) -> Future[None]:
        future: Future[None] = self._submit(_Op(WriterOp.DISCARD))
        self._closes_asked += 1
        return future

    def take_ended(self) -> tuple[FaultKind, str] | None:
        """Why the writer ended the open take (the spill's bound, a full disk), or None (loop
        thread)."""
        ended = self._take_ended
        if ended is None or ended[0] != self._closes_asked:
            return None
        return ended[1], ended[2]

    def finalize(self) -> Future[None]:
        return self._submit(_Op(WriterOp.FINALIZE))

    def update_dataset_sidecar(self, fields: Mapping[str, Any]) -> Future[None]:
        """Merge ``fields`` into hilrec/dataset.json, in order with everything else written."""
        return self._submit(_Op(WriterOp.SIDECAR, sidecar=fields))

    def update_episode_sidecar(self, episode_index: int, fields: Mapping[str, Any]) -> Future[None]:
        """Merge ``fields`` into a saved episode's ``hilrec/episodes/episode-NNNNNN.json``
        (atomically: a crash leaves the old file or the new one, never a torn one)."""
        return self._submit(_Op(WriterOp.EPISODE_SIDECAR, sidecar=fields, episode_index=episode_index))

    # --- views -------------------------------------------------------------------------------

    def status(self, root: object) -> dict[str, Any]:
        """The ``dataset`` section of the daemon's status."""
        stats = self.stats()
        return {
            "root": root,
            "episodes": self.initial_episodes + stats.episodes_saved,
            "saved_this_session": stats.episodes_saved,
            "discarded_this_session": stats.episodes_discarded,
            "saving": stats.saving,
            "last_saved_index": stats.last_saved_index,
            "finalized": stats.finalized,
            "writer_queue": self.queued,
            "writer_capacity": self.capacity,
            "errors": stats.errors,
            # Frames of the open take a crash now would keep (about a second behind it).
            "durable_frames": int(getattr(self._sink, "durable_frames", 0)),
            **self._backlog_status(),
        }

    def _backlog_status(self) -> dict[str, Any]:
        backlog = self.video_backlog_s()
        if backlog is None:
            return {}
        sink = self._sink
        return {
            "video_backlog_s": round(backlog, 3),
            "spill_bytes": int(getattr(sink, "spill_bytes", 0)),
            "spill_bytes_limit": int(getattr(sink, "spill_bytes_limit", 0)),
        }

    def spill_problem(self) -> str | None:
        """Why the sink's video backlog forbids a new take (see the writer's ``spill_problem``),
        or None; safe from any thread."""
        sink = self._sink
        ask = getattr(sink, "spill_problem", None)
        return ask() if ask is not None else None

    def space_problem(self) -> str | None:
        """Why the sink's disk cannot hold one more take (see the writer's ``space_problem``),
        or None; safe from any thread."""
        sink = self._sink
        ask = getattr(sink, "space_problem", None)
        return ask() if ask is not None else None

    def video_backlog_s(self) -> float | None:
        """Seconds of video waiting for the encoder processes; None when the sink cannot tell."""
        sink = self._sink
        ask = getattr(sink, "video_backlog_s", None)
        if ask is None or getattr(sink, "video_encoder", None) != "process":
            return None
        return float(ask())

    @property
    def queued(self) -> int:
        return self._queue.qsize()

    @property
    def capacity(self) -> int:
        return self._queue.maxsize

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def stats(self) -> RecorderStats:
        with self._lock:
            s = self._stats
            return RecorderStats(
                frames_written=s.frames_written,
                episodes_saved=s.episodes_saved,
                episodes_discarded=s.episodes_discarded,
                saving=s.saving,
                finalized=s.finalized,
                last_saved_index=s.last_saved_index,
                errors=list(s.errors[-10:]),
            )

    # --- the writer thread -------------------------------------------------------------------

    def _submit(self, op: _Op) -> Future[Any]:
        op.future = Future()
        self._put_control(op, self._stall_s)
        return op.future

    def _put_control(self, op: _Op, timeout_s: float) -> None:
        try:
            self._queue.put(op, timeout=timeout_s)
        except queue.Full:
            raise WriterStalledError(
                f"dataset writer for {self._root()} took no request for {timeout_s:.1f} s"
            ) from None

    def _root(self) -> str:
        return str(self._sink.root) if self._sink is not None else "<not open>"

    def _run(self) -> None:
        try:
            self._sink = self._sink_factory()
            self.initial_episodes = self._sink.num_episodes
        except BaseException as exc:  # noqa: BLE001 - handed to start(), which raises it on the caller's thread
            self._start_error = exc
            self._ready.set()
            return
        self._ready.set()
        while True:
            op = self._queue.get()
            if op.kind == WriterOp.STOP:
                return
            if op.kind == WriterOp.FRAME:
                self._write_frame(op)
                continue
            assert op.future is not None
            if not op.future.set_running_or_notify_cancel():
                continue
            try:
                op.future.set_result(self._apply(op))
            except Exception as exc:  # noqa: BLE001 - a full disk, a bug: reported via the future
                # and status; the thread lives on so saved episodes can still be finalized.
                self._record_error(f"{op.kind}: {type(exc).__name__}: {exc}")
                op.future.set_exception(exc)
            finally:
                if op.kind == WriterOp.SAVE:
                    with self._lock:
                        self._stats.saving -= 1

    def _write_frame(self, op: _Op) -> None:
        assert self._sink is not None and op.frame is not None
        if self._episode_error is not None or self._truncated_at is not None:
            return  # the episode is broken (its stop turns into a discard) or ended at the bound
        try:
            self._sink.add_frame(op.frame)
        except TakeEndedError as exc:
            self._truncated_at = self._episode_frames
            self._record_error(f"take ended at frame {self._episode_frames}: {exc}")
            kind = FaultKind.DISK_FULL if isinstance(exc, DiskFullError) else FaultKind.SPILL_FULL
            self._take_ended = (self._closes_done, kind, str(exc))
            return
        except Exception as exc:  # noqa: BLE001 - the episode is marked broken, never saved short
            self._episode_error = f"{type(exc).__name__}: {exc}"
            self._record_error(f"frame refused: {exc}")
            return
        self._episode_frames += 1
        with self._lock:
            self._stats.frames_written += 1

    def _apply(self, op: _Op) -> Any:
        sink = self._sink
        assert sink is not None
        if op.kind == WriterOp.SAVE:
            truncated, self._truncated_at, self._episode_frames = self._truncated_at, None, 0
            self._closes_done += 1
            if self._episode_error is not None:
                error, self._episode_error = self._episode_error, None
                sink.discard_episode()
                with self._lock:
                    self._stats.episodes_discarded += 1
                raise DatasetStateError(f"episode discarded instead of saved: {error}")
            sidecar, arrays = op.sidecar, op.arrays
            if truncated is not None:
                if truncated == 0:
                    sink.discard_episode()
                    with self._lock:
                        self._stats.episodes_discarded += 1
                    raise DatasetStateError(
                        "episode discarded: its first frame was refused "
                        f"({self._take_ended[2] if self._take_ended else 'spill full'})"
                    )
                kind = self._take_ended[1] if self._take_ended else FaultKind.SPILL_FULL
                sidecar, arrays = _cut(sidecar, arrays, truncated, kind)
            index = sink.save_episode(sidecar=sidecar, arrays=arrays)
            with self._lock:
                self._stats.episodes_saved += 1
                self._stats.last_saved_index = index
            return index
        if op.kind == WriterOp.DISCARD:
            self._episode_error = None
            self._truncated_at, self._episode_frames = None, 0
            self._closes_done += 1
            sink.discard_episode()
            with self._lock:
                self._stats.episodes_discarded += 1
            return None
        if op.kind == WriterOp.SIDECAR:
            from hilrec.daemon.dataset import update_dataset_sidecar

            update_dataset_sidecar(sink.root, dict(op.sidecar or {}))
            return None
        if op.kind == WriterOp.EPISODE_SIDECAR:
            assert op.episode_index is not None
            _merge_episode_sidecar(sink.root, op.episode_index, dict(op.sidecar or {}))
            return None
        if op.kind == WriterOp.FINALIZE:
            sink.finalize()
            with self._lock:
                self._stats.finalized = True
            return None
        raise DatasetStateError(f"unknown writer request {op.kind!r}")

    def _record_error(self, message: str) -> None:
        log.error("dataset writer: %s", message)
        with self._lock:
            self._stats.errors.append(message)
            del self._stats.errors[:-100]


def _cut(
    sidecar: Mapping[str, Any] | None, arrays: Mapping[str, np.ndarray] | None, frames: int, kind: FaultKind
) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """The sidecar of a take ended at ``frames`` by the spill's bound or a full disk: its
    per-frame arrays cut to the frames the writer took, and the count and the reason said."""
    out = dict(sidecar or {})
    recorded = int(out.get("frames", frames))
    cut = {
        key: value[:frames] if key in PER_FRAME_ARRAYS and len(value) == recorded else value
        for key, value in (arrays or {}).items()
    }
    out.update(frames=frames, ticks_recorded=recorded)
    out["ended_at_spill_bound" if kind == FaultKind.SPILL_FULL else "ended_at_full_disk"] = True
    return out, cut


def _merge_episode_sidecar(root: Path, episode_index: int, fields: dict[str, Any]) -> None:
    # Not write_episode_sidecar: that rewrites the arrays' flag too. This keeps every other key.
    from hilrec.daemon.atomic import atomic_write_bytes, json_bytes, read_json
    from hilrec.daemon.dataset import episode_json_path

    path = episode_json_path(root, episode_index)
    payload = read_json(path, what="episode sidecar")
    if not isinstance(payload, dict):
        raise DatasetStateError(f"{path}: not a JSON object")
    payload.update(fields)
    atomic_write_bytes(path, json_bytes(payload))
