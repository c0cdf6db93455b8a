"""Pacing the loop on an absolute grid of deadlines, and the per-tick timing record.

Tick ``k`` is due at ``t0 + k * period`` (``time.monotonic``), so a late tick does not push the
next one back and the error never accumulates. The pacer sleeps to just before the deadline and
spins only the last fraction of a millisecond, which keeps the start jitter small without burning
the whole period. A tick that starts more than a period late has missed its slot: the pacer jumps
to the slot it is actually in and reports how many slots it skipped, so the record shows the gap
instead of pretending the frames were a period apart.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Final

import numpy as np

# Sleep until this close to the deadline, then spin: time.sleep overshoots by ~0.1 ms on Linux.
DEFAULT_SPIN_S: Final[float] = 0.0005


@dataclass(slots=True)
class TickTimes:
    """Monotonic timestamps (seconds) of one tick's phases, filled in as the tick runs."""

    slot: int
    deadline: float
    start: float
    skipped: int = 0
    observed: float = math.nan  # follower + cameras read
    leader_read: float = math.nan  # action known
    written: float = math.nan  # follower write returned
    end: float = math.nan
    # Seconds the tick spent on the arms' bus reads: from the first read's start until both
    # have returned (reads that overlap count once).
    bus_s: float = math.nan
    # Two arms: how far apart (s) the two followers' / the two leaders' readings were taken
    # (hilrec.daemon.control.arm_pair); NaN for one arm, or when a read failed.
    follower_skew_s: float = math.nan
    leader_skew_s: float = math.nan

    @property
    def late_s(self) -> float:
        return self.start - self.deadline

    def overran(self, period_s: float) -> bool:
        """The tick's work did not finish before the next tick was due."""
        return self.end > self.deadline + period_s


class TickPacer:
    """Hands out ticks on the absolute deadline grid. ``realtime=False`` never waits."""

    def __init__(self, period_s: float, *, realtime: bool = True, spin_s: float = DEFAULT_SPIN_S) -> None:
        if period_s <= 0:
            raise ValueError(f"period must be positive, got {period_s}")
        self.period_s = period_s
        self.realtime = realtime
        self.spin_s = spin_s
        self._t0: float | None = None
        self._slot = -1

    def next_tick(self) -> TickTimes:
        now = time.monotonic()
        if self._t0 is None:
            self._t0 = now
            self._slot = 0
            return TickTimes(slot=0, deadline=now, start=now)
        if not self.realtime:
            self._slot += 1
            return TickTimes(slot=self._slot, deadline=now, start=now)
        slot = self._slot + 1
        deadline = self._t0 + slot * self.period_s
        self._wait_until(deadline)
        start = time.monotonic()
        skipped = 0
        if start - deadline >= self.period_s:
            # Missed at least one whole slot: start in the slot we are in and say so.
            current = int((start - self._t0) // self.period_s)
            skipped = current - slot
            slot = current
            deadline = self._t0 + slot * self.period_s
        self._slot = slot
        return TickTimes(slot=slot, deadline=deadline, start=start, skipped=skipped)

    def _wait_until(self, deadline: float) -> None:
        remaining = deadline - time.monotonic() - self.spin_s
        if remaining > 0:
            time.sleep(remaining)
        while time.monotonic() < deadline:
            pass


# Per-tick arrays kept beside the dataset (episode npz) and summarised in its JSON.
TIMING_ARRAYS: Final[tuple[str, ...]] = (
    "tick_slot",
    "tick_deadline",
    "tick_start",
    "tick_observed",
    "tick_leader_read",
    "tick_written",
    "tick_end",
    "tick_skipped",
    "tick_bus_s",  # a duration (s), not a timestamp: TickTimes.bus_s
)
# Two arms only (durations, s): TickTimes.follower_skew_s and leader_skew_s.
SKEW_ARRAYS: Final[tuple[str, ...]] = ("tick_follower_skew_s", "tick_leader_skew_s")


def timing_summary(arrays: dict[str, np.ndarray], period_s: float) -> dict[str, float | int]:
    """Per-episode timing figures in milliseconds from the per-tick arrays."""
    start = arrays["tick_start"]
    if len(start) == 0:
        return {"ticks": 0}
    late_ms = (start - arrays["tick_deadline"]) * 1e3
    duration_ms = (arrays["tick_end"] - start) * 1e3
    latency_ms = (arrays["tick_written"] - arrays["tick_leader_read"]) * 1e3
    overruns = int(np.count_nonzero(arrays["tick_end"] > arrays["tick_deadline"] + period_s))
    intervals_ms = np.diff(start) * 1e3
    return {
        "ticks": len(start),
        "period_ms": period_s * 1e3,
        "late_ms_p50": _pct(late_ms, 50),
        "late_ms_p99": _pct(late_ms, 99),
        "late_ms_max": _max(late_ms),
        "duration_ms_p50": _pct(duration_ms, 50),
        "duration_ms_p99": _pct(duration_ms, 99),
        "duration_ms_max": _max(duration_ms),
        "leader_to_write_ms_p50": _pct(latency_ms, 50),
        "leader_to_write_ms_p99": _pct(latency_ms, 99),
        **_bus_summary(arrays),
        **_skew_summary(arrays),
        "interval_ms_min": float(intervals_ms.min()) if len(intervals_ms) else period_s * 1e3,
        "interval_ms_max": float(intervals_ms.max()) if len(intervals_ms) else period_s * 1e3,
        "overruns": overruns,
        "skipped_slots": int(arrays["tick_skipped"].sum()),
        "wall_span_s": float(start[-1] - start[0]),
        "nominal_span_s": (len(start) - 1) * period_s,
    }


def _bus_summary(arrays: dict[str, np.ndarray]) -> dict[str, float]:
    bus = arrays.get("tick_bus_s")
    if bus is None or len(bus) == 0:
        return {}
    bus_ms = bus * 1e3
    return {"bus_ms_p50": _pct(bus_ms, 50), "bus_ms_p99": _pct(bus_ms, 99), "bus_ms_max": _max(bus_ms)}


def _skew_summary(arrays: dict[str, np.ndarray]) -> dict[str, float]:
    out: dict[str, float] = {}
    for name in SKEW_ARRAYS:
        skew = arrays.get(name)
        if skew is None or len(skew) == 0:
            continue
        what = name.removeprefix("tick_").removesuffix("_s")
        skew_ms = skew * 1e3
        out[f"{what}_ms_p50"] = _pct(skew_ms, 50)
        out[f"{what}_ms_p99"] = _pct(skew_ms, 99)
        out[f"{what}_ms_max"] = _max(skew_ms)
    return out


def _pct(values: np.ndarray, q: float) -> float:
    finite = values[np.isfinite(values)]
    return float(np.percentile(finite, q)) if len(finite) else math.nan


def _max(values: np.ndarray) -> float:
    finite = values[np.isfinite(values)]
    return float(finite.max()) if len(finite) else math.nan
