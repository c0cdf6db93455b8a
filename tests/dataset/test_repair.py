"""``hilrec repair``: orphan temp files, truncated parquet, wrong info.json counts, unsaved episodes;
and issue 10's attacks: each file LeRobot reads damaged in the way that used to lose episodes or
give up, the journal damaged, a full disk, an empty dataset, a root another process holds."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from _frames import front_camera_writer

from hilrec.daemon.cli import main as cli_main
from hilrec.daemon.dataset.check.checker import check_dataset
from hilrec.daemon.dataset.format.reader import column_to_numpy
from hilrec.daemon.dataset.format.sidecar import load_episode_sidecar
from hilrec.daemon.dataset.repair.recover import repair
from hilrec.daemon.dataset.store.journal import read_entry
from hilrec.daemon.dataset.store.rootlock import RootLock
from hilrec.daemon.dataset.writer.dataset_writer import DatasetWriter
from hilrec.daemon.so101 import so101_features

FPS = 25
H, W = 32, 48
CAM = "observation.images.front"
LENGTHS = (12, 9, 15)


def frames_of(episode: int, length: int) -> list[dict]:
    rng = np.random.default_rng(episode)
    return [
        {
            "action": rng.normal(size=6).astype(np.float32),
            "observation.state": rng.normal(size=6).astype(np.float32),
            CAM: np.full((H, W, 3), 20 * episode + i, np.uint8),
            "task": f"task {episode}",
        }
        for i in range(length)
    ]


@pytest.fixture()
def dataset(tmp_path: Path) -> Path:
    root = tmp_path / "ds"
    with front_camera_writer(root, (H, W)) as writer:
        for episode, length in enumerate(LENGTHS):
            for frame in frames_of(episode, length):
                writer.add_frame(frame)
            writer.save_episode(sidecar={"episode": episode})
    return root


def read_actions(root: Path) -> dict[int, np.ndarray]:
    info = json.loads((root / "meta/info.json").read_text())
    out: dict[int, list[np.ndarray]] = {}
    for path in sorted((root / "data").glob("chunk-*/file-*.parquet")):
        table = pq.read_table(path)
        episodes = column_to_numpy(table.column("episode_index"))
        actions = column_to_numpy(table.column("action"))
        for e in np.unique(episodes):
            out.setdefault(int(e), []).append(actions[episodes == e])
    assert sorted(out) == list(range(info["total_episodes"]))
    return {e: np.concatenate(parts) for e, parts in out.items()}


def expected_actions(episode: int) -> np.ndarray:
    return np.stack([f["action"] for f in frames_of(episode, LENGTHS[episode])])


def test_a_clean_dataset_needs_nothing(dataset: Path) -> None:
    report = repair(dataset)
    assert report.exit_code == 0 and report.kept == [0, 1, 2] and not report.rebuilt


def test_orphan_temp_files_are_removed(dataset: Path) -> None:
    (dataset / "meta/.info.json.tmp-4242").write_text("{")
    (dataset / "data/chunk-000/file-000.parquet.hilrec-new").write_bytes(b"PAR1")
    report = repair(dataset)
    assert report.exit_code == 0
    assert not (dataset / "meta/.info.json.tmp-4242").exists()
    assert not (dataset / "data/chunk-000/file-000.parquet.hilrec-new").exists()
    assert len(report.actions) == 2


def test_a_truncated_data_parquet_is_rebuilt_from_the_journal(dataset: Path) -> None:
    path = dataset / "data/chunk-000/file-000.parquet"
    path.write_bytes(path.read_bytes()[:-200])  # footer gone
    report = repair(dataset)
    assert report.rebuilt and report.exit_code == 0 and report.kept == [0, 1, 2]
    actions = read_actions(dataset)
    for episode in range(3):
        assert np.array_equal(actions[episode], expected_actions(episode))
    assert list((dataset / "hilrec").glob("damaged-*/data/chunk-000/file-000.parquet"))


def test_without_a_journal_the_episodes_of_a_broken_file_are_dropped_and_reported(dataset: Path) -> None:
    shutil.rmtree(dataset / "hilrec/journal")
    video = dataset / f"videos/{CAM}/chunk-000/file-000.mp4"
    video.write_bytes(video.read_bytes()[: video.stat().st_size // 3])
    report = repair(dataset)
    assert report.exit_code == 3 and report.rebuilt
    assert {d["episode"] for d in report.dropped} <= {0, 1, 2} and report.dropped
    info = json.loads((dataset / "meta/info.json").read_text())
    assert info["total_episodes"] == len(report.kept)
    for old, new in zip(report.kept, range(len(report.kept)), strict=True):
        assert np.array_equal(read_actions(dataset)[new], expected_actions(old))
        meta, _ = load_episode_sidecar(dataset, new)
        assert meta is not None and meta["episode"] == old


def test_info_counts_that_disagree_with_the_files_are_fixed(dataset: Path) -> None:
    info_path = dataset / "meta/info.json"
    info = json.loads(info_path.read_text())
    info["total_frames"] = 999
    info_path.write_text(json.dumps(info))
    report = repair(dataset)
    assert report.exit_code == 0
    fixed = json.loads(info_path.read_text())
    assert fixed["total_frames"] == sum(LENGTHS) and fixed["total_episodes"] == 3


UNSAVED_CHILD = """
import sys
import numpy as np
from hilrec.daemon.dataset.writer.dataset_writer import DatasetWriter
writer = DatasetWriter.open(sys.argv[1], video_codec="libx264")
for i in range(5):
    writer.add_frame({
        "action": np.zeros(6, np.float32), "observation.state": np.zeros(6, np.float32),
        "observation.images.front": np.full((32, 48, 3), i, np.uint8), "task": "task 0",
    })
