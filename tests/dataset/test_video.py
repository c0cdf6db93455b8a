"""The streaming episode encoder, probing and stream-copy concatenation (real PyAV, no mocks)."""

from __future__ import annotations

from pathlib import Path

import av
import numpy as np
import pytest

from hilrec.daemon.dataset.video.codec import (
    EpisodeVideoEncoder,
    Segment,
    VideoSettings,
    concat_segments,
    probe_video,
)
from hilrec.daemon.errors import VideoEncodingError

FPS = 25


def gradient_frames(count: int, height: int = 48, width: int = 64) -> list[np.ndarray]:
    base = np.linspace(0, 180, width, dtype=np.float32)[None, :, None]
    return [
        np.clip(base + 3 * i + np.zeros((height, width, 3), np.float32), 0, 255).astype(np.uint8)
        for i in range(count)
    ]


def encode(path: Path, frames: list[np.ndarray], codec: str = "libsvtav1") -> int:
    height, width, _ = frames[0].shape
    encoder = EpisodeVideoEncoder(
        path,
        key="cam",
        episode_index=0,
        fps=FPS,
        height=height,
        width=width,
        settings=VideoSettings(codec=codec),
    )
    for frame in frames:
        encoder.put(frame)
    return encoder.finish(timeout=60)


@pytest.mark.parametrize("codec, name", [("libsvtav1", "av1"), ("libx264", "h264")])
def test_every_frame_lands_on_the_fps_grid(tmp_path: Path, codec: str, name: str) -> None:
    frames = gradient_frames(37)
    path = tmp_path / "ep.mp4"
    assert encode(path, frames, codec) == 37
    probe = probe_video(path)
    assert (probe.frames, probe.codec, probe.pix_fmt, probe.fps) == (37, name, "yuv420p", FPS)
    assert probe.duration_s == pytest.approx(37 / FPS)
    with av.open(str(path)) as container:
        decoded = list(container.decode(video=0))
    assert [round(f.time * FPS) for f in decoded] == list(range(37))
    for frame, original in zip(decoded, frames, strict=True):
        assert np.abs(frame.to_ndarray(format="rgb24").astype(int) - original).mean() < 4


def test_the_encoder_copies_frames_the_caller_reuses(tmp_path: Path) -> None:
    buffer = np.zeros((48, 64, 3), np.uint8)
    encoder = EpisodeVideoEncoder(
        tmp_path / "ep.mp4",
        key="cam",
        episode_index=0,
        fps=FPS,
        height=48,
        width=64,
        settings=VideoSettings(codec="libx264"),
    )
    for value in (0, 250):
        buffer[:] = value
        encoder.put(buffer)
    encoder.finish(timeout=60)
    with av.open(str(tmp_path / "ep.mp4")) as container:
        means = [f.to_ndarray(format="rgb24").mean() for f in container.decode(video=0)]
    assert means[0] < 10 and means[1] > 240


def test_falling_behind_past_the_memory_bound_fails_loudly(tmp_path: Path) -> None:
    frame = np.random.default_rng(0).integers(0, 255, (720, 1280, 3), dtype=np.uint8)
    encoder = EpisodeVideoEncoder(
        tmp_path / "ep.mp4",
        key="cam",
        episode_index=4,
        fps=FPS,
        height=720,
        width=1280,
        settings=VideoSettings(),
        max_queue_bytes=2 * frame.nbytes,
    )
    with pytest.raises(VideoEncodingError, match="refusing to drop") as caught:
        for _ in range(200):
            encoder.put(frame)
    assert "'cam' episode 4" in str(caught.value)
    assert encoder.frames_in < 200
    encoder.abort()
    assert not (tmp_path / "ep.mp4").exists()


def test_an_encoder_failure_surfaces_at_the_next_call(tmp_path: Path) -> None:
    blocked = tmp_path / "not-a-dir"
    blocked.write_text("a file where the encoder wants a directory")
    encoder = EpisodeVideoEncoder(
        blocked / "ep.mp4",
        key="cam",
        episode_index=2,
        fps=FPS,
        height=48,
        width=64,
        settings=VideoSettings(codec="libx264"),
    )
    with pytest.raises(VideoEncodingError, match="episode 2"):
        for frame in gradient_frames(5):
            encoder.put(frame)
        encoder.finish(timeout=60)


def test_unknown_codec_is_refused() -> None:
    with pytest.raises(VideoEncodingError, match="mpeg2"):
        VideoSettings(codec="mpeg2video")


def test_concat_places_segments_back_to_back(tmp_path: Path) -> None:
    first, second = tmp_path / "a.mp4", tmp_path / "b.mp4"
    encode(first, gradient_frames(10))
    encode(second, gradient_frames(7))
    joined = tmp_path / "joined.mp4"
    assert concat_segments(joined, [Segment(first), Segment(second)], fps=FPS) == [
        (0.0, 0.4, 10),
        (0.4, 0.68, 7),
    ]
    sliced = tmp_path / "slice.mp4"
    assert concat_segments(sliced, [Segment(joined, 0.4, 0.68)], fps=FPS) == [(0.0, 0.28, 7)]
    with av.open(str(joined)) as container:
        times = [f.time for f in container.decode(video=0)]
    assert np.allclose(times, np.arange(17) / FPS, atol=1e-4)


def test_defaults_are_lerobots_codec_settings() -> None:
    """LeRobot 0.4.4's _get_codec_options(libsvtav1) and its encode defaults, exactly."""
    from lerobot.datasets.video_utils import _get_codec_options

    settings = VideoSettings()
    assert (settings.codec, settings.pix_fmt, settings.g, settings.crf, settings.preset) == (
        "libsvtav1",
        "yuv420p",
        2,
        30,
        12,
    )
    assert settings.options() == _get_codec_options("libsvtav1", 2, 30, None)


@pytest.mark.parametrize("codec, name", [("h264", "h264"), ("hevc", "hevc")])
def test_h264_and_hevc_are_offered(tmp_path: Path, codec: str, name: str) -> None:
    if name == "hevc" and "libx265" not in av.codecs_available:
        pytest.skip("PyAV has no libx265")
    settings = VideoSettings(codec=codec)
    assert settings.codec == {"h264": "libx264", "hevc": "libx265"}[codec]
    assert {"g": "2", "crf": "30"}.items() <= settings.options().items()
    path = tmp_path / "ep.mp4"
    assert encode(path, gradient_frames(12), settings.codec) == 12
    probe = probe_video(path)
    assert (probe.frames, probe.codec) == (12, name)
    with av.open(str(path)) as container:
        assert sum(1 for _ in container.decode(video=0)) == 12
