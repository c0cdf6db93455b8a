"""The verdict worker: one episode judged alone, in a process at the bottom of the CPU queue.

A sound sim episode replays bit for bit; a hardware-like episode whose wrist servo stopped
following its goal (it holds where it is, its reading truthful: a stalled servo) is bad, and the
summary names the joint and when. The daemon's side (event, sidecar) is in test_collect_*.py.
"""

from __future__ import annotations

import os
import queue
import re
from pathlib import Path
from typing import Any

import pytest
from _recordings import Frozen, RecordingSpec, make_twin, record, write_native
from support.procs import children
from support.verdicts import VERDICT_MODULE
from support.wait import wait_until

from hilrec.daemon.cli import main
from hilrec.daemon.control.judge import judge_episode
from hilrec.daemon.control.verdict import VerdictWorker
from hilrec.daemon.dataset import EpisodeVerdict
from hilrec.daemon.ui.takes import replay_png_path


@pytest.fixture(scope="module")
def sim_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("verdict") / "sim"
    argv = ["record", "--sim", "--root", str(root), "--episodes", "2", "--size", "64x48", "--no-progress"]
    assert main(argv) == 0
    return root


@pytest.mark.slow  # a recorded sim episode and the worker process
def test_the_worker_process_judges_a_sound_sim_episode_at_idle_priority(sim_root: Path) -> None:
    verdicts: queue.Queue[dict[str, Any]] = queue.Queue()
    worker = VerdictWorker(root=sim_root, mode="sim", on_verdict=verdicts.put)
    worker.start()
    try:
        worker.submit(1)
        verdict = verdicts.get(timeout=120)
        assert worker.drain(10.0) and worker.pending == 0
        assert worker._process is not None
        pid = worker._process.pid
        # The lowest CPU priority there is: SCHED_IDLE, which Linux grants without privileges.
        assert worker.priority == "SCHED_IDLE"
        assert os.sched_getscheduler(pid) == os.SCHED_IDLE
    finally:
        worker.close()
    assert verdict["episode_index"] == 1 and verdict["verdict"] == EpisodeVerdict.SOUND, verdict
    assert "replays bit for bit" in verdict["summary"]
    details = verdict["details"]
    assert details["data_problems"] == [] and details["replay"]["status"] == "passed"
    assert details["replay"]["frames"] > 0 and verdict["take_end_to_verdict_s"] >= details["worker_s"]


@pytest.mark.slow  # the worker process
def test_the_worker_process_starts_with_the_first_take_not_with_the_daemon(tmp_path: Path) -> None:
    # A daemon that is started, asked for its status and stopped (the ui's, a test's, a bench's
    # first look) never pays for a process that imports MuJoCo.
    worker = VerdictWorker(root=tmp_path, mode="sim", on_verdict=lambda _verdict: None)
    worker.start()
    try:
        assert worker._process is None and worker.status()["priority"] == "not started"
        assert children(os.getpid(), VERDICT_MODULE) == []
        worker.prepare()  # a take has begun
        wait_until(lambda: worker.priority == "SCHED_IDLE", 120, 0.05, "the worker ready at SCHED_IDLE")
        [child] = children(os.getpid(), VERDICT_MODULE)
        assert worker._process is not None and child.pid == worker._process.pid
    finally:
        worker.close()
    assert children(os.getpid(), VERDICT_MODULE) == []


def test_a_worker_closed_before_its_first_take_never_started_a_process() -> None:
    worker = VerdictWorker(root=Path("/nonexistent"), mode="sim", on_verdict=lambda _verdict: None)
    worker.start()
    worker.close()
    assert not worker._thread.is_alive()
    assert worker._process is None and worker.status()["priority"] == "not started"


@pytest.mark.slow  # the worker process, maybe
def test_a_worker_closed_as_its_first_take_begins_leaves_no_process() -> None:
    worker = VerdictWorker(root=Path("/nonexistent"), mode="sim", on_verdict=lambda _verdict: None)
    worker.start()
    worker.prepare()  # the thread may be starting the process while close() runs
    worker.close()
    assert not worker._thread.is_alive()
    assert children(os.getpid(), VERDICT_MODULE) == []


