"""Issue 12: ``hilrec repair`` keeps a saved take whose video still waits in its spill.

A recording process using the encoder processes (``HILREC_VIDEO_ENCODER=process``) saves one
take with its mp4 done, then stops its encoder (SIGSTOP: an encoder far behind the camera), saves
two more takes (durable with their spills, their mp4s unfinished), opens a fourth and is
SIGKILLed mid-take. ``hilrec repair ROOT`` runs as a command on that root as the kill left it,
no writer reopened first: the three saved takes are kept with every row and frame (the two
spilled ones encoded from their spills), the open take is lost, the result passes
``hilrec check``, and the report (text and JSON) says which episodes it kept, which it encoded
from a spill and which it lost.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import av
import numpy as np
import pyarrow.parquet as pq
import pytest

from hilrec.daemon.dataset.format.reader import column_to_numpy
from hilrec.daemon.dataset.store import journal
from hilrec.daemon.dataset.store.spilled import pending_spills
from hilrec.daemon.dataset.video.codec import Segment, concat_segments

FPS = 25
H, W = 32, 48
CAM = "observation.images.front"
LENGTHS = (12, 9, 15)  # saved takes; the open one has OPEN_FRAMES
OPEN_FRAMES = 6
SPILLED = (1, 2)  # the takes saved while the encoder was stopped

BOOTSTRAP = (
    "import importlib.util, sys\n"
    "spec = importlib.util.spec_from_file_location('spill_child', sys.argv[1])\n"
    "module = importlib.util.module_from_spec(spec); spec.loader.exec_module(module)\n"
    "module.child_main(sys.argv[2])\n"
)


def take_frames(episode: int, length: int) -> list[dict]:
    rng = np.random.default_rng(100 + episode)
    return [
        {
            "action": rng.normal(size=6).astype(np.float32),
            "observation.state": rng.normal(size=6).astype(np.float32),
            # Flat frames a lossy codec keeps to within a few levels: their order is checkable.
            CAM: np.full((H, W, 3), 40 * episode + 2 * i, np.uint8),
            "task": f"task {episode % 2}",
        }
        for i in range(length)
    ]


def child_main(root: str) -> None:
    from hilrec.daemon.dataset.writer.dataset_writer import DatasetWriter
    from hilrec.daemon.so101 import so101_features

    def say(text: str) -> None:
        sys.stdout.write(text + "\n")
        sys.stdout.flush()

    writer = DatasetWriter.create(
        root,
        fps=FPS,
        features=so101_features({"front": (H, W)}),
        robot_type="so_follower",
        video_codec="libx264",
    )
    assert writer.video_encoder == "process"
    worker = writer._workers[CAM]
    say(f"WORKER {worker.pid}")
    for episode, length in enumerate(LENGTHS):
        if episode == SPILLED[0]:
            writer.wait_consolidated(timeout=120)  # the first take whole in LeRobot's files
            os.kill(worker.pid, signal.SIGSTOP)
        for frame in take_frames(episode, length):
            writer.add_frame(frame)
        say(f"SAVED {writer.save_episode(sidecar={'episode': episode})}")
    for frame in take_frames(len(LENGTHS), OPEN_FRAMES):
        writer.add_frame(frame)
    say("READY")
    sys.stdin.read()  # SIGKILLed here, mid-take


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    # A zombie still answers signal 0; it holds no file open any more.
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[-1].startswith("Z")
    return True


def kill_mid_take(root: Path) -> list[int]:
    """Run the child to READY, SIGKILL it and its stopped encoder; return the takes it saved."""
    env = dict(os.environ, HILREC_VIDEO_ENCODER="process", PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(
        [sys.executable, "-c", BOOTSTRAP, __file__, str(root)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
    )
    lines: list[str] = []
    ready = threading.Event()

    def reader() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line.strip())
            if line.startswith("READY"):
                ready.set()

    thread = threading.Thread(target=reader, daemon=True)
    thread.start()
    worker: int | None = None
    outlived = False
    try:
        assert ready.wait(120), f"the child never got mid-take: {lines[-5:]}"
    finally:  # never leave a child behind, even when the test fails
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
        thread.join(30)
        worker = next((int(x.split()[1]) for x in lines if x.startswith("WORKER")), None)
        if worker is not None:
            # It must die with its parent (its parent-death signal, SIGKILL): asked
            # before any kill of ours, so a worker that outlives the writer fails the test.
            end = time.monotonic() + 30
            while not gone(worker) and time.monotonic() < end:
                time.sleep(0.05)  # polled: a process not ours to wait for
            outlived = not gone(worker)
            with contextlib.suppress(ProcessLookupError):
                os.kill(worker, signal.SIGKILL)  # the cleanup, once the verdict is in
    assert worker is not None
    assert not outlived, f"encoder process {worker} outlived the writer's SIGKILL (parent-death signal)"
    return [int(x.split()[1]) for x in lines if x.startswith("SAVED")]


def hilrec(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hilrec.daemon.cli", *argv],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


@pytest.fixture(scope="module")
def killed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A root as the SIGKILL left it (copied by each test before it repairs)."""
    root = tmp_path_factory.mktemp("killed") / "ds"
    saved = kill_mid_take(root)
    assert saved == [0, 1, 2]
    yield root


