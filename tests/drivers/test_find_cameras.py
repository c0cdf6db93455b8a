"""`hilrec find-cameras` and what a camera error says. This machine has no /dev/video*, so the
enumeration is tested through explicit sources: OpenCV opens a video file like a device."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import pytest

from hilrec.daemon.cli import main
from hilrec.daemon.config import from_mapping
from hilrec.daemon.errors import CameraError, ConfigError
from hilrec.daemon.wire.settings import CameraSettings
from hilrec.drivers.camera import CameraConfig, OpenCVCamera, video_devices


def write_video(path: Path, *, size: tuple[int, int] = (48, 64), fps: int = 10, frames: int = 5) -> Path:
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter.fourcc(*"MJPG"), fps, (size[1], size[0]))
    assert writer.isOpened()
    for i in range(frames):
        image = np.zeros((*size, 3), np.uint8)
        image[:, :, 2] = 40 * i  # red ramps up
        image[: size[0] // 2, :, 1] = 200
        writer.write(image)
    writer.release()
    return path


def test_sources_are_listed_with_resolution_fps_and_a_snapshot(tmp_path: Path, capsys) -> None:
    video = write_video(tmp_path / "wrist.avi")
    other = write_video(tmp_path / "front.avi", size=(96, 128), fps=25)
    out = tmp_path / "snaps"
    code = main(["find-cameras", "--source", str(video), "--source", str(other), "--out", str(out)])
    printed = capsys.readouterr().out
    assert code == 0
    assert f"{video} (OpenCV " in printed and ": 64x48 at 10 fps, MJPG" in printed
    assert ": 128x96 at 25 fps" in printed
    assert 'source = "video"' in printed and f'path = "{video}"' in printed
    snapshot = cv2.imread(str(out / f"opencv_{str(video).replace('/', '_')}.png"))
    assert snapshot is not None and snapshot.shape == (48, 64, 3)
    assert snapshot[:24, :, 1].mean() > 150  # the image itself, not a blank
    assert len(list(out.glob("*.png"))) == 2


def test_a_source_that_does_not_open_is_named(tmp_path: Path, capsys) -> None:
    code = main(["find-cameras", "--source", str(tmp_path / "missing.avi"), "--no-snapshot"])
    assert code == 1
    assert "missing.avi: OpenCV cannot open it" in capsys.readouterr().out


@pytest.mark.skipif(bool(video_devices()), reason="this machine has cameras")
def test_no_camera_on_this_machine_is_said(tmp_path: Path, capsys) -> None:
    assert main(["find-cameras", "--out", str(tmp_path)]) == 1
    assert "no /dev/video* device on this machine" in capsys.readouterr().out


def test_a_wrong_camera_lists_the_cameras_that_exist() -> None:
    with pytest.raises(CameraError) as caught:
        OpenCVCamera(CameraConfig(name="front", source="/dev/video9")).open()
    message = str(caught.value)
    assert "no such device" in message and "hilrec find-cameras" in message
    devices = video_devices()
    assert (", ".join(devices) in message) if devices else ("no /dev/video* device" in message)


def test_index_camera_device_in_lerobot_style_is_accepted() -> None:
    """`device = 0` (an integer, as LeRobot's index_or_path) is a valid opencv camera."""
    cam = from_mapping(CameraSettings, {"source": "opencv", "device": 0})
    assert cam.device == 0
    assert from_mapping(CameraSettings, {"source": "opencv", "device": "/dev/video0"}).device == "/dev/video0"
    with pytest.raises(ConfigError, match="device"):
        from_mapping(CameraSettings, {"source": "opencv", "device": -1})
    with pytest.raises(ConfigError, match="device"):
        from_mapping(CameraSettings, {"source": "opencv"})
    with pytest.raises(CameraError, match="find-cameras"):  # an index reaches OpenCV as an index
        OpenCVCamera(CameraConfig(name="front", source=cam.device)).open()


def test_an_av1_file_is_named_quietly_not_as_a_uvc_node(tmp_path: Path, capfd) -> None:
    """LeRobot's videos are AV1, which OpenCV's FFmpeg cannot decode here: its ~60 decoder errors
    on fd 2 are held back and the line says what is wrong, not "a UVC camera's second node"."""
    import av

    path = tmp_path / "lerobot.mp4"
    with av.open(str(path), "w") as container:
        stream = container.add_stream("libsvtav1", rate=25)
        assert isinstance(stream, av.VideoStream)
        stream.width, stream.height, stream.pix_fmt = 64, 64, "yuv420p"
        for i in range(10):
            image = np.full((64, 64, 3), 20 * i, dtype=np.uint8)
            for packet in stream.encode(av.VideoFrame.from_ndarray(image, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    capfd.readouterr()
    assert main(["find-cameras", "--source", str(path), "--out", str(tmp_path / "snaps")]) == 1
    out, err = capfd.readouterr()
    assert "[av1 @" not in err and "Failed to get pixel format" not in err, err
    assert "UVC" not in out, out
    assert f"{path}: OpenCV opens this file but cannot decode its AV01 video" in out, out
