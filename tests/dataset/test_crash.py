"""SIGKILL a writer process at chosen and at random moments; every saved episode must survive.

The child (forked by a fork server, so it starts in milliseconds, not in the seconds its imports
take) records a few short episodes and sends ``SAVED i`` each time save_episode() returns, and
``HOOK name`` at the writer's internal steps (videos finished, episode written,
committed, merge intent written, each rename of the merge, merge done). For the deterministic
trials the child stops at one named step and the parent kills it there; for the random trials the
parent kills it after a seeded random delay. Then: either the dataset checks out as it is, or
``repair`` makes it check out; and every episode whose save_episode() returned is there,
bit-equal, with exactly as many video frames as rows (decoded and counted).

Video is encoded in line (the writer's default) or in worker processes. In the "pending" trials
the child never waits for its encoder at save (``FINISH_WAIT_S = 0``): every episode is saved with
its spill and encoded after, so the kills land while frames are spilled (``spill-synced``), while
the catch-up encodes (after ``committed``, at random) and as it places an mp4 (``video-placed``).
In the "behind" trials the encoder process is also frozen for the second part of every episode
and its ring holds two frames: the frames spill only from there, each episode is cut where the
encoder fell behind, and its mp4 is the part encoded before the cut joined with the rest.
The spill is part of the journal: ``finish_spilled_encodes`` (which ``hilrec repair`` must call
first, as ``DatasetWriter.open`` does) finishes the encode, and nothing saved is lost.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import random
import signal
import threading
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import av
import numpy as np
import pyarrow.parquet as pq
import pytest
from support import wait_until

from hilrec.daemon.dataset.format.reader import column_to_numpy
from hilrec.daemon.dataset.repair.recover import repair
from hilrec.daemon.dataset.store.spilled import finish_spilled_encodes
from hilrec.daemon.dataset.video.codec import Segment, concat_segments
from hilrec.daemon.dataset.video.encoder_process import RING_ENV

# Real daemons, processes or kill loops: the slow tier (make test runs it; make test-fast does not).
pytestmark = pytest.mark.slow

FPS = 25
H, W = 48, 64
CAM = "observation.images.front"
LENGTHS = (20, 13, 26, 9, 11)  # the child records the first CHILD_EPISODES
CHILD_EPISODES = 4

# What the fork server imports once, so that no trial's child pays for it.
PRELOAD = ["hilrec.daemon.dataset.writer.dataset_writer", "hilrec.daemon.so101", "av", "test_crash"]


def episode_frames(episode: int, length: int) -> list[dict]:
    rng = np.random.default_rng(1000 + episode)
    return [
        {
            "action": rng.normal(size=6).astype(np.float32),
            "observation.state": rng.normal(size=6).astype(np.float32),
            CAM: rng.integers(0, 255, (H, W, 3), dtype=np.uint8),
            "task": f"task {episode % 2}",
        }
        for _ in range(length)
    ]


def _own_resource_tracker() -> None:
    """Give this child a resource tracker of its own, as a process started anew has.

    A fork server's children share the tracker of the test process: the shared-memory rings of
    a SIGKILLed child's encoders (64 MB each) would then stay in /dev/shm until pytest ends. A
    tracker of its own unlinks them as soon as the child is killed, as it always did."""
    from multiprocessing import resource_tracker

    tracker: Any = resource_tracker._resource_tracker  # private state: typeshed knows none of it
    with tracker._lock:
        if tracker._fd is not None:
            os.close(tracker._fd)  # this child's copy: the test process keeps its tracker
        tracker._fd = None
        tracker._pid = None


def child_main(
    root: str, codec: str, stall_at: str, mode: str, env: dict[str, str], conn: Connection
) -> None:
    from hilrec.daemon.dataset.writer.dataset_writer import DatasetWriter
    from hilrec.daemon.so101 import so101_features

    os.environ.update(env)
    _own_resource_tracker()
    if mode in ("pending", "behind"):
        import hilrec.daemon.dataset.writer.episode as episode_module

        episode_module.FINISH_WAIT_S = 0.0
    target, _, nth = stall_at.partition("#")
    serial_merges = int(nth or 1) > 1 and target.startswith(("intent-", "renamed "))
    seen: dict[str, int] = {}
    lock = threading.Lock()

    def emit(text: str) -> None:
        # One message at a time, under a lock: the merge thread reports too.
        with lock:
            conn.send(text)

    def hook(name: str) -> None:
        with lock:
            seen[name] = seen.get(name, 0) + 1
            stall = name == target and seen[name] == int(nth or 1)
        emit(f"HOOK {name}")
        if stall:
            emit("STALLED")
            time.sleep(120)

    writer = DatasetWriter.create(
        root,
        fps=FPS,
        features=so101_features({"front": (H, W)}),
        robot_type="so_follower",
        video_codec=codec,
        hook=hook,
    )
    for episode, length in enumerate(LENGTHS[:CHILD_EPISODES]):
        worker = writer._workers.get(CAM) if mode == "behind" else None
        for i, frame in enumerate(episode_frames(episode, length)):
            if worker is not None and i == length // 3:
                # Caught up, then frozen from here to the save: the ring (two slots) fills, the
                # frames spill, and the episode is cut here, where the encoder fell behind.
                wait_until(lambda w=worker: w.backlog_frames == 0, 60, 0.005, "the encoder to catch up")
                os.kill(worker.pid, signal.SIGSTOP)
            writer.add_frame(frame)
            if i == length // 2:
                hook(f"mid-episode-{episode}")
        if worker is not None:
            os.kill(worker.pid, signal.SIGCONT)
        index = writer.save_episode(sidecar={"episode": episode})
        emit(f"SAVED {index}")
        if serial_merges:
            # One merge per episode, so the nth merge step exists whatever the merge's speed
            # (a background merge slower than the next take merges two takes in one batch).
            writer._merger.wait(60)
    writer.finalize()
    emit("DONE")


def run_child(
    root: Path,
    codec: str,
    stall_at: str,
    kill_after_s: float | None,
    mode: str = "wait",
) -> tuple[list[int], list[str]]:
    """Run the child until it stalls at ``stall_at`` (or ``kill_after_s`` passes); SIGKILL it."""
    env: dict[str, str] = {}
    if mode in ("pending", "behind"):  # spills exist only with the encoder processes
        env["HILREC_VIDEO_ENCODER"] = "process"
    if mode == "behind":
        env[RING_ENV] = str(2 * H * W * 3)
    # Forked from a fresh single-threaded process, not from this one, whose threads (torch's, a
    # writer's) a plain fork would copy mid-lock.
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
    parent, child_end = ctx.Pipe(duplex=False)
    proc = ctx.Process(
        target=child_main, args=(str(root), codec, stall_at, mode, env, child_end), daemon=True
    )
    proc.start()
    child_end.close()
    lines: list[str] = []
    stalled = threading.Event()

    def reader() -> None:
        with contextlib.suppress(EOFError, OSError):  # the child killed: its end closed
            while True:
                line = parent.recv()
                lines.append(line)
                if line.startswith("STALLED"):
                    stalled.set()

    thread = threading.Thread(target=reader, daemon=True)
    thread.start()
    try:
        if kill_after_s is None:
            assert stalled.wait(60), f"child never reached {stall_at}: {lines[-5:]}"
        else:
            stalled.wait(kill_after_s)
    finally:  # never leave a child behind, even when the test fails
        if proc.pid is not None:
            # A child that finished before a timed kill is gone: the fork server reaped it.
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)
        proc.join(30)
        thread.join(30)
        parent.close()
    saved = [int(line.split()[1]) for line in lines if line.startswith("SAVED")]
    return saved, lines


def check_dataset(root: Path, saved: int = 0) -> int:
    """Assert the dataset is whole, holds at least ``saved`` episodes, and every episode in it is
    exactly what the child wrote. Returns the number of episodes it holds.
    """
    import json

    info = json.loads((root / "meta/info.json").read_text())
    rows = []
    for path in sorted((root / "meta/episodes").glob("chunk-*/file-*.parquet")):
        rows.extend(pq.read_table(path).to_pylist())
    assert [r["episode_index"] for r in rows] == list(range(info["total_episodes"]))
    assert len(rows) >= saved, f"{len(rows)} episodes in LeRobot's files, {saved} were saved"
    tables = [pq.read_table(p) for p in sorted((root / "data").glob("chunk-*/file-*.parquet"))]
    if not rows:
        return 0
    data = {
        name: np.concatenate([column_to_numpy(t.column(name)) for t in tables])
        for name in tables[0].column_names
    }
    assert data["index"].tolist() == list(range(info["total_frames"]))
    assert info["total_frames"] == sum(r["length"] for r in rows)
    for row in rows:
        episode = row["episode_index"]
        expected = episode_frames(episode, LENGTHS[episode])
        assert row["length"] == len(expected)
        span = slice(row["dataset_from_index"], row["dataset_to_index"])
        assert np.array_equal(data["action"][span], np.stack([f["action"] for f in expected]))
        assert np.array_equal(
            data["observation.state"][span], np.stack([f["observation.state"] for f in expected])
        )
        assert np.array_equal(data["episode_index"][span], np.full(len(expected), episode))
        ref = (row[f"videos/{CAM}/chunk_index"], row[f"videos/{CAM}/file_index"])
        video = root / f"videos/{CAM}/chunk-{ref[0]:03d}/file-{ref[1]:03d}.mp4"
        probe_out = root.parent / f"probe-{episode}.mp4"
        placed = concat_segments(
            probe_out,
            [Segment(video, row[f"videos/{CAM}/from_timestamp"], row[f"videos/{CAM}/to_timestamp"])],
            fps=FPS,
        )
        with av.open(str(probe_out)) as container:
            decoded = sum(1 for _ in container.decode(video=0))
        probe_out.unlink()
        assert placed[0][2] == len(expected), f"episode {episode}: {placed[0][2]} video frames"
        assert decoded == len(expected), f"episode {episode}: {decoded} frames decode"
    return len(rows)


# Named steps: during video encoding, during save, after commit, and at every step of the merge
# (intent, each rename with info.json last, done), at first and later episodes.
STEPS = [
    "mid-episode-0",
    "mid-episode-2",
    "videos-finished#2",
    "episode-written#1",
    "committed#2",
    "intent-written#1",
    "intent-written#3",
    "renamed data/chunk-000/file-000.parquet#2",
    f"renamed videos/{CAM}/chunk-000/file-000.mp4#1",
    f"renamed videos/{CAM}/chunk-000/file-000.mp4#3",
    "renamed meta/episodes/chunk-000/file-000.parquet#2",
    "renamed meta/tasks.parquet#2",
    "renamed meta/stats.json#1",
    "renamed meta/info.json#1",
    "renamed meta/info.json#3",
    "intent-done#2",
]
RANDOM_TRIALS = 6
# Kills while frames are spilled and while the catch-up encodes (the "pending" mode).
SPILL_STEPS = [
    "spill-synced#1",
    "spill-synced#3",
    "committed#1",
    "committed#3",
    "video-placed#1",
    "video-placed#2",
]
SPILL_RANDOM_TRIALS = 4
# The same while the encoder is behind: cut episodes, whose mp4 is the frames encoded before the
# cut joined with the rest from the spill ("behind" mode).
BEHIND_STEPS = ["spill-synced#2", "committed#1", "video-placed#1", "video-placed#3"]
BEHIND_RANDOM_TRIALS = 3


def trials() -> list[tuple[str, str, float | None, str]]:
    rng = random.Random(20240611)
    plan: list[tuple[str, str, float | None, str]] = []
    for i, step in enumerate(STEPS):
        plan.append((step, "libsvtav1" if i % 2 == 0 else "libx264", None, "wait"))
    for i in range(RANDOM_TRIALS):
        plan.append(("never", "libsvtav1" if i % 2 else "libx264", rng.uniform(0.9, 3.0), "wait"))
    for i, step in enumerate(SPILL_STEPS):
        plan.append((step, "libsvtav1" if i % 2 == 0 else "libx264", None, "pending"))
    for i in range(SPILL_RANDOM_TRIALS):
        plan.append(("never", "libsvtav1" if i % 2 else "libx264", rng.uniform(0.9, 3.0), "pending"))
    for i, step in enumerate(BEHIND_STEPS):
        plan.append((step, "libsvtav1" if i % 2 == 0 else "libx264", None, "behind"))
    for i in range(BEHIND_RANDOM_TRIALS):
        plan.append(("never", "libsvtav1" if i % 2 else "libx264", rng.uniform(0.9, 3.0), "behind"))
    return plan


def test_saved_episodes_survive_sigkill_at_any_moment(tmp_path: Path) -> None:
    outcomes = []
    for number, (step, codec, delay, mode) in enumerate(trials()):
        trial = tmp_path / f"trial-{number:02d}"
        trial.mkdir()
        root = trial / "ds"
        saved, _lines = run_child(root, codec, step, delay, mode)
        if not (root / "meta/info.json").exists():
            assert saved == [], f"trial {number}: saved {saved} but no info.json"
            outcomes.append((step, "killed before create", saved))
            continue
        try:
            held = check_dataset(root, len(saved))
            how = "loads as is"
        except (AssertionError, OSError, KeyError, ValueError, IndexError) as exc:
            cause = f"{exc!r:.80}"
            finished = finish_spilled_encodes(root)
            report = repair(root)
            held = check_dataset(root, len(saved))
            if finished:
                cause = f"{len(finished)} encodes finished from spills; {cause}"
            how = f"repaired (exit {report.exit_code}, {len(report.dropped)} dropped) after: {cause}"
            assert not report.rebuilt, f"trial {number} ({step}): needed a rebuild: {report.actions}"
        assert held >= len(saved), f"trial {number} ({step}): saved {saved}, dataset holds {held}"
        assert saved == list(range(len(saved)))
        # The repaired dataset also takes new episodes.
        outcomes.append((f"{step} ({mode})", how, saved))
    for step, how, saved in outcomes:
        print(f"{step:58s} saved={saved} {how}")
    assert len(outcomes) >= 30
    assert any(o[1].startswith("repaired") for o in outcomes)
    assert any(o[1] == "loads as is" for o in outcomes)


@pytest.mark.parametrize(
    "step, mode",
    [("renamed meta/info.json#2", "wait"), ("video-placed#1", "pending"), ("spill-synced#2", "behind")],
)
def test_a_crashed_dataset_can_be_reopened_and_extended(tmp_path: Path, step: str, mode: str) -> None:
    from hilrec.daemon.dataset.writer.dataset_writer import DatasetWriter

    root = tmp_path / "ds"
    saved, _ = run_child(root, "libx264", step, None, mode)
    assert saved
    with DatasetWriter.open(root, video_codec="libx264") as writer:
        start = writer.num_episodes
        assert start >= len(saved)
        for frame in episode_frames(start, LENGTHS[start]):
            writer.add_frame(frame)
        writer.save_episode()
    assert check_dataset(root) == start + 1