print("READY", flush=True)
sys.stdin.read()
"""


def kill_mid_take(root: Path) -> None:
    """A writer process dies (SIGKILL) with an episode open: its directory stays behind."""
    child = subprocess.Popen(
        [sys.executable, "-c", UNSAVED_CHILD, str(root)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "READY"
    finally:
        child.kill()
        child.wait(timeout=30)


@pytest.mark.slow
def test_an_unsaved_episode_is_dropped_and_its_sidecar_removed(dataset: Path) -> None:
    kill_mid_take(dataset)
    open_dir = dataset / "hilrec/journal/.episode-000003.tmp"
    assert open_dir.exists()
    (dataset / "hilrec/episodes/episode-000003.json").write_text('{"episode_index": 3}')
    report = repair(dataset)
    assert report.exit_code == 3
    dropped = report.dropped[0]
    assert dropped["episode"] == 3 and "never saved" in dropped["reason"]
    # What of its frames had reached the disk (an mp4 or a spill) when it died, at most all 5.
    assert 0 <= dropped["video_frames_on_disk"].get(CAM, 0) <= 5
    assert not open_dir.exists()
    assert not (dataset / "hilrec/episodes/episode-000003.json").exists()
    assert read_actions(dataset).keys() == {0, 1, 2}


@pytest.mark.slow
def test_the_command_says_what_a_kill_mid_take_kept_and_lost(dataset: Path, capsys) -> None:
    kill_mid_take(dataset)
    assert cli_main(["repair", str(dataset)]) == 3
    text = capsys.readouterr().out
    assert re.search(rf"^ +0-2 +0-2 +{sum(LENGTHS)}  kept, unchanged$", text, re.M), text
    assert re.search(r"^ +3 +- +\S+  DROPPED: open \(never saved\)", text, re.M), text
    assert "kept 3 episode(s) (0-2); 1 episode(s) dropped (3)" in text, text
    assert check_dataset(dataset).passed


def test_the_command_prints_json_and_uses_mcap_exit_codes(dataset: Path, capsys) -> None:
    assert cli_main(["repair", str(dataset), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["kept_episodes"] == [0, 1, 2] and out["dropped"] == []
    shutil.rmtree(dataset / "hilrec/journal")
    (dataset / "data/chunk-000/file-000.parquet").write_bytes(b"PAR1 truncated")
    assert cli_main(["repair", str(dataset)]) == 3
    text = capsys.readouterr().out
    assert re.search(r"^ +0 +- +12  DROPPED: rows unreadable", text, re.M) and "3 episode(s) dropped" in text
    assert cli_main(["repair", str(dataset.parent / "nothing-here")]) == 2
    assert not (dataset.parent / "nothing-here").exists()


# --- issue 10: repair rebuilds from the journal and the intact files, or says why not -----------


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    rc = cli_main(argv)
    out, err = capsys.readouterr()
    return rc, out, err


def repair_json(root: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, dict]:
    rc, out, _ = run(["repair", str(root), "--json"], capsys)
    report = json.loads(out)
    assert report["exit_code"] == rc
    return rc, report


def passes_check(root: Path) -> bool:
    return check_dataset(root).passed


def file_bytes(root: Path, under: str) -> dict[str, bytes]:
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in sorted((root / under).rglob("*"))
        if p.is_file()
    }


def test_truncated_episodes_metadata_keeps_every_episode_and_lerobot_loads_the_result(
    dataset: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = dataset / "meta/episodes/chunk-000/file-000.parquet"
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    rc, report = repair_json(dataset, capsys)
    assert rc == 0 and report["rebuilt"] and report["kept_episodes"] == [0, 1, 2] and report["dropped"] == []
    # Without the episodes metadata the frames are found by aligning the video's frame count.
    assert all("aligned by frame counts" in e["frames"] for e in report["episodes"])
    assert passes_check(dataset)
    actions = read_actions(dataset)
    assert all(np.array_equal(actions[e], expected_actions(e)) for e in range(3))
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    loaded = LeRobotDataset("hilrec/repaired", root=dataset, video_backend="pyav")
    assert loaded.num_episodes == 3 and len(loaded) == sum(LENGTHS)
    stored = np.stack([np.asarray(a, dtype=np.float32) for a in loaded.hf_dataset["action"]])
    assert np.array_equal(stored, np.concatenate([expected_actions(e) for e in range(3)]))
    assert loaded[LENGTHS[0]][CAM].shape == (3, H, W)  # episode 1's first frame decodes


def test_a_deleted_video_file_drops_only_the_episodes_whose_frames_it_held(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "ds"
    with DatasetWriter.create(
        root,
        fps=FPS,
        features=so101_features({"front": (H, W)}),
        robot_type="so_follower",
        video_codec="libx264",
        video_files_size_in_mb=0.001,  # one video file per episode
    ) as writer:
        for episode, length in enumerate(LENGTHS):
            for frame in frames_of(episode, length):
                writer.add_frame(frame)
            writer.save_episode(sidecar={"episode": episode})
    videos = sorted((root / f"videos/{CAM}").rglob("*.mp4"))
    assert len(videos) == 3
    videos[1].unlink()
    rc, out, err = run(["repair", str(root)], capsys)
    assert rc == 3 and "Traceback" not in out + err
    assert re.search(
        rf"^ +1 +- +9  DROPPED: frames of '{CAM}' unreadable: .*file-001\.mp4: missing", out, re.M
    )
    assert "kept 2 episode(s) (0, 2); 1 episode(s) dropped" in out
    assert passes_check(root)
    actions = read_actions(root)
    assert np.array_equal(actions[0], expected_actions(0)) and np.array_equal(actions[1], expected_actions(2))
    meta, _ = load_episode_sidecar(root, 1)
    assert meta is not None and meta["episode"] == 2 and meta["renumbered_from"] == 2


@pytest.mark.parametrize("attack", ["stats.json deleted", "fps changed"])
def test_derived_metadata_is_rewritten_from_the_episodes(
    dataset: Path, attack: str, capsys: pytest.CaptureFixture[str]
) -> None:
    info_path, stats_path = dataset / "meta/info.json", dataset / "meta/stats.json"
    info, stats = json.loads(info_path.read_text()), json.loads(stats_path.read_text())
    if attack == "fps changed":
        info_path.write_text(info_path.read_text().replace('"fps": 25', '"fps": 30'))
    else:
        stats_path.unlink()
    assert not passes_check(dataset)
    rc, report = repair_json(dataset, capsys)
    assert rc == 0 and not report["rebuilt"] and report["kept_episodes"] == [0, 1, 2]
    assert passes_check(dataset)
    assert json.loads(info_path.read_text()) == info and json.loads(stats_path.read_text()) == stats
    if attack == "fps changed":
        assert any("fps 30 -> 25" in action for action in report["actions"])


def test_what_repair_cannot_fix_exits_2_says_what_and_changes_nothing(
    dataset: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The rows (every copy of them) say 30 fps, the videos 25: no copy is right, nothing to drop.
    parquets = [*(dataset / "data").rglob("*.parquet"), *(dataset / "hilrec/journal").rglob("*.parquet")]
    for path in parquets:
        table = pq.read_table(path)
        frames = column_to_numpy(table.column("frame_index"))
        column = pa.array((frames / 30).astype(np.float32))
        table = table.set_column(
            table.schema.get_field_index("timestamp"), table.schema.field("timestamp"), column
        )
        pq.write_table(table, path)
    info_path = dataset / "meta/info.json"
    info_path.write_text(info_path.read_text().replace('"fps": 25', '"fps": 30'))
    before = {**file_bytes(dataset, "data"), **file_bytes(dataset, "videos"), **file_bytes(dataset, "meta")}
    rc, out, _ = run(["repair", str(dataset)], capsys)
    assert rc == 2, out
    assert "NOT repaired" in out and "UNREPAIRED" in out and "[video.fps]" in out
    assert before == {
        **file_bytes(dataset, "data"),
        **file_bytes(dataset, "videos"),
        **file_bytes(dataset, "meta"),
    }
    assert not list((dataset / "hilrec").glob(".rebuild-*"))
    assert not passes_check(dataset)


@pytest.mark.parametrize("attack", ["invalid JSON", "deleted"])
def test_an_unreadable_info_json_is_rebuilt_from_the_data(
    dataset: Path, attack: str, capsys: pytest.CaptureFixture[str]
) -> None:
    info_path = dataset / "meta/info.json"
    info = json.loads(info_path.read_text())
    if attack == "deleted":
        info_path.unlink()
    else:
        info_path.write_bytes(b'{"codebase_version": "v3.0", "robot_type": "so_fol\xff')
    rc, report = repair_json(dataset, capsys)
    assert rc == 0 and report["kept_episodes"] == [0, 1, 2]
    assert json.loads(info_path.read_text()) == info
    assert passes_check(dataset)


def test_garbage_in_the_merge_intent_of_a_whole_dataset(
    dataset: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    intent = dataset / "hilrec/journal/consolidation.json"
    intent.write_bytes(b"\x00garbage{")
    data = file_bytes(dataset, "data")
    rc, report = repair_json(dataset, capsys)
    assert rc == 0 and not report["rebuilt"] and report["kept_episodes"] == [0, 1, 2]
    assert not intent.exists() and list(
        (dataset / "hilrec").glob("damaged-*/replaced/hilrec/journal/consolidation.json")
    )
    assert passes_check(dataset) and file_bytes(dataset, "data") == data


def test_garbage_in_the_intent_of_a_half_done_merge(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The crash image is a copy of the root taken while the second merge stands between renames."""
    root, image = tmp_path / "ds", tmp_path / "image"

    def hook(step: str) -> None:
        # A merge that rewrites the data file of an earlier one, between its renames.
        old = root / "data/chunk-000/file-000.parquet.hilrec-old"
        if step == "renamed data/chunk-000/file-000.parquet" and old.exists() and not image.exists():
            shutil.copytree(root, image)

    with front_camera_writer(root, (H, W), hook=hook) as writer:
        for episode in range(2):
            for frame in frames_of(episode, LENGTHS[episode]):
                writer.add_frame(frame)
            writer.save_episode()
            writer.wait_consolidated(timeout=60)
    assert list(image.rglob("*.hilrec-old")), "the image was not taken in the middle of the merge"
    (image / "hilrec/journal/consolidation.json").write_text("{not json")
    rc, report = repair_json(image, capsys)
    assert rc == 0 and report["kept_episodes"] == [0, 1] and not report["rebuilt"]
    assert passes_check(image)
    actions = read_actions(image)
    assert all(np.array_equal(actions[e], expected_actions(e)) for e in range(2))