@pytest.mark.slow
def test_a_stalled_servo_is_bad_and_named(tmp_path: Path) -> None:
    twin = make_twin()
    try:
        clean = record(RecordingSpec(seed=3, frames=250), twin)
        stalled = record(RecordingSpec(seed=4, frames=250, frozen=Frozen("wrist_flex", 100)), twin)
        root = write_native(tmp_path / "hw", [clean, stalled], twin)
    finally:
        twin.close()
    good = judge_episode(root, 0, mode="emulated")
    assert good["verdict"] == EpisodeVerdict.SOUND, good
    assert "consistent with the twin" in good["summary"]
    # The replay's figure is part of the verdict: the ui links it without `hilrec replay --report`.
    assert good["details"]["replay"]["plot"] == "hilrec/replay/episode-000000.png"
    png = root / "hilrec" / "replay" / "episode-000000.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert replay_png_path(root, 0) == png.resolve()
    bad = judge_episode(root, 1, mode="emulated")
    assert bad["verdict"] == EpisodeVerdict.BAD, bad
    # One sentence a person acts on: which joint, from when, and what to do.
    # The servo froze at frame 100 (4.0 s); the reading may have been still for a few frames
    # before, and the stall is dated from where it stopped moving.
    match = re.match(r"wrist_flex stalled from (\d+\.\d) s", bad["summary"])
    assert match is not None and 3.0 <= float(match.group(1)) <= 4.1, bad["summary"]
    assert bad["summary"].endswith("press ← to record it again")
    replay = bad["details"]["replay"]
    assert replay["status"] == "diverged" and replay["divergence"]["joint"] == "wrist_flex"


@pytest.mark.slow
def test_an_episode_that_never_gets_merged_is_not_checked(sim_root: Path) -> None:
    verdict = judge_episode(sim_root, 7, mode="sim", merge_timeout_s=0.2)
    assert verdict["verdict"] == EpisodeVerdict.NOT_CHECKED
    assert "not merged into LeRobot's files within" in verdict["summary"]


def test_the_tick_gate_holds_the_worker_off_each_tick_and_always_lets_it_go(tmp_path: Path) -> None:
    import subprocess
    import sys
    import time

    from hilrec.daemon.control.verdict import GATE_GUARD_S, GATE_RESUME_S, TickGate

    period = 0.04
    origin = time.monotonic()
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        gate = TickGate(busy.pid, lambda: (origin, period))
        gate.start()
        states = []
        deadline = time.monotonic() + 10.0
        while gate.ticks < 10 and time.monotonic() < deadline:
            # Mid-way through the hold (the guard before a deadline to the resume after it) the
            # process is stopped ("T"); in the rest of the period it runs.
            now = time.monotonic()
            next_deadline = origin + (int((now - origin) / period) + 1) * period
            time.sleep(max(0.0, next_deadline + (GATE_RESUME_S - GATE_GUARD_S) / 2 - time.monotonic()))
            states.append(_state(busy.pid))
        held = gate.stop()
        assert held >= 10, held
        # Held mid-way through a hold at least once; the share of holds the sampler finds stopped
        # depends on how late a loaded machine wakes it: bench/bench_verdict.py reports it.
        assert "T" in states, states
        assert _state(busy.pid) != "T"  # continued when the gate ends
    finally:
        busy.kill()
        busy.wait(10)


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()[0]


def test_a_take_ended_by_a_fault_says_so_when_the_replay_warns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Seen: a rollout whose policy was killed warned of the follower's lag and not of the fault."""
    from hilrec.daemon.control import judge

    lag = "the follower is 26 ms behind the twin (+0.66 frames)"
    monkeypatch.setattr(judge, "episode_data_problems", lambda root, index: ([], []))
    monkeypatch.setattr(
        judge, "_hardware_replay", lambda root, index: {"verdict": EpisodeVerdict.WARNING, "summary": lag}
    )
    meta = {"frames": 40, "ended_by": "fault:policy:policy pid 7"}
    verdict, summary, details = judge._judge_take(tmp_path, 0, "hardware", meta, judge._recorder_notes(meta))
    assert verdict == EpisodeVerdict.WARNING
    assert summary.startswith(lag) and "ended by a fault (policy on policy pid 7)" in summary, summary
    assert details["recorder_notes"] == ["the take was ended by a fault (policy on policy pid 7)"]
