"""``hilrec collect --config configs/bimanual-emulated.toml --episodes 2`` without a terminal: the
daemon it starts runs four emulated arms, the dataset passes check, and each verdict judges both
arms and names them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from _daemon import check_passes, free_ports

from hilrec.daemon.dataset.format.reader import load_episodes, load_info
from hilrec.daemon.dataset.format.sidecar import load_episode_sidecar

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]


def _shipped_config(tmp_path: Path) -> Path:
    """configs/bimanual-emulated.toml on free ports, a small camera, into ``tmp_path``."""
    text = (REPO / "configs" / "bimanual-emulated.toml").read_text()
    control, telemetry, leader = free_ports(3)
    for old, new in [
        ('root = "data/so101_bimanual_emulated"', f'root = "{tmp_path / "ds"}"'),
        ("control_port = 5555", f"control_port = {control}"),
        ("telemetry_port = 5556", f"telemetry_port = {telemetry}"),
        ("leader_port = 5557", f"leader_port = {leader}"),
        ("width = 320", "width = 64"),
        ("height = 240", "height = 48"),
        ("stall_ms = 1000", "stall_ms = 5000"),
        # A shared 2-core machine stalls four emulators at times: marked frames, not a lost arm.
        ("max_failed_ticks = 5", "max_failed_ticks = 50"),
        ("bus_reply_timeout_ms = 10.0", "bus_reply_timeout_ms = 30.0"),
    ]:
        assert old in text, old
        text = text.replace(old, new)
    path = tmp_path / "bimanual-emulated.toml"
    path.write_text(text)
    return path


def test_collect_two_episodes_on_four_emulated_arms_with_a_verdict_per_arm(tmp_path: Path) -> None:
    config = _shipped_config(tmp_path)
    argv = ["collect", "--config", str(config), "--episodes", "2", "--no-sounds"]
    result = subprocess.run(
        [sys.executable, "-m", "hilrec.daemon.cli", *argv, "--episode-time-s", "3", "--reset-time-s", "0.5"],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=500,
        check=False,
    )
    out = result.stdout
    assert result.returncode == 0, out + result.stderr
    assert "no terminal on stdin" in out and "collect: 2 take(s) kept" in out
    root = tmp_path / "ds"
    check_passes(root)
    assert load_info(root)["robot_type"] == "bi_so_follower"
    judged = 0
    for episode in load_episodes(root):
        meta, _ = load_episode_sidecar(root, episode["episode_index"])
        assert meta is not None
        verdict = meta.get("verdict")
        if verdict is None:  # not judged before the daemon stopped (a loaded machine): no claim
            continue
        judged += 1
        replay = verdict["details"]["replay"]
        assert set(replay["arms"]) == {"left", "right"}, replay
        assert "left arm" in verdict["summary"] or "right arm" in verdict["summary"], verdict
        if verdict["verdict"] == "sound":
            assert "left arm" in verdict["summary"] and "right arm" in verdict["summary"]
    assert judged >= 1, out
