"""One two-arm sim dataset, recorded once for the tests of this folder."""

from __future__ import annotations

from pathlib import Path

import pytest

from hilrec.daemon.cli import main

EPISODES = 3


@pytest.fixture(scope="session")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``hilrec record --sim --arms 2 --episodes 3 --cameras front``, at a small image size."""
    root = tmp_path_factory.mktemp("bimanual") / "ds"
    argv = ["record", "--sim", "--arms", "2", "--episodes", str(EPISODES), "--cameras", "front"]
    code = main([*argv, "--size", "64x48", "--root", str(root), "--no-progress"])
    assert code == 0
    return root