def journal_findings(root: Path) -> list[str]:
    """What ``hilrec check`` says of the journal: findings (warnings) or notes."""
    report = check_dataset(root)
    found = [f.format() for f in report.failures if f.rule == "journal.entries"]
    return found + list(report.summary.get("notes", []))


def test_check_reports_a_damaged_journal_and_repair_rewrites_it_from_the_dataset(dataset: Path) -> None:
    journal = dataset / "hilrec/journal"
    intact = {e: pq.read_table(journal / f"episode-{e:06d}/data.parquet") for e in range(3)}
    data = journal / "episode-000001/data.parquet"
    data.write_bytes(data.read_bytes()[:100])
    (journal / "episode-000002/episode.json").write_text('{"episode_index": 2, "len')
    shutil.rmtree(journal / "episode-000000")
    whole = check_dataset(dataset)
    assert whole.passed, whole.format_text()  # the dataset itself is whole: a warning (or a note)
    found = journal_findings(dataset)
    for episode in range(3):
        assert any(f"episode-{episode:06d}" in line for line in found), found
    (dataset / "meta/stats.json").unlink()
    broken = check_dataset(dataset)
    assert not broken.passed and {"journal.entries", "stats.dataset"} <= broken.rules_failed()
    report = repair(dataset)
    assert report.exit_code == 0 and not report.rebuilt and report.kept == [0, 1, 2]
    assert passes_check(dataset) and journal_findings(dataset) == []
    for episode in range(3):
        entry = read_entry(dataset, episode)
        assert entry.intact and entry.table is not None and entry.table.equals(intact[episode])


