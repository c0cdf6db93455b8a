"""The CPU share an emulated arm runs with, standalone (``hilrec emulate``) or under the daemon.

Emulated servos stand in for hardware, which answers within microseconds whatever the host is
doing. A client such as LeRobot waits about 34 ms for a status packet and does not retry, so an
emulator that a loaded machine leaves unscheduled for that long fails it ("There is no status
packet!"). Both ways of starting an emulator therefore ask for the same treatment:

- the one thread that answers the bus runs ``SCHED_FIFO`` at the lowest real-time priority
  (``EMULATOR_RT_PRIORITY``). A nice value alone is not enough: with sched autogroups (on by
  default in most distributions) nice orders threads only within one login session, and a
  busy process in another terminal took the emulator's CPU for 40-100 ms (p99 of the reply
  time 39 ms under load; 3.8 ms with this policy, measured on 2 cores);
- every other thread stays ``SCHED_OTHER``, even when started from the daemon's real-time loop
  thread: library thread pools that spin-wait can livelock a core under ``SCHED_FIFO``. The
  serving thread never spins (it sleeps in ``select``), and the kernel's real-time throttling
  keeps a share of every CPU for the rest;
- nice ``EMULATOR_NICE`` (-10) for every thread, set absolutely (``setpriority``), so applying
  it twice (the daemon's pre-exec hook, then ``hilrec emulate`` itself) stays -10.

Both need root, ``CAP_SYS_NICE`` or an rlimit allowance (``ulimit -r 1`` for the real-time
priority, ``ulimit -e 30`` for the nice value, or ``/etc/security/limits.conf``). Without them
the emulator runs as it can and says so: its replies are then only as punctual as the machine
is idle.

Linux nice values and policies belong to threads, and a new thread inherits its creator's.
Between fork and exec (the daemon's ``preexec_fn``) the process has one thread and the call
makes only system calls; ``hilrec emulate`` asks for ``all_threads``, because imports have
already started some (numpy's BLAS pool), and gives the serving thread its policy once started.
"""

from __future__ import annotations

import contextlib
import os

EMULATOR_NICE = -10
EMULATOR_RT_PRIORITY = 1  # the lowest: any real-time thread of the daemon's (its loop) goes first


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


def raise_serving_thread(native_id: int) -> str | None:
    """Give the thread that answers the bus (``threading.Thread.native_id``) ``SCHED_FIFO`` at
    ``EMULATOR_RT_PRIORITY``. Returns None, or why it was not applied."""
    try:
        os.sched_setscheduler(native_id, os.SCHED_FIFO, os.sched_param(EMULATOR_RT_PRIORITY))
    except OSError as exc:
        return (
            f"could not run the serving thread at real-time priority {EMULATOR_RT_PRIORITY} "
            f"({exc.strerror}): a busy process in another login session can then delay a reply "
            "past a client's 34 ms (LeRobot: 'There is no status packet!'). Run it as root, give "
            "python CAP_SYS_NICE, or allow the user real-time priority 1 (RLIMIT_RTPRIO: "
            "`ulimit -r 1`, or '<user> - rtprio 1' in /etc/security/limits.conf)"
        )
    return None
