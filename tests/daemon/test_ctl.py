"""`hilrec ctl` as a person uses it: no daemon running, and `stop --wait` reporting the stop."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from _daemon import Daemon, free_ports, sim_config

from hilrec.daemon.cli import main


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Daemon]:
    running = Daemon(tmp_path, sim_config(tmp_path / "ds", size=(24, 32))).start()
    yield running
    running.close()


def ctl(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict, str]:
    code = main(["ctl", *args])
    out, err = capsys.readouterr()
    return code, (json.loads(out) if out.strip() else {}), err


def test_no_daemon_running_is_said_at_once(capsys: pytest.CaptureFixture[str]) -> None:
    (port,) = free_ports(1)
    # How soon (was 3 x 2 s of waiting for a reply) is bench/bench_give_up.py's to measure.
    code, reply, err = ctl(capsys, "status", "--port", str(port))
    assert code == 3 and reply == {}
    assert f"no daemon is running at 127.0.0.1:{port}" in err
    assert "hilrec daemon --config" in err and "control_port" in err


@pytest.mark.slow  # a real daemon
def test_stop_wait_prints_the_stops_result(daemon: Daemon, capsys: pytest.CaptureFixture[str]) -> None:
    port = str(daemon.control_port)
    code, started, _ = ctl(capsys, "start", "--task", "Put the cube in the bin.", "--port", port)
    assert code == 0 and started["cmd"] == "start_episode"
    daemon.wait_frames(5)
    code, stopped, err = ctl(capsys, "stop", "--success", "--wait", "--port", port)
    assert code == 0, err
    assert stopped["ok"] is True and stopped["cmd"] == "stop_episode", stopped
    assert stopped["episode_index"] == started["episode_index"] == 0
    assert stopped["saved"] is True and stopped["saving"] is False
    assert stopped["frames"] >= 5
    assert "state" not in stopped and "loop" not in stopped  # not a status reply
    code, finalized, _ = ctl(capsys, "finalize", "--wait", "--port", port)
    assert code == 0 and finalized["cmd"] == "finalize" and finalized["finalized"] is True
    assert finalized["episodes"] == 1


@pytest.mark.slow
def test_config_gives_the_port(daemon: Daemon, capsys: pytest.CaptureFixture[str]) -> None:
    # The daemon's ports are in its config (free ports, not 5555): ctl reads them, as ui and
    # display do, and a --port beside --config is refused rather than silently preferred.
    code, status, err = ctl(capsys, "status", "--config", str(daemon.config_path))
    assert code == 0, err
    assert status["ok"] is True and status["cmd"] == "status"
    assert ctl(capsys, "status", "--config", str(daemon.config_path), "--port", "5555")[0] == 2
    bad = daemon.tmp_path / "bad.toml"
    bad.write_text("[zmq]\ncontrol_port = 0\n")
    code, _, err = ctl(capsys, "status", "--config", str(bad))
    assert code == 2 and "control_port" in err and str(bad) in err