def test_rows_damaged_only_in_the_data_file_are_restored_from_the_journal(dataset: Path) -> None:
    """A changed value the stats tolerance lets through: the journal copy reproduces the stats."""
    path = dataset / "data/chunk-000/file-000.parquet"
    table = pq.read_table(path)
    actions = column_to_numpy(table.column("action")).copy()
    row = LENGTHS[0] + 4  # episode 1, neither its minimum nor its maximum
    actions[row, 2] = np.nextafter(actions[row, 2], np.float32(np.inf))
    column = pa.FixedSizeListArray.from_arrays(pa.array(actions.reshape(-1)), 6)
    pq.write_table(
        table.set_column(table.schema.get_field_index("action"), table.schema.field("action"), column), path
    )
    verdict = check_dataset(dataset)
    assert not verdict.passed and "data.journal_copy" in verdict.rules_failed(), verdict.format_text()
    report = repair(dataset)
    assert report.exit_code == 0 and report.rebuilt and report.kept == [0, 1, 2]
    assert passes_check(dataset)
    restored = read_actions(dataset)
    assert all(np.array_equal(restored[e], expected_actions(e)) for e in range(3))


@pytest.mark.parametrize("how", ["none recorded", "every take discarded"])
def test_an_empty_dataset_is_valid_after_repair_and_takes_episodes(tmp_path: Path, how: str) -> None:
    root = tmp_path / "ds"
    with front_camera_writer(root, (H, W)) as writer:
        if how == "every take discarded":
            for _take in range(2):
                for frame in frames_of(0, 5):
                    writer.add_frame(frame)
                writer.discard_episode()
    report = repair(root)
    assert report.exit_code == 0 and report.kept == []
    assert passes_check(root)
    with DatasetWriter.open(root, video_codec="libx264") as writer:
        for frame in frames_of(0, LENGTHS[0]):
            writer.add_frame(frame)
        writer.save_episode()
    assert passes_check(root) and np.array_equal(read_actions(root)[0], expected_actions(0))


