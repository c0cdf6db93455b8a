"""bench_daemon's pacing side by side: LeRobot 0.4.4's relative sleep against hilrec's absolute
deadlines, on the same synthetic work, in the benchmark's own process."""

from __future__ import annotations

import time

import numpy as np

from hilrec.daemon.control.clock import TickPacer


def _pct(values: np.ndarray, q: float) -> float:
    return float(np.percentile(values, q)) if len(values) else float("nan")


def pacer_comparison(ticks: int, period: float) -> dict[str, dict[str, float]]:
    """LeRobot's relative pacing vs ours, same synthetic work (2-6 ms per tick) in this process."""
    from lerobot.utils.robot_utils import precise_sleep

    rng = np.random.default_rng(0)
    work = rng.uniform(0.002, 0.006, size=ticks)

    def busy(seconds: float) -> None:
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            pass

    out: dict[str, dict[str, float]] = {}
    starts = np.empty(ticks)
    t0 = time.perf_counter()
    for k in range(ticks):  # lerobot_record's loop: work, then sleep the rest of 1/fps
        start = time.perf_counter()
        starts[k] = start
        busy(work[k])
        precise_sleep(period - (time.perf_counter() - start))
    out["LeRobot 0.4.4 precise_sleep(1/fps - dt)"] = _pacing_stats(starts - t0, period)
    pacer = TickPacer(period)
    for k in range(ticks):
        tick = pacer.next_tick()
        starts[k] = tick.start
        busy(work[k])
    out["hilrec absolute deadlines"] = _pacing_stats(starts - starts[0], period)
    return out


def _pacing_stats(starts: np.ndarray, period: float) -> dict[str, float]:
    nominal = np.arange(len(starts)) * period
    return {
        "rate_hz": (len(starts) - 1) / (starts[-1] - starts[0]),
        "drift_ms": (starts[-1] - nominal[-1]) * 1e3,
        "interval_p99_ms": _pct(np.abs(np.diff(starts) - period) * 1e3, 99),
    }
