"""A codec's threads never run above the loop: SVT-AV1 creates its threads at SCHED_FIFO 99
wherever the process may (root, CAP_SYS_NICE), which put 96 encoder threads above the daemon's
FIFO 10 loop. Real encoders, real threads, read back from /proc."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import numpy as np
import pytest

from hilrec.daemon.dataset.codec_threads import thread_ids
from hilrec.daemon.dataset.video import StreamEncoder, VideoSettings

REAL_TIME = (os.SCHED_FIFO, os.SCHED_RR)


def _real_time_threads() -> list[tuple[int, int]]:
    found = []
    for tid in thread_ids():
        try:
            if os.sched_getscheduler(tid) in REAL_TIME:
                found.append((tid, os.sched_getparam(tid).sched_priority))
        except OSError:
            continue
    return found


def _encode(path: Path, codec: str, frames: int = 4) -> None:
    encoder = StreamEncoder(path, fps=25, height=64, width=96, settings=VideoSettings(codec=codec))
    image = np.zeros((64, 96, 3), dtype=np.uint8)
    for i in range(frames):
        image[:] = 40 * i
        encoder.encode(image)
    try:
        assert _real_time_threads() == [], "a codec thread runs at a real-time policy"
    finally:
        encoder.close()


@pytest.mark.parametrize("codec", ["libsvtav1", "libx264"])
def test_a_codec_opened_by_an_ordinary_thread_starts_no_real_time_thread(tmp_path: Path, codec: str) -> None:
    _encode(tmp_path / "a.mp4", codec)


def test_a_codec_opened_by_a_real_time_thread_still_runs_below_it(tmp_path: Path) -> None:
    """The writer may be started from a real-time thread (the loop's, the control thread's):
    the codec's threads go to SCHED_OTHER, the opening thread keeps its own priority."""
    outcome: list[BaseException | list[tuple[int, int]]] = []

    def opener() -> None:
        try:
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(5))
        except PermissionError:
            outcome.append([])  # not permitted here: then no codec may raise itself either
            return
        try:
            encoder = StreamEncoder(tmp_path / "b.mp4", fps=25, height=64, width=96, settings=VideoSettings())
            for _ in range(3):
                encoder.encode(np.zeros((64, 96, 3), dtype=np.uint8))
            me = threading.get_native_id()
            outcome.append([t for t in _real_time_threads() if t[0] != me])
            encoder.close()
        except BaseException as exc:  # noqa: BLE001 - handed to the test thread
            outcome.append(exc)

    thread = threading.Thread(target=opener)
    thread.start()
    thread.join(60)
    assert not thread.is_alive() and outcome
    result = outcome[0]
    if isinstance(result, BaseException):
        raise result
    assert result == [], f"codec threads at a real-time policy: {result}"
