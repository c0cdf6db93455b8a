"""SIGKILL the daemon ``hilrec collect`` started, at ten seeded random moments of a session.

Each trial runs a timed collect session (no terminal) and kills its daemon child once it serves,
after a delay drawn from a seeded generator over the session's span. What must hold every time:
collect ends by itself, with exit status 2 and a message naming the daemon, not a traceback
(or 0, when the kill came after the session had finished); and every take it reported judged
(the verdict, printed once the episode is durable and merged) is in the dataset after
``hilrec repair``, which then passes the check.
"""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _daemon import Daemon, check_passes, run_cli, sim_config
from support.procs import children

from hilrec.daemon.dataset.format.reader import load_episodes

# Real daemons, processes or kill loops: the slow tier (make test runs it; make test-fast does not).
pytestmark = pytest.mark.slow

TRIALS = 10
SEED = 20261203
EXIT_TIMEOUT_S = 180.0
SERVE_TIMEOUT_S = 120.0
TIMED = ("--episodes", "3", "--episode-time-s", "1.0", "--reset-time-s", "0.2")


def daemon_child(collect: subprocess.Popen[str], log: Path) -> int | None:
    """The daemon's pid once it serves (its log says so), or None if collect ended first."""
    deadline = time.monotonic() + SERVE_TIMEOUT_S
    while collect.poll() is None:
        if log.exists() and "serving control" in log.read_text(errors="replace"):
            for pid in (child.pid for child in children(collect.pid)):
                if "daemon" in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace"):
                    return pid
        assert time.monotonic() < deadline, f"the daemon did not serve in {SERVE_TIMEOUT_S} s"
        time.sleep(0.02)  # poll interval for the log line
    return None


def test_ten_random_kills_of_collects_daemon_end_collect_cleanly_and_lose_no_judged_take(
    tmp_path: Path,
) -> None:
    rng = random.Random(SEED)
    outcomes = []
    for trial in range(TRIALS):
        base = tmp_path / f"trial-{trial}"
        base.mkdir()
        root = base / "ds"
        config = Daemon(base, sim_config(root, size=(24, 32))).config_path
        command = [sys.executable, "-m", "hilrec.daemon.cli", "collect", "--config", str(config)]
        collect = subprocess.Popen(
            [*command, "--no-sounds", *TIMED],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            pid = daemon_child(collect, base / "ds.daemon.log")
            delay = rng.uniform(0.0, 6.0)  # three 1 s takes, resets and verdicts: about 6 s
            if pid is not None:
                time.sleep(delay)  # the random moment itself, not a wait for a condition
                with_kill = collect.poll() is None
                if with_kill:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        with_kill = False
            out, err = collect.communicate(timeout=EXIT_TIMEOUT_S)
        finally:
            if collect.poll() is None:
                collect.kill()
                collect.wait(10)
        code = collect.returncode
        assert "Traceback" not in err, err
        if code != 0:
            assert code == 2 and "daemon" in err, (code, out, err)
        judged = sorted({int(i) for i in re.findall(r"verdict take \d+ \(episode (\d+)\)", out)})
        if root.exists() and any(root.iterdir()):
            repaired = run_cli("repair", str(root))
            assert "Traceback" not in repaired.stderr, repaired.stderr
            kept = [int(e["episode_index"]) for e in load_episodes(root)]
            assert set(judged) <= set(kept), (judged, kept, out, repaired.stdout)
            check_passes(root)
        else:
            kept = []
        outcomes.append((trial, round(delay, 2), code, judged, kept))
    print(
        "\n".join(
            f"trial {t}: killed after {d} s: exit {c}, judged {j}, kept {k}" for t, d, c, j, k in outcomes
        )
    )
    assert len(outcomes) == TRIALS
