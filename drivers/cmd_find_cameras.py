"""``hilrec find-cameras``: the OpenCV cameras, what each delivers, and a snapshot of each.

As LeRobot's ``lerobot-find-cameras opencv``: on Linux every /dev/video* node is opened (a UVC
camera has a second, metadata-only node, reported as delivering no frame), elsewhere the
indices 0..9. Each camera is printed with its resolution, fps and FOURCC as OpenCV opened it, and
the ``[cameras.NAME]`` lines that make the daemon use it; one frame is saved as
``<out>/opencv_<device>.png``. ``--source`` (repeatable) looks at those sources instead: a
device path, an index, a video file or a stream URL.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cv2
import numpy as np

from hilrec.drivers.camera import video_devices

EXIT_NONE_FOUND = 1
_INDICES = range(10)  # non-Linux: no device nodes to list
_WARMUP_FRAMES = 5  # a device's first frames are often dark while its exposure settles


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "find-cameras",
        help="list the cameras with their resolution and fps, and save a snapshot of each",
        description=__doc__.splitlines()[0],
    )
    parser.add_argument(
        "--source",
        action="append",
        default=[],
        metavar="DEVICE|INDEX|FILE|URL",
        help="look at this source instead of the machine's devices (repeatable)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=Path("outputs/captured_images"),
        help="folder for the snapshots (LeRobot's)",
    )
    parser.add_argument("--no-snapshot", action="store_true", help="only list, save no image")
    parser.set_defaults(func=run)


@dataclass
class CameraInfo:
    source: str | int
    width: int = 0
    height: int = 0
    fps: float = 0.0
    fourcc: str = ""
    backend: str = ""
    frame: np.ndarray | None = None  # BGR, as OpenCV delivers it
    problem: str | None = None

    @property
    def is_file(self) -> bool:
        return isinstance(self.source, str) and Path(self.source).is_file() and not _is_device(self.source)

    def config_lines(self, name: str) -> str:
        fps = f"{self.fps:g}" if self.fps > 0 else "30"
        if self.is_file:
            where = f'source = "video"\npath = "{self.source}"'
        else:
            device = self.source if isinstance(self.source, int) else f'"{self.source}"'
            where = f'source = "opencv"\ndevice = {device}\nfps = {fps}'
        return f"[cameras.{name}]\n{where}\nwidth = {self.width}\nheight = {self.height}"


def _is_device(source: str) -> bool:
    return source.startswith("/dev/")


def _target(source: str) -> str | int:
    return int(source) if source.isdigit() else source


def inspect(source: str | int) -> CameraInfo:
    """Open ``source`` with OpenCV and read one frame (after a warm-up for devices). A file's
    decoder errors (OpenCV's FFmpeg writes them to fd 2 itself, one or more a frame) are held
    back: the problem line says what they mean."""
    info = CameraInfo(source)
    if not info.is_file:
        return _inspect(info)
    with tempfile.TemporaryFile() as held, _fd2_to(held):
        _inspect(info)
    if info.frame is None and info.problem is not None:
        av1 = " (LeRobot records AV1)" if info.fourcc == "AV01" else ""
        info.problem = (
            f"OpenCV opens this file but cannot decode its {info.fourcc or 'unknown'} video: its FFmpeg "
            f"has no decoder for it here{av1}. A file, not a camera; a recorded episode: hilrec view ROOT"
            if info.backend
            else info.problem
        )
    return info


@contextlib.contextmanager
def _fd2_to(target: Any) -> Iterator[None]:
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        os.dup2(target.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def _inspect(info: CameraInfo) -> CameraInfo:
    source = info.source
    capture = cv2.VideoCapture(source)
    try:
        if not capture.isOpened():
            info.problem = "OpenCV cannot open it"
            return info
        info.backend = capture.getBackendName()
        code = int(capture.get(cv2.CAP_PROP_FOURCC))
        info.fourcc = "".join(chr((code >> 8 * i) & 0xFF) for i in range(4)).strip("\x00 ")
        info.fps = float(capture.get(cv2.CAP_PROP_FPS) or 0.0)
        frames = 1 if info.is_file else _WARMUP_FRAMES
        frame = None
        for _ in range(frames):
            ok, image = capture.read()
            if ok and image is not None:
                frame = image
        if frame is None:
            info.problem = "opens but delivers no frame (a UVC camera's second node is metadata only)"
            return info
        info.height, info.width = frame.shape[:2]
        info.frame = frame
        return info
    finally:
        capture.release()


def _targets(sources: list[str]) -> list[str | int]:
    if sources:
        return [_target(s) for s in sources]
    if platform.system() == "Linux":
        return list(video_devices())
    return list(_INDICES)


def _snapshot_name(source: str | int) -> str:
    safe = str(source).replace("/", "_").replace("\\", "_").replace(":", "_")
    return f"opencv_{safe}.png"


def run(args: argparse.Namespace) -> int:
    targets = _targets(args.source)
    if not targets:
        print(
            "No camera found: there is no /dev/video* device on this machine. Is the camera plugged "
            "in (and, in a container, passed through)? A video file works too: --source FILE."
        )
        return EXIT_NONE_FOUND
    cameras = [inspect(target) for target in targets]
    working = [cam for cam in cameras if cam.problem is None]
    if working and not args.no_snapshot:
        args.out.mkdir(parents=True, exist_ok=True)
    print("--- Detected cameras ---")
    for number, cam in enumerate(cameras):
        if cam.problem is not None:
            print(f"{cam.source}: {cam.problem}")
            continue
        fps = f"{cam.fps:g} fps" if cam.fps > 0 else "fps unknown"
        codec = f", {cam.fourcc}" if cam.fourcc else ""
        line = f"{cam.source} (OpenCV {cam.backend}): {cam.width}x{cam.height} at {fps}{codec}"
        if not args.no_snapshot and cam.frame is not None:
            path = args.out / _snapshot_name(cam.source)
            if cv2.imwrite(str(path), cam.frame):
                line += f"; snapshot {path}"
            else:
                line += f"; the snapshot could not be written to {path}"
        print(line)
        print("  " + cam.config_lines(f"cam{number}").replace("\n", "\n  "))
    if not working:
        print("No source delivers frames.")
        return EXIT_NONE_FOUND
    return 0
