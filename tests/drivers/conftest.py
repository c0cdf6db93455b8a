"""Emulated SO-101 arms on real pseudo-terminals, for the driver tests.

Most tests use the first-order servo model (fast to build, no MuJoCo stepping). Buses keep the
SDK's reply timeout (about 34 ms at 1 Mbps): shorter ones made replies late on a loaded machine.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from support.emulators import serve_promptly, short_gil_switch

from hilrec.daemon.so101 import Role
from hilrec.drivers.bus import BusConfig, FeetechBus
from hilrec.drivers.calibration import save_calibration
from hilrec.drivers.emulated.emulator import EmulatedArm, EmulatorConfig


@pytest.fixture
def emulate() -> Iterator[Callable[..., EmulatedArm]]:
    """Start emulated arms, served promptly (tests/support/emulators.py):
    ``emulate(role="follower", motion="servo", clock=None, **config)``."""
    started: list[EmulatedArm] = []

    def start(
        role: str = "follower", *, clock: Callable[[], float] | None = None, **kwargs: Any
    ) -> EmulatedArm:
        kwargs.setdefault("motion", "servo")
        config = EmulatorConfig(role=Role(role), **kwargs)
        arm = EmulatedArm(config) if clock is None else EmulatedArm(config, clock=clock)
        started.append(arm)
        return serve_promptly(arm)

    with short_gil_switch():
        try:
            yield start
        finally:
            for arm in started:
                arm.stop()


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
