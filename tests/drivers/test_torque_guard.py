"""The torque guard beside a daemon turns off the arm that daemon had, and writes to nothing else."""

from __future__ import annotations

import os
import pty
import select

import pytest

from hilrec.drivers.torque_guard import TorqueGuard


@pytest.mark.slow  # the guard's process, and its open timeout
def test_a_guard_whose_arm_is_gone_writes_nothing_into_the_terminal_that_took_its_number() -> None:
    """Seen in the suite: a SIGKILLed daemon's emulated leader ended with it, the next test's
    terminal got the pty's number, and the guard's Torque_Enable packets arrived in that
    terminal's output."""
    master, slave = pty.openpty()
    port = os.ttyname(slave)
    guard = TorqueGuard(port, open_timeout_s=1.0)
    try:
        os.close(slave)
        os.close(master)  # the emulated arm ends with its daemon
        terminal, terminal_slave = pty.openpty()  # the next terminal opened on the machine
        try:
            assert os.ttyname(terminal_slave) != port  # the guard holds the arm's number
            assert guard.process.stdin is not None
            guard.process.stdin.close()  # the daemon is gone: the guard goes for the arm
            assert guard.process.wait(30) == 1  # the arm is gone too: given up on
            assert select.select([terminal], [], [], 0)[0] == []  # not a byte in the terminal
        finally:
            os.close(terminal_slave)
            os.close(terminal)
    finally:
        guard.stand_down()
