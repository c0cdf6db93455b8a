"""The display child's lifecycle as its parents see it: one that cannot start, one that will not
stop, one stopped before it heard anything, and a ``[display]`` that cannot work, refused at
the daemon's start naming the key. Real child processes; nothing here needs rerun's viewer."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from _daemon import sim_config

from hilrec.daemon.collect.launch import LiveDisplay
from hilrec.daemon.wire.display_child import RECEIVING, DisplayChild

STUBBORN = (
    "import signal, sys, time\n"
    "signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
    f"print({RECEIVING!r}, flush=True)\n"
    "time.sleep(120)\n"
)


@pytest.mark.timeout(120)
def test_a_display_that_cannot_start_is_reported_at_once(tmp_path: Path) -> None:
    out = io.StringIO()
    display = LiveDisplay([str(tmp_path / "no-such-program")], tmp_path / "display.log")
    # It gives up on the failed start itself, not at the end of the wait (the old code spun the
    # whole wait): an hour's wait would outlast this test's timeout. How soon: bench_give_up.
    assert display.start(out, ready_timeout_s=3600.0) is False
    assert "could not start" in out.getvalue() and "goes on without it" in out.getvalue()
    display.stop(out)


def test_a_display_that_ignores_the_stop_is_killed_and_said_so() -> None:
    child = DisplayChild([sys.executable, "-c", STUBBORN], output=lambda _line: None).start()
    assert child.wait_receiving(60.0)
    problem = child.stop(timeout_s=0.5)
    assert problem is not None and "was killed" in problem and "may lack the end" in problem
    assert child.process is not None and child.process.returncode is not None


def test_a_display_stopped_before_it_heard_anything_is_not_a_fault() -> None:
    child = DisplayChild([sys.executable, "-c", "import time; time.sleep(120)"], output=lambda _l: None)
    child.start()
    assert child.stop(timeout_s=30.0) is None  # SIGINT's KeyboardInterrupt exit is not reported


@pytest.mark.slow  # a daemon process to its refusal
def test_a_spawned_viewer_without_a_screen_is_refused_at_start_naming_the_key(tmp_path: Path) -> None:
    config = tmp_path / "d.toml"
    config.write_text(sim_config(tmp_path / "ds") + '[display]\nrerun = "spawn"\n')
    env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY")}
    done = subprocess.run(
        [sys.executable, "-m", "hilrec.daemon.cli", "daemon", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert "display.rerun" in done.stderr and "no screen" in done.stderr
    assert not (tmp_path / "ds").exists() or not any((tmp_path / "ds").iterdir())


def test_a_display_started_from_a_real_time_thread_runs_as_an_ordinary_process() -> None:
    """A child inherits its creator's policy, and SVT-AV1 raises a thread that opens it to FIFO
    99: a display must still never go before the loop."""
    policies: list[int] = []

    def from_real_time() -> None:  # lives as long as its child (the death signal is per thread)
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
        child = DisplayChild([sys.executable, "-c", STUBBORN], output=lambda _l: None).start()
        try:
            if child.wait_receiving(60.0) and child.process is not None:
                policies.append(os.sched_getscheduler(child.process.pid))
        finally:
            child.stop(timeout_s=0.5)

    thread = threading.Thread(target=from_real_time)
    thread.start()
    thread.join(90)
    assert policies == [os.SCHED_OTHER]
