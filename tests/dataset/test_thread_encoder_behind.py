"""An in-process (thread) encoder that falls behind ends the take there, saved, on every camera.

It used to refuse the frame with a plain ``VideoEncodingError``: the recorder took the episode for
broken and discarded it at the stop ("episode discarded instead of saved"), so a take the
operator had watched being recorded was lost, and the frame's row had already been appended to
the columns while the slow camera never got it. ``bench_daemon.py --cameras 3`` in thread mode
lost a 30 s take that way.
"""

from __future__ import annotations

from pathlib import Path

import av
import numpy as np
import pytest
from support import wait_until

from hilrec.daemon.control.faults import FaultKind
from hilrec.daemon.control.recorder import Recorder
from hilrec.daemon.dataset.check.checker import check_dataset
from hilrec.daemon.dataset.format.reader import read_episode
from hilrec.daemon.dataset.format.sidecar import load_episode_sidecar
from hilrec.daemon.dataset.writer.dataset_writer import DatasetWriter
from hilrec.daemon.errors import EncoderBehindError, TakeEndedError
from hilrec.daemon.so101 import so101_features

FPS = 25
# Random frames: a memory copy outruns SVT-AV1 on any machine, so two queued frames are passed
# long before 300 are offered (here about 80 are taken, most of them into the encoder's lookahead,
# at this size as at 640x480, which cost twice the CPU for the same outcome).
H, W = 240, 320
CAMERAS = ("front", "wrist", "side")
QUEUE_BYTES = 2 * H * W * 3
OFFERED = 300


def frame(rng: np.random.Generator, n: int) -> dict:
    out: dict = {
        "action": np.full(6, n, dtype=np.float32),
        "observation.state": rng.normal(size=6).astype(np.float32),
        "task": "pick",
    }
    for name in CAMERAS:
        out[f"observation.images.{name}"] = rng.integers(0, 255, (H, W, 3), dtype=np.uint8)
    return out


def create(root: Path) -> DatasetWriter:
    return DatasetWriter.create(
        root,
        fps=FPS,
        features=so101_features(dict.fromkeys(CAMERAS, (H, W))),
        robot_type="so_follower",
        video_encoder="thread",
        max_video_queue_bytes=QUEUE_BYTES,
    )


def frames_in(path: Path) -> int:
    container = av.open(str(path))
    try:
        return sum(1 for _ in container.decode(video=0))
    finally:
        container.close()


@pytest.mark.slow
def test_the_writer_refuses_the_frame_whole_as_a_take_end(tmp_path: Path) -> None:
    root = tmp_path / "ds"
    writer = create(root)
    rng = np.random.default_rng(0)
    accepted = 0
    try:
        with pytest.raises(TakeEndedError) as caught:
            for n in range(OFFERED):
                writer.add_frame(frame(rng, n))
                accepted += 1
        assert isinstance(caught.value, EncoderBehindError)
        assert f"the take ends at frame {accepted}" in str(caught.value)
        assert accepted < OFFERED
        writer.save_episode()
        writer.finalize()
    finally:
        writer.close()
    assert not check_dataset(root).failures
    rows = read_episode(root, 0)
    assert len(rows["frame_index"]) == accepted
    assert rows["action"][-1][0] == accepted - 1  # the rows end at the last frame taken whole
    for name in CAMERAS:
        video = next((root / "videos" / f"observation.images.{name}").rglob("*.mp4"))
        assert frames_in(video) == accepted, name


@pytest.mark.timeout(300)
@pytest.mark.slow
def test_the_recorder_ends_the_take_at_the_bound_and_saves_it(tmp_path: Path) -> None:
    root = tmp_path / "ds"
    recorder = Recorder(lambda: create(root), queue_frames=OFFERED + 1, stall_s=60.0)
    recorder.start()
    rng = np.random.default_rng(1)
    try:
        for n in range(OFFERED):
            recorder.add_frame(frame(rng, n))
        # As the loop does each tick: the take's end is seen before the stop.
        ended = wait_until(recorder.take_ended, timeout=240, what="the take ended by the writer")
        assert ended[0] == FaultKind.SPILL_FULL and "frames behind" in ended[1]
        saved = recorder.save(sidecar={"frames": OFFERED}, arrays={})
        assert saved.result(timeout=240) == 0
        recorder.finalize().result(240)
    finally:
        recorder.close(60)
    assert not check_dataset(root).failures
    length = len(read_episode(root, 0)["frame_index"])
    assert 0 < length < OFFERED
    sidecar, _ = load_episode_sidecar(root, 0)
    assert sidecar is not None and sidecar["ended_at_spill_bound"] is True
    assert sidecar["frames"] == length and sidecar["ticks_recorded"] == OFFERED
