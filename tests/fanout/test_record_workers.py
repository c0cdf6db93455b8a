"""record --sim --workers N: the dataset of one process, whatever N; a dead worker loses one seed."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
from _snapshot import differences, record, seeds_of, snapshot

from hilrec.daemon.cli import main
from hilrec.daemon.dataset.reader import load_info
from hilrec.sim.record_workers import KILL_ENV, scratch_dir

# Small images keep a test episode around a second; pushes put disturbances in the sidecars.
EPISODE_FLAGS = ("--cameras", "front", "--size", "64x48", "--pushes", "0.5")


def test_two_workers_write_the_bytes_of_one_process(tmp_path: Path) -> None:
    one, two = tmp_path / "one", tmp_path / "two"
    assert record(one, "--episodes", "4", *EPISODE_FLAGS) == 0  # no --workers: today's writer path
    assert record(two, "--episodes", "4", "--workers", "2", *EPISODE_FLAGS) == 0
    first, second = snapshot(one), snapshot(two)
    assert any(k.startswith("data/") for k in first) and any(k.endswith(".mp4") for k in first)
    assert differences(first, second) == []
    assert seeds_of(two) == [0, 1, 2, 3]
    assert main(["check", str(two)]) == 0
    assert not scratch_dir(two).exists()  # the workers' one-episode datasets are gone


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
    assert not scratch_dir(root).exists()  # the dead worker's half-written scratch too

    # The command it prints records the lost seed into the same dataset.
    monkeypatch.delenv(KILL_ENV)
    hint = err.split("record them again with: ")[1].strip()
    argv = shlex.split(hint)
    assert argv[:2] == ["hilrec", "record"] and "--seed=2" in argv and "--episodes=1" in argv
    assert main([*argv[1:], "--no-progress"]) == 0
    assert seeds_of(root) == [0, 1, 3, 4, 2]
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
