"""The CPU share an emulated arm runs with, standalone (``hilrec emulate``) or under the daemon.

Emulated servos stand in for hardware, which answers within microseconds whatever the host is
doing. A client such as LeRobot waits about 34 ms for a status packet and does not retry, so an
emulator that a loaded machine leaves unscheduled for that long fails it ("There is no status
packet!"). Both ways of starting an emulator therefore ask for the same treatment:

- ``SCHED_OTHER``, never a real-time policy, even when started from the daemon's real-time loop
  thread: a Python process with library thread pools that spin-wait can livelock a core under
  ``SCHED_FIFO``;
- nice ``EMULATOR_NICE`` (-10), set absolutely (``setpriority``), so applying it twice (the
  daemon's pre-exec hook, then ``hilrec emulate`` itself) stays -10.

A negative nice needs root, ``CAP_SYS_NICE`` or an ``RLIMIT_NICE`` allowance (``ulimit -e``,
``/etc/security/limits.conf``). Without one the emulator keeps nice 0 and says so: its replies
are then only as punctual as the machine is idle.

Linux nice values belong to threads, and a new thread inherits its creator's. Between fork and
exec (the daemon's ``preexec_fn``) the process has one thread and the call makes only system
calls; ``hilrec emulate`` asks for ``all_threads``, because imports have already started some
(numpy's BLAS pool), and then starts the serving thread.
"""

from __future__ import annotations

import contextlib
import os

EMULATOR_NICE = -10


def raise_emulator_priority(*, all_threads: bool = False) -> str | None:
    """Apply the emulator's scheduling to the calling thread (or to every thread of the process).
    Returns None, or why the nice value was not applied."""
    threads = [int(tid) for tid in os.listdir("/proc/self/task")] if all_threads else [0]
    try:
        for tid in threads:
            with contextlib.suppress(OSError):  # already SCHED_OTHER in every ordinary case
                os.sched_setscheduler(tid, os.SCHED_OTHER, os.sched_param(0))
            with contextlib.suppress(ProcessLookupError):  # a thread that has just ended
                os.setpriority(os.PRIO_PROCESS, tid, EMULATOR_NICE)
    except OSError as exc:
        return (
            f"could not set nice {EMULATOR_NICE} ({exc.strerror}): the emulated servos run at "
            f"nice {os.getpriority(os.PRIO_PROCESS, 0)} and may answer late on a loaded machine "
            "(a client that does not retry, like LeRobot, then fails with 'There is no status "
            "packet!'). Run it as root, give python CAP_SYS_NICE, or allow the user nice -10 "
            "(RLIMIT_NICE 30: `ulimit -e 30`, or '<user> - nice -10' in /etc/security/limits.conf)"
        )
    return None
