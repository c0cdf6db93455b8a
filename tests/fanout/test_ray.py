"""--ray ADDRESS: the same per-episode tasks on a Ray cluster (a local one on loopback)."""

from __future__ import annotations

from pathlib import Path

import pytest
from _snapshot import differences, record, seeds_of, snapshot

from hilrec.daemon.dataset.format.reader import load_info
from hilrec.daemon.fanout import run_tasks

# Real daemons, processes or kill loops: the slow tier (make test runs it; make test-fast does not).
pytestmark = pytest.mark.slow

EPISODE_FLAGS = ("--cameras", "front", "--size", "64x48", "--pushes", "0.5")


def test_ray_records_the_bytes_of_the_process_pool(tmp_path: Path, ray_address: str) -> None:
    pool, ray = tmp_path / "pool", tmp_path / "ray"
    assert record(pool, "--episodes", "3", "--workers", "2", *EPISODE_FLAGS) == 0
    assert record(ray, "--episodes", "3", "--ray", ray_address, *EPISODE_FLAGS) == 0
    assert seeds_of(ray) == [0, 1, 2]
    assert differences(snapshot(pool), snapshot(ray)) == []


def test_a_failing_ray_task_is_an_outcome_with_its_own_error(tmp_path: Path, ray_address: str) -> None:
    root = tmp_path / "ds"
    assert record(root, "--episodes", "1", "--cameras", "none") == 0
    outcomes = run_tasks(load_info, [root, tmp_path / "missing"], ray_address=ray_address)
    assert outcomes[0].error is None and outcomes[0].result == load_info(root)
    assert outcomes[1].result is None
    # The task's exception itself (type: message), not Ray's wrapper with a remote traceback.
    assert outcomes[1].error is not None and outcomes[1].error.startswith("CorruptDatasetError: ")
    assert "missing" in outcomes[1].error and "Traceback" not in outcomes[1].error
