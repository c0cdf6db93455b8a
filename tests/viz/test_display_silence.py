"""``hilrec display`` with no daemon behind its telemetry socket says so after a few seconds
(a SUB socket connects to nothing without an error), and goes on listening."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from _daemon import free_ports

pytest.importorskip("rerun")


@pytest.mark.slow
def test_nothing_arriving_is_said(tmp_path: Path) -> None:
    (port,) = free_ports(1)
    endpoint = f"tcp://127.0.0.1:{port}"
    done = subprocess.run(
        [
            *(sys.executable, "-m", "hilrec.daemon.cli", "display", "--telemetry", endpoint),
            *("--rrd", str(tmp_path / "out.rrd"), "--duration", "8"),
        ],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    said = [ln for ln in done.stdout.splitlines() if "nothing received" in ln]
    assert len(said) == 1, done.stdout
    assert f"nothing received from {endpoint} in 5 s: is a daemon running there" in said[0]