def fresh_copy(killed: Path, tmp_path: Path) -> Path:
    root = tmp_path / "ds"
    shutil.copytree(killed, root, symlinks=True)
    return root


def assert_takes_whole(root: Path) -> None:
    """Every saved take is in LeRobot's files, bit-equal rows, one frame per row, in order."""
    info = json.loads((root / "meta/info.json").read_text())
    assert info["total_episodes"] == len(LENGTHS) and info["total_frames"] == sum(LENGTHS)
    rows = []
    for path in sorted((root / "meta/episodes").glob("chunk-*/file-*.parquet")):
        rows.extend(pq.read_table(path).to_pylist())
    tables = [pq.read_table(p) for p in sorted((root / "data").glob("chunk-*/file-*.parquet"))]
    data = {
        name: np.concatenate([column_to_numpy(t.column(name)) for t in tables])
        for name in ("episode_index", "action", "observation.state")
    }
    assert [r["episode_index"] for r in rows] == [0, 1, 2]
    for row in rows:
        episode = row["episode_index"]
        sent = take_frames(episode, LENGTHS[episode])
        span = slice(row["dataset_from_index"], row["dataset_to_index"])
        assert np.array_equal(data["action"][span], np.stack([f["action"] for f in sent]))
        assert np.array_equal(
            data["observation.state"][span], np.stack([f["observation.state"] for f in sent])
        )
        assert (data["episode_index"][span] == episode).all()
        chunk, file = row[f"videos/{CAM}/chunk_index"], row[f"videos/{CAM}/file_index"]
        video = root / f"videos/{CAM}/chunk-{chunk:03d}/file-{file:03d}.mp4"
        out = root.parent / f"episode-{episode}.mp4"
        segment = Segment(video, row[f"videos/{CAM}/from_timestamp"], row[f"videos/{CAM}/to_timestamp"])
        concat_segments(out, [segment], fps=FPS)
        with av.open(str(out)) as container:
            levels = [float(f.to_ndarray(format="rgb24").mean()) for f in container.decode(video=0)]
        out.unlink()
        want = [float(f[CAM][0, 0, 0]) for f in sent]
        assert len(levels) == len(want), f"episode {episode}: {len(levels)} frames for {len(want)} rows"
        assert np.abs(np.array(levels) - np.array(want)).max() < 1.5, f"episode {episode}: wrong frames"


@pytest.mark.slow
def test_the_kill_left_two_takes_in_their_spills_and_one_open(killed: Path) -> None:
    """What the repair tests below start from (else they would prove nothing about spills)."""
    assert pending_spills(killed) == [(i, CAM) for i in SPILLED]
    assert journal.open_episode_dir(killed, len(LENGTHS)).exists()
    # LeRobot's files hold the first take only: the others wait for their mp4s to be merged.
    assert json.loads((killed / "meta/info.json").read_text())["total_episodes"] == 1


