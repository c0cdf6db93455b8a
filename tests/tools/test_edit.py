"""``hilrec edit``: every sub-command's result is the source's episodes, renumbered, checked clean.

A synthetic dataset (six short episodes, one camera, two tasks, sidecars with success and a
verdict) serves most tests; a three-episode sim recording shows that an edited sim dataset still
replays bit for bit; LeRobot's own ``delete_episodes`` output shows that ``recompute-stats``
clears the stale-stats warnings, and LeRobot loads what ``hilrec edit`` writes.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from hilrec.daemon.cli import main
from hilrec.daemon.dataset.check.checker import check_dataset
from hilrec.daemon.dataset.format.reader import (
    load_episodes,
    load_info,
    load_task_list,
    read_episode,
    read_episode_frames,
)
from hilrec.daemon.dataset.format.sidecar import load_dataset_sidecar, load_episode_sidecar
from hilrec.daemon.dataset.writer.dataset_writer import DatasetWriter
from hilrec.daemon.errors import DatasetError, FlagError
from hilrec.daemon.so101 import ACTION_KEY, STATE_KEY, so101_features
from hilrec.daemon.tools import edit

FPS = 25
H, W = 48, 64
CAM = "observation.images.front"
LENGTHS = (12, 9, 14, 8, 11, 10)
TASKS = ("pick up the cube", "put the cube in the bin")


def frames(episode: int, length: int) -> list[dict]:
    rng = np.random.default_rng(500 + episode)
    base = np.linspace(0, 255, W, dtype=np.float32)[None, :, None]
    out = []
    for i in range(length):
        image = np.clip(base + 9 * i + 40 * episode + np.zeros((H, W, 3), np.float32), 0, 255)
        out.append(
            {
                ACTION_KEY: rng.normal(size=6).astype(np.float32),
                STATE_KEY: rng.normal(size=6).astype(np.float32),
                CAM: image.astype(np.uint8),
                "task": TASKS[episode % 2],
            }
        )
    return out


def make_dataset(root: Path, lengths: tuple[int, ...] = LENGTHS, *, fps: int = FPS, offset: int = 0) -> Path:
    """Episodes of ``lengths``; sidecars: success on even episodes, verdict sound on multiples of 3."""
    with DatasetWriter.create(
        root,
        fps=fps,
        features=so101_features({"front": (H, W)}),
        robot_type="so_follower",
        video_codec="libx264",
    ) as writer:
        for episode, length in enumerate(lengths):
            for frame in frames(episode + offset, length):
                writer.add_frame(frame)
            verdict = {"verdict": "sound" if episode % 3 == 0 else "warning", "summary": "test"}
            writer.save_episode(
                sidecar={
                    "task": TASKS[episode % 2],
                    "success": episode % 2 == 0,
                    "verdict": verdict,
                    "mark": episode + offset,
                },
                arrays={"marker": np.full(3, episode + offset)},
            )
    return root


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_dataset(tmp_path_factory.mktemp("edit") / "src")


def copy_of(source: Path, tmp_path: Path, name: str = "ds") -> Path:
    root = tmp_path / name
    shutil.copytree(source, root, symlinks=True)
    return root


def tree_digest(root: Path) -> dict[str, str]:
    out = {}
    for directory, _dirs, files in os.walk(root):
        for name in files:
            if name == ".hilrec-writer.lock":
                continue
            path = Path(directory) / name
            out[str(path.relative_to(root))] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


def assert_clean(root: Path) -> None:
    report = check_dataset(root, strict=True)
    assert not report.failures, report.format_text()
    assert not edit.temp_dirs(root), edit.temp_dirs(root)


def assert_same_episode(src: Path, old: int, dst: Path, new: int) -> None:
    a, b = read_episode(src, old, [ACTION_KEY, STATE_KEY]), read_episode(dst, new, [ACTION_KEY, STATE_KEY])
    for key in (ACTION_KEY, STATE_KEY):
        np.testing.assert_array_equal(a[key], b[key])
    # Packets are copied: the decoded frames are bit-equal.
    np.testing.assert_array_equal(read_episode_frames(src, old, CAM), read_episode_frames(dst, new, CAM))
    meta_a, arrays_a = load_episode_sidecar(src, old)
    meta_b, arrays_b = load_episode_sidecar(dst, new)
    assert meta_a is not None and meta_b is not None
    assert meta_b["mark"] == meta_a["mark"] and meta_b["episode_index"] == new
    assert meta_b["edited_from"]["episode_index"] == old
    np.testing.assert_array_equal(arrays_a["marker"], arrays_b["marker"])


@pytest.mark.slow  # > 5 s (make test-fast leaves it out)
def test_delete_episodes_renumbers_everything_in_place(source: Path, tmp_path: Path) -> None:
    root = copy_of(source, tmp_path)
    report = edit.delete_episodes(root, [1, 3, 4])
    assert report.swap == "exchange" and report.videos_cut == 1 and report.videos_reencoded == 0
    assert_clean(root)
    kept = [0, 2, 5]
    rows = load_episodes(root)
    assert [r["length"] for r in rows] == [LENGTHS[k] for k in kept]
    for new, old in enumerate(kept):
        assert_same_episode(source, old, root, new)
    # Tasks: in order of first use; episode 5 uses task 1.
    assert load_task_list(root) == [TASKS[0], TASKS[1]]
    assert [r["tasks"] for r in rows] == [[TASKS[0]], [TASKS[0]], [TASKS[1]]]
    info = load_info(root)
    assert info["total_episodes"] == 3 and info["total_frames"] == sum(LENGTHS[k] for k in kept)
    sidecars = sorted(p.name for p in (root / "hilrec/episodes").iterdir())
    assert sidecars == [f"episode-{i:06d}.{ext}" for i in range(3) for ext in ("json", "npz")]
    assert (load_dataset_sidecar(root) or {})["edits"][-1]["command"] == "hilrec edit delete-episodes"


@pytest.mark.slow  # > 5 s (make test-fast leaves it out)
def test_delete_to_out_leaves_the_source_alone(source: Path, tmp_path: Path) -> None:
    root = copy_of(source, tmp_path)
    before = tree_digest(root)
    out = tmp_path / "out"
    assert main(["edit", "delete-episodes", str(root), "--episodes", "0,2-3", "--out", str(out)]) == 0
    assert tree_digest(root) == before
    assert_clean(out)
    assert [r["length"] for r in load_episodes(out)] == [LENGTHS[1], LENGTHS[4], LENGTHS[5]]
    with pytest.raises(DatasetError, match="not empty"):
        edit.delete_episodes(root, [0], out=out)
    with pytest.raises(DatasetError, match="no episode"):
        edit.delete_episodes(root, [17])
    assert tree_digest(root) == before and not edit.temp_dirs(root)


def test_a_result_that_fails_the_check_never_replaces_the_source(source: Path, tmp_path: Path) -> None:
    root = copy_of(source, tmp_path)
    before = tree_digest(root)

    def build(sources: Sequence[edit.Source], result: Path, report: edit.EditReport) -> None:
        edit.write_dataset(result, sources, [edit.Pick(0, 0), edit.Pick(0, 1)], report=report)
        (result / "meta/stats.json").write_text("{}")  # damaged: stats of no feature

    with pytest.raises(DatasetError, match="fails hilrec check"):
        edit.run_edit("test", [root], root, build)
    assert tree_digest(root) == before and not edit.temp_dirs(root)


@pytest.mark.slow  # > 5 s (make test-fast leaves it out)
def test_set_task_keep_and_remove_feature(source: Path, tmp_path: Path) -> None:
    root = copy_of(source, tmp_path)
    edit.set_task(root, [0, 2], "stack the cubes")
    assert_clean(root)
    assert (
        load_task_list(root) == ["stack the cubes", TASKS[1]] or load_task_list(root)[0] == "stack the cubes"
    )
    rows = load_episodes(root)
    assert rows[0]["tasks"] == ["stack the cubes"] and rows[2]["tasks"] == ["stack the cubes"]
    assert rows[1]["tasks"] == [TASKS[1]] and rows[4]["tasks"] == [TASKS[0]]
    assert (load_episode_sidecar(root, 2)[0] or {})["task"] == "stack the cubes"
    with pytest.raises(DatasetError, match=r"one line|empty|task"):
        edit.set_task(root, [0], "two\nlines")

    kept = tmp_path / "kept"
    edit.keep_episodes(root, success=True, out=kept)
    assert_clean(kept)
    assert [r["length"] for r in load_episodes(kept)] == [LENGTHS[0], LENGTHS[2], LENGTHS[4]]
    sound = tmp_path / "sound"
    assert main(["edit", "keep", str(root), "--verdict", "sound", "--out", str(sound)]) == 0
    assert [r["length"] for r in load_episodes(sound)] == [LENGTHS[0], LENGTHS[3]]
    # A misspelt verdict named the valid ones, rather than "no episode matches".
    with pytest.raises(FlagError, match=r"unknown verdict\(s\) sond; the verdicts are sound, warning, bad"):
        edit.keep_episodes(root, verdicts=["sond"], out=tmp_path / "misspelt")
    assert not (tmp_path / "misspelt").exists()

    no_cam = tmp_path / "nocam"
    edit.remove_feature(root, CAM, out=no_cam)
    assert_clean(no_cam)
    assert CAM not in load_info(no_cam)["features"] and not (no_cam / "videos").exists()
    with pytest.raises(DatasetError, match="default columns"):
        edit.remove_feature(root, "index", out=tmp_path / "x")


@pytest.mark.slow  # > 5 s (make test-fast leaves it out)
def test_merge_and_split(source: Path, tmp_path: Path) -> None:
    other = make_dataset(tmp_path / "other", (7, 13), offset=10)
    merged = tmp_path / "merged"
    assert main(["edit", "merge", str(source), str(other), "--out", str(merged)]) == 0
    assert_clean(merged)
    assert len(load_episodes(merged)) == len(LENGTHS) + 2
    assert_same_episode(source, 4, merged, 4)
    assert_same_episode(other, 1, merged, len(LENGTHS) + 1)
    assert (load_episode_sidecar(merged, 7)[0] or {})["edited_from"]["dataset"] == str(other)

    slow = make_dataset(tmp_path / "slow", (6,), fps=20)
    with pytest.raises(DatasetError, match=r"fps differs: 25 .* 20"):
        edit.merge([source, slow], tmp_path / "bad")
    assert not (tmp_path / "bad").exists()

    parts = [tmp_path / "train", tmp_path / "val"]
    edit.split(merged, parts, fractions=[0.75, 0.25])
    assert [len(load_episodes(p)) for p in parts] == [6, 2]
    # Fractions that do not sum to 1 dropped the rest without a word: refused.
    short = [tmp_path / "short-a", tmp_path / "short-b"]
    with pytest.raises(DatasetError, match=r"--fractions 0.5,0.2: .*summing to 1 \(they sum to 0.7"):
        edit.split(merged, short, fractions=[0.5, 0.2])
    assert not any(p.exists() for p in short)
    for part in parts:
        assert_clean(part)
    assert_same_episode(merged, 6, parts[1], 0)
    assert (load_episode_sidecar(parts[1], 0)[0] or {})["edited_from"]["previous"]["episode_index"] == 0
    lists = [tmp_path / "a", tmp_path / "b"]
    assert main(["edit", "split", str(source), "--out", *map(str, lists), "--episodes", "0-1", "4"]) == 0
    assert [len(load_episodes(p)) for p in lists] == [2, 1]


def test_the_two_rename_fallback_recovers(
    source: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = copy_of(source, tmp_path)
    monkeypatch.setenv("HILREC_EDIT_NO_EXCHANGE", "1")
    report = edit.delete_episodes(root, [0])
    assert report.swap == "two renames"
    assert_clean(root)
    assert len(load_episodes(root)) == len(LENGTHS) - 1

    # An exception between the two renames puts the source back.
    before = tree_digest(root)

    def fail(name: str) -> None:
        if name == "renamed-old":
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        edit.delete_episodes(root, [0], options=edit.Options(hook=fail))
    assert tree_digest(root) == before and not edit.temp_dirs(root)


@pytest.mark.slow  # > 5 s (make test-fast leaves it out)
def test_sim_dataset_still_replays_after_delete(tmp_path: Path) -> None:
    from hilrec.sim.recorder import RecordConfig, record
    from hilrec.sim.replay import replay_check

    root = tmp_path / "sim"
    record(
        RecordConfig(root=root, episodes=3, seed=7, image_size=(48, 64), video_codec="libx264"),
        progress=False,
    )
    edit.delete_episodes(root, [1])
    assert_clean(root)
    report = replay_check(root)
    assert report.passed and len(report.episodes) == 2, report.format_text()
