"""While a policy drives, the leader follows the follower under a low torque, so a takeover
starts where the arm is.

Each tick the policy has the arm, the leader's servos are sent the follower's measured joints
(:meth:`~hilrec.drivers.arm.SO101Leader.send_feedback`: at most ``max_step`` from where the
leader is, inside its calibrated range) with Torque_Limit ``[policy] leader_follow_torque``: low,
so the person's hand resting on it goes along, and a hand that pushes wins. When the person takes
over, the torque goes off in that tick (one packet) and teleop continues from where the leader
is, which is where the arm is; on handback it goes back under torque, holding where it stands
first. It runs every tick: a Goal_Position sync write is one packet with no reply (about 30 bytes,
0.3 ms at 1 Mbps), measured in :meth:`status` (``feedback_ms``).

The leader's bus is handled like the follower's: a port that is gone raises (the loop's leader
fault, which ends and saves the take); any other failed write is counted and the tick goes on
(a release that failed is tried again the next tick). :meth:`close`, on every way out of the
daemon, lets the torque go; the arm's own close then turns every servo's torque off again. For
the ways out that run no code (SIGKILL, a crash in C) a guard process beside the daemon turns it
off when the daemon is gone (:mod:`hilrec.drivers.torque_guard`).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from typing import TYPE_CHECKING, Any

import numpy as np

from hilrec.daemon.errors import DeviceError, PortGoneError

if TYPE_CHECKING:
    from hilrec.daemon.control.sources import JointReading, Leader
    from hilrec.drivers.arm import SO101Leader
    from hilrec.drivers.torque_guard import TorqueGuard

log = logging.getLogger(__name__)
_TIMES_KEPT = 500


class LeaderFollow:
    """The leader under torque following the follower while the policy drives; see the module."""

    def __init__(
        self, arm: SO101Leader, *, torque_limit: int, max_step: float, guard: TorqueGuard | None = None
    ) -> None:
        self.arm = arm
        self.guard = guard
        self.torque_limit = torque_limit
        self.max_step = max_step
        self.engaged = False
        self.writes = 0
        self.failures = 0
        self.engagements = 0
        self.last_error = ""
        self.gap = float("nan")  # leader vs follower at the last tick the leader followed
        self._times: deque[float] = deque(maxlen=_TIMES_KEPT)

    @classmethod
    def for_leader(
        cls, leader: Leader, *, enabled: bool, torque_limit: int, max_step: float
    ) -> LeaderFollow | None:
        """A follow for ``leader`` when it is an arm on a serial bus and following is asked for."""
        from hilrec.drivers.arm import SO101Leader
        from hilrec.drivers.torque_guard import TorqueGuard

        arm = getattr(leader, "arm", None)
        if not enabled or not isinstance(arm, SO101Leader):
            return None
        # Started here, on the loop thread, which lives as long as the rig (procs.start).
        return cls(arm, torque_limit=torque_limit, max_step=max_step, guard=TorqueGuard(arm.config.port))

    def update(self, follow: bool, observation: np.ndarray, leader: JointReading | None) -> None:
        """This tick: follow ``observation`` (the follower's joints) or let go."""
        if (not follow and not self.engaged) or (follow and leader is None):
            return  # nothing to let go; or no reading of the leader, so no goal around it
        began = time.monotonic()
        try:
            if not follow:
                self.arm.release()
                self.engaged = False
                return
            assert leader is not None
            if not self.engaged:
                self.arm.hold_under_torque(self.torque_limit, leader.values)
                self.engaged = True
                self.engagements += 1
            self.arm.send_feedback(observation, leader.values, self.max_step)
            self.writes += 1
            self.gap = float(np.abs(leader.values.astype(np.float64) - observation.astype(np.float64)).max())
        except PortGoneError:
            raise  # the loop's leader fault: the take is saved
        except DeviceError as exc:
            self.failures += 1
            self.last_error = str(exc)
            log.warning("%r: leader feedback failed (%d so far): %s", self.arm, self.failures, exc)
        finally:
            self._times.append(time.monotonic() - began)

    def close(self) -> None:
        """Let the torque go (the daemon stops, a fault, SIGTERM): never raises. Idempotent."""
        if self.engaged:
            try:
                self.arm.release()
                self.engaged = False
            except DeviceError as exc:  # the arm's close tries once more, and the guard after it
                log.warning("%r: could not let the leader's torque go: %s", self.arm, exc)
        if self.guard is not None and not self.engaged:
            self.guard.stand_down()  # the torque is off: the guard must not touch the open port
            self.guard = None

    def status(self) -> dict[str, Any]:
        times = np.asarray(self._times, dtype=np.float64) * 1e3
        return {
            "engaged": self.engaged,
            "guard_pid": self.guard.pid if self.guard is not None else None,
            "torque_limit": self.torque_limit,
            "writes": self.writes,
            "failures": self.failures,
            "last_error": self.last_error,
            "engagements": self.engagements,
            "gap": None if np.isnan(self.gap) else self.gap,
            "feedback_ms": {
                "p50": float(np.percentile(times, 50)) if times.size else None,
                "max": float(times.max()) if times.size else None,
            },
        }
