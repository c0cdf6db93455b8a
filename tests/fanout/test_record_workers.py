"""record --sim --workers N: the dataset of one process, whatever N; a dead worker loses one seed."""

from __future__ import annotations

import dataclasses
import errno
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from _procs import spawn_workers, still_running_after
from _snapshot import differences, record, seeds_of, snapshot

from hilrec.daemon.cli import main
from hilrec.daemon.dataset.format.reader import load_info
from hilrec.daemon.dataset.store import journal
from hilrec.daemon.fanout import TaskOutcome
from hilrec.sim.cmd_record import _seed_list
from hilrec.sim.record_workers import (
    KILL_ENV,
    SCRATCH_MARK,
    FanoutSummary,
    SeedTask,
    _Gatherer,
    _open_destination,
    close_twins,
    record_seed,
    scratch_dirs,
)
from hilrec.sim.recorder import RecordConfig

# Real daemons, processes or kill loops: the slow tier (make test runs it; make test-fast does not).
pytestmark = pytest.mark.slow

# Small images keep a test episode around a second; pushes put disturbances in the sidecars.
EPISODE_FLAGS = ("--cameras", "front", "--size", "64x48", "--pushes", "0.5")
HILREC = str(Path(sys.executable).with_name("hilrec"))
WITHIN_S = 60.0  # bound of every poll below: a process starting or ending on a loaded machine


def test_two_workers_write_the_bytes_of_one_process(tmp_path: Path) -> None:
    one, two = tmp_path / "one", tmp_path / "two"
    assert record(one, "--episodes", "4", *EPISODE_FLAGS) == 0  # no --workers: today's writer path
    assert record(two, "--episodes", "4", "--workers", "2", *EPISODE_FLAGS) == 0
    first, second = snapshot(one), snapshot(two)
    assert any(k.startswith("data/") for k in first) and any(k.endswith(".mp4") for k in first)
    assert differences(first, second) == []
    assert seeds_of(two) == [0, 1, 2, 3]
    assert main(["check", str(two)]) == 0
    assert scratch_dirs(two) == []  # the workers' one-episode datasets are gone


def test_a_killed_worker_loses_only_its_seed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "ds"
    # The worker recording seed 2 SIGKILLs itself before its frame 10: mid-episode, mp4 open.
    monkeypatch.setenv(KILL_ENV, "2:10")
    assert record(root, "--episodes", "5", "--workers", "2", *EPISODE_FLAGS) == 1
    err = capsys.readouterr().err
    assert "seed 2 not recorded: worker process died" in err
    assert seeds_of(root) == [0, 1, 3, 4]  # the others, saved, in seed order
    assert load_info(root)["total_episodes"] == 4
    assert main(["check", str(root)]) == 0  # finalized: nothing left to repair
    assert scratch_dirs(root) == []  # the dead worker's half-written scratch too

    # --resume with no --seed goes on after the highest seed, not at the episode count (4).
    monkeypatch.delenv(KILL_ENV)
    assert record(root, "--resume", "--episodes", "1", "--workers", "2", *EPISODE_FLAGS) == 0
    assert seeds_of(root) == [0, 1, 3, 4, 5]

    # The command it prints records the lost seed into the same dataset.
    hint = err.split("record them again with: ")[1].strip()
    argv = shlex.split(hint)
    assert argv[:2] == ["hilrec", "record"] and "--seed=2" in argv and "--episodes=1" in argv
    assert main([*argv[1:], "--no-progress"]) == 0
    assert seeds_of(root) == [0, 1, 3, 4, 5, 2]
    assert main(["check", str(root)]) == 0


def test_resume_with_workers_appends_the_next_seeds(tmp_path: Path) -> None:
    whole, resumed = tmp_path / "whole", tmp_path / "resumed"
    assert record(whole, "--episodes", "4", "--workers", "2", *EPISODE_FLAGS) == 0
    assert record(resumed, "--episodes", "2", *EPISODE_FLAGS) == 0
    assert record(resumed, "--episodes", "2", "--resume", "--workers", "2", *EPISODE_FLAGS) == 0
    assert seeds_of(resumed) == [0, 1, 2, 3]
    assert differences(snapshot(whole), snapshot(resumed)) == []


