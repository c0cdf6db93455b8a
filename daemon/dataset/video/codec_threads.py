"""Keep a codec out of real-time scheduling.

SVT-AV1 (LeRobot's libsvtav1) raises itself to ``SCHED_FIFO`` priority 99 wherever the process
may (root, ``CAP_SYS_NICE`` or an rtprio limit): its worker threads, and the very thread that
opened it. Measured in the daemon: 96 encoder threads at FIFO 99 above the loop's FIFO 10, so two
640x480 cameras took the CPU the loop needed (jitter p99 10-13 ms, missed deadlines, bus reads
retried), in the daemon's process and in the encoder processes alike. An encoder is background
work: :class:`CodecThreads` notes the encoding thread's policy before the codec opens, and puts
that thread back and the codec's new threads at it (``SCHED_OTHER`` in the writer, ``SCHED_IDLE``
in an encoder process; ``SCHED_OTHER`` when the encoding thread itself is real-time).
"""

from __future__ import annotations

import contextlib
import os

_REAL_TIME = (os.SCHED_FIFO, os.SCHED_RR)


def thread_ids() -> set[int]:
    try:
        return {int(tid) for tid in os.listdir("/proc/self/task")}
    except OSError:  # not Linux: nothing to watch
        return set()


class CodecThreads:
    """Made on the thread that will encode, before the codec opens; :meth:`settle` after each
    call that may have started codec threads."""

    def __init__(self) -> None:
        self._before = thread_ids()
        self._policy = os.sched_getscheduler(0)
        self._param = os.sched_getparam(0)

    def settle(self) -> int:
        """Put the encoding thread back to its own policy, and every real-time thread the codec
        started to it (to SCHED_OTHER if that policy is real-time); how many were changed."""
        changed = 0
        with contextlib.suppress(OSError):
            # Only a raise to real time is undone: another change (an encoder process hurried
            # to SCHED_OTHER while a save waits on it) is someone else's to make.
            now = os.sched_getscheduler(0), os.sched_getparam(0)
            if now[0] in _REAL_TIME and now != (self._policy, self._param):
                os.sched_setscheduler(0, self._policy, self._param)
                changed += 1
        policy, param = self._policy, self._param
        if policy in _REAL_TIME:
            policy, param = os.SCHED_OTHER, os.sched_param(0)
        for tid in thread_ids() - self._before:
            with contextlib.suppress(OSError):  # ended meanwhile
                if os.sched_getscheduler(tid) in _REAL_TIME:
                    os.sched_setscheduler(tid, policy, param)
                    changed += 1
        return changed
