"""``hilrec edit`` against LeRobot: ``recompute-stats`` clears the stale-stats warnings LeRobot's
own ``delete_episodes`` leaves, LeRobot loads what ``hilrec edit`` writes with the right frames,
and a cut that cannot land on a key frame re-encodes only the span up to the next one.

Its own file, named to run after ``test_edit_kill.py``: once torch is loaded in the pytest
process, PyAV decoding in that process has been seen to stall.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from test_edit import (
    CAM,
    FPS,
    LENGTHS,
    assert_clean,
    make_dataset,
)

from hilrec.daemon.cli import main
from hilrec.daemon.dataset.check.checker import check_dataset
from hilrec.daemon.dataset.format.reader import decode_video, read_episode, read_episode_frames
from hilrec.daemon.dataset.video.codec import Segment
from hilrec.daemon.so101 import ACTION_KEY
from hilrec.daemon.tools import edit, edit_video

# Real daemons, processes or kill loops: the slow tier (make test runs it; make test-fast does not).
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_dataset(tmp_path_factory.mktemp("edit-lerobot") / "src")


def test_recompute_stats_clears_lerobot_delete_warnings_and_lerobot_loads_edits(
    source: Path, tmp_path: Path
) -> None:
    import torch
    from lerobot.datasets.dataset_tools import delete_episodes
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    lerobot_out = tmp_path / "lerobot_deleted"
    dataset = LeRobotDataset("local/src", root=source, video_backend="pyav")
    delete_episodes(dataset, [1, 2], output_dir=lerobot_out, repo_id="local/deleted")
    before = check_dataset(lerobot_out)
    assert not before.errors and before.warnings, before.format_text()
    assert {f.rule for f in before.warnings} == {"stats.default_columns"}

    assert main(["edit", "recompute-stats", str(lerobot_out)]) == 0
    assert_clean(lerobot_out)

    # Edit what LeRobot wrote, then load the result in LeRobot: the frames are the source's.
    out = tmp_path / "edited"
    report = edit.delete_episodes(lerobot_out, [0], out=out)
    assert_clean(out)
    assert report.videos_cut + report.videos_reencoded + report.videos_linked >= 1
    loaded = LeRobotDataset("local/edited", root=out, video_backend="pyav")
    assert loaded.meta.total_episodes == 3
    start = 0
    # LeRobot's delete kept source episodes 0, 3, 4, 5; ours dropped the first of those.
    for new, old in enumerate([3, 4, 5]):
        want = read_episode(source, old, [ACTION_KEY])[ACTION_KEY]
        got = torch.stack([loaded[start + i][ACTION_KEY] for i in range(LENGTHS[old])]).numpy()
        np.testing.assert_array_equal(got, want)
        image = loaded[start + 2][CAM].permute(1, 2, 0).numpy() * 255
        reference = read_episode_frames(out, new, CAM, [2])[0].astype(np.float32)
        assert np.abs(image - reference).max() <= 1.0
        start += LENGTHS[old]

    # Where a cut cannot land on a key frame (LeRobot's re-encoded file has them only here and
    # there), the span is re-encoded: same frames, within a lossy generation.
    import av

    video = next((lerobot_out / "videos").rglob("*.mp4"))
    with av.open(str(video)) as container:
        stream = container.streams.video[0]
        assert stream.time_base is not None
        tb = float(stream.time_base)
        packets = sorted(
            (int(p.pts), bool(p.is_keyframe)) for p in container.demux(stream) if p.size and p.pts is not None
        )
    first = next(i for i, (_, is_key) in enumerate(packets) if not is_key)
    cut_s = packets[first][0] * tb
    segments = [Segment(video, cut_s, cut_s + 4 / FPS)]
    assert not edit_video.starts_on_keyframes(segments)
    placed = edit_video.reencode_spans(tmp_path / "re.mp4", segments, fps=FPS, lengths=[4])
    assert placed == [(0.0, 4 / FPS, 4)]
    again = decode_video(tmp_path / "re.mp4", np.arange(4) / FPS).astype(np.int16)
    original = decode_video(video, cut_s + np.arange(4) / FPS).astype(np.int16)
    assert np.abs(again - original).mean() < 4

    # The smallest span instead: only the frames up to the next key frame are re-encoded.
    key_s = next(pts for pts, is_key in packets[first:] if is_key) * tb
    head = round((key_s - cut_s) * FPS)
    end = key_s + 3 / FPS
    spliced, frames = edit_video.splice_spans(
        tmp_path / "splice.mp4", [Segment(video, cut_s, end)], fps=FPS, lengths=[head + 3]
    )
    assert frames == head and spliced == [(0.0, (head + 3) / FPS, head + 3)]
    got = decode_video(tmp_path / "splice.mp4", np.arange(head + 3) / FPS).astype(np.int16)
    want = decode_video(video, cut_s + np.arange(head + 3) / FPS).astype(np.int16)
    np.testing.assert_array_equal(got[head:], want[head:])  # copied packets: bit-equal
    assert np.abs(got[:head] - want[:head]).mean() < 4