def test_workers_flag_is_checked(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert record(tmp_path / "ds", "--episodes", "1", "--workers", "0") == 2
    assert "flag --workers: must be at least 1" in capsys.readouterr().err
    assert not (tmp_path / "ds").exists()


def test_a_full_disk_loses_only_the_seed_it_hit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "ds"
    real, written = journal.write_synced, []

    def full_at_the_third_episode(path: Any, data: bytes) -> None:
        # The parent's commit of seed 2 (the third adopted): the disk is full half-way through.
        if Path(path).name == journal.EPISODE_DATA:
            written.append(path)
            if len(written) == 3:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        real(path, data)

    monkeypatch.setattr(journal, "write_synced", full_at_the_third_episode)
    assert record(root, "--episodes", "4", "--workers", "2", *EPISODE_FLAGS) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert re.search(r"seed 2 not recorded: .*episode 2 \(seed 2\) could not be written.*No space left", err)
    assert "--seed=2 --episodes=1" in err.split("record them again with: ")[1]
    assert seeds_of(root) == [0, 1, 3]  # seed 3 took the index seed 2 could not have
    assert journal.open_episodes(root) == []  # no staging left behind
    assert main(["check", str(root)]) == 0


@pytest.mark.parametrize("receiver", ["main thread", "another thread"])
def test_ctrl_c_landing_inside_a_commit_waits_for_the_episode(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], receiver: str
) -> None:
    root = tmp_path / "ds"
    real, commits = journal.commit_episode, []
    # A terminal's Ctrl-C goes to the process, and the kernel hands it to any thread that does not
    # block it: under load that is often a pool or merger thread rather than the main one.
    bystander_stop = threading.Event()
    bystander = threading.Thread(target=bystander_stop.wait, daemon=True)
    bystander.start()
    target = threading.main_thread().ident if receiver == "main thread" else bystander.ident
    assert target is not None

    def interrupted_after_the_rename(*args: Any, **kwargs: Any) -> Path:
        # Ctrl-C between the commit's rename and the adopter's numbering: the worst moment.
        done = real(*args, **kwargs)
        commits.append(done)
        if len(commits) == 2:
            signal.pthread_kill(target, signal.SIGINT)
        return done

    monkeypatch.setattr(journal, "commit_episode", interrupted_after_the_rename)
    try:
        assert record(root, "--episodes", "4", "--workers", "2", "--cameras", "none") == 130
    finally:
        bystander_stop.set()
    err = capsys.readouterr().err
    kept = seeds_of(root)
    assert kept[:2] == [0, 1]
    assert f"interrupted: {len(kept)} episodes kept in {root}, finalized" in err
    lost = sorted(set(range(4)) - set(kept))  # what the summary says is lost is what is missing
    assert err.strip().endswith(f"not recorded: seeds {_seed_list(lost)}")
    assert load_info(root)["total_episodes"] == len(kept)
    assert main(["check", str(root)]) == 0


def test_a_seed_from_another_world_is_failed_by_name(tmp_path: Path) -> None:
    config = RecordConfig(root=tmp_path / "ds", episodes=2, cameras=())
    first, second = (record_seed(SeedTask(config=dataclasses.replace(config, seed=s))) for s in (0, 1))
    # As recorded on a node with another MuJoCo (and its own venv, which is no difference).
    sim = second.provenance["sim"]
    moved = {**sim["model"], "xml": {**sim["model"]["xml"], "path": "/elsewhere/so101_new_calib.xml"}}
    other = {**second.provenance, "sim": {**sim, "mujoco_version": "0.0.0", "model": moved}}
    second = dataclasses.replace(second, provenance=other)
    summary = FanoutSummary(root=config.root, fps=config.fps)
    adopter = _open_destination(config)
    gather = _Gatherer(adopter, [0, 1], summary)
    for index, recording in enumerate((first, second)):
        gather.finished(TaskOutcome(index=index, result=recording, error=None))
    adopter.finalize()
    close_twins()
    assert summary.failed == {
        1: "recorded in another world than seed 0 (on another node?): sim.mujoco_version differ"
    }
    assert seeds_of(config.root) == [0]
    assert main(["check", str(config.root)]) == 0


def private_shared_memory(shm: Path) -> list[str]:
    """The argv prefix that runs a command with ``shm`` as its ``/dev/shm``, in a mount namespace
    of its own (same pid: ``unshare`` and ``sh`` exec it).

    Scratch directories live in ``/dev/shm``, and any recording run on the host removes those of a
    dead recorder, whatever their destination (what a user wants: shared memory back). Another
    test's run on another pytest worker once removed this test's, between the kill and the look.
    """
    shm.mkdir()
    return [
        "unshare", "--map-root-user", "--mount", "--propagation", "private",
        "sh", "-c", 'mount --bind "$0" /dev/shm && exec "$@"', str(shm),
    ]  # fmt: skip


def test_killing_the_recorder_leaves_no_worker_and_the_next_run_removes_its_scratch(tmp_path: Path) -> None:
    root, shm = tmp_path / "ds", tmp_path / "shm"
    private = private_shared_memory(shm)
    argv = [*private, HILREC, "record", "--sim", "--root", str(root), "--cameras", "none", "--no-progress"]

    def scratch() -> list[Path]:
        return sorted(path for path in shm.iterdir() if SCRATCH_MARK in path.name)

    # --realtime: an episode lasts ~5 s, so both workers are surely mid-episode when it is killed.
    parent = subprocess.Popen(
        [*argv, "--episodes", "6", "--realtime", "--workers", "2"],
        env=dict(os.environ),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        workers: list[int] = []
        deadline = time.monotonic() + WITHIN_S
        while len(workers) < 2 or not scratch():
            assert parent.poll() is None and time.monotonic() < deadline, "no two workers recording"
            workers = spawn_workers(parent.pid)
            time.sleep(0.05)  # polling for the workers, bounded
    finally:
        parent.kill()
        parent.wait()
    alive = still_running_after(workers, WITHIN_S)
    assert not alive, f"workers {alive} outlive the killed recorder"
    [left] = scratch()  # nobody was there to remove it
    assert f"{SCRATCH_MARK}{parent.pid}-" in left.name  # named after the recorder that made it
    resumed = subprocess.run(
        [*argv, "--resume", "--episodes", "1", "--workers", "2"],
        env=dict(os.environ),
        capture_output=True,
        text=True,
        timeout=WITHIN_S * 5,
        check=False,
    )
    assert resumed.returncode == 0, resumed.stderr
    assert scratch() == []
    assert scratch_dirs(root) == []
    assert main(["check", str(root)]) == 0
