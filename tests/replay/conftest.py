"""Datasets recorded through the emulated follower (pty, STS3215 registers)."""

from __future__ import annotations

from pathlib import Path

import pytest
from _recordings import Frozen, RecordingSpec, make_twin, record_emulated, write_native

CLEAN_HARDWARE = (RecordingSpec(seed=0, frames=100), RecordingSpec(seed=2, frames=100))
# A clean take, a servo that jams at frame 60 (diverged), a follower 70 ms late (lagging).
MIXED_HARDWARE = (
    RecordingSpec(seed=0, frames=100),
    RecordingSpec(seed=10, frames=100, frozen=Frozen("elbow_flex", 60)),
    RecordingSpec(seed=1, frames=100, latency_ms=70.0),
)


def _emulated_dataset(work: Path, specs: tuple[RecordingSpec, ...]) -> Path:
    episodes = [record_emulated(spec, work) for spec in specs]
    return write_native(work / "dataset", episodes, make_twin())


@pytest.fixture(scope="session")
def clean_hardware_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two clean takes of the emulated follower: the hardware replay finds both consistent."""
    return _emulated_dataset(tmp_path_factory.mktemp("hardware-clean"), CLEAN_HARDWARE)


@pytest.fixture(scope="session")
def mixed_hardware_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Consistent, diverged and lagging takes of the emulated follower, in that order."""
    return _emulated_dataset(tmp_path_factory.mktemp("hardware-mixed"), MIXED_HARDWARE)
