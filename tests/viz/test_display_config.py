"""The daemon's ``[display]``: a ``hilrec display`` child beside it writes the live view to an
``.rrd`` (read back with rerun's own dataframe API), is flushed at shutdown, and dies with a
SIGKILLed daemon leaving a complete file."""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

import pytest
from _daemon import Daemon, emulated_config, sim_config

# Real daemons, processes or kill loops: the slow tier (make test runs it; make test-fast does not).
pytestmark = pytest.mark.slow

dataframe = pytest.importorskip("rerun.dataframe")

JOINTS = ("shoulder_pan", "shoulder_lift", "elbow_flex", "wrist_flex", "wrist_roll", "gripper")
WAIT_S = 90.0


def entities(path: Path) -> set[str]:
    recording = dataframe.load_recording(str(path))
    return {c.entity_path for c in recording.schema().component_columns()}


def rows(path: Path, entity: str, index: str = "tick") -> int:
    table = dataframe.load_recording(str(path)).view(index=index, contents=entity).select().read_all()
    column = next(n for n in table.column_names if n.startswith(entity + ":"))
    return int(table.num_rows - table.column(column).null_count)


def display_section(rrd: Path) -> str:
    return f'[display]\nrerun = "rrd"\nrrd = "{rrd}"\n'


def wait_log(daemon: Daemon, pattern: str, timeout_s: float = WAIT_S) -> re.Match[str]:
    """The first match of ``pattern`` in the daemon's log (polled, bounded)."""
    deadline = time.monotonic() + timeout_s
    while (found := re.search(pattern, daemon.log())) is None:
        assert time.monotonic() < deadline, f"{pattern!r} not in the daemon's log:\n{daemon.log()}"
        time.sleep(0.1)  # poll interval of a bounded wait on a log file
    return found


def display_pid(daemon: Daemon) -> int:
    return int(wait_log(daemon, r"\[display\]: started hilrec display \(pid (\d+)").group(1))


def wait_gone(pid: int, timeout_s: float = 40.0) -> None:
    deadline = time.monotonic() + timeout_s
    while Path(f"/proc/{pid}").exists() and "zombie" not in _state(pid):
        assert time.monotonic() < deadline, f"the display child {pid} outlived the daemon"
        time.sleep(0.1)  # poll interval of a bounded wait on another process's exit


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/status").read_text().lower()
    except OSError:
        return "zombie"


@pytest.mark.timeout(300)
def test_display_section_logs_an_emulated_daemon_with_a_fault_and_stops_with_it(tmp_path: Path) -> None:
    out = tmp_path / "live.rrd"
    faults = 'follower_faults = ["vanish:after_s=15"]'
    daemon = Daemon(tmp_path, emulated_config(tmp_path / "ds", faults=faults) + display_section(out))
    try:
        daemon.start()
        pid = display_pid(daemon)
        wait_log(daemon, "display: hilrec display: receiving")
        events = daemon.telemetry(topics=(b"event",))
        try:
            fault = events.wait_for(lambda _t, h: h.get("event") == "fault", WAIT_S)
        finally:
            events.close()
        assert fault is not None, daemon.log()
        assert daemon.shutdown() == 0
        wait_gone(pid)
    finally:
        daemon.close()
    log = daemon.log()
    summary = re.search(r"display: hilrec display: (\d+) ticks, .* missed (\d+)", log)
    assert summary is not None, log
    found = entities(out)
    expected = {"/faults", "/events", "/timing/late_ms"}
    expected |= {f"/{s}/{j}" for s in ("state", "action", "leader", "twin") for j in JOINTS}
    assert expected <= found, sorted(expected - found)
    assert rows(out, "/timing/late_ms") == int(summary.group(1)) > 0
    assert rows(out, "/faults") >= 1
    assert "[display]: " not in log.replace("[display]: started", "")  # nothing reported wrong


@pytest.mark.timeout(240)
def test_display_child_dies_with_a_killed_daemon_and_its_file_is_complete(tmp_path: Path) -> None:
    out = tmp_path / "live.rrd"
    daemon = Daemon(tmp_path, sim_config(tmp_path / "ds") + display_section(out))
    try:
        daemon.start()
        pid = display_pid(daemon)
        wait_log(daemon, "display: hilrec display: receiving")
        daemon.signal(signal.SIGKILL)
        daemon.wait_exit()
        wait_gone(pid)  # its death signal (SIGTERM) ends it, flushed
    finally:
        daemon.close()
    assert {"/state/gripper", "/timing/late_ms"} <= entities(out)
    assert rows(out, "/state/gripper") > 0
    assert not os.path.exists(f"/proc/{pid}/cmdline") or "zombie" in _state(pid)


def _viewers(web_port: int) -> list[int]:
    """Processes serving rerun's web viewer on ``web_port``."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            argv = cmdline.read_bytes().split(b"\0")
        except OSError:
            continue
        if b"--serve-web" in argv and str(web_port).encode() in argv:
            found.append(int(cmdline.parent.name))
    return found


@pytest.mark.timeout(120)
def test_a_served_viewer_ends_with_the_display_run_as_a_child(tmp_path: Path) -> None:
    """Run as a child (no terminal on stdin), a ``--serve`` display takes its web viewer down with
    it: nobody is there to end one left serving (the ``rerun`` wrapper script's own child was)."""
    import subprocess
    import sys

    from _daemon import free_ports

    telemetry, web_port = free_ports(2)
    display = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "hilrec.daemon.cli",
            "display",
            "--telemetry",
            f"tcp://127.0.0.1:{telemetry}",
            "--serve",
            "--web-port",
            str(web_port),
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert display.stdout is not None
        for line in display.stdout:  # bounded by the test's timeout
            if line.startswith("hilrec display: tcp://"):
                break
        viewers = _viewers(web_port)
        assert viewers, "no web viewer serving"
        display.send_signal(signal.SIGINT)
        assert display.wait(60) == 0
        for pid in viewers:
            wait_gone(pid, 20.0)
    finally:
        if display.poll() is None:
            display.kill()
            display.wait(10)
        for pid in _viewers(web_port):
            os.kill(pid, signal.SIGKILL)
