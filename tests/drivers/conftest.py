"""Emulated SO-101 arms on real pseudo-terminals, for the driver tests.

Most tests use the first-order servo model (fast to build, no MuJoCo stepping). Buses keep the
SDK's reply timeout (about 34 ms at 1 Mbps): shorter ones made replies late on a loaded machine.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from hilrec.daemon.so101 import Role
from hilrec.drivers.bus import BusConfig, FeetechBus
from hilrec.drivers.calibration import save_calibration
from hilrec.drivers.emulated.emulator import EmulatedArm, EmulatorConfig
from hilrec.drivers.emulated.priority import raise_serving_thread

GIL_SWITCH_S = 0.0005


@pytest.fixture
def emulate() -> Iterator[Callable[..., EmulatedArm]]:
    """Start emulated arms: ``emulate(role="follower", motion="servo", **config)``."""
    started: list[EmulatedArm] = []
    # The SDK's client spins on the GIL while it waits for a reply; a short switch interval hands
    # the GIL to the emulator's thread within a fraction of a millisecond, not 5 ms.
    switch = sys.getswitchinterval()
    sys.setswitchinterval(GIL_SWITCH_S)

    def start(role: str = "follower", **kwargs: Any) -> EmulatedArm:
        kwargs.setdefault("motion", "servo")
        arm = EmulatedArm(EmulatorConfig(role=Role(role), **kwargs))
        arm.start()
        started.append(arm)
        # As `hilrec emulate` and the daemon serve theirs: the bus-answering thread at real-time
        # priority, so that test workers running side by side (pytest -n) cannot starve it past
        # the client's 34 ms reply timeout.
        assert arm._thread is not None and arm._thread.native_id is not None
        raise_serving_thread(arm._thread.native_id)
        return arm

    try:
        yield start
    finally:
        for arm in started:
            arm.stop()
        sys.setswitchinterval(switch)


@pytest.fixture
def follower_emu(emulate: Callable[..., EmulatedArm]) -> EmulatedArm:
    return emulate("follower")


@pytest.fixture
def bus(follower_emu: EmulatedArm) -> Iterator[FeetechBus]:
    with FeetechBus(BusConfig(port=follower_emu.port)) as bus:
        yield bus


@pytest.fixture
def calibration_file(tmp_path: Path, follower_emu: EmulatedArm) -> Path:
    """The emulated arm's calibration as a LeRobot file (what `hilrec emulate
    --write-calibration` writes)."""
    return save_calibration(follower_emu.frame.calibration, tmp_path / "so101.json")
