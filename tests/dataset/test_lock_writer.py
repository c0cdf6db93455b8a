"""One writer per root: DatasetWriter holds the root's lock from create/open to finalize/close.

Before the lock, a second writer's ``open`` ran the crash recovery on a root another process was
recording into: it deleted that process's open episode, and both then committed "episode 0" to
the same journal folder. Here the second writer is refused with the holder's pid, the first
writer's open episode survives it, and reading (``check``) never waits for or takes the lock.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from hilrec.daemon.dataset.check.checker import check_dataset
from hilrec.daemon.dataset.format.reader import load_episodes, read_episode
from hilrec.daemon.dataset.store.rootlock import LOCK_NAME, RootLock
from hilrec.daemon.dataset.writer.dataset_writer import DatasetWriter
from hilrec.daemon.errors import DatasetError, DatasetLockedError, DatasetStateError
from hilrec.daemon.so101 import ACTION_KEY, so101_features

FPS = 25
H, W = 32, 48
CAM = "observation.images.front"

# The first writer, in a process of its own, driven line by line over stdin: "open" (create the
# dataset and record 10 frames of A1, leaving the episode open), "save" (10 more, then save),
# "quit" (finalize), "exit" (leave without finalize: the exit hook's turn). It answers each.
WRITER_A = """
import sys
import numpy as np
from hilrec.daemon.dataset.writer.dataset_writer import DatasetWriter
from hilrec.daemon.so101 import so101_features

root, mode = sys.argv[1], sys.argv[2]

def frame(i):
    return {"action": np.full(6, i, np.float32), "observation.state": np.zeros(6, np.float32),
            "observation.images.front": np.full((32, 48, 3), 7 * i, np.uint8), "task": "A1"}

if mode == "create":
    w = DatasetWriter.create(root, fps=25, features=so101_features({"front": (32, 48)}),
                             robot_type=None, video_codec="libx264", lock_command="hilrec daemon (A)")
else:
    w = DatasetWriter.open(root, video_codec="libx264", lock_command="hilrec daemon (A)")
for i in range(10):
    w.add_frame(frame(i))
print("open", flush=True)
for line in sys.stdin:
    if line.strip() == "save":
        for i in range(10, 20):
            w.add_frame(frame(i))
        print("saved", w.save_episode(), flush=True)
    elif line.strip() == "quit":
        w.finalize()
        print("finalized", flush=True)
        break
    elif line.strip() == "exit":
        print("leaving", flush=True)
        break
