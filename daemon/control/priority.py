"""Real-time scheduling for two of the daemon's threads, asked for and reported, never assumed.

The loop thread runs under ``SCHED_FIFO`` at ``loop.realtime_priority`` and the control server
(with libzmq's I/O thread) just below it at ``loop.control_priority``, so neither waits behind
ordinary processes for a CPU. Nothing else is made real-time: threads inherit the policy of the
thread that starts them, and library thread pools that spin-wait (OpenCV, BLAS, codecs) can
livelock a core under a FIFO policy. That is why the priorities are raised only once the threads
that start other threads have done so (the loop after the rig is built, the control server last).

Without ``CAP_SYS_NICE`` the request is refused; the daemon says so (log and status) and runs at
normal priority.
"""

from __future__ import annotations

import logging
import os

log = logging.getLogger(__name__)


def set_thread_priority(priority: int, what: str) -> str:
    """Put the calling thread under SCHED_FIFO at ``priority`` (0: normal). Says what happened."""
    if priority <= 0:
        return "normal"
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(priority))
    except OSError as exc:
        log.warning("%s stays at normal priority: SCHED_FIFO %d refused (%s)", what, priority, exc)
        return f"normal (SCHED_FIFO {priority} refused: {exc.strerror or exc})"
    return f"SCHED_FIFO {priority}"
