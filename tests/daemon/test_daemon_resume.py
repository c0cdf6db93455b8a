"""Resuming is explicit: ``hilrec daemon`` and ``hilrec record --sim`` refuse an existing,
non-empty root unless told ``--resume``, and with it refuse a dataset that does not match,
naming what differs."""

from __future__ import annotations

from pathlib import Path

import pytest
from _daemon import Daemon, check_passes, sim_config

from hilrec.daemon.cli import main
from hilrec.daemon.dataset.format.reader import load_episodes, load_info
from hilrec.daemon.dataset.format.sidecar import load_episode_sidecar

# Real daemons, processes or kill loops: the slow tier (make test runs it; make test-fast does not).
pytestmark = pytest.mark.slow


def _refused(tmp_path: Path, config: str, *args: str) -> str:
    """Start a daemon that must exit at once (status 2, before binding a port); its log."""
    daemon = Daemon(tmp_path, config)
    try:
        daemon.start(expect_ready=False, args=args)
        assert daemon.wait_exit(120) == 2, daemon.log()
        return daemon.log()
    finally:
        daemon.close()


def test_the_daemon_resumes_only_when_told_and_only_a_matching_dataset(tmp_path: Path) -> None:
    root = tmp_path / "ds"
    first = Daemon(tmp_path, sim_config(root, realtime=False)).start()
    try:
        first.call("start_episode", task="first", seed=1)
        first.wait_frames(10)
        first.call("stop_episode")
        first.wait_saved(1)
        assert first.shutdown() == 0
    finally:
        first.close()
    before = (root / "meta" / "info.json").read_bytes()

    # No silent appending: a non-empty root needs --resume.
    log = _refused(tmp_path, sim_config(root, realtime=False))
    assert f"{root} already exists and is not empty; pass --resume" in log
    # With --resume, a config recording other features is refused, naming the difference.
    log = _refused(tmp_path, sim_config(root, realtime=False, size=(24, 32)), "--resume")
    assert "cannot resume" in log and "'observation.images.front' has shape [48, 64, 3] in the dataset" in log
    assert "[24, 32, 3] here" in log
    log = _refused(tmp_path, sim_config(root, realtime=False).replace("fps = 25", "fps = 50"), "--resume")
    assert "fps is 25 in the dataset, 50 in this recording" in log
    # A directory that holds something else is no dataset to resume.
    stranger = tmp_path / "stranger"
    stranger.mkdir()
    (stranger / "notes.txt").write_text("not a dataset")
    log = _refused(tmp_path, sim_config(stranger, realtime=False), "--resume")
    assert "holds no LeRobot dataset" in log
    assert (root / "meta" / "info.json").read_bytes() == before  # nothing refused touched it

    # The matching config with --resume carries on after the saved episode.
    again = Daemon(tmp_path, sim_config(root, realtime=False)).start(args=("--resume",))
    try:
        assert again.call("start_episode", task="second", seed=2)["episode_index"] == 1
        again.wait_frames(10)
        again.call("stop_episode")
        again.wait_saved(1)
        assert again.shutdown() == 0
    finally:
        again.close()
    check_passes(root)
    assert [e["episode_index"] for e in load_episodes(root)] == [0, 1]


def _record(root: Path, *args: str) -> int:
    return main(["record", "--sim", "--root", str(root), "--episodes", "1", "--no-progress", *args])


def test_record_sim_resumes_only_when_told_and_only_a_matching_dataset(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "sim"
    assert _record(root, "--cameras", "none") == 0
    capsys.readouterr()
    assert _record(root, "--cameras", "none") == 2
    assert "already exists and is not empty; pass --resume" in capsys.readouterr().err
    assert _record(root, "--cameras", "front", "--size", "64x48", "--resume") == 2
    err = capsys.readouterr().err
    assert (
        "cannot resume" in err
        and "'observation.images.front' is in this recording but not in the dataset" in err
    )
    assert _record(root, "--cameras", "none", "--fps", "50", "--resume") == 2
    assert "fps is 25 in the dataset, 50 in this recording" in capsys.readouterr().err
    assert load_info(root)["total_episodes"] == 1

    assert _record(root, "--cameras", "none", "--resume") == 0
    episodes = load_episodes(root)
    assert [e["episode_index"] for e in episodes] == [0, 1]
    seeds = [load_episode_sidecar(root, i)[0]["sim"]["seed"] for i in (0, 1)]  # type: ignore[index]
    assert seeds == [0, 1]  # a resumed recording does not repeat the seeds it has
    check_passes(root)
    from hilrec.sim.replay import replay_check

    assert replay_check(root).passed
