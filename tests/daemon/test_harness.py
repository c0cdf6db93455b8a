"""The test daemon harness (tests/daemon/_daemon.py) itself: a port taken between being picked
and being bound costs a restart on other ports, not the test (seen at three pytest workers)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from _daemon import PORT_TAKEN, Daemon, sim_config

pytestmark = pytest.mark.slow


def test_a_daemon_whose_picked_port_was_taken_starts_on_other_ports(tmp_path: Path) -> None:
    daemon = Daemon(tmp_path, sim_config(tmp_path / "ds", size=None))
    first_log = daemon.log_path
    with socket.socket() as thief:
        thief.bind(("127.0.0.1", daemon.control_port))  # another worker's process, in the meantime
        thief.listen()
        try:
            daemon.start()
            assert daemon.control_port != thief.getsockname()[1]
            assert daemon.call("status")["state"] == "idle"
        finally:
            daemon.close()
    assert PORT_TAKEN in first_log.read_text()  # the first start did lose its port


def test_ports_given_from_another_daemon_are_not_picked_again(tmp_path: Path) -> None:
    daemon = Daemon(tmp_path, sim_config(tmp_path / "ds", size=None))
    daemon.repick_ports = False  # as tests/ui/_ui.py's on_the_same_ports does
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", daemon.control_port))
        holder.listen()
        try:
            with pytest.raises(AssertionError, match=PORT_TAKEN):
                daemon.start()
        finally:
            daemon.close()
