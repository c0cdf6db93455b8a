"""Damage every file of a small dataset in turn; ``hilrec repair`` keeps every episode that survives.

The dataset (2 episodes, 1 tiny camera) is written by the real writer. Each of its files is then,
on a fresh copy, truncated to half its size, has the byte in its middle flipped, or is deleted;
and ``repair`` must:

- exit 0 (nothing lost) or 3 (episodes dropped, each with a reason), and leave a dataset that
  ``hilrec check`` accepts;
- keep every episode whose data survive the damage, with its rows bit-equal to what was written.
  Rows and metadata are kept twice (the journal and LeRobot's files), so damage to one file never
  costs an episode; frames are kept once (in LeRobot's video file, once merged), so an episode
  whose frames the damage reached may go. Which episodes' frames survive is decided from the
  original mp4's own packet table: truncation keeps an episode whose packets all lie before the
  cut; a flipped byte spares the episodes whose packets do not hold it.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import av
import numpy as np
import pytest
from _frames import front_camera_writer

from hilrec.daemon.dataset.check.checker import check_dataset
from hilrec.daemon.dataset.format.reader import load_episodes, load_info, load_tasks, read_episode
from hilrec.daemon.dataset.repair.recover import EXIT_DROPPED, EXIT_OK, repair
from hilrec.daemon.dataset.store.rootlock import LOCK_NAME

FPS = 25
H, W = 16, 24
CAM = "observation.images.front"
VIDEO = f"videos/{CAM}/chunk-000/file-000.mp4"
LENGTHS = (8, 6)
DAMAGES = ("truncate", "flip", "delete")
COMPARED = ("action", "observation.state", "timestamp", "frame_index")


def frames_of(episode: int, length: int) -> list[dict]:
    rng = np.random.default_rng(100 + episode)
    return [
        {
            "action": rng.normal(size=6).astype(np.float32),
            "observation.state": rng.normal(size=6).astype(np.float32),
            CAM: np.full((H, W, 3), 40 * episode + 10 * i, np.uint8),
            "task": f"task {episode}",
        }
        for i in range(length)
    ]


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("pristine") / "ds"
    with front_camera_writer(root, (H, W)) as writer:
        for episode, length in enumerate(LENGTHS):
            for frame in frames_of(episode, length):
                writer.add_frame(frame)
            writer.save_episode(sidecar={"episode": episode})
    assert check_dataset(root).passed
    return root


def damage(path: Path, how: str) -> int:
    """Damage ``path``; returns the offset from which its bytes are gone or wrong."""
    data = path.read_bytes()
    if how == "delete":
        path.unlink()
        return 0
    middle = len(data) // 2
    if how == "truncate":
        path.write_bytes(data[:middle])
    else:
        path.write_bytes(data[:middle] + bytes([data[middle] ^ 0xFF]) + data[middle + 1 :])
    return middle


def episodes_with_frames_in(video: Path, how: str, offset: int) -> set[int]:
    """Episodes whose frames the damage at ``offset`` leaves intact, by the original packet table."""
    if how == "delete":
        return set()
    with av.open(str(video)) as container:
        packets = [
            (int(p.pos), int(p.size))
            for p in container.demux(container.streams.video[0])
            if p.size and p.pos is not None
        ]
    starts = np.cumsum([0, *LENGTHS])
    spans = [packets[starts[e] : starts[e + 1]] for e in range(len(LENGTHS))]
    # Where the index (moov) sits decides whether anything survives a cut: before the first packet.
    index_before = min(pos for pos, _ in packets) < offset
    if how == "truncate":
        return {e for e, span in enumerate(spans) if index_before and all(p + s <= offset for p, s in span)}
    return {e for e, span in enumerate(spans) if not any(p <= offset < p + s for p, s in span)}


def expected_survivors(rel: str, how: str, offset: int, pristine: Path) -> set[int]:
    if rel == VIDEO:
        return episodes_with_frames_in(pristine / VIDEO, how, offset)
    return set(range(len(LENGTHS)))  # rows and metadata have two copies


def targets(root: Path) -> list[str]:
    return sorted(
        p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file() and p.name != LOCK_NAME
    )


@pytest.mark.slow  # every file of a dataset damaged every way, each repaired and checked
def test_repair_keeps_every_episode_whose_data_survive(pristine: Path, tmp_path: Path) -> None:
    original = {e: read_episode(pristine, e, COMPARED) for e in range(len(LENGTHS))}
    tasks = load_tasks(pristine)
    original_tasks = {r["episode_index"]: r["tasks"] for r in load_episodes(pristine)}
    files = targets(pristine)
    assert VIDEO in files and len(files) >= 12
    table: list[str] = []
    for number, (rel, how) in enumerate((rel, how) for rel in files for how in DAMAGES):
        root = tmp_path / f"trial-{number:02d}" / "ds"
        shutil.copytree(pristine, root)
        offset = damage(root / rel, how)
        report = repair(root)
        where = f"{how} {rel}"
        assert report.exit_code in (EXIT_OK, EXIT_DROPPED), f"{where}: {report.to_json()}"
        verdict = check_dataset(root)
        assert verdict.passed, (
            f"{where}: check fails after repair:\n{verdict.format_text()}\n{report.to_json()}"
        )
        survivors = expected_survivors(rel, how, offset, pristine)
        assert survivors <= set(report.kept), (
            f"{where}: kept {report.kept}, {survivors} survive: {report.dropped}"
        )
        assert set(report.kept) | {d["episode"] for d in report.dropped} == set(range(len(LENGTHS)))
        for item in report.dropped:
            assert rel == VIDEO and "frames" in item["reason"], f"{where}: dropped {item}"
        assert load_info(root)["total_episodes"] == len(report.kept)
        for new, old in enumerate(report.kept):
            rows = read_episode(root, new, COMPARED)
            for key in COMPARED:
                assert rows[key].dtype == original[old][key].dtype
                assert np.array_equal(rows[key], original[old][key]), (
                    f"{where}: episode {old} '{key}' differs"
                )
            row = load_episodes(root)[new]
            assert row["tasks"] == original_tasks[old]
            assert [load_tasks(root)[t] for t in read_episode(root, new, ["task_index"])["task_index"]] == [
                tasks[int(t)] for t in read_episode(pristine, old, ["task_index"])["task_index"]
            ]
        table.append(f"{where:60s} exit {report.exit_code} kept {report.kept} rebuilt {report.rebuilt}")
    print("\n".join(table))
