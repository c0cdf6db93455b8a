"""The page's tests start real daemons with the daemon tests' helper (tests/daemon/_daemon.py)."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "daemon"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _daemon import Daemon
from _ui import Ui


@pytest.fixture
def daemons() -> Iterator[Callable[[Daemon], Daemon]]:
    started: list[Daemon] = []

    def start(daemon: Daemon) -> Daemon:
        started.append(daemon)
        return daemon.start()

    yield start
    for daemon in started:
        daemon.close()


@pytest.fixture
def uis() -> Iterator[Callable[[Ui], Ui]]:
    started: list[Ui] = []

    def start(ui: Ui) -> Ui:
        started.append(ui)
        return ui.start()

    yield start
    for ui in started:
        ui.close()
