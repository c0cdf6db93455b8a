"""A test daemon's verdict worker, lifted from SCHED_IDLE to normal priority.

The worker runs at SCHED_IDLE so it never takes a CPU the loop wants; on a bench machine that is
time nothing else wants. On a test machine two other pytest workers keep both cores busy, and a
SCHED_IDLE process then gets almost none: the web page's test once waited 60 s and saw no
verdict. A test about what is shown, not about the priority, lifts the worker once it has
lowered itself (tests/collect/test_verdict.py asserts the priority itself).
"""

from __future__ import annotations

import os

from hilrec.daemon.control import verdict
from support.procs import children
from support.wait import wait_until

VERDICT_MODULE = verdict.__name__


def lift_verdict_worker(parent: int, timeout: float = 120.0) -> int:
    """Put ``parent``'s verdict worker at SCHED_OTHER once it is at SCHED_IDLE; its pid."""

    def lowered() -> int | None:
        for child in children(parent, VERDICT_MODULE):
            if os.sched_getscheduler(child.pid) == os.SCHED_IDLE:
                return child.pid
        return None

    pid = wait_until(lowered, timeout, 0.05, "the daemon's verdict worker at SCHED_IDLE", retry_on=(OSError,))
    os.sched_setscheduler(pid, os.SCHED_OTHER, os.sched_param(0))
    return pid
