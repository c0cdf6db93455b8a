"""``view --spawn`` run as ``.venv/bin/hilrec`` (PATH without .venv/bin): the viewer is found where
``--serve`` finds it; with no screen it is refused at once, in one line, under the right name."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("rerun")


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from hilrec.sim.recorder import RecordConfig, record

    root = tmp_path_factory.mktemp("spawn") / "sim"
    record(RecordConfig(root=root, episodes=1, seed=3, image_size=(48, 64), video_codec="libx264"))
    return root


def hilrec(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """The console script itself, as a person runs it without activating the venv."""
    script = Path(sys.executable).with_name("hilrec")
    return subprocess.run(
        [str(script), *args], capture_output=True, text=True, timeout=180, env=env, check=False
    )


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY")}
    return {**env, "PATH": "/usr/bin:/bin", **extra}


@pytest.mark.slow
def test_no_screen_is_refused_in_one_line_under_view(dataset: Path) -> None:
    done = hilrec("view", str(dataset), "--spawn", env=_env())
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("hilrec view: error: flag --spawn: there is no screen"), lines[0]
    assert "--rrd" in lines[0] and "--serve" in lines[0]


@pytest.mark.slow
def test_the_viewer_is_found_without_venv_bin_on_path(dataset: Path) -> None:
    # A screen that is not there: the viewer binary starts (and cannot open it) rather than
    # not being found at all, as rerun's own spawn() did, looking only on PATH.
    done = hilrec("view", str(dataset), "--spawn", "--no-replay", env=_env(DISPLAY=":97"))
    said = done.stdout + done.stderr
    assert "Failed to find Rerun Viewer executable" not in said, said
    assert "hilrec display" not in said, said  # every line under the command's own name
