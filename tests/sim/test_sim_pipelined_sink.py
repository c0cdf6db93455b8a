"""The writer-thread sink: same order, nothing dropped, errors surface on the caller's side."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from hilrec.daemon.dataset.reader import load_info, read_episode
from hilrec.daemon.dataset.writer import DatasetWriter
from hilrec.daemon.errors import DatasetStateError, FrameError
from hilrec.daemon.so101 import ACTION_KEY, ROBOT_TYPE, STATE_KEY
from hilrec.sim.features import sim_features
from hilrec.sim.pipelined_sink import PipelinedSink


def _sink(root: Path) -> PipelinedSink:
    return PipelinedSink(DatasetWriter.create(root, fps=25, features=sim_features({}),
                                              robot_type=ROBOT_TYPE, video_codec="libsvtav1"))


def _frame(value: float) -> dict:
    row = np.full(6, value, dtype=np.float32)
    return {STATE_KEY: row, ACTION_KEY: row, "task": "t"}


def test_frames_arrive_in_order_even_if_the_caller_reuses_its_arrays(tmp_path: Path) -> None:
    sink = _sink(tmp_path / "ds")
    with sink:
        frame = _frame(0.0)
        for value in range(30):
            frame[STATE_KEY][:] = value  # the same array, refilled
            sink.add_frame(frame)
        assert sink.save_episode() == 0
        sink.add_frame(_frame(7.0))
        assert sink.save_episode() == 1
    assert load_info(tmp_path / "ds")["total_episodes"] == 2
    states = read_episode(tmp_path / "ds", 0, [STATE_KEY])[STATE_KEY]
    np.testing.assert_array_equal(states[:, 0], np.arange(30, dtype=np.float32))


def test_a_refused_frame_is_raised_by_the_next_call_and_saved_episodes_survive(
        tmp_path: Path) -> None:
    sink = _sink(tmp_path / "ds")
    sink.add_frame(_frame(1.0))
    sink.save_episode()
    bad = _frame(2.0)
    bad[ACTION_KEY] = bad[ACTION_KEY].astype(np.float64)
    sink.add_frame(bad)  # refused on the writer thread
    with pytest.raises(FrameError):
        # The queue holds 256 calls, so the writer thread meets the bad frame before this ends.
        for _ in range(1000):
            sink.add_frame(_frame(3.0))
    with pytest.raises(FrameError):
        sink.finalize()
    assert load_info(tmp_path / "ds")["total_episodes"] == 1
    with pytest.raises(DatasetStateError):
        sink.add_frame(_frame(4.0))
