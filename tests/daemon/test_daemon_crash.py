"""A SIGKILL of the daemon mid-take costs at most about a second of it (issue 23, item 6).

A real sim daemon records; once its writer reports a durable frame count of at least N (the
open take's checkpoint, about once a second), it is killed. ``hilrec repair`` must then give the
take back with at least those N frames, marked ``ended_by: crash`` in its sidecar, the dataset
passing ``hilrec check``. Both encoders (in threads, and the encoder processes) and several kill
points; the bound is the writer's own report, not a wall-clock guess.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest
from _daemon import Daemon, check_passes, run_cli, sim_config

from hilrec.daemon.dataset.format.reader import load_episodes
from hilrec.daemon.dataset.format.sidecar import load_episode_sidecar

# Real daemons, processes or kill loops: the slow tier (make test runs it; make test-fast does not).
pytestmark = pytest.mark.slow

ENCODERS = {
    "process": 'video_encoder = "process"',
    "thread": 'video_encoder = "thread"\nvideo_codec = "libx264"',
}


@pytest.mark.parametrize("encoder", sorted(ENCODERS))
@pytest.mark.parametrize("saved_before", [0, 1])
def test_a_killed_daemon_loses_at_most_a_second_of_the_open_take(
    tmp_path: Path, encoder: str, saved_before: int
) -> None:
    root = tmp_path / "ds"
    daemon = Daemon(tmp_path, sim_config(root, dataset_extra=ENCODERS[encoder])).start()
    try:
        for take in range(saved_before):
            daemon.call("start_episode", task="place the cube", seed=10 + take)
            daemon.wait_frames(15)
            daemon.call("stop_episode", success=True)
            daemon.wait_saved(take + 1)
        daemon.call("start_episode", task="pick the cube", seed=1)
        # Kill points: just past the first checkpoint, and a few seconds in.
        wanted = 25 if saved_before == 0 else 75
        status = daemon.wait_status(
            lambda s: s["dataset"].get("durable_frames", 0) >= wanted,
            timeout_s=60,
            what=f"{wanted} durable frames of the open take",
        )
        durable = status["dataset"]["durable_frames"]
        recorded = status["episode"]["frames"]
        daemon.signal(signal.SIGKILL)
        daemon.wait_exit(30)
    finally:
        daemon.close()
    repaired = run_cli("repair", str(root), "--json")
    assert repaired.returncode == 0, repaired.stdout + repaired.stderr
    report = json.loads(repaired.stdout)
    assert len(report["crashed_takes"]) == 1, report
    check_passes(root)
    episodes = load_episodes(root)
    assert len(episodes) == saved_before + 1
    kept = episodes[-1]["length"]
    # At least what the writer called durable; at most what the loop had recorded.
    assert durable <= kept <= recorded + 50, (durable, kept, recorded)
    sidecar, _ = load_episode_sidecar(root, saved_before)
    assert sidecar is not None and sidecar["ended_by"] == "crash" and sidecar["frames"] == kept
    assert sidecar["task"] == "pick the cube"