"""


class WriterA:
    def __init__(self, root: Path, mode: str = "create") -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", WRITER_A, str(root), mode],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.ask(None) == "open"

    @property
    def pid(self) -> int:
        return self.proc.pid

    def ask(self, command: str | None) -> str:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        if command is not None:
            self.proc.stdin.write(command + "\n")
            self.proc.stdin.flush()
        return self.proc.stdout.readline().strip()

    def end(self, command: str) -> str:
        answer = self.ask(command)
        assert self.proc.wait(timeout=120) == 0
        return answer

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)


def features() -> dict:
    return so101_features({"front": (H, W)})


def frame(i: int, task: str) -> dict:
    return {
        "action": np.full(6, 100 + i, np.float32),
        "observation.state": np.zeros(6, np.float32),
        CAM: np.zeros((H, W, 3), np.uint8),
        "task": task,
    }


@pytest.mark.slow  # > 5 s (make test-fast leaves it out)
def test_a_second_writer_is_refused_and_the_first_ones_take_survives(tmp_path: Path) -> None:
    """The daemon-like sequence: A records, B starts on the same root, A saves "A1": episode 0
    holds A1, whole; B was told who writes the root."""
    root = tmp_path / "ds"
    a = WriterA(root)
    try:
        open_dir = root / "hilrec/journal/.episode-000000.tmp"
        assert open_dir.is_dir()
        video = open_dir / f"{CAM}.mp4"
        deadline = time.monotonic() + 30.0  # A's encoder opens its file on its own thread
        while not video.exists() and time.monotonic() < deadline:
            time.sleep(0.01)  # polling a condition (a file appearing) with a deadline
        assert video.exists(), "A's open take has no video file after 30 s"
        for attempt in (
            lambda: DatasetWriter.open(root, video_codec="libx264"),
            lambda: DatasetWriter.create(root, fps=FPS, features=features(), robot_type=None),
        ):
            with pytest.raises(DatasetLockedError) as refused:
                attempt()
            assert f"pid {a.pid}" in str(refused.value) and "hilrec daemon (A)" in str(refused.value)
        assert open_dir.is_dir() and video.exists()  # B touched nothing
        # Reading stays free while A writes.
        assert check_dataset(root, decode_video=False) is not None
        assert a.ask("save") == "saved 0"
        assert a.end("quit") == "finalized"
    finally:
        a.kill()
    (episode,) = load_episodes(root)
    assert episode["tasks"] == ["A1"] and episode["length"] == 20
    assert read_episode(root, 0, [ACTION_KEY])[ACTION_KEY][:, 0].tolist() == list(range(20))
    # A is gone: now B may write, after A's episode.
    with DatasetWriter.open(root, video_codec="libx264") as b:
        for i in range(5):
            b.add_frame(frame(i, "B1"))
        assert b.save_episode() == 1
    assert [e["tasks"] for e in load_episodes(root)] == [["A1"], ["B1"]]
    assert check_dataset(root).failures == []


@pytest.mark.slow  # > 5 s (make test-fast leaves it out)
def test_a_writer_that_exits_without_finalize_frees_the_root(tmp_path: Path) -> None:
    root = tmp_path / "ds"
    a = WriterA(root)
    try:
        assert a.ask("save") == "saved 0"
        assert a.end("exit") == "leaving"  # the exit hook merges, then releases
    finally:
        a.kill()
    second = WriterA(root, mode="open")  # the open episode of the first is gone, the saved one kept
    try:
        assert second.ask("save") == "saved 1"
        assert second.end("quit") == "finalized"
    finally:
        second.kill()
    assert [e["length"] for e in load_episodes(root)] == [20, 20]


@pytest.mark.slow  # > 5 s (make test-fast leaves it out)
def test_a_killed_writer_frees_the_root_and_its_open_episode_is_dropped(tmp_path: Path) -> None:
    root = tmp_path / "ds"
    a = WriterA(root)
    assert a.ask("save") == "saved 0"
    assert a.proc.stdin is not None
    a.proc.stdin.write("save\n")
    a.proc.stdin.flush()
    a.kill()
    with DatasetWriter.open(root, video_codec="libx264") as b:
        start = b.num_episodes
        assert start in (1, 2)  # killed before or after that save
        b.add_frame(frame(0, "B1"))
        assert b.save_episode() == start


def test_one_process_cannot_open_a_root_twice_and_finalize_releases_it(tmp_path: Path) -> None:
    root = tmp_path / "ds"
    first = DatasetWriter.create(root, fps=FPS, features=so101_features(), robot_type=None)
    with pytest.raises(DatasetLockedError, match=r"pid \d+"):
        DatasetWriter.open(root)
    first.add_frame({k: v for k, v in frame(0, "t").items() if k != CAM})
    assert first.save_episode() == 0
    first.finalize()
    second = DatasetWriter.open(root)
    second.add_frame({k: v for k, v in frame(1, "t").items() if k != CAM})
    second.close()  # close() discards the open episode and releases the root too
    with RootLock(root, "test") as lock:
        assert lock.held
    third = DatasetWriter.open(root)
    assert third.num_episodes == 1
    third.close()
    holder = json.loads((root / LOCK_NAME).read_text())
    assert holder["command"] and holder["pid"] > 0


def test_a_root_is_checked_before_a_lock_file_is_put_into_it(tmp_path: Path) -> None:
    not_a_dataset = tmp_path / "photos"
    not_a_dataset.mkdir()
    (not_a_dataset / "cat.jpg").write_bytes(b"jpeg")
    with pytest.raises(DatasetStateError, match="not empty"):
        DatasetWriter.create(not_a_dataset, fps=FPS, features=so101_features(), robot_type=None)
    with pytest.raises(DatasetError, match="not a LeRobot dataset"):
        DatasetWriter.open(not_a_dataset)
    assert sorted(p.name for p in not_a_dataset.iterdir()) == ["cat.jpg"]
    with pytest.raises(DatasetError, match="not a LeRobot dataset"):
        DatasetWriter.open(tmp_path / "missing")
    assert not (tmp_path / "missing").exists()
    # A lock file an earlier (failed) create left does not make a root "not empty".
    empty = tmp_path / "empty"
    with RootLock(empty, "an earlier writer"):
        pass
    with DatasetWriter.create(empty, fps=FPS, features=so101_features(), robot_type=None) as writer:
        writer.add_frame({k: v for k, v in frame(0, "t").items() if k != CAM})
        assert writer.save_episode() == 0
