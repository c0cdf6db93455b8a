"""``hilrec rollout``'s bad flags: each is refused at once, before a daemon starts, with a message
naming the flag; and the daemon's own policy flags (which rollout passes it) are checked the
same way."""

from __future__ import annotations

from pathlib import Path

import pytest
from _daemon import Daemon, emulated_config, run_cli

POLICIES = Path(__file__).resolve().parents[1] / "policy" / "_policies.py"
HIL = """
mode = "hil"
fps = 25
[dataset]
root = "{root}"
[follower]
port = "/dev/ttyACM0"
[leader]
source = "remote"
"""


def rollout(config: Path, *flags: str) -> tuple[int, str]:
    done = run_cli("rollout", "--config", str(config), "--episodes", "1", "--no-sounds", *flags, timeout_s=60)
    return done.returncode, done.stdout + done.stderr


@pytest.fixture
def config(tmp_path: Path) -> Path:
    return Daemon(tmp_path, emulated_config(tmp_path / "ds")).config_path


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (("--policy", "not-a-spec"), "flag --policy: 'not-a-spec' is neither a LeRobot pretrained"),
        (("--policy", "missing.py:act"), "flag --policy: 'missing.py:act': no file missing.py"),
        (
            ("--policy", f"{POLICIES}:hold_still", "--record", "corrections", "--takeover", "off"),
            "flag --record: recording only the corrections needs a takeover",
        ),
        (
            ("--policy", f"{POLICIES}:hold_still", "--takeover", "elbow"),
            "--takeover: invalid choice: 'elbow'",
        ),
        (("--policy", f"{POLICIES}:hold_still", "--task", ""), "flag --task:"),
        (
            ("--policy", f"{POLICIES}:hold_still", "--episode-time-s", "0"),
            "--episode-time-s: must be positive",
        ),
    ],
)
@pytest.mark.slow
def test_a_bad_flag_is_named_and_no_daemon_starts(config: Path, flags: tuple[str, ...], said: str) -> None:
    code, out = rollout(config, *flags)
    assert code == 2, out
    assert said in out, out
    assert "Traceback" not in out
    assert not (config.parent / "ds.daemon.log").exists()  # refused before anything started


@pytest.mark.slow
def test_expert_takeover_is_refused_in_hil_mode(tmp_path: Path) -> None:
    config = tmp_path / "hil.toml"
    config.write_text(HIL.format(root=tmp_path / "ds"))
    code, out = rollout(config, "--policy", f"{POLICIES}:hold_still", "--takeover", "expert")
    assert code == 2 and "flag --takeover: expert is the scripted hand of sim and emulated mode" in out, out


@pytest.mark.slow
def test_the_daemons_policy_flags_are_checked_and_named(config: Path) -> None:
    done = run_cli(
        "daemon", "--config", str(config), "--policy", "x:y", "--takeover", "sometimes", timeout_s=60
    )
    assert done.returncode == 2
    assert "flag --takeover: expected one of key, leader, expert, off, got 'sometimes'" in done.stderr, (
        done.stderr
    )
    done = run_cli(
        "daemon",
        "--config",
        str(config),
        "--policy",
        "x:y",
        "--takeover",
        "off",
        "--policy-record",
        "corrections",
    )
    assert done.returncode == 2 and "flag --policy-record: recording only the corrections" in done.stderr
