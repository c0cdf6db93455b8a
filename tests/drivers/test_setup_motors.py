"""`hilrec setup-motors`: six factory-new servos (all id 1), connected one at a time as a person
does it, get ids 6..1 and 1 Mbps; driven on a real pty with pexpect like LeRobot's
lerobot-setup-motors, against the emulator's new-servos mode."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pexpect
import pytest

from hilrec.daemon.so101 import JOINT_NAMES
from hilrec.drivers.arm import FollowerConfig, SO101Follower
from hilrec.drivers.bus import BusConfig, FeetechBus
from hilrec.drivers.calibration import save_calibration
from hilrec.drivers.emulated.emulator import EmulatedArm
from hilrec.drivers.tables import REGISTER


def setup_motors(port: str) -> pexpect.spawn:
    child = pexpect.spawn(
        sys.executable,
        ["-m", "hilrec.daemon.cli", "setup-motors", "follower", "--port", port],
        encoding="utf-8",
        timeout=60,
        env=dict(os.environ),
    )
    return child


def prompt(child: pexpect.spawn, joint: str) -> None:
    child.expect(f"Connect the controller board to the '{joint}' motor only and press Enter.")


@pytest.mark.slow
def test_new_servos_get_their_ids_one_at_a_time(emulate, tmp_path: Path) -> None:
    arm: EmulatedArm = emulate("follower", new_servos=True)
    with arm.paused():
        assert [s.servo_id for s in arm.servos] == [1] * 6
        arm.servos[JOINT_NAMES.index("wrist_flex")].set("Baud_Rate", 1)  # one shipped at 500 kbps
    child = setup_motors(arm.port)
    for step, joint in enumerate(reversed(JOINT_NAMES)):
        prompt(child, joint)
        if step:
            assert arm.connect_next() == joint  # the person moves the cable to the next servo
        child.sendline("")
        was = "500 kbps" if joint == "wrist_flex" else "1 Mbps"
        child.expect(f"'{joint}' motor id set to {JOINT_NAMES.index(joint) + 1} \\(was id 1 at {was}\\)")
    child.expect("hilrec calibrate follower --port")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0

    assert arm.connect_next() == "all"  # daisy-chained
    with arm.paused():
        assert [s.servo_id for s in arm.servos] == [1, 2, 3, 4, 5, 6]
        assert [s.baud_index for s in arm.servos] == [0] * 6
        assert [s.get("Lock") for s in arm.servos] == [1] * 6  # EEPROM protected again
        assert [s.log.rejected_eeprom for s in arm.servos] == [[]] * 6  # no EEPROM write was refused
    # The chain is now an arm hilrec opens (with a calibration file, as after `calibrate`).
    calibration = save_calibration(arm.frame.calibration, tmp_path / "f.json")
    with SO101Follower(FollowerConfig(port=arm.port, calibration=calibration)) as follower:
        assert follower.read().values.shape == (6,)


def test_eeprom_writes_are_unlocked_first(emulate) -> None:
    """ID and Baud_Rate are EEPROM: with Lock 1 the servo ignores them, so the lock comes off."""
    arm: EmulatedArm = emulate("follower", new_servos=True)
    child = setup_motors(arm.port)
    prompt(child, "gripper")
    child.sendline("")
    child.expect("'gripper' motor id set to 6")
    child.sendeof()
    child.expect(pexpect.EOF)
    child.close()
    gripper = arm.servos[JOINT_NAMES.index("gripper")]
    with arm.paused():
        assert gripper.servo_id == 6
        ids = (REGISTER["ID"].address, REGISTER["Baud_Rate"].address)
        assert not any(address in ids for address in gripper.log.rejected_eeprom)


@pytest.mark.slow
def test_two_servos_at_once_or_none_ask_again(emulate) -> None:
    arm: EmulatedArm = emulate("follower", new_servos=True)
    arm.connect_all()  # the person left the whole chain connected: six servos at id 1
    child = setup_motors(arm.port)
    prompt(child, "gripper")
    child.sendline("")
    child.expect("more than one servo answers")
    child.expect("press Enter to try the 'gripper' motor again")
    with arm.lock:
        arm.connected = frozenset()  # ... then unplugged everything
    child.sendline("")
    child.expect("no servo answers .* at any baud rate")
    child.expect("press Enter to try the 'gripper' motor again")
    with arm.lock:
        arm.connected = frozenset({JOINT_NAMES.index("gripper")})
    child.sendline("")
    child.expect("'gripper' motor id set to 6")
    child.sendeof()
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus != 0  # stdin closed before the next motor: stopped, named
    with arm.paused():
        assert arm.servos[JOINT_NAMES.index("gripper")].servo_id == 6
        assert [s.servo_id for s in arm.servos].count(1) == 5


def test_new_servo_hears_only_its_baud_rate(emulate) -> None:
    arm: EmulatedArm = emulate("follower", new_servos=True)
    with arm.paused():
        arm.servos[-1].set("Baud_Rate", 4)  # 115200
    with FeetechBus(BusConfig(port=arm.port)) as bus:
        assert bus.broadcast_ping(200).ids == []
    with FeetechBus(BusConfig(port=arm.port, baudrate=115_200)) as bus:
        assert bus.broadcast_ping(300).ids == [1]


@pytest.mark.slow
def test_standalone_emulator_connects_the_next_servo_on_enter() -> None:
    """`hilrec emulate --new-servos`: Enter on its stdin connects the next servo."""
    child = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "hilrec.daemon.cli",
            "emulate",
            "follower",
            "--motion",
            "servo",
            "--new-servos",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None and child.stdin is not None
        port = child.stdout.readline().strip()
        with FeetechBus(BusConfig(port=port)) as bus:
            assert bus.broadcast_ping(300).answers == 1
        child.stdin.write("\n")
        child.stdin.flush()
        assert child.stdout.readline().strip() == "connected: the wrist_roll servo only"
        for _ in range(5):
            child.stdin.write("\n")
            child.stdin.flush()
            child.stdout.readline()
        with FeetechBus(BusConfig(port=port)) as bus:
            assert bus.broadcast_ping(300).answers == 6  # the whole chain, all at id 1
    finally:
        child.terminate()
        child.wait(10)


@pytest.mark.slow
def test_enter_before_moving_the_cable_is_refused_naming_the_joint(emulate) -> None:
    """Enter pressed while the servo just set is still the one connected: it is not re-ided."""
    arm: EmulatedArm = emulate("follower", new_servos=True)
    child = setup_motors(arm.port)
    prompt(child, "gripper")
    child.sendline("")
    child.expect("'gripper' motor id set to 6")
    prompt(child, "wrist_roll")
    child.sendline("")  # the cable is still on the gripper
    child.expect("'wrist_roll': the servo connected is the 'gripper' motor, given id 6 just now")
    child.expect("press Enter to try the 'wrist_roll' motor again")
    assert arm.connect_next() == "wrist_roll"
    child.sendline("")
    child.expect("'wrist_roll' motor id set to 5 \\(was id 1 at 1 Mbps\\)")
    child.sendeof()
    child.expect(pexpect.EOF)
    child.close()
    with arm.paused():
        assert arm.servos[JOINT_NAMES.index("gripper")].servo_id == 6
        assert arm.servos[JOINT_NAMES.index("wrist_roll")].servo_id == 5


@pytest.mark.slow
def test_the_arm_of_a_pair_is_named_in_every_prompt_and_in_the_calibrate_step(emulate) -> None:
    """`--arm right`: each prompt and result names the right leader, and the step it ends with is
    that side's calibration (its own file, `hilrec calibrate leader --arm right`)."""
    arm: EmulatedArm = emulate("leader", new_servos=True)
    argv = ["-m", "hilrec.daemon.cli", "setup-motors", "leader", "--arm", "right", "--port", arm.port]
    child = pexpect.spawn(
        sys.executable,
        [*argv, "--joints", "gripper,wrist_roll"],
        encoding="utf-8",
        timeout=60,
        env=dict(os.environ),
    )
    for step, joint in enumerate(("gripper", "wrist_roll")):
        child.expect(f"Connect the right leader's controller board to the '{joint}' motor only")
        if step:
            assert arm.connect_next() == joint
        child.sendline("")
        child.expect(f"right leader: '{joint}' motor id set to {JOINT_NAMES.index(joint) + 1}")
    child.expect(f"hilrec calibrate leader --arm right --port {arm.port}")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
