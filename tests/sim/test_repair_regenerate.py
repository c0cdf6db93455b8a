"""A missing mp4 of a sim dataset costs no episode: ``hilrec repair`` re-renders it (issue 23, item 7).

The episodes of a dataset share video files; deleting one took every episode in it (repair
moved them all to ``hilrec/damaged-*``). A sim episode's frames are a function of its start state
and its actions, so the repair now makes them again on the twin and keeps every episode.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from hilrec.daemon.dataset.check.checker import check_dataset
from hilrec.daemon.dataset.format.reader import load_episodes, read_episode
from hilrec.daemon.dataset.video.codec import probe_video
from hilrec.daemon.so101 import ACTION_KEY
from hilrec.sim.recorder import RecordConfig, record

CAM = "observation.images.front"


@pytest.mark.slow  # > 5 s (make test-fast leaves it out)
def test_a_deleted_shared_mp4_of_a_sim_dataset_is_re_rendered_and_every_episode_kept(tmp_path: Path) -> None:
    root = tmp_path / "sim"
    record(
        RecordConfig(
            root=root, episodes=3, seed=7, image_size=(48, 64), push_rate=0.5, video_codec="libx264"
        ),
        progress=False,
    )
    before = load_episodes(root)
    actions = {e: read_episode(root, e, [ACTION_KEY])[ACTION_KEY] for e in range(3)}
    shared = root / f"videos/{CAM}/chunk-000/file-000.mp4"
    assert {int(row[f"videos/{CAM}/file_index"]) for row in before} == {0}  # one file holds them all
    shared.unlink()
    done = subprocess.run(
        [sys.executable, "-m", "hilrec.daemon.cli", "repair", str(root), "--json"],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout)
    kept = [e for e in report["episodes"] if e.get("new_index") is not None]
    assert len(kept) == 3, report
    assert all("re-rendered on the twin" in json.dumps(e) for e in kept), report
    assert check_dataset(root).passed
    after = load_episodes(root)
    assert [row["length"] for row in after] == [row["length"] for row in before]
    for e in range(3):
        assert (read_episode(root, e, [ACTION_KEY])[ACTION_KEY] == actions[e]).all()
    assert probe_video(shared).frames == sum(int(row["length"]) for row in before)
