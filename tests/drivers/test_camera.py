"""OpenCV camera sources on small videos made with PyAV at test time."""

from __future__ import annotations

import re
from pathlib import Path

import av
import numpy as np
import pytest

from hilrec.daemon.errors import CameraError, CameraStalledError
from hilrec.drivers.camera import CameraConfig, OpenCVCamera

WIDTH, HEIGHT, FPS = 64, 48, 50


def make_video(path: Path, frames: int, *, still: bool = False) -> Path:
    with av.open(str(path), "w") as container:
        stream = container.add_stream("mpeg4", rate=FPS)
        stream.width, stream.height, stream.pix_fmt = WIDTH, HEIGHT, "yuv420p"
        stream.options = {"qscale": "1"}
        for i in range(frames):
            image = np.zeros((HEIGHT, WIDTH, 3), dtype=np.uint8)
            image[..., 0] = 200  # red: checks the BGR -> RGB conversion
            image[: (HEIGHT if still else 4 + i), :, 2] = 120  # a growing blue band
            for packet in stream.encode(av.VideoFrame.from_ndarray(image, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return path


@pytest.fixture
def video(tmp_path: Path) -> Path:
    return make_video(tmp_path / "moving.mp4", 30)


def test_frames_arrive_newest_first_in_rgb(video: Path) -> None:
    config = CameraConfig(name="front", source=str(video), width=WIDTH, height=HEIGHT)
    with OpenCVCamera(config) as camera:
        assert (camera.width, camera.height, camera.fps) == (WIDTH, HEIGHT, FPS)
        first = camera.latest()
        later = camera.wait_newer(first.index + 3, timeout=5)
        assert later.index > first.index + 3 and later.captured_at > first.captured_at
        image = camera.read_latest()
    assert image.shape == (HEIGHT, WIDTH, 3) and image.dtype == np.uint8
    assert image[..., 0].mean() > 150 and image[-1, :, 2].mean() < 60  # red, blue band on top


def test_missing_source_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(CameraError, match=r"camera 'wrist'.*nothere\.mp4.*no such device or file"):
        OpenCVCamera(CameraConfig(name="wrist", source=str(tmp_path / "nothere.mp4"))).open()
    not_video = tmp_path / "notes.txt"
    not_video.write_text("not a video")
    with pytest.raises(CameraError, match=re.escape("notes.txt")):
        OpenCVCamera(CameraConfig(name="wrist", source=str(not_video))).open()


def test_wrong_size_is_refused(video: Path) -> None:
    config = CameraConfig(name="front", source=str(video), width=640, height=480)
    with pytest.raises(CameraError, match="delivers 64x48, the config asks for 640x480"):
        OpenCVCamera(config).open()


def test_a_camera_that_stops_is_reported_not_repeated(video: Path) -> None:
    config = CameraConfig(name="front", source=str(video), stall_timeout_s=0.3)
    with OpenCVCamera(config) as camera:
        frame = camera.latest()
        while True:  # the file ends after 30 frames: then no frame is served as "latest"
            try:
                frame = camera.wait_newer(frame.index, timeout=2)
            except CameraStalledError as exc:
                assert "end of the video file" in str(exc)
                break
        assert frame.index == 30
        with pytest.raises(CameraStalledError):
            camera.read_latest()


def test_a_frozen_image_is_a_stall(tmp_path: Path) -> None:
    still = make_video(tmp_path / "still.mp4", 60, still=True)
    config = CameraConfig(name="front", source=str(still), stall_timeout_s=0.2, detect_frozen=True, loop=True)
    with OpenCVCamera(config) as camera:
        frame = camera.latest()
        with pytest.raises(CameraStalledError, match="frozen, the same image"):
            while True:  # frames keep coming, but they are all the same picture
                frame = camera.wait_newer(frame.index, timeout=2)
                camera.read_latest()


def test_looping_file_never_runs_dry(tmp_path: Path) -> None:
    short = make_video(tmp_path / "short.mp4", 5)
    with OpenCVCamera(CameraConfig(name="front", source=str(short), loop=True)) as camera:
        assert camera.wait_newer(12, timeout=5).index > 12
