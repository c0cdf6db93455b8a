"""``hilrec collect``'s start-up errors come first and at once: a root the daemon would refuse is
refused before anything starts (the daemon's own rule), and a daemon that exits before serving
has its error line printed first, not buried at the end of its log."""

from __future__ import annotations

from pathlib import Path

import pytest
from _daemon import Daemon, sim_config
from test_collect_batch import collect

# Real daemons, processes or kill loops: the slow tier (make test runs it; make test-fast does not).
pytestmark = pytest.mark.slow


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else ""


def test_a_root_the_daemon_refuses_is_refused_before_anything_starts(tmp_path: Path) -> None:
    root = tmp_path / "ds"
    root.mkdir()
    (root / "notes.txt").write_text("not a dataset\n")
    config = Daemon(tmp_path, sim_config(root)).config_path
    log = root.parent / "ds.daemon.log"

    result = collect(config, "--episodes", "1", timeout_s=60)
    assert result.returncode == 2, result.stdout + result.stderr
    first = _first_line(result.stderr)
    assert first.startswith("hilrec collect: error: config key 'dataset.root': "), result.stderr
    assert "already exists and is not empty; pass --resume" in first
    assert "starting the daemon" not in result.stdout and not log.exists()

    resumed = collect(config, "--episodes", "1", "--resume", timeout_s=60)
    assert resumed.returncode == 2, resumed.stdout + resumed.stderr
    assert _first_line(resumed.stderr).startswith(
        f"hilrec collect: error: config key 'dataset.root': cannot resume {root}"
    )
    assert "starting the daemon" not in resumed.stdout and not log.exists()


def test_a_daemon_that_exits_before_serving_has_its_error_line_first(tmp_path: Path) -> None:
    root = tmp_path / "ds"
    missing = tmp_path / "no-such-serial-port"
    config = Daemon(
        tmp_path,
        f"""
mode = "hil"
fps = 25
[dataset]
root = "{root}"
[follower]
port = "{missing}"
calibration = "{tmp_path / "follower.json"}"
[leader]
source = "serial"
port = "{missing}"
calibration = "{tmp_path / "leader.json"}"
""",
    ).config_path
    result = collect(config, "--episodes", "1", timeout_s=120)
    assert result.returncode == 2, result.stdout + result.stderr
    first = _first_line(result.stderr)
    assert first.startswith("hilrec collect: error: the daemon exited with status 2 before serving: "), first
    cause = first.split("before serving: ", 1)[1]
    assert cause and "Traceback" not in cause and "INFO" not in cause, result.stderr
    assert len(result.stderr.strip().splitlines()) <= 3, result.stderr


def test_an_empty_task_is_refused_not_made_the_default(tmp_path: Path) -> None:
    root = tmp_path / "ds"
    config = Daemon(tmp_path, sim_config(root)).config_path
    result = collect(config, "--episodes", "1", "--task", "", timeout_s=60)
    assert result.returncode == 2, result.stdout + result.stderr
    assert _first_line(result.stderr) == (
        "hilrec collect: error: flag --task: must not be empty or only white space "
        "(leave --task out for the default task)"
    ), result.stderr
    assert "starting the daemon" not in result.stdout and not root.exists()