def test_a_repair_that_drops_every_episode_leaves_a_valid_empty_dataset(dataset: Path) -> None:
    (dataset / f"videos/{CAM}/chunk-000/file-000.mp4").unlink()
    report = repair(dataset)
    assert report.exit_code == 3 and report.kept == [] and [d["episode"] for d in report.dropped] == [0, 1, 2]
    assert passes_check(dataset)
    # The rows of the dropped episodes stay in the damaged copy of the journal.
    assert len(list((dataset / "hilrec").glob("damaged-*/journal/episode-*/data.parquet"))) == 3


def test_repair_of_a_root_another_process_holds_is_refused_with_its_pid(
    dataset: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (dataset / "meta/stats.json").unlink()
    with RootLock(dataset, "hilrec daemon (test holder)"):
        rc, _out, err = run(["repair", str(dataset)], capsys)
    assert rc == 2 and f"pid {os.getpid()} (hilrec daemon (test holder))" in err and "Traceback" not in err
    assert not (dataset / "meta/stats.json").exists()


# --- a full disk is not damage ---------------------------------------------------------------------

# Runs inside a private mount namespace (unshare -rm): each trial mounts a small tmpfs, copies a
# dataset onto it, runs `hilrec repair` there, and reports what it said and what it changed; then
# gives the file system room and repairs again.
FULL_DISK_CHILD = r"""
import contextlib, io, json, os, shutil, subprocess, sys
from pathlib import Path
from hilrec.daemon.cli import main
from hilrec.daemon.dataset.check.checker import check_dataset

source, work, trials = Path(sys.argv[1]), Path(sys.argv[2]), json.loads(sys.argv[3])

def files(root, under):
    found = (p for top in under for p in sorted((root / top).rglob("*")) if p.is_file())
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in found}

def usage(root):  # what a copy takes on tmpfs: whole pages
    return sum(-(-p.stat().st_size // 4096) * 4096 for p in root.rglob("*") if p.is_file())

def repair(root):
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        rc = main(["repair", str(root)])
    return rc, out.getvalue()

results = {}
for name, trial in trials.items():
    mount = work / name
    mount.mkdir()
    size = trial["size"] or usage(source / trial["dataset"]) + trial["margin"]
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=%d" % size, "tmpfs", str(mount)], check=True)
    root = mount / "ds"
    shutil.copytree(source / trial["dataset"], root)
    if trial["inodes_left"] is not None:
        stat = os.statvfs(mount)
        used = stat.f_files - stat.f_ffree
        options = "remount,nr_inodes=%d" % (used + trial["inodes_left"])
        subprocess.run(["mount", "-o", options, str(mount)], check=True)
    before = files(root, trial["unchanged"])
    rc, text = repair(root)
    left = sorted(p.relative_to(root).as_posix() for p in root.rglob("*")
                  if p.name.startswith((".rebuild-", ".restore-")) or ".tmp-" in p.name
                  or p.name.endswith((".hilrec-new", ".hilrec-old")))
    unchanged = files(root, trial["unchanged"]) == before
    subprocess.run(["mount", "-o", "remount,size=256m,nr_inodes=100000", str(mount)], check=True)
    rc_room, text_room = repair(root)
    results[name] = {"rc": rc, "text": text, "left": left, "unchanged": unchanged,
                     "rc_with_room": rc_room, "text_with_room": text_room,
                     "passes_with_room": check_dataset(root).passed}
print("RESULTS " + json.dumps(results))
"""


def namespaces_work(tmp_path: Path) -> bool:
    if shutil.which("unshare") is None or shutil.which("mount") is None:
        return False
    probe = tmp_path / "probe"
    probe.mkdir()
    done = subprocess.run(
        ["unshare", "-rm", "mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(probe)],
        capture_output=True,
        timeout=30,
        check=False,
    )
    return done.returncode == 0


@pytest.mark.slow  # tmpfs mounts filled in a child process, repaired twice each
def test_a_full_disk_is_not_damage(dataset: Path, tmp_path: Path) -> None:
    if not namespaces_work(tmp_path):
        pytest.skip("needs unshare -rm and mount (a private tmpfs) to fill a disk for real")
    sources = tmp_path / "sources"
    damaged = sources / "damaged"  # needs a rebuild: the episodes metadata is gone
    shutil.copytree(dataset, damaged)
    (damaged / "meta/episodes/chunk-000/file-000.parquet").write_bytes(b"PAR1")
    pending = sources / "pending"  # a crash image: episode 1 saved, not merged yet

    def hook(step: str) -> None:
        if step == "committed" and (root / "hilrec/journal/episode-000001").exists() and not pending.exists():
            shutil.copytree(root, pending)

    root = tmp_path / "ds2"
    with DatasetWriter.create(
        root,
        fps=FPS,
        features=so101_features({"front": (H, W)}),
        robot_type="so_follower",
        video_codec="libx264",
        merge_interval_s=3600,  # nothing is merged before finalize
        hook=hook,
    ) as writer:
        for episode in range(2):
            for frame in frames_of(episode, LENGTHS[episode]):
                writer.add_frame(frame)
            writer.save_episode()
    assert (pending / "hilrec/journal/episode-000001").is_dir() and not (pending / "meta/episodes").exists()
    everything = ["meta", "data", "videos", "hilrec"]
    # The crash image's frames wait unencoded in the journal; repair encodes them first (lasting
    # progress, not damage): there only LeRobot's files must stay as they were.
    lerobot = ["meta", "data", "videos"]
    big = 64 * 1024 * 1024
    trials = {
        # the rebuild does not fit: refused before anything is written
        "rebuild, bytes": {"dataset": "damaged", "size": 0, "margin": 96 * 1024, "inodes_left": None},
        # bytes enough, but no inode for the files it makes: the disk says ENOSPC half way
        "rebuild, inodes": {"dataset": "damaged", "size": big, "margin": 0, "inodes_left": 6},
        # encoding and merging the saved episodes does not fit
        "merge, bytes": {"dataset": "pending", "size": 0, "margin": 32 * 1024, "inodes_left": None},
        "merge, inodes": {"dataset": "pending", "size": big, "margin": 0, "inodes_left": 2},
    }
    for trial in trials.values():
        trial["unchanged"] = everything if trial["dataset"] == "damaged" else lerobot
    work = tmp_path / "mounts"
    work.mkdir()
    child = subprocess.run(
        [
            "unshare",
            "-rm",
            sys.executable,
            "-c",
            FULL_DISK_CHILD,
            str(sources),
            str(work),
            json.dumps(trials),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    lines = [line for line in child.stdout.splitlines() if line.startswith("RESULTS ")]
    assert child.returncode == 0 and lines, child.stdout[-3000:] + child.stderr[-3000:]
    results = json.loads(lines[0][len("RESULTS ") :])
    for name, result in results.items():
        text = result["text"]
        print(f"{name}: exit {result['rc']}: {text.splitlines()[-1].strip()}")
        assert result["rc"] == 4, f"{name}: {text}"
        assert "Traceback" not in text and "not enough disk space" in text, f"{name}: {text}"
        assert re.search(
            r"needs about \d+ bytes, \d+ are free: free at least \d+ bytes|no inode was left", text
        )
        assert "rebuilt" not in text.splitlines()[0], f"{name}: escalated to a rebuild: {text}"
        assert result["left"] == [] and result["unchanged"], f"{name}: left {result['left']}"
        assert result["rc_with_room"] == 0 and result["passes_with_room"], (
            f"{name}: {result['text_with_room']}"
        )
