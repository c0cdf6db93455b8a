"""The 25 Hz loop: observe, read the leader, command, hand the frame over, mirror, publish.

One tick, in this order (the order is the recording's meaning: README.md, "The contracts
a recording keeps", 1, observe, then command, then step):

1. read the follower and the cameras: the observation;
2. read the leader: the action. A leader on a serial bus of its own (``Leader.concurrent``) is
   read on a second thread (``hilrec-leader``, one for the loop's life, started by the loop thread
   so it runs at its priority) while the follower and the cameras are read, so a retry on one bus
   does not add to the other; both reads have returned before the write;
3. write the follower (float32; the action recorded is what was sent, after any clamp), then let
   the step happen (the twin steps physics in sim mode);
4. hand the frame to the writer thread (never blocking while the writer keeps up);
5. let the mirroring twin follow the measured joints (hil/emulated) and publish telemetry.

Ticks are paced on an absolute deadline grid (:mod:`hilrec.daemon.control.clock`); each tick's phase times
are recorded beside the episode, and a late one is marked, never stretched to look on time.

Device trouble is handled here, per tick, without ever blocking: a retryable bus error (after the
driver's own bounded retries) marks the frame and reuses the last good value; ``max_failed_ticks``
of them in a row, a vanished port or a stalled camera raise a fault that ends the open episode
(see :mod:`hilrec.daemon.control.session`). A faulted device is probed once a second and the fault clears
when it answers again.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np

from hilrec.daemon.control.clock import TickPacer, TickTimes
from hilrec.daemon.control.faults import Fault, FaultKind
from hilrec.daemon.control.rig import Rig
from hilrec.daemon.control.session import Session
from hilrec.daemon.control.sources import JointReading
from hilrec.daemon.dataset import LATE_BUDGET_S, FrameFlag, flag_names
from hilrec.daemon.errors import (
    BusPacketError,
    BusTimeoutError,
    CameraError,
    CameraStalledError,
    DeviceError,
    PolicyError,
    PortGoneError,
    WriterStalledError,
)
from hilrec.daemon.so101 import ACTION_KEY, IMAGE_PREFIX, STATE_KEY
from hilrec.daemon.wire.telemetry import Telemetry

log = logging.getLogger(__name__)

_RETRYABLE = (BusTimeoutError, BusPacketError)
_DEVICE_KINDS = frozenset({FaultKind.DEVICE_LOST, FaultKind.DEVICE_FAULT})
PROBE_PERIOD_S = 1.0


class ControlLoop:
    def __init__(
        self,
        *,
        rig: Rig,
        session: Session,
        telemetry: Telemetry,
        pacer: TickPacer,
        max_failed_ticks: int,
        watchdog_faults: bool,
    ) -> None:
        self.rig = rig
        self.session = session
        self.telemetry = telemetry
        self.pacer = pacer
        self.period_s = pacer.period_s
        self.max_failed_ticks = max_failed_ticks
        self.watchdog_faults = watchdog_faults
        self._measured: np.ndarray | None = None
        self._last_sent: np.ndarray | None = None
        self._last_images: dict[str, np.ndarray] = {}
        self._failures = {"follower": 0, "leader": 0}
        self._next_probe: dict[str, float] = {}
        self._leader_was_live = False
        self.ticks = 0
        self.late_ticks = 0
        self.overruns = 0
        self.skipped_slots = 0
        self.last_tick: dict[str, Any] = {}
        self.crashed: str | None = None
        # A policy leader (control.rollout) is shown the cameras' images before it is read.
        self._sees: Callable[[Mapping[str, np.ndarray]], None] | None = getattr(rig.leader, "see", None)
        # ...and says what a frame's features are when its read failed (who has the arm).
        self._features: Callable[[int | None], Mapping[str, np.ndarray] | None] = getattr(
            rig.leader, "frame_features", lambda frame_index: None
        )
        # The leader's reading thread (see the module docstring), made at the first tick that
        # needs it, on the loop thread.
        self._leader_pool: ThreadPoolExecutor | None = None
        # What a leader is shown before the follower's first reading: zeros of the rig's width.
        self._no_observation = np.zeros(rig.joints, np.float32)

    # --- thread body -------------------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        try:
            while not stop.is_set():
                self.step()
        except Exception as exc:
            # Device faults are handled per tick; anything reaching this point (a twin gone
            # unstable, a bug) ends the loop. Say so, save the open episode by policy, and keep
            # the control server and the saved episodes alive.
            self.crashed = f"{type(exc).__name__}: {exc}"
            log.exception("control loop stopped")
            self.session.raise_fault(
                Fault(kind=FaultKind.LOOP, device="loop", message=self.crashed, ends_episode=True)
            )
        finally:
            self.close()

    def close(self) -> None:
        """End the leader's reading thread (after its read in progress, if any)."""
        pool, self._leader_pool = self._leader_pool, None
        if pool is not None:
            pool.shutdown(wait=True)

    def step(self) -> None:
        tick = self.pacer.next_tick()
        self.session.apply_pending()
        flags = FrameFlag(0)
        if tick.skipped:
            flags |= FrameFlag.SKIPPED
        if tick.late_s > LATE_BUDGET_S:
            flags |= FrameFlag.LATE

        reads_start = time.monotonic()
        early = self._start_leader_read()
        measured, flags = self._observe(flags)
        follower_done = time.monotonic()
        tick.follower_skew_s = _skew(self.rig.follower)
        # A frame nobody will see (no take, no policy, no preview due) is not made by a camera
        # that makes it on demand: the twin's renderer costs more than the rest of an idle tick.
        wanted = self.session.recording or self._sees is not None or self.telemetry.wants_preview(tick.start)
        images, flags = self._read_cameras(flags, wanted)
        tick.observed = time.monotonic()

        if images is not None and self._sees is not None:
            self._sees(images)  # a policy looks at the same images the frame records
        leader, flags, leader_s = self._read_leader(measured, flags, early)
        tick.leader_read = time.monotonic()
        tick.leader_skew_s = _skew(self.rig.leader)
        if early is not None:
            # Overlapping reads: the bus time is until the later of the two has returned.
            tick.bus_s = max(follower_done - reads_start, leader_s)
        else:
            tick.bus_s = (follower_done - reads_start) + leader_s
        if leader is not None and leader.flags:
            flags |= FrameFlag(leader.flags)

        goal = leader.values if leader is not None else self._hold_target(measured)
        sent, flags = self._command(goal, flags)
        tick.written = time.monotonic()
        if sent is not None:
            self.rig.follower.advance()

        # A row is only ever the whole triple: the state observed, the action sent, the images.
        row = (measured, sent) if measured is not None and sent is not None else None
        recorded = False
        frame_index = self.session.frame_index
        if self.session.recording and row is not None and images is not None:
            features = leader.features if leader is not None else self._features(frame_index)
            recorded = self._hand_off(row[0], row[1], images, features)

        twin = (
            self.rig.mirror.follow(measured) if self.rig.mirror is not None and measured is not None else None
        )
        tick.end = time.monotonic()
        if tick.overran(self.period_s):
            flags |= FrameFlag.OVERRUN
        if recorded and row is not None:
            self.session.append_row(
                tick, int(flags), row[0], row[1], twin, leader.values if leader is not None else None
            )
        self._account(tick, flags)
        self._publish(tick, flags, frame_index if recorded else None, measured, sent, leader, twin, images)

    # --- 1. observation ----------------------------------------------------------------------

    def _observe(self, flags: FrameFlag) -> tuple[np.ndarray | None, FrameFlag]:
        if not self._device_usable("follower"):
            return None, flags
        reading = self._read_arm("follower", self.rig.follower.read)
        if not isinstance(reading, JointReading):  # a follower always answers or fails
            if "follower" in self.session.faults:
                return None, flags
            return self._measured, flags | FrameFlag.FOLLOWER_FAILED  # last good observation, marked
        if reading.retries:
            flags |= FrameFlag.FOLLOWER_RETRIED
        self._measured = reading.values
        return reading.values, flags

    def _read_cameras(self, flags: FrameFlag, wanted: bool) -> tuple[dict[str, np.ndarray] | None, FrameFlag]:
        """The frame's images, or None when a camera failed or the images were not ``wanted`` and
        are made on demand. Each camera is read once before that may be skipped (a renderer's
        first frame builds its context: an idle tick's cost, never a take's)."""
        if not wanted and self._made_on_demand():
            return None, flags
        images: dict[str, np.ndarray] = {}
        for name, camera in self.rig.cameras.items():
            device = f"camera.{name}"
            if not self._device_usable(device):
                return None, flags
            try:
                image = camera.read_latest()
            except CameraStalledError as exc:
                self._fault(FaultKind.CAMERA_STALLED, device, str(exc))
                return None, flags
            except CameraError as exc:
                self._fault(FaultKind.DEVICE_LOST, device, str(exc))
                return None, flags
            self.session.clear_fault(device)
            if self._last_images.get(name) is image:
                flags |= FrameFlag.CAMERA_REPEATED
            self._last_images[name] = image
            images[name] = image
        return images, flags

    def _made_on_demand(self) -> bool:
        cameras = self.rig.cameras.items()
        seen = self._last_images
        return bool(cameras) and all(getattr(c, "on_demand", False) and name in seen for name, c in cameras)

    # --- 2. action -----------------------------------------------------------------------------

    def _start_leader_read(self) -> Future[_Timed] | None:
        """Start the leader's read on its thread when it reads a bus of its own and may be read
        now; its outcome is judged on the loop thread (:meth:`_read_leader`)."""
        if not getattr(self.rig.leader, "concurrent", False) or not self._device_usable("leader"):
            return None
        if self._leader_pool is None:
            self._leader_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hilrec-leader")
        frame_index = self.session.frame_index
        observation = self._measured if self._measured is not None else self._no_observation
        return self._leader_pool.submit(_timed, lambda: self.rig.leader.read(frame_index, observation))

    def _read_leader(
        self, measured: np.ndarray | None, flags: FrameFlag, early: Future[_Timed] | None
    ) -> tuple[JointReading | None, FrameFlag, float]:
        """The leader's reading with the fault policy, and how long its read took (s)."""
        if early is None:
            if not self._device_usable("leader"):
                return None, flags | FrameFlag.LEADER_FAILED, 0.0
            observation = measured if measured is not None else self._no_observation
            outcome = _timed(lambda: self.rig.leader.read(self.session.frame_index, observation))
        else:
            outcome = early.result()
        reading = self._read_arm("leader", outcome.get)
        if reading is None:
            return None, flags | FrameFlag.LEADER_FAILED, outcome.seconds
        if isinstance(reading, _NoCommand):
            self._watch_leader(live=False)
            return None, flags | FrameFlag.LEADER_STALE, outcome.seconds
        self._watch_leader(live=True)
        if reading.retries:
            flags |= FrameFlag.LEADER_RETRIED
        return reading, flags, outcome.seconds

    def _watch_leader(self, *, live: bool) -> None:
        if not self.watchdog_faults:
            return
        if live:
            if not self._leader_was_live:
                self.session.clear_fault("leader")
            self._leader_was_live = True
            return
        status = self.rig.leader.status()
        if status.get("state") == "stale" and "leader" not in self.session.faults:
            self._leader_was_live = False
            self.session.raise_fault(
                Fault(
                    kind=FaultKind.LEADER_TIMEOUT,
                    device="leader",
                    ends_episode=False,
                    message=f"no remote leader command for {status.get('age_ms', 0):.0f} ms "
                    f"(watchdog {status.get('watchdog_ms', 0):.0f} ms); the follower holds position",
                )
            )

    def _hold_target(self, measured: np.ndarray | None) -> np.ndarray | None:
        # Hold = keep the last goal sent (no new motion); before any goal, hold where it is.
        return self._last_sent if self._last_sent is not None else measured

    # --- 3. command ----------------------------------------------------------------------------

    def _command(self, goal: np.ndarray | None, flags: FrameFlag) -> tuple[np.ndarray | None, FrameFlag]:
        if goal is None or "follower" in self.session.faults:
            return None, flags
        try:
            result = self.rig.follower.write(np.asarray(goal, dtype=np.float32))
        except PortGoneError as exc:
            self._fault(FaultKind.DEVICE_LOST, "follower", str(exc))
            return None, flags | FrameFlag.WRITE_FAILED
        except DeviceError as exc:
            log.warning("follower write failed: %s", exc)
            return None, flags | FrameFlag.WRITE_FAILED
        if result.clamped:
            flags |= FrameFlag.CLAMPED
        self._last_sent = result.sent
        return result.sent, flags

    # --- 4. hand-off ---------------------------------------------------------------------------

    def _hand_off(
        self,
        measured: np.ndarray,
        sent: np.ndarray,
        images: Mapping[str, np.ndarray],
        features: Mapping[str, np.ndarray] | None = None,
    ) -> bool:
        frame: dict[str, Any] = {STATE_KEY: measured, ACTION_KEY: sent, "task": self.session.task}
        for name, image in images.items():
            frame[IMAGE_PREFIX + name] = image
        if features:
            frame.update(features)
        try:
            self.session.hand_off(frame)
        except WriterStalledError as exc:
            self._fault(FaultKind.WRITER_STALLED, "writer", str(exc))
            return False
        return True

    # --- faults --------------------------------------------------------------------------------

    def _read_arm(
        self, device: str, read: Callable[[], JointReading | None]
    ) -> JointReading | _NoCommand | None:
        """One arm read with the loop's fault policy; None when it failed."""
        try:
            reading = read()
        except _RETRYABLE as exc:
            self._failures[device] += 1
            if self._failures[device] >= self.max_failed_ticks:
                self._fault(
                    FaultKind.DEVICE_LOST,
                    device,
                    f"{self._failures[device]} ticks in a row failed after bus retries; last: {exc}",
                )
            return None
        except PortGoneError as exc:
            self._fault(FaultKind.DEVICE_LOST, device, str(exc))
            return None
        except DeviceError as exc:
            self._fault(FaultKind.DEVICE_FAULT, device, str(exc))
            return None
        except PolicyError as exc:  # the policy's process died: hold, and say why
            self._fault(FaultKind.POLICY, device, str(exc))
            return None
        self._failures[device] = 0
        # The device answered, so the faults of a failing device clear; a leader that answered
        # with nothing new keeps its watchdog fault, which only a live command clears.
        self.session.clear_fault(device, kinds=None if reading is not None else _DEVICE_KINDS)
        return _NO_COMMAND if reading is None else reading

    def _fault(self, kind: FaultKind, device: str, message: str) -> None:
        self._next_probe[device] = time.monotonic() + PROBE_PERIOD_S
        self.session.raise_fault(Fault(kind=kind, device=device, message=message, ends_episode=True))

    def _device_usable(self, device: str) -> bool:
        """False while a device is faulted, except for one probe per second."""
        fault = self.session.faults.get(device)
        if fault is None or not fault.ends_episode:
            return True
        now = time.monotonic()
        if now >= self._next_probe.get(device, 0.0):
            self._next_probe[device] = now + PROBE_PERIOD_S
            return True
        return False

    # --- accounting and telemetry ------------------------------------------------------------

    def _account(self, tick: TickTimes, flags: FrameFlag) -> None:
        self.ticks += 1
        self.skipped_slots += tick.skipped
        if flags & FrameFlag.LATE:
            self.late_ticks += 1
        if flags & FrameFlag.OVERRUN:
            self.overruns += 1

    def _publish(
        self,
        tick: TickTimes,
        flags: FrameFlag,
        frame_index: int | None,
        measured: np.ndarray | None,
        sent: np.ndarray | None,
        leader: JointReading | None,
        twin: np.ndarray | None,
        images: Mapping[str, np.ndarray] | None,
    ) -> None:
        previous = self.last_tick.get("action")
        divergence: dict[str, Any] = {}
        if measured is not None and previous is not None:
            divergence["commanded_vs_measured"] = _absdiff(previous, measured)
        if twin is not None and measured is not None:
            divergence["measured_vs_twin"] = _absdiff(measured, twin)
            if previous is not None:
                divergence["commanded_vs_twin"] = _absdiff(previous, twin)
        message = {
            "slot": tick.slot,
            "recording": frame_index is not None,
            "episode_index": self.session.episode_index,
            "frame_index": frame_index,
            "state": _list(measured),
            "action": _list(sent),
            "leader": _list(leader.values) if leader is not None else None,
            "twin": _list(twin),
            "divergence": divergence,
            "timing": {
                "deadline": tick.deadline,
                "start": tick.start,
                "late_ms": tick.late_s * 1e3,
                "duration_ms": (tick.end - tick.start) * 1e3,
                "observe_ms": (tick.observed - tick.start) * 1e3,
                "leader_to_write_ms": (tick.written - tick.leader_read) * 1e3 if sent is not None else None,
                "skipped": tick.skipped,
                "overrun": bool(flags & FrameFlag.OVERRUN),
            },
            "flags": flag_names(int(flags)),
            "faults": self.session.faults.devices(),
        }
        self.last_tick = {"action": sent if sent is not None else previous, "timing": message["timing"]}
        self.telemetry.tick(message)
        if images and self.telemetry.wants_preview(tick.start):
            self.telemetry.preview(tick.start, frame_index, images)

    def stats(self) -> dict[str, Any]:
        return {
            "ticks": self.ticks,
            "late_ticks": self.late_ticks,
            "overruns": self.overruns,
            "skipped_slots": self.skipped_slots,
            "period_ms": self.period_s * 1e3,
            "realtime": self.pacer.realtime,
            "last": self.last_tick.get("timing"),
            "crashed": self.crashed,
        }


