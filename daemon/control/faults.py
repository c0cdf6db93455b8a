"""Faults: what went wrong with which device, kept until the device works again.

The kinds go into status, telemetry events and episode sidecars under their values, so the
values are the wire names and never change. The registry is shared by the loop thread (raises and
clears) and the control thread (status), so every access takes its lock and what it hands out is
a copy.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any


class FaultKind(StrEnum):
    DEVICE_LOST = "device_lost"  # a port vanished, or max_failed_ticks reads in a row failed
    DEVICE_FAULT = "device_fault"  # a servo or the bus reported an error that retries cannot carry
    CAMERA_STALLED = "camera_stalled"  # no new frame within the camera's stall limit
    LEADER_TIMEOUT = "leader_timeout"  # no remote leader command within the watchdog
    WRITER_STALLED = "writer_stalled"  # the writer thread did not take a frame in time
    SPILL_FULL = "spill_full"  # the frames waiting for the encoder reached their bound: the take ended, saved
    DISK_FULL = "disk_full"  # the dataset's disk filled during a take: the take ended there, saved
    LOOP = "loop"  # the loop itself died; only status and shutdown are served after it
    POLICY = "policy"  # the policy cannot drive (its process died): the follower holds


@dataclass(frozen=True)
class Fault:
    kind: FaultKind
    device: str  # follower | leader | camera.<name> | writer | loop
    message: str
    ends_episode: bool
    since_wall: float = field(default_factory=time.time)
    since_mono: float = field(default_factory=time.monotonic)

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": str(self.kind),
            "device": self.device,
            "message": self.message,
            "since": self.since_wall,
            "ends_episode": self.ends_episode,
        }


class FaultRegistry:
    """At most one fault per device; a fault of the same kind raised again is the same fault."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._faults: dict[str, Fault] = {}

    def raise_(self, fault: Fault) -> bool:
        """Record ``fault``; False when that device already has a fault of that kind."""
        with self._lock:
            known = self._faults.get(fault.device)
            if known is not None and known.kind == fault.kind:
                return False
            self._faults[fault.device] = fault
            return True

    def clear(self, device: str, *, kinds: frozenset[FaultKind] | None = None) -> Fault | None:
        """Remove the device's fault (only if it is of one of ``kinds``, when given)."""
        with self._lock:
            fault = self._faults.get(device)
            if fault is None or (kinds is not None and fault.kind not in kinds):
                return None
            return self._faults.pop(device)

    def get(self, device: str) -> Fault | None:
        with self._lock:
            return self._faults.get(device)

    def __contains__(self, device: object) -> bool:
        with self._lock:
            return device in self._faults

    def devices(self) -> list[str]:
        """The faulted devices, sorted (what each tick's telemetry lists)."""
        with self._lock:
            return sorted(self._faults)

    def blocking(self) -> list[Fault]:
        """The faults that forbid starting an episode."""
        with self._lock:
            return [f for f in self._faults.values() if f.ends_episode]

    def to_list(self) -> list[dict[str, Any]]:
        with self._lock:
            return [f.to_dict() for f in self._faults.values()]
