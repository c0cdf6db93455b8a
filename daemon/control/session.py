"""The recording session: the episode state machine, its faults, and what goes beside each episode.

States: ``idle`` -> (start_episode) -> ``recording`` -> (stop_episode | discard_episode | a device
fault) -> ``idle`` ... -> (finalize) -> ``finalized``.

Threads: the control thread *submits* requests and waits (bounded) on a future; the loop thread
*applies* them at the edge of a tick (:meth:`Session.apply_pending`), so an episode starts and
ends on a whole frame and the twin is reset on the thread that steps it. ``status`` needs no loop:
it reads a snapshot. Saves run on the writer thread; a stop is answered when the episode is closed
and handed over, and the save's outcome arrives as an ``episode_saved`` event and in status.

Faults that end an episode (a port gone, a camera stalled, the writer stalled, the loop died) save
it, or discard it when ``faults.on_device_lost = "discard"``; the fault stays in status until the
device works again (:mod:`hilrec.daemon.control.faults`).

The video backlog (encoder processes behind, frames in the spill) is the writer's: a take is not
started while ``writer.spill_problem()`` says the spill could not hold it (refused, naming the
bound ``spill_bytes_limit``), and a take whose frame met the bound ends there with a
``spill_full`` fault and is saved with the frames before it (whatever ``on_device_lost`` says:
nothing is lost by keeping them). The disk likewise: a take is not started while
``writer.space_problem()`` says the disk cannot hold one, and a take the disk fills under ends
with a ``disk_full`` fault and is saved into the room the writer held back for it. Either fault
clears once a take may start again.

Locking: ``_lock`` guards the state, the open episode and the last episode's result, which the
control thread reads for status while the loop thread changes them.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import numpy as np

from hilrec.daemon.control.episode import EpisodeBuffer
from hilrec.daemon.control.faults import Fault, FaultKind, FaultRegistry
from hilrec.daemon.control.recorder import Recorder
from hilrec.daemon.control.rig import EpisodeHooks, NoHooks
from hilrec.daemon.errors import HilrecError, RequestRefusedError, WriterStalledError
from hilrec.daemon.wire.protocol import CODE_BAD_STATE, CODE_FAULT, Request

log = logging.getLogger(__name__)


class SessionState(StrEnum):
    """The values are what status reports as ``state``."""

    IDLE = "idle"
    RECORDING = "recording"
    FINALIZED = "finalized"


def _refused(message: str, code: str = CODE_BAD_STATE) -> RequestRefusedError:
    """A well-formed request that does not fit the session's state."""
    return RequestRefusedError(message, code)


@dataclass
class _Pending:
    request: Request
    future: Future[dict[str, Any]]
    prepared: Any = None


