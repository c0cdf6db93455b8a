"""An emulated arm in the test's own process, served as ``hilrec emulate`` and the daemon serve
theirs, so that test workers running side by side (pytest -n) cannot starve it past a client's
reply timeout.

Two things make an in-process emulator answer in time on a loaded machine:

- its bus-answering thread runs at real-time priority (``raise_serving_thread``), as the
  standalone emulator's does;
- the GIL switch interval is short: the SDK's client spins on the GIL while it waits for a reply,
  and a short interval hands the GIL to the emulator's thread within a fraction of a millisecond,
  not 5 ms.

A test that started its emulator without them failed a sync read after its three attempts
(``There is no status packet!``) in a clean-clone ``make test`` at four workers.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator

from hilrec.drivers.emulated.emulator import EmulatedArm
from hilrec.drivers.emulated.priority import raise_serving_thread

GIL_SWITCH_S = 0.0005


def serve_promptly(arm: EmulatedArm) -> EmulatedArm:
    """Start ``arm`` and put its serving thread at real-time priority."""
    arm.start()
    assert arm._thread is not None and arm._thread.native_id is not None
    raise_serving_thread(arm._thread.native_id)
    return arm


@contextlib.contextmanager
def short_gil_switch() -> Iterator[None]:
    """The GIL switch interval at :data:`GIL_SWITCH_S` inside the block, as it was after it."""
    switch = sys.getswitchinterval()
    sys.setswitchinterval(GIL_SWITCH_S)
    try:
        yield
    finally:
        sys.setswitchinterval(switch)


@contextlib.contextmanager
def served(arm: EmulatedArm) -> Iterator[EmulatedArm]:
    """``arm`` started and served promptly for the block, stopped after it."""
    with short_gil_switch():
        try:
            yield serve_promptly(arm)
        finally:
            arm.stop()
