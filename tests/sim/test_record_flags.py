"""record --sim and render: --size is WxH (as video tools write it); Ctrl-C keeps what is saved."""

from __future__ import annotations

import json
import os
import shlex
import sys
import time
from pathlib import Path

import pexpect
import pytest

from hilrec.daemon.cli import main
from hilrec.daemon.dataset.format.reader import load_episodes, load_info, probe_video, video_file_path
from hilrec.daemon.dataset.store.journal import EPISODE_META, episode_dir
from hilrec.sim.cmd_record import _rerun_hint
from hilrec.sim.record_workers import scratch_dirs
from hilrec.sim.recorder import RecordConfig
from hilrec.sim.scene import SceneConfig

# Real daemons, processes or kill loops: the slow tier (make test runs it; make test-fast does not).
pytestmark = pytest.mark.slow

HILREC = str(Path(sys.executable).with_name("hilrec"))
FRONT = "observation.images.front"
SAVED_WITHIN_S = 120.0


def _record(root: Path, *flags: str) -> int:
    return main(["record", "--sim", "--root", str(root), "--episodes", "1", "--no-progress", *flags])


def _shape_on_disk(root: Path, key: str = FRONT) -> tuple[list[int], tuple[int, int]]:
    info = load_info(root)
    video = probe_video(video_file_path(root, info, load_episodes(root)[0], key))
    return info["features"][key]["shape"], (video.height, video.width)


@pytest.mark.parametrize(("size", "height", "width"), [("80x48", 48, 80), ("48x80", 80, 48)])
def test_size_is_width_by_height_and_the_summary_names_the_shape(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], size: str, height: int, width: int
) -> None:
    root = tmp_path / "ds"
    assert _record(root, "--size", size) == 0
    assert _shape_on_disk(root) == ([height, width, 3], (height, width))
    assert f"images {width}x{height} (WxH), {height} rows of {width} pixels" in capsys.readouterr().out


def test_render_size_is_width_by_height(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root, out = tmp_path / "ds", tmp_path / "rendered"
    assert _record(root, "--cameras", "none") == 0
    assert main(["render", str(root), "--out", str(out), "--camera", "front", "--size", "64x48"]) == 0
    assert _shape_on_disk(out) == ([48, 64, 3], (48, 64))
    assert "images 64x48 (WxH), 48 rows of 64 pixels" in capsys.readouterr().out


def test_a_size_that_is_not_wxh_names_the_flag(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert _record(tmp_path / "ds", "--size", "640") == 2
    assert "flag --size: expected WxH (width x height) such as 640x480" in capsys.readouterr().err


@pytest.mark.parametrize("workers", ["1", "2"])
def test_ctrl_c_keeps_the_saved_episodes_and_finalizes(tmp_path: Path, workers: str) -> None:
    root = tmp_path / "ds"
    argv = ["record", "--sim", "--root", str(root), "--episodes", "6", "--cameras", "none"]
    # --realtime: an episode lasts ~5 s, so the run is surely still going when Ctrl-C comes.
    argv += ["--realtime", "--no-progress", "--workers", workers]
    child = pexpect.spawn(HILREC, argv, env=dict(os.environ), encoding="utf-8", timeout=60)
    try:
        _wait_for_saved_episode(root, child)
        child.sendintr()  # Ctrl-C on the terminal: SIGINT to the whole foreground process group
        child.expect(r"interrupted: (\d+) episodes kept in (\S+), finalized")
        kept, where = int(child.match.group(1)), child.match.group(2)
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    assert child.exitstatus == 130
    assert where == str(root)
    assert 1 <= kept < 6
    assert load_info(root)["total_episodes"] == kept
    assert main(["check", str(root)]) == 0
    assert scratch_dirs(root) == []  # killed workers leave no scratch, wherever it was


def _wait_for_saved_episode(root: Path, child: pexpect.spawn) -> None:
    """Polls the journal until episode 0 is committed (its episode.json is there)."""
    deadline = time.monotonic() + SAVED_WITHIN_S
    while not (episode_dir(root, 0) / EPISODE_META).is_file():
        assert child.isalive(), child.before
        assert time.monotonic() < deadline, f"no episode saved in {root} within {SAVED_WITHIN_S} s"
        time.sleep(0.05)  # a poll interval: the condition is checked, not assumed


def _seeds(root: Path) -> list[int]:
    paths = sorted((root / "hilrec" / "episodes").glob("episode-*.json"))
    return [json.loads(p.read_bytes())["sim"]["seed"] for p in paths]


def test_resume_goes_on_after_the_highest_seed(tmp_path: Path) -> None:
    root = tmp_path / "ds"
    assert _record(root, "--cameras", "none", "--seed", "3") == 0
    # One episode in the dataset, but seed 1 was never its next: 3 was used, 4 is.
    assert _record(root, "--cameras", "none", "--resume") == 0
    assert _seeds(root) == [3, 4]


def test_the_rerun_hint_gives_the_push_rate_unrounded(tmp_path: Path) -> None:
    config = RecordConfig(
        root=tmp_path / "ds", episodes=1, push_rate=1 / 3, scene=SceneConfig(timestep=1 / 210)
    )
    argv = shlex.split(_rerun_hint(config, [2]))
    flags = dict(arg.split("=", 1) for arg in argv if "=" in arg)
    assert float(flags["--pushes"]) == 1 / 3
    assert float(flags["--timestep"]) == 1 / 210
