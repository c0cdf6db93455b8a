"""`hilrec calibrate` writes the file LeRobot's own procedure writes for the same arm.

The emulated arm is moved by a "person" (``--motion sweep``): it stands at the middle of its
range until the homing offsets are written, then sweeps every joint through its range once.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from pathlib import Path

import pytest
from _teleoperate import missed_a_reply
from lerobot.teleoperators.so_leader import SOLeader, SOLeaderTeleopConfig

from hilrec.daemon.cli import main
from hilrec.drivers.calibration import load_calibration
from hilrec.drivers.emulated.emulator import EmulatedArm


def expected_file(emu: EmulatedArm) -> dict:
    expected = json.loads(emu.frame.calibration.to_json())
    expected["wrist_roll"].update(range_min=0, range_max=4095)  # LeRobot's full-turn joint
    return expected


@pytest.mark.slow
def test_hilrec_calibrate_recovers_the_arms_calibration(emulate, tmp_path: Path) -> None:
    emu = emulate("leader", motion="sweep", factory_fresh=True)
    output = tmp_path / "leader.json"
    assert (
        main(
            ["calibrate", "leader", "--port", emu.port, "--output", str(output), "--yes", "--duration", "2.5"]
        )
        == 0
    )
    assert emu.sweep is not None and emu.sweep.done.is_set()
    assert json.loads(output.read_text()) == expected_file(emu)
    with emu.paused():  # and the servos hold it, as LeRobot's write_calibration leaves them
        assert [s.get("Min_Position_Limit") for s in emu.servos] == [
            cal["range_min"] for cal in expected_file(emu).values()
        ]
    load_calibration(output)


def run_lerobot_calibrate(
    emulate, calibration_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> list[BaseException]:
    emu = emulate("leader", motion="sweep", factory_fresh=True)
    leader = SOLeader(SOLeaderTeleopConfig(port=emu.port, id="emulated", calibration_dir=calibration_dir))
    failures: list[BaseException] = []

    def calibrate() -> None:
        try:
            leader.connect(calibrate=True)
            leader.disconnect()
        except BaseException as exc:  # noqa: BLE001 - returned to the test thread
            failures.append(exc)

    # LeRobot asks for Enter twice on stdin (input() and enter_pressed()): give it a pipe and
    # press Enter the way a person would, once at the middle and once after the sweep.
    read_fd, write_fd = os.pipe()
    with os.fdopen(read_fd) as stdin, os.fdopen(write_fd, "w") as keyboard:
        monkeypatch.setattr(sys, "stdin", stdin)
        thread = threading.Thread(target=calibrate)
        thread.start()
        keyboard.write("\n")  # "Move ... to the middle of its range ... and press ENTER"
        keyboard.flush()
        assert emu.sweep is not None
        while thread.is_alive() and not emu.sweep.done.wait(0.1):
            pass  # the person moves the joints (or LeRobot gave up)
        keyboard.write("\n")  # "Press ENTER to stop..."
        keyboard.flush()
        thread.join(timeout=30)
    assert not thread.is_alive()
    return failures


@pytest.mark.slow  # > 5 s (make test-fast leaves it out)
def test_same_file_as_lerobots_own_calibrate(
    emulate, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ours_emu = emulate("leader", motion="sweep", factory_fresh=True)
    ours = tmp_path / "ours.json"
    assert (
        main(
            [
                "calibrate",
                "leader",
                "--port",
                ours_emu.port,
                "--output",
                str(ours),
                "--yes",
                "--duration",
                "2.5",
            ]
        )
        == 0
    )

    # LeRobot 0.4.4 reads with num_retry=0 while it calibrates, so on a loaded machine one late
    # reply aborts it (ConnectionError, or its connect's motor check finds a servo missing:
    # RuntimeError). That is LeRobot's behaviour, not what is tested here:
    # run it again on a fresh arm (twice: this machine is shared). The fixture `emulate` keeps
    # the GIL switch interval short meanwhile, so the in-process emulator answers while LeRobot's
    # SDK busy-polls.
    for attempt in range(3):
        failures = run_lerobot_calibrate(emulate, tmp_path / "lerobot", monkeypatch)
        lost = failures and (isinstance(failures[0], ConnectionError) or missed_a_reply(str(failures[0])))
        if not lost or attempt == 2:
            break
    assert not failures, failures
    theirs = tmp_path / "lerobot" / "emulated.json"
    assert ours.read_bytes() == theirs.read_bytes()


@pytest.mark.slow  # > 5 s (make test-fast leaves it out)
def test_a_joint_that_barely_moved_is_warned_and_asked_again(emulate, tmp_path: Path) -> None:
    """A person who forgot wrist_flex (2047..2048): calibrate warns and records again, rather
    than saving a range the daemon would clamp that joint to; without Enter (--duration) it
    refuses and names the emulator's --motion sweep."""
    import pexpect

    from hilrec.daemon.so101 import JOINT_NAMES

    emu = emulate("leader", motion="sweep", factory_fresh=True)
    assert emu.sweep is not None
    low, high = emu.frame.range_ends()
    middle = emu.frame.middle()
    k = JOINT_NAMES.index("wrist_flex")
    narrow_low, narrow_high = low.copy(), high.copy()
    narrow_low[k], narrow_high[k] = middle[k], middle[k] + 1
    emu.sweep.restart(narrow_low, narrow_high)
    output = tmp_path / "leader.json"
    argv = ["-m", "hilrec.daemon.cli", "calibrate", "leader", "--port", emu.port, "--output", str(output)]
    child = pexpect.spawn(sys.executable, argv, encoding="utf-8", timeout=60, env=dict(os.environ))
    try:
        child.expect("middle of its range of motion and press ENTER")
        child.sendline("")
        child.expect("Press ENTER to stop")
        assert emu.sweep.done.wait(60)
        child.sendline("")
        child.expect(r"WARNING: joint\(s\) barely moved: wrist_flex \d+\.\.\d+ \(less than 200 ticks")
        child.expect("Press ENTER to record the ranges again")
        emu.sweep.restart(low, high)  # the person sweeps again, wrist_flex this time
        child.sendline("")
        child.expect("Press ENTER to stop")
        assert emu.sweep.done.wait(60)
        child.sendline("")
        child.expect("Calibration saved to")
        child.expect(pexpect.EOF)
    finally:
        child.close()
    assert child.exitstatus == 0
    assert json.loads(output.read_text()) == expected_file(emu)

    emu.sweep.restart(narrow_low, narrow_high)
    code = main(
        [
            "calibrate",
            "leader",
            "--port",
            emu.port,
            "--output",
            str(tmp_path / "x.json"),
            "--yes",
            "--duration",
            "2.5",
        ]
    )
    assert code == 2 and not (tmp_path / "x.json").exists()
