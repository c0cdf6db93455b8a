"""``hilrec collect`` without a terminal (a script, CI, the README's pasted command): no keys,
timed takes, tasks cycling from a file, verdicts printed and stored; ``--resume`` passed on to
the daemon it starts; ``--attach`` to a daemon already running."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from _daemon import Daemon, check_passes, sim_config

from hilrec.daemon.dataset.format.reader import load_episodes, load_tasks
from hilrec.daemon.dataset.format.sidecar import load_episode_sidecar

# Real daemons, processes or kill loops: the slow tier (make test runs it; make test-fast does not).
pytestmark = pytest.mark.slow


def collect(config: Path, *args: str, timeout_s: float = 300.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hilrec.daemon.cli", "collect", "--config", str(config), "--no-sounds", *args],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )


def test_timed_takes_without_a_terminal_then_a_refused_and_a_resumed_session(tmp_path: Path) -> None:
    root = tmp_path / "ds"
    config = Daemon(tmp_path, sim_config(root)).config_path  # free ports; collect starts the daemon
    tasks = tmp_path / "tasks.txt"
    tasks.write_text("Put the cube in the bin.\n\nPut the cube back.\n")
    timed = ("--episode-time-s", "1.2", "--reset-time-s", "0.3")
    result = collect(config, "--episodes", "3", *timed, "--tasks", str(tasks))
    out = result.stdout
    assert result.returncode == 0, out + result.stderr
    assert "no terminal on stdin: no keys, the takes run their time" in out
    assert "collect: 3 take(s) kept, 0 re-recorded, 0 discarded" in out
    log = root.parent / "ds.daemon.log"
    assert f"its log: {log}" in out and "serving control" in log.read_text()
    episodes = load_episodes(root)
    assert len(episodes) == 3
    names = load_tasks(root)
    assert [names[i] for e in episodes for i in _task_indices(root, e)] == [
        "Put the cube in the bin.",
        "Put the cube back.",
        "Put the cube in the bin.",
    ]
    for e in episodes:
        index = e["episode_index"]
        meta, _ = load_episode_sidecar(root, index)
        assert meta is not None
        verdict = meta["verdict"]
        # Sim episodes get the bit-exact replay: each one sound, printed, and stored beside it.
        assert verdict["verdict"] == "sound" and "replays bit for bit" in verdict["summary"], verdict
        assert f"verdict take {index + 1} (episode {index}): SOUND: " in out
        assert verdict["details"]["take_end_to_verdict_s"] < 60
    assert f"dataset: {root} (finalized)" in out
    check_passes(root)

    # The same root again: the daemon refuses it without --resume, and collect says why.
    refused = collect(config, "--episodes", "1", *timed)
    assert refused.returncode == 2
    assert "already exists and is not empty; pass --resume" in refused.stderr
    assert len(load_episodes(root)) == 3

    resumed = collect(config, "--episodes", "1", *timed, "--resume", "--task", "one more")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "take 1 of 1: recording episode 3" in resumed.stdout
    assert [e["episode_index"] for e in load_episodes(root)] == [0, 1, 2, 3]
    check_passes(root)


def test_attach_drives_a_running_daemon_and_leaves_it_running(tmp_path: Path) -> None:
    root = tmp_path / "ds"
    daemon = Daemon(tmp_path, sim_config(root)).start()
    try:
        result = collect(
            daemon.config_path, "--attach", "--episodes", "1", "--episode-time-s", "1", "--reset-time-s", "0"
        )
        assert result.returncode == 0, result.stdout + result.stderr
        assert "starting the daemon" not in result.stdout
        assert "collect: 1 take(s) kept" in result.stdout
        status = daemon.call("status")  # still serving, its dataset finalized by collect
        assert status["state"] == "finalized" and status["dataset"]["finalized"]
        assert daemon.shutdown() == 0
    finally:
        daemon.close()
    assert len(load_episodes(root)) == 1


def test_collect_tells_the_daemon_its_phase_take_and_countdown(tmp_path: Path) -> None:
    root = tmp_path / "ds"
    daemon = Daemon(tmp_path, sim_config(root)).start()
    try:
        argv = [sys.executable, "-m", "hilrec.daemon.cli", "collect", "--config", str(daemon.config_path)]
        argv += ["--no-sounds", "--attach", "--episodes", "2", "--episode-time-s", "2", "--reset-time-s", "2"]
        argv += ["--task", "Put the cube in the bin."]
        proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
        )
        notes: list[dict[str, Any]] = []
        deadline = time.monotonic() + 240.0
        while proc.poll() is None and time.monotonic() < deadline:
            note = daemon.call("status")["collect"]
            if note is not None and (not notes or _key(note) != _key(notes[-1])):
                notes.append(note)
            time.sleep(0.05)  # a polling period, not a wait for an outcome
        out = proc.communicate(timeout=30)[0].decode()
        assert proc.returncode == 0, out
        seen = [_key(n) for n in notes]
        assert ("recording", 1, 2) in seen and ("recording", 2, 2) in seen, seen
        assert ("reset", 1, 2) in seen and ("final_reset", 2, 2) in seen, seen
        assert seen.index(("recording", 1, 2)) < seen.index(("reset", 1, 2)) < seen.index(("recording", 2, 2))
        for note in notes:
            assert note["task"] == "Put the cube in the bin." and note["age_s"] < 5.0
            if note["phase"] in ("recording", "reset"):
                assert note["seconds_left"] is not None and 0.0 <= note["seconds_left"] <= 2.0
        assert daemon.call("status")["state"] == "finalized"
        # collect is gone: its last note stops being reported once it is not renewed.
        daemon.wait_status(lambda st: st["collect"] is None, timeout_s=30.0)
        assert daemon.shutdown() == 0
    finally:
        daemon.close()


def _key(note: dict[str, Any]) -> tuple[str, int, int]:
    return note["phase"], note["take"], note["takes"]


def _task_indices(root: Path, episode: dict) -> list[int]:
    from hilrec.daemon.dataset.format.reader import read_episode

    return sorted(set(read_episode(root, episode["episode_index"], ["task_index"])["task_index"].tolist()))