class Session:
    def __init__(
        self,
        *,
        recorder: Recorder,
        period_s: float,
        on_device_lost: str,
        context: Mapping[str, Any],
        publish_event: Callable[..., None],
        on_saved: Callable[[int, int, float], None] | None = None,
    ) -> None:
        self._recorder = recorder
        self.hooks: EpisodeHooks = NoHooks()  # the rig's, set once the loop thread has built it
        self._period_s = period_s
        self._on_device_lost = on_device_lost
        self._context = dict(context)
        self._publish_event = publish_event
        # (episode_index, frames, when its take ended, monotonic), on the writer thread once the
        # episode is durable: the daemon's verdict worker starts from there.
        self._on_saved_hook = on_saved
        self._pending: queue.SimpleQueue[_Pending] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._state = SessionState.IDLE
        self._episode: EpisodeBuffer | None = None
        self.faults = FaultRegistry()
        self._saves_queued = 0
        self._last_episode: dict[str, Any] | None = None

    def tick_fields(self) -> dict[str, Any]:
        """The optional tick fields this session knows (:data:`~.protocol.TICK_OPTIONAL_FIELDS`)."""
        backlog = self._recorder.video_backlog_s()
        return {} if backlog is None else {"video_backlog_s": round(backlog, 3)}

    # --- control thread ----------------------------------------------------------------------

    def submit(self, request: Request) -> Future[dict[str, Any]]:
        """Queue a transition for the loop. A start is prepared here first (it may be slow)."""
        prepared = None
        if request.cmd == "start_episode":
            if self._episode is not None:  # refuse early rather than plan for nothing
                raise _refused(
                    f"episode {self._episode.index} is already recording; stop or discard it first"
                )
            prepared = self.hooks.prepare(request.args.get("seed"))
        future: Future[dict[str, Any]] = Future()
        self._pending.put(_Pending(request, future, prepared))
        return future

    @property
    def state(self) -> SessionState:
        with self._lock:
            return self._state

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            episode = self._episode.summary() if self._episode is not None else None
            state = self._state
            last = dict(self._last_episode) if self._last_episode else None
        return {
            "state": str(state),
            "episode": episode,
            "last_episode": last,
            "faults": self.faults.to_list(),
            "dataset": self._recorder.status(self._context.get("root")),
        }

    # --- loop thread -------------------------------------------------------------------------

    @property
    def recording(self) -> bool:
        return self._episode is not None

    @property
    def frame_index(self) -> int | None:
        return self._episode.frames if self._episode is not None else None

    @property
    def episode_index(self) -> int | None:
        return self._episode.index if self._episode is not None else None

    @property
    def task(self) -> str:
        return self._episode.task if self._episode is not None else ""

    def apply_pending(self) -> None:
        """Run the requests submitted since the last tick, in order (and end a take the
        spill's bound stopped)."""
        if self._episode is not None:
            ended = self._recorder.take_ended()
            if ended is not None:
                kind, why = ended
                message = f"{why}; the daemon ended the take there and saves it"
                self.raise_fault(Fault(kind=kind, device="writer", message=message, ends_episode=True))
        while True:
            try:
                pending = self._pending.get_nowait()
            except queue.Empty:
                return
            if not pending.future.set_running_or_notify_cancel():
                continue  # the control thread gave up waiting; do not act on it late
            try:
                pending.future.set_result(self._apply(pending.request, pending.prepared))
            except (HilrecError, OSError) as exc:
                pending.future.set_exception(exc)
            except BaseException as exc:
                pending.future.set_exception(exc)  # answer the request, then let the loop stop
                raise

    def hand_off(self, frame: Mapping[str, Any]) -> None:
        """Give the writer this tick's frame (call only while recording)."""
        self._recorder.add_frame(frame)

    def append_row(
        self,
        tick: Any,
        flags: int,
        measured: np.ndarray,
        commanded: np.ndarray,
        twin: np.ndarray | None,
        leader: np.ndarray | None,
    ) -> None:
        assert self._episode is not None
        with self._lock:
            self._episode.append(tick, flags, measured, commanded, twin, leader)

    def raise_fault(self, fault: Fault) -> None:
        if not self.faults.raise_(fault):
            return
        log.error("fault on %s (%s): %s", fault.device, fault.kind, fault.message)
        self._publish_event("fault", fault=fault.to_dict())
        if self._episode is not None:
            self._episode.note_fault(fault.to_dict())
            if fault.ends_episode:
                self._end_for_fault(fault)

    def clear_fault(self, device: str, *, kinds: frozenset[FaultKind] | None = None) -> None:
        fault = self.faults.clear(device, kinds=kinds)
        if fault is not None:
            log.warning("fault on %s (%s) cleared", fault.device, fault.kind)
            self._publish_event("fault_cleared", fault=fault.to_dict())

    # --- shutdown (main thread, loop stopped) ------------------------------------------------

    def close_open_episode(self, reason: str) -> None:
        """Save the open episode (SIGINT/SIGTERM/shutdown): a clean stop, not a fault."""
        if self._episode is not None:
            if self._episode.frames > 0:
                self._close_episode(save=True, success=None, ended_by=reason)
            else:
                self._close_episode(save=False, success=None, ended_by=reason)

    def finalize(self, timeout_s: float) -> bool:
        """Finalize the dataset unless already done; True when it is finalized."""
        with self._lock:
            if self._state == SessionState.FINALIZED and self._recorder.stats().finalized:
                return True
            self._state = SessionState.FINALIZED
        future = self._recorder.finalize()
        try:
            future.result(timeout=timeout_s)
        except (HilrecError, OSError, TimeoutError) as exc:
            log.error("finalize of %s failed: %s", self._context.get("root"), exc)
            return False
        self._publish_event("finalized", root=str(self._context.get("root")))
        return True

    # --- transitions ---------------------------------------------------------------------------

    def _apply(self, request: Request, prepared: Any) -> dict[str, Any]:
        cmd, args = request.cmd, request.args
        if cmd == "start_episode":
            return self._start(args["task"], prepared)
        if cmd == "stop_episode":
            return self._stop(args.get("success"))
        if cmd == "discard_episode":
            return self._discard()
        if cmd == "finalize":
            return self._finalize_request()
        raise _refused(f"command {cmd!r} is not a session transition")

    def _start(self, task: str, prepared: Any) -> dict[str, Any]:
        if self.state == SessionState.FINALIZED:
            raise _refused(
                f"dataset {self._context.get('root')} is finalized; "
                "restart the daemon to record more episodes"
            )
        if self._episode is not None:
            raise _refused(f"episode {self._episode.index} is already recording; stop or discard it first")
        spill_problem = self._recorder.spill_problem()
        space_problem = self._recorder.space_problem()
        # What stopped the last take is gone (the backlog, the full disk): so is its fault.
        if spill_problem is None:
            self.clear_fault("writer", kinds=frozenset({FaultKind.SPILL_FULL}))
        if space_problem is None:
            self.clear_fault("writer", kinds=frozenset({FaultKind.DISK_FULL}))
        blocking = self.faults.blocking()
        if blocking:
            raise _refused(
                f"cannot start an episode while {blocking[0].device} is faulted: {blocking[0].message}",
                CODE_FAULT,
            )
        if not self._recorder.alive:
            raise _refused("the dataset writer is not running", CODE_FAULT)
        problem = spill_problem or space_problem
        if problem is not None:
            raise _refused(f"cannot start an episode: {problem}", CODE_FAULT)
        index = self._recorder.initial_episodes + self._saves_queued
        seed_used, start_fields, start_arrays = self.hooks.begin(prepared)
        episode = EpisodeBuffer(
            index=index,
            task=task,
            seed=seed_used,
            period_s=self._period_s,
            context=self._context,
            start_fields=start_fields,
            start_arrays=start_arrays,
        )
        with self._lock:
            self._episode = episode
            self._state = SessionState.RECORDING
        self._publish_event("episode_started", episode_index=index, task=task, seed=seed_used)
        return {"episode_index": index, "task": task, "seed": seed_used}

    def _stop(self, success: bool | None) -> dict[str, Any]:
        episode = self._require_episode("stop")
        if episode.frames == 0:
            raise _refused(f"episode {episode.index} has no frames yet; wait a tick or discard it")
        return self._close_episode(save=True, success=success, ended_by="stop_episode")

    def _discard(self) -> dict[str, Any]:
        self._require_episode("discard")
        return self._close_episode(save=False, success=None, ended_by="discard_episode")

    def _finalize_request(self) -> dict[str, Any]:
        if self._episode is not None:
            raise _refused(f"episode {self._episode.index} is still recording; stop or discard it first")
        with self._lock:
            if self._state == SessionState.FINALIZED:
                return {"finalizing": False, "already": True}
            self._state = SessionState.FINALIZED
        future = self._recorder.finalize()
        future.add_done_callback(self._on_finalized)
        return {"finalizing": True}

    def _on_finalized(self, future: Future[None]) -> None:
        if future.exception() is None:
            self._publish_event("finalized", root=str(self._context.get("root")))
        else:
            self._publish_event("finalize_failed", error=str(future.exception()))

    def _require_episode(self, verb: str) -> EpisodeBuffer:
        if self._episode is None:
            raise _refused(f"no episode is recording; nothing to {verb}")
        return self._episode

    def _end_for_fault(self, fault: Fault) -> None:
        assert self._episode is not None
        keep = self._on_device_lost == "save" or fault.kind in (FaultKind.SPILL_FULL, FaultKind.DISK_FULL)
        save = keep and self._episode.frames > 0
        self._close_episode(save=save, success=None, ended_by=f"fault:{fault.kind}:{fault.device}")

    def _close_episode(self, *, save: bool, success: bool | None, ended_by: str) -> dict[str, Any]:
        episode = self._episode
        assert episode is not None
        ended_at = time.monotonic()
        outcome = self.hooks.end()
        with self._lock:
            self._episode = None
        result: dict[str, Any] = {
            "episode_index": episode.index,
            "frames": episode.frames,
            "ended_by": ended_by,
        }
        event: tuple[str, dict[str, Any]] | None = None
        try:
            if save:
                # A rollout's per-frame record (control.rollout) rides beside the tick timing.
                end_record = getattr(self.hooks, "end_record", None)
                more: dict[str, np.ndarray] = {}
                if end_record is not None:
                    fields, more = end_record(episode.frames, success=success)
                    outcome = {**outcome, **fields}
                sidecar, arrays = episode.finish(success=success, ended_by=ended_by, outcome=outcome)
                arrays = {**arrays, **more}
                future = self._recorder.save(sidecar=sidecar, arrays=arrays)
                self._saves_queued += 1
                index, frames = episode.index, episode.frames
                future.add_done_callback(lambda done: self._on_saved(done, index, frames, ended_at))
                result["saving"] = True
                event = ("episode_stopped", dict(result))
            else:
                self._recorder.discard()
                result["discarded"] = True
                event = ("episode_discarded", dict(result))
        except WriterStalledError as exc:
            # The writer cannot take the request: the episode's fate is the writer's fault, said
            # here and in status; the loop goes on.
            result.update(saved=False, error=str(exc))
            event = ("episode_save_failed", {"episode_index": episode.index, "error": str(exc)})
        finally:
            # Idle only with the take's last_episode in place and its save queued: a client that
            # waits for "idle, nothing saving" then reads this take's outcome, not the one before.
            with self._lock:
                self._last_episode = dict(result)
                if self._state == SessionState.RECORDING:
                    self._state = SessionState.IDLE
        if event is not None:
            self._publish_event(event[0], **event[1])
        return result

    def _on_saved(self, future: Future[int], expected: int, frames: int, ended_at: float) -> None:
        if future.exception() is None:
            index = future.result()
            with self._lock:
                if self._last_episode is not None and self._last_episode.get("episode_index") == expected:
                    self._last_episode["saved"] = True
                    self._last_episode["episode_index"] = index
            self._publish_event("episode_saved", episode_index=index, frames=frames)
            if self._on_saved_hook is not None:
                try:
                    self._on_saved_hook(index, frames, ended_at)
                except Exception:  # a verdict that cannot be asked for never fails a save
                    log.exception("after saving episode %d", index)
        else:
            with self._lock:
                self._saves_queued -= 1
                if self._last_episode is not None and self._last_episode.get("episode_index") == expected:
                    self._last_episode["saved"] = False
                    self._last_episode["error"] = str(future.exception())
            self._publish_event("episode_save_failed", episode_index=expected, error=str(future.exception()))


def entropy_seed() -> int:
    """A seed for an episode started without one (recorded, so the episode stays reproducible)."""
    return int.from_bytes(os.urandom(4), "little")
