"""`hilrec find-port`: the unplug-and-press-Enter procedure (on a real pty, with pexpect) and
`--list`, which names the ports whose servos answer, against emulated arms."""

from __future__ import annotations

import os
import pty
import sys
from collections.abc import Iterator
from pathlib import Path

import pexpect
import pytest

from hilrec.daemon.cli import main
from hilrec.drivers.emulated.emulator import EmulatedArm
from hilrec.drivers.emulated.faults import Fault


@pytest.fixture
def silent_pty() -> Iterator[str]:
    """A serial port nothing answers on (a pty whose other end nobody serves)."""
    master, slave = pty.openpty()
    yield os.ttyname(slave)
    os.close(master)
    os.close(slave)


def hilrec(*args: str) -> pexpect.spawn:
    return pexpect.spawn(
        sys.executable, ["-m", "hilrec.daemon.cli", *args], encoding="utf-8", timeout=60, env=dict(os.environ)
    )


@pytest.mark.slow
def test_list_names_each_port_and_the_servo_ids_on_it(emulate, silent_pty: str, capsys) -> None:
    follower = emulate("follower")
    leader = emulate("leader")
    leader.inject(Fault(kind="missing", servo_id=4))
    new = emulate("follower", new_servos=True)  # one factory-new servo: id 1
    ports = [follower.port, leader.port, new.port, silent_pty, "/dev/null"]
    # How soon a silent port is given up on (about 2 s) is bench/bench_give_up.py's to measure.
    code = main(["find-port", "--list", *(arg for port in ports for arg in ("--port", port))])
    lines = {line.split(": ", 1)[0]: line for line in capsys.readouterr().out.splitlines()}
    assert code == 0
    assert lines[follower.port] == f"{follower.port}: servo ids 1, 2, 3, 4, 5, 6 (an SO-101 arm)"
    assert "servo ids 1, 2, 3, 5, 6 (ids 4 missing)" in lines[leader.port]
    assert "servo ids 1 (ids 2, 3, 4, 5, 6 missing)" in lines[new.port]
    assert lines[silent_pty] == f"{silent_pty}: no Feetech servo answers at 1 Mbps"
    assert "not a serial port" in lines["/dev/null"]


def test_list_reports_a_servo_at_an_id_beyond_the_arm(emulate, capsys) -> None:
    arm = emulate("follower")
    with arm.paused():
        arm.servo(6).set("ID", 9)  # e.g. a spare set to another id
    assert main(["find-port", "--list", "--port", arm.port]) == 0
    out = capsys.readouterr().out
    assert "servo ids 1, 2, 3, 4, 5 (ids 6 missing)" in out
    assert "also id(s) 9, not SO-101 ids" in out


@pytest.mark.slow
def test_list_without_any_answer_says_what_to_check(silent_pty: str, capsys) -> None:
    assert main(["find-port", "--list", "--port", silent_pty]) == 1
    assert "power supply" in capsys.readouterr().out


def test_unplugging_the_arm_names_its_port(emulate, tmp_path: Path) -> None:
    links = [tmp_path / "ttyARM0", tmp_path / "ttyARM1"]
    arms = [emulate("follower", link=links[0]), emulate("leader", link=links[1])]
    child = hilrec("find-port", "--port", str(tmp_path / "ttyARM*"))
    child.expect(r"Ports before disconnecting: ([^\r\n]*)\r\n")
    assert child.match.group(1) == f"{links[0]}, {links[1]}"
    child.expect("press Enter when done")
    arms[1].stop()  # the person pulls the leader's USB cable
    assert not links[1].exists()
    child.sendline("")
    child.expect(f"The port of this arm is '{links[1]}'")
    child.expect("follower.port or leader.port")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0


@pytest.mark.slow
def test_nothing_unplugged_is_said(emulate, tmp_path: Path) -> None:
    emulate("follower", link=tmp_path / "ttyARM0")
    child = hilrec("find-port", "--port", str(tmp_path / "ttyARM*"))
    child.expect("press Enter when done")
    child.sendline("")
    child.expect("no port disappeared")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 1


def test_stopping_an_emulator_removes_its_port(emulate, tmp_path: Path) -> None:
    """What the unplug test relies on: a stopped emulated arm's device node and link vanish."""
    arm: EmulatedArm = emulate("follower", link=tmp_path / "link")
    device = arm.device_path
    assert os.path.exists(device) and (tmp_path / "link").is_symlink()
    arm.stop()
    assert not os.path.exists(device) and not (tmp_path / "link").exists()


def test_unplugging_one_arm_of_a_pair_names_that_arm(emulate, tmp_path: Path, capsys) -> None:
    """`--arm right` on a two-arm bench: the answer names the right arm, its config section and the
    `--arm right` the setup steps take; `--list` with `--arm` is refused (it unplugs nothing)."""
    links = [tmp_path / f"ttyARM{i}" for i in range(4)]
    arms = [emulate("follower" if i % 2 == 0 else "leader", link=link) for i, link in enumerate(links)]
    child = hilrec("find-port", "--arm", "right", "--port", str(tmp_path / "ttyARM*"))
    child.expect("Remove the USB cable from the right arm's controller board and press Enter when done")
    arms[2].stop()  # the right follower's cable
    child.sendline("")
    child.expect(f"The port of the right arm is '{links[2]}'")
    child.expect(r"\[arms\.right\]")
    child.expect(f"calibrate --arm right --port {links[2]}")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
    assert main(["find-port", "--list", "--arm", "left", "--port", str(links[0])]) == 2
    assert "--list probes every port" in capsys.readouterr().err
