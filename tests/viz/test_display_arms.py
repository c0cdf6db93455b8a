"""``hilrec display`` of a two-arm daemon's telemetry (twelve values per vector, left arm first):
each arm's joints logged under its own name, ``state/left/<joint>`` and ``state/right/<joint>``,
with that arm's values. The daemon's side is tests/support/standin.py on the real wire."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from _daemon import Daemon, sim_config
from support.standin import ACTION, STATE, two_arm_wire

from hilrec.daemon.so101 import JOINT_NAMES

pytestmark = pytest.mark.slow

dataframe = pytest.importorskip("rerun.dataframe")


def values(path: Path, entity: str) -> np.ndarray:
    recording = dataframe.load_recording(str(path))
    table = recording.view(index="tick", contents=entity).select().read_all()
    column = next(n for n in table.column_names if n.startswith(entity + ":"))
    return np.asarray([v[0] for v in table.column(column).to_pylist() if v is not None])


@pytest.mark.timeout(180)
def test_display_logs_each_arm_under_its_name(tmp_path: Path) -> None:
    daemon = Daemon(tmp_path, sim_config(tmp_path / "ds"))
    out = tmp_path / "display.rrd"
    command = [sys.executable, "-m", "hilrec.daemon.cli", "display", "--config", str(daemon.config_path)]
    with two_arm_wire(daemon.config_path):
        process = subprocess.Popen([*command, "--rrd", str(out)], stdout=subprocess.PIPE, text=True)
        try:
            assert process.stdout is not None
            for line in process.stdout:  # its first joints logged; the test's timeout bounds it
                if "hilrec display: receiving" in line:
                    break
            process.send_signal(signal.SIGINT)
            process.communicate(timeout=60)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait(10)
    assert process.returncode == 0
    recording = dataframe.load_recording(str(out))
    found = {c.entity_path for c in recording.schema().component_columns()}
    for series, sent in (("state", STATE), ("action", ACTION), ("leader", ACTION)):
        for k, side in enumerate(("left", "right")):
            for j, joint in enumerate(JOINT_NAMES):
                logged = values(out, f"/{series}/{side}/{joint}")
                assert logged.size and set(logged) == {sent[6 * k + j]}, (series, side, joint)
    assert not {e for e in found if e.startswith(("/state/left_", "/state/shoulder"))}
