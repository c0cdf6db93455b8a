"""``hilrec view`` of a two-arm dataset: each arm's joints under its own name (``state/left/...``,
``state/right/...``) and a layout with the two arms' plots side by side, read back from the
``.rrd`` with rerun's own dataframe API and its ``rrd print``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from hilrec.daemon.dataset.format.reader import load_episodes, read_episode
from hilrec.daemon.so101 import JOINT_NAMES, STATE_KEY

rr = pytest.importorskip("rerun")
dataframe = pytest.importorskip("rerun.dataframe")


def logged(path: Path, entity: str) -> np.ndarray:
    recording = dataframe.load_recording(str(path))
    table = recording.view(index="frame", contents=entity).select().read_all()
    column = next(n for n in table.column_names if n.startswith(entity + ":"))
    return np.asarray([v[0] for v in table.column(column).to_pylist() if v is not None], dtype=np.float64)


@pytest.mark.slow
def test_view_groups_the_joints_per_arm_and_lays_the_arms_side_by_side(
    recorded: Path, tmp_path: Path
) -> None:
    from hilrec.daemon.viz.sink import _viewer_binary

    out = tmp_path / "view.rrd"
    command = [
        sys.executable,
        "-m",
        "hilrec.daemon.cli",
        "view",
        str(recorded),
        "--episode",
        "1",
        "--rrd",
        str(out),
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    recording = dataframe.load_recording(str(out))
    found = {c.entity_path for c in recording.schema().component_columns()}
    per_arm = {
        f"/{s}/{side}/{j}" for s in ("state", "action") for side in ("left", "right") for j in JOINT_NAMES
    }
    assert per_arm <= found, sorted(found)
    assert not {e for e in found if e.startswith("/state/left_")}  # not the flat column names
    # Each arm's plot holds that arm's column: right_elbow_flex is state[:, 8].
    state = read_episode(recorded, 1, [STATE_KEY])[STATE_KEY]
    assert len(state) == int(load_episodes(recorded)[1]["length"])
    np.testing.assert_array_equal(logged(out, "/state/right/elbow_flex"), state[:, 8].astype(np.float64))
    np.testing.assert_array_equal(logged(out, "/state/left/elbow_flex"), state[:, 2].astype(np.float64))
    printed = subprocess.run(
        [_viewer_binary("--rrd"), "rrd", "print", "-vvv", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert printed.returncode == 0, printed.stderr
    assert "[left arm]" in printed.stdout and "[right arm]" in printed.stdout  # the blueprint's two views
