"""`hilrec calibrate --arm left|right`: the two sides of a two-arm bench, calibrated one after the
other as a person does it (Enter on a real pty, with pexpect), get a file each, named as LeRobot
0.4.4's bi_so_leader names them (``<id>_left`` / ``<id>_right``), where its BiSOLeader reads them."""

from __future__ import annotations

import json
import os
import sys
from dataclasses import replace
from pathlib import Path

import pexpect
import pytest
from lerobot.teleoperators.bi_so_leader import BiSOLeader, BiSOLeaderConfig
from lerobot.teleoperators.so_leader import SOLeaderConfig

from hilrec.drivers.calibration import (
    ArmCalibration,
    arm_calibration_id,
    default_arm_id,
    load_calibration,
    save_calibration,
)
from hilrec.drivers.emulated.emulator import EmulatedArm
from hilrec.sim import units

# The right arm's servos were mounted a little differently: other homing offsets, so a file
# written for the wrong side is told apart.
RIGHT_SHIFT = {"shoulder_pan": 60, "elbow_flex": -45, "gripper": 30}


def expected_file(emu: EmulatedArm) -> dict:
    expected = json.loads(emu.frame.calibration.to_json())
    expected["wrist_roll"].update(range_min=0, range_max=4095)  # LeRobot's full-turn joint
    return expected


def shifted_calibration(path: Path) -> Path:
    base = ArmCalibration.from_mapping(units.emulated_calibration(), source="emulated")
    motors = {
        name: replace(cal, homing_offset=cal.homing_offset + RIGHT_SHIFT.get(name, 0))
        for name, cal in base.items()
    }
    return save_calibration(replace(base, motors=motors), path)


def calibrate(port: str, arm: str, env: dict[str, str]) -> str:
    """Run ``hilrec calibrate leader --arm ARM`` as a person: Enter at the middle; returns its output."""
    argv = ["-m", "hilrec.daemon.cli", "calibrate", "leader", "--arm", arm, "--port", port]
    argv += ["--duration", "2.5"]
    child = pexpect.spawn(sys.executable, argv, encoding="utf-8", timeout=60, env=env)
    try:
        child.expect(f"Move the {arm} leader to the middle of its range of motion and press ENTER")
        child.sendline("")
        child.expect(f"Calibration of the {arm} leader saved to ([^\r\n]+)\r\n")
        saved = str(child.match.group(1))
        child.expect(pexpect.EOF)
    finally:
        child.close()
    assert child.exitstatus == 0, child.before
    return saved


@pytest.mark.slow  # > 5 s (make test-fast leaves it out)
def test_each_arm_gets_its_own_file_where_lerobots_bi_so_leader_reads_it(emulate, tmp_path: Path) -> None:
    arms = {
        "left": emulate("leader", motion="sweep", factory_fresh=True),
        "right": emulate(
            "leader", motion="sweep", factory_fresh=True, calibration=shifted_calibration(tmp_path / "r.json")
        ),
    }
    assert expected_file(arms["left"]) != expected_file(arms["right"])
    root = tmp_path / "calibration"
    env = {**os.environ, "HF_LEROBOT_CALIBRATION": str(root)}
    folder = root / "teleoperators" / "so_leader"
    for side, emu in arms.items():
        saved = calibrate(emu.port, side, env)
        assert saved == str(folder / f"so101_leader_{side}.json")
        assert default_arm_id("leader", side) == arm_calibration_id("so101_leader", side)
    assert sorted(p.name for p in folder.iterdir()) == ["so101_leader_left.json", "so101_leader_right.json"]
    for side, emu in arms.items():
        assert json.loads((folder / f"so101_leader_{side}.json").read_text()) == expected_file(emu), side

    # LeRobot's own two-arm leader with the pair's id finds each side's file, and reads what was written.
    leader = BiSOLeader(
        BiSOLeaderConfig(
            id="so101_leader",
            calibration_dir=folder,
            left_arm_config=SOLeaderConfig(port=arms["left"].port),
            right_arm_config=SOLeaderConfig(port=arms["right"].port),
        )
    )
    for side, one in (("left", leader.left_arm), ("right", leader.right_arm)):
        assert one.calibration_fpath == folder / f"so101_leader_{side}.json"
        ours = load_calibration(one.calibration_fpath)
        assert {k: v.homing_offset for k, v in one.calibration.items()} == {
            k: v.homing_offset for k, v in ours.items()
        }


@pytest.mark.slow
def test_the_pairs_id_names_both_files_and_a_bad_side_is_refused(emulate, tmp_path: Path) -> None:
    from hilrec.daemon.cli import main

    emu = emulate("leader", motion="sweep", factory_fresh=True)
    out = tmp_path / "cal"
    args = ["calibrate", "leader", "--port", emu.port, "--id", "bench7", "--arm", "right"]
    assert main([*args, "--output", f"{out}/", "--yes", "--duration", "2.5"]) == 0
    assert [p.name for p in out.iterdir()] == ["bench7_right.json"]
    # A side's own id given with --arm would name a file <id>_right_right: refused, arm untouched.
    assert main([*args[:-4], "--id", "bench7_right", "--arm", "right", "--output", f"{out}/", "--yes"]) == 2
    assert [p.name for p in out.iterdir()] == ["bench7_right.json"]
    try:
        main(["calibrate", "leader", "--port", emu.port, "--arm", "middle", "--yes"])
    except SystemExit as exc:
        assert exc.code == 2
    else:
        raise AssertionError("--arm middle was accepted")