@pytest.mark.slow  # > 5 s (make test-fast leaves it out)
def test_repair_encodes_spilled_takes_keeps_them_and_reports_it(killed: Path, tmp_path: Path) -> None:
    root = fresh_copy(killed, tmp_path)
    done = hilrec("repair", str(root))
    assert done.returncode == 3, done.stdout + done.stderr  # 3: an episode was lost (the open take)
    text = done.stdout
    for episode in range(len(LENGTHS)):
        assert re.search(rf"^ +{episode} +{episode} +{LENGTHS[episode]}  kept", text, re.M), text
    for episode in SPILLED:
        line = re.search(rf"^ +{episode} +{episode} +{LENGTHS[episode]}  kept.*$", text, re.M)
        assert line and "spill" in line.group(0), text
    assert re.search(rf"^ +{len(LENGTHS)} +- +\S+  DROPPED: open \(never saved\)", text, re.M), text
    assert "kept 3 episode(s) (0-2)" in text, text
    assert "encoded from their spill: 2 episode(s) (1-2)" in text, text
    assert "1 episode(s) dropped (3)" in text, text
    assert pending_spills(root) == []
    assert not journal.open_episode_dir(root, len(LENGTHS)).exists()
    checked = hilrec("check", str(root))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert_takes_whole(root)


@pytest.mark.slow  # > 5 s (make test-fast leaves it out)
def test_the_json_report_lists_kept_encoded_and_lost_apart(killed: Path, tmp_path: Path) -> None:
    root = fresh_copy(killed, tmp_path)
    done = hilrec("repair", str(root), "--json")
    report = json.loads(done.stdout)
    assert done.returncode == report["exit_code"] == 3
    assert report["kept_episodes"] == [0, 1, 2]
    assert report["encoded_from_spill"] == [
        {"episode": i, "camera": CAM, "frames": LENGTHS[i]} for i in SPILLED
    ]
    assert [d["episode"] for d in report["dropped"]] == [len(LENGTHS)]
    assert "never saved" in report["dropped"][0]["reason"]
    assert 0 <= report["dropped"][0]["video_frames_on_disk"].get(CAM, 0) <= OPEN_FRAMES
    assert not report["rebuilt"]
    assert hilrec("check", str(root)).returncode == 0
    assert_takes_whole(root)
    # A second repair finds nothing left to do.
    again = json.loads(hilrec("repair", str(root), "--json").stdout)
    assert again["exit_code"] == 0 and again["encoded_from_spill"] == [] and again["dropped"] == []


@pytest.mark.slow  # > 5 s (make test-fast leaves it out)
def test_a_rebuild_keeps_the_spilled_takes_and_says_where_their_frames_came_from(
    killed: Path, tmp_path: Path
) -> None:
    """The same kill with LeRobot's data file damaged too: the rebuild takes the spilled takes'
    frames from the mp4s repair encoded, and the report says they came from the spill."""
    root = fresh_copy(killed, tmp_path)
    data = root / "data/chunk-000/file-000.parquet"
    data.write_bytes(data.read_bytes()[:-200])  # footer gone: take 0's rows only in the journal now
    done = hilrec("repair", str(root), "--json")
    report = json.loads(done.stdout)
    assert done.returncode == report["exit_code"] == 3, done.stdout + done.stderr
    assert report["rebuilt"] and report["kept_episodes"] == [0, 1, 2]
    assert [e["episode"] for e in report["encoded_from_spill"]] == list(SPILLED)
    frames = {e["episode"]: e["frames"] for e in report["episodes"] if e["new_index"] is not None}
    assert [frames[i] for i in SPILLED] == ["its spill (encoded by repair)"] * len(SPILLED)
    assert frames[0] == "journal (staged mp4)" or frames[0].startswith("videos/")
    assert [d["episode"] for d in report["dropped"]] == [len(LENGTHS)]
    assert hilrec("check", str(root)).returncode == 0
    assert_takes_whole(root)