class _NoCommand:
    """A leader that answered with nothing new: hold, and let the watchdog judge its age."""


class _Timed:
    """A leader read's outcome (its reading or its exception) and how long it took."""

    def __init__(self, reading: JointReading | None, error: BaseException | None, seconds: float) -> None:
        self.reading = reading
        self.error = error
        self.seconds = seconds

    def get(self) -> JointReading | None:
        if self.error is not None:
            raise self.error
        return self.reading


def _timed(read: Callable[[], JointReading | None]) -> _Timed:
    began = time.monotonic()
    try:
        reading = read()
    except Exception as exc:  # noqa: BLE001 - judged on the loop thread, as a read there would be
        return _Timed(None, exc, time.monotonic() - began)
    return _Timed(reading, None, time.monotonic() - began)


_NO_COMMAND = _NoCommand()


def _skew(device: object) -> float:
    """The two arms' read skew of this tick (s), for a device that pairs two arms; else NaN."""
    take: Callable[[], float] | None = getattr(device, "take_skew", None)
    return take() if take is not None else math.nan


def _absdiff(a: np.ndarray, b: np.ndarray) -> list[float]:
    return [float(x) for x in np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))]


def _list(values: np.ndarray | None) -> list[float] | None:
    return None if values is None else [float(x) for x in values]
