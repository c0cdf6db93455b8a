"""A codec's threads never run above the loop: SVT-AV1 creates its threads at SCHED_FIFO 99
wherever the process may (root, CAP_SYS_NICE), which put 96 encoder threads above the daemon's
FIFO 10 loop. Real encoders, real threads, read back from /proc; each case in an interpreter of
its own, since other tests (LeRobot's own encodes) leave real-time threads in the test process."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

PROBE = """
import os
# A clean start whatever the parent runs at, before any import starts a thread: the test process's
# thread may itself have been raised to FIFO 99 by LeRobot's own SVT-AV1 encodes in earlier
# tests, and a child inherits that.
os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
import sys, threading
from pathlib import Path
import numpy as np
from hilrec.daemon.dataset.video.codec_threads import thread_ids
from hilrec.daemon.dataset.video.codec import StreamEncoder, VideoSettings

REAL_TIME = (os.SCHED_FIFO, os.SCHED_RR)
codec, opener_priority, out = sys.argv[1], int(sys.argv[2]), Path(sys.argv[3])
found = []

def real_time_threads(skip):
    rt = []
    for tid in thread_ids() - {skip}:
        try:
            if os.sched_getscheduler(tid) in REAL_TIME:
                rt.append((tid, os.sched_getparam(tid).sched_priority))
        except OSError:
            pass
    return rt

def opener():
    me = threading.get_native_id()
    if opener_priority:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(opener_priority))
    encoder = StreamEncoder(out, fps=25, height=64, width=96, settings=VideoSettings(codec=codec))
    image = np.zeros((64, 96, 3), dtype=np.uint8)
    for i in range(4):
        image[:] = 40 * i
        encoder.encode(image)
    found.extend(real_time_threads(me if opener_priority else -1))
    own = (os.sched_getscheduler(0), os.sched_getparam(0).sched_priority)
    encoder.close()
    found.extend(real_time_threads(me if opener_priority else -1))
    if opener_priority and own != (os.SCHED_FIFO, opener_priority):
        found.append(("the opening thread's own policy changed", own))

thread = threading.Thread(target=opener)
thread.start()
thread.join(60)
print("REAL-TIME:", found)
sys.exit(1 if found or thread.is_alive() else 0)
"""


def _probe(tmp_path: Path, codec: str, opener_priority: int) -> None:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, codec, str(opener_priority), str(tmp_path / "out.mp4")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]


@pytest.mark.parametrize("codec", ["libsvtav1", "libx264"])
@pytest.mark.slow
def test_a_codec_opened_by_an_ordinary_thread_starts_no_real_time_thread(tmp_path: Path, codec: str) -> None:
    _probe(tmp_path, codec, 0)


def test_a_codec_opened_by_a_real_time_thread_still_runs_below_it(tmp_path: Path) -> None:
    """The writer may be started from a real-time thread: the codec's threads go to SCHED_OTHER,
    the opening thread keeps its own FIFO priority (SVT-AV1 had raised it to 99)."""
    _probe(tmp_path, "libsvtav1", 5)
