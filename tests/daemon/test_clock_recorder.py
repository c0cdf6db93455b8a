"""The pacer's deadline grid and the writer thread's promise: frames are never dropped silently."""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hilrec.daemon.control.clock import TickPacer, timing_summary
from hilrec.daemon.control.recorder import Recorder
from hilrec.daemon.errors import WriterStalledError


def _work(seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


def test_deadlines_stay_on_the_grid_and_a_missed_slot_is_reported_not_hidden() -> None:
    period = 0.02
    pacer = TickPacer(period)
    ticks = [pacer.next_tick()]
    worked_until = float("nan")
    for k in range(1, 12):
        if k == 4:
            _work(2.5 * period)  # tick 3's work runs past slot 4, into slot 5 (or later, loaded)
            worked_until = time.monotonic()
        ticks.append(pacer.next_tick())
    t0 = ticks[0].deadline
    for tick in ticks:
        # Every deadline is t0 + slot * period: lateness never shifts the grid.
        assert tick.deadline == pytest.approx(t0 + tick.slot * period, abs=1e-9)
        assert tick.start >= tick.deadline
    late = ticks[4]
    # Slot 4 was missed entirely; the tick runs in the slot the work ended in (5, or later on a
    # loaded machine) and is recorded as late within that slot: by how long it started after it.
    assert late.skipped >= 1 and late.slot == 4 + late.skipped
    assert worked_until <= late.start and worked_until - period < late.deadline <= late.start
    assert late.late_s == pytest.approx(late.start - late.deadline, abs=1e-9) and late.late_s < period
    # Slots are accounted for: every slot up to the last is a tick or a skip.
    assert ticks[-1].slot == len(ticks) - 1 + sum(t.skipped for t in ticks)


@pytest.mark.timeout(120)
def test_non_realtime_pacer_never_waits() -> None:
    # An hour a tick: a pacer that waited would hold this test for four hours, past its timeout.
    pacer = TickPacer(3600.0, realtime=False)
    ticks = [pacer.next_tick() for _ in range(5)]
    assert [t.slot for t in ticks] == [0, 1, 2, 3, 4] and all(t.late_s == 0 for t in ticks)


def test_timing_summary_reports_late_ticks_and_real_span() -> None:
    deadline = np.arange(5) * 0.04
    start = deadline + np.array([0, 0, 0.010, 0, 0])
    arrays = {
        "tick_start": start,
        "tick_deadline": deadline,
        "tick_end": start + 0.005,
        "tick_written": start + 0.003,
        "tick_leader_read": start + 0.002,
        "tick_skipped": np.zeros(5, np.int64),
    }
    summary = timing_summary(arrays, 0.04)
    assert summary["late_ms_max"] == pytest.approx(10.0) and summary["overruns"] == 0
    assert summary["leader_to_write_ms_p50"] == pytest.approx(1.0)
    assert summary["wall_span_s"] == pytest.approx(0.16)


class GatedSink:
    """A FrameSink whose add_frame waits for a gate: a writer that has fallen behind."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.fps = 25
        self.features: dict[str, Any] = {}
        self.gate = threading.Event()
        self.frames: list[int] = []
        self.saved: list[list[int]] = []
        self._open: list[int] = []

    def add_frame(self, frame: Mapping[str, Any]) -> None:
        if not self.gate.wait(10):
            raise TimeoutError("test gate never opened")
        self._open.append(frame["n"])

    def save_episode(
        self, *, sidecar: Mapping[str, Any] | None = None, arrays: Mapping[str, np.ndarray] | None = None
    ) -> int:
        self.saved.append(self._open)
        self._open = []
        return len(self.saved) - 1

    def discard_episode(self) -> None:
        self._open = []

    def finalize(self) -> None:
        pass

    @property
    def episode_open(self) -> bool:
        return bool(self._open)

    @property
    def num_episodes(self) -> int:
        return len(self.saved)


@pytest.mark.timeout(120)
def test_a_full_writer_queue_raises_after_the_stall_timeout_and_nothing_is_dropped(tmp_path: Path) -> None:
    sink = GatedSink(tmp_path)
    recorder = Recorder(lambda: sink, queue_frames=3, stall_s=0.2)
    recorder.start()
    for n in range(4):  # one in the sink's hands, three queued
        recorder.add_frame({"n": n})
    began = time.monotonic()
    with pytest.raises(WriterStalledError, match=r"took no frame for 0\.2 s"):
        recorder.add_frame({"n": 99})
    assert time.monotonic() - began > 0.15  # it waited for the stall timeout (a wait is never short)
    sink.gate.set()
    saved = recorder.save(sidecar={}, arrays={})
    assert saved.result(timeout=10) == 0
    assert sink.saved == [[0, 1, 2, 3]]  # every accepted frame, in order; the refused one is not there
    assert recorder.close(5.0)
