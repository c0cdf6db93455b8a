"""``hilrec coverage``: grid counts, KD-tree test coverage against data and against roll-outs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from hilrec.daemon.tools.coverage import States, dataset_states, measure, rollout_states
from hilrec.sim.recorder import RecordConfig, record


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("coverage") / "sim"
    record(RecordConfig(root=root, episodes=3, seed=10, cameras=(), push_rate=0.5), progress=False)
    return root


def test_a_dataset_covers_its_own_states_and_the_rollouts_of_its_own_seeds(sim: Path) -> None:
    data = dataset_states(sim)
    itself = measure(data, str(sim), test=data)
    assert itself.test_coverage == 1.0 and itself.farthest[0]["distance_std"] == 0.0
    same_seeds = rollout_states(range(10, 13), push_rate=0.5)
    np.testing.assert_array_equal(same_seeds.values, data.values)  # the recorder's own loop, seed for seed
    other = rollout_states(range(40, 42))
    result = measure(data, str(sim), test=other)
    assert result.test_coverage is not None and result.test_coverage < 1.0
    far = result.farthest[0]
    assert far["kind"] == "seed" and far["number"] in (40, 41) and far["distance_std"] > 0.5
    assert result.disturbed_episode_share > 0 and result.cube_cells_occupied == 3


def test_a_broader_dataset_measures_broader() -> None:
    rng = np.random.default_rng(0)
    narrow = States(values=rng.normal(0, 5, (4000, 6)), origin=[("episode", 0, 0)], episodes=1)
    broad = States(values=rng.normal(0, 30, (4000, 6)), origin=[("episode", 0, 0)], episodes=1)
    test = States(values=rng.normal(0, 30, (3000, 6)), origin=[("seed", 0, 0)], episodes=1)
    small, large = measure(narrow, "narrow", test=test), measure(broad, "broad", test=test)
    assert large.cell_share > small.cell_share
    assert large.test_coverage is not None and small.test_coverage is not None
    assert large.test_coverage > small.test_coverage


@pytest.mark.slow  # > 5 s (make test-fast leaves it out)
def test_100k_against_100k_states_takes_seconds() -> None:
    rng = np.random.default_rng(1)
    data = States(values=rng.normal(0, 1, (100_000, 6)), origin=[("episode", 0, 0)], episodes=1)
    test = States(values=rng.normal(0, 1, (100_000, 6)), origin=[("seed", 0, 0)], episodes=1)
    # An all-pairs loop would take hours: the suite's per-test timeout (pyproject) catches that.
    result = measure(data, "big", test=test)
    assert result.test_coverage is not None and 0.0 < result.test_coverage < 1.0


@pytest.mark.slow  # > 5 s (make test-fast leaves it out)
def test_the_command_writes_json_and_a_png(sim: Path, tmp_path: Path) -> None:
    png = tmp_path / "coverage.png"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "hilrec.daemon.cli",
            "coverage",
            str(sim),
            "--against-seeds",
            "10:12",
            "--json",
            "--plot",
            str(png),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["test"]["coverage"] == 1.0 and report["grid"]["cells_occupied"] > 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    bad = subprocess.run(
        [sys.executable, "-m", "hilrec.daemon.cli", "coverage", str(sim), "--pair", "elbow"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert bad.returncode == 2 and "--pair takes two of" in bad.stderr
