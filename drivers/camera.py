"""Camera sources: OpenCV devices, files and streams read in the background.

The twin's cameras (:mod:`hilrec.drivers.emulated.sim_camera`) share the newest-frame base here.

A source's background thread keeps only the newest frame, with its capture time on the
monotonic clock and a running index. ``read_latest()`` never blocks; it raises
CameraStalledError when the newest frame is older than ``stall_timeout_s`` (the camera froze,
was unplugged, or a file ran out), and also when an OpenCV device keeps delivering byte-identical
images for that long (some drivers repeat their last buffer when the sensor hangs): a frozen
camera is never recorded as a run of repeated frames.

Frames are RGB uint8 (H, W, 3), like LeRobot's OpenCVCamera with its default color mode.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np

from hilrec.daemon.errors import CameraError, CameraStalledError, ConfigError

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class CameraConfig:
    name: str
    # A device index (0 or "0", LeRobot's style), a device path (/dev/video0), a video file, or
    # a stream URL.
    source: str | int
    width: int | None = None
    height: int | None = None
    fps: float | None = None
    fourcc: str | None = None  # e.g. "MJPG": USB cameras reach full fps at 640x480 only in MJPG
    stall_timeout_s: float = 0.5
    # Video files: pace frames at the file's fps (a file read flat out is not a camera), and
    # start over at the end (test sources that never run dry).
    realtime: bool = True
    loop: bool = False
    # Byte-identical images for stall_timeout_s mean a frozen camera. None: check devices and
    # streams only (a video file may hold a still scene on purpose); True/False: always/never.
    detect_frozen: bool | None = None

    def validate(self) -> None:
        if self.fourcc is not None and len(self.fourcc) != 4:
            raise ConfigError("fourcc", f"a FOURCC has 4 characters, got {self.fourcc!r}")
        if (self.width is None) != (self.height is None):
            raise ConfigError("width", "give both width and height, or neither")
        if self.stall_timeout_s <= 0:
            raise ConfigError("stall_timeout_s", f"must be positive, got {self.stall_timeout_s}")


@dataclass(frozen=True)
class Frame:
    image: np.ndarray  # RGB uint8 (H, W, 3); never written to after publication
    captured_at: float  # time.monotonic() when the frame was received
    index: int


class LatestFrame:
    """The newest frame and the freshness rules, shared by every source."""

    def __init__(self, name: str, stall_timeout_s: float) -> None:
        self.name = name
        self.stall_timeout_s = stall_timeout_s
        self._cond = threading.Condition()
        self._frame: Frame | None = None
        self._count = 0
        self.error: str | None = None  # why the reader thread stopped, if it did
        self.frozen_since: float | None = None

    def publish(self, image: np.ndarray, captured_at: float) -> None:
        with self._cond:
            self._count += 1
            self._frame = Frame(image, captured_at, self._count)
            self._cond.notify_all()

    def fail(self, reason: str) -> None:
        with self._cond:
            self.error = reason
            self._cond.notify_all()

    def latest(self) -> Frame:
        now = time.monotonic()
        with self._cond:
            frame, error, frozen = self._frame, self.error, self.frozen_since
        if frame is None or error is not None:
            raise CameraStalledError(
                f"camera '{self.name}': " + (f"stopped: {error}" if error else "no frame yet")
            )
        age = now - frame.captured_at
        if age > self.stall_timeout_s:
            raise CameraStalledError(
                f"camera '{self.name}': no new frame for {age * 1000:.0f} ms (limit "
                f"{self.stall_timeout_s * 1000:.0f} ms)"
            )
        if frozen is not None and now - frozen > self.stall_timeout_s:
            raise CameraStalledError(f"camera '{self.name}': frozen, the same image for {now - frozen:.2f} s")
        return frame

    def wait_newer(self, index: int, timeout: float) -> Frame:
        with self._cond:
            self._cond.wait_for(
                lambda: (self._frame is not None and self._frame.index > index) or self.error is not None,
                timeout,
            )
        return self.latest()  # raises if nothing newer came, with the reason


def _parse_source(source: str | int) -> int | str:
    if isinstance(source, int):
        return source
    return int(source) if source.isdigit() else source


def video_devices() -> list[str]:
    """The machine's V4L2 device nodes (/dev/video*), in index order: what ``hilrec
    find-cameras`` opens. A UVC camera usually has two, the second for metadata only."""

    def index(path: Path) -> tuple[int, str]:
        digits = path.name.removeprefix("video")
        return (int(digits) if digits.isdigit() else 1 << 30, path.name)

    return [str(p) for p in sorted(Path("/dev").glob("video*"), key=index)]


def cameras_hint() -> str:
    """What exists, for an error about a camera that does not."""
    devices = video_devices()
    found = (
        f"the video devices here are {', '.join(devices)}"
        if devices
        else "there is no /dev/video* device on this machine (is the camera plugged in?)"
    )
    return f"{found}; `hilrec find-cameras` lists the cameras with their resolutions and fps"


class NewestFrameSource:
    """What every camera offers: the newest frame, kept by its own capture or render thread."""

    _latest: LatestFrame

    def read_latest(self) -> np.ndarray:
        """The newest frame (RGB uint8), at once; CameraStalledError if it is too old."""
        return self._latest.latest().image

    def latest(self) -> Frame:
        return self._latest.latest()

    def wait_newer(self, index: int, timeout: float) -> Frame:
        """Block until a frame newer than ``index`` arrives (or the camera fails/stalls)."""
        return self._latest.wait_newer(index, timeout)


class OpenCVCamera(NewestFrameSource):
    """A cv2.VideoCapture read by a background thread; open() ... close(), or ``with``."""

    def __init__(self, config: CameraConfig) -> None:
        config.validate()
        self.config = config
        self.name = config.name
        self.width = config.width or 0
        self.height = config.height or 0
        self.fps = config.fps or 0.0
        self._latest = LatestFrame(config.name, config.stall_timeout_s)
        self._capture: cv2.VideoCapture | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    def __repr__(self) -> str:
        return f"camera '{self.name}' ({self.config.source})"

    def open(self) -> None:
        cfg = self.config
        source = _parse_source(cfg.source)
        if isinstance(source, str) and "://" not in source and not Path(source).exists():
            raise CameraError(f"{self!r}: no such device or file; {cameras_hint()}")
        capture = cv2.VideoCapture(source)
        if not capture.isOpened():
            capture.release()
            raise CameraError(f"{self!r}: OpenCV cannot open it; {cameras_hint()}")
        if cfg.fourcc:
            capture.set(cv2.CAP_PROP_FOURCC, cv2.VideoWriter.fourcc(*cfg.fourcc))
        if cfg.width is not None and cfg.height is not None:  # validate(): both or neither
            capture.set(cv2.CAP_PROP_FRAME_WIDTH, cfg.width)
            capture.set(cv2.CAP_PROP_FRAME_HEIGHT, cfg.height)
        if cfg.fps is not None:
            capture.set(cv2.CAP_PROP_FPS, cfg.fps)
        ok, first = capture.read()
        if not ok or first is None:
            capture.release()
            raise CameraError(
                f"{self!r}: opened but delivers no frame (a UVC camera's second node is metadata "
                f"only); {cameras_hint()}"
            )
        height, width = first.shape[:2]
        if cfg.width is not None and (width, height) != (cfg.width, cfg.height):
            capture.release()
            raise CameraError(
                f"{self!r}: delivers {width}x{height}, the config asks for {cfg.width}x{cfg.height} "
                "(`hilrec find-cameras` shows what each camera delivers)"
            )
        self.width, self.height = width, height
        self.fps = float(capture.get(cv2.CAP_PROP_FPS) or 0.0) or (cfg.fps or 0.0)
        self._capture = capture
        self._latest.publish(cv2.cvtColor(first, cv2.COLOR_BGR2RGB), time.monotonic())
        self._stop.clear()
        self._thread = threading.Thread(
            target=self._read_loop, args=(capture,), name=f"camera-{self.name}", daemon=True
        )
        self._thread.start()

    def _is_file(self) -> bool:
        source = _parse_source(self.config.source)
        return isinstance(source, str) and Path(source).is_file()

    def _read_loop(self, capture: cv2.VideoCapture) -> None:
        cfg = self.config
        is_file = self._is_file()
        period = 1.0 / self.fps if (is_file and cfg.realtime and self.fps > 0) else 0.0
        next_due = time.monotonic() + period
        last_digest: bytes | None = None
        failures = 0
        while not self._stop.is_set():
            if period:
                self._stop.wait(max(0.0, next_due - time.monotonic()))
                next_due += period
            ok, bgr = capture.read()
            if not ok or bgr is None:
                if is_file and cfg.loop:
                    capture.set(cv2.CAP_PROP_POS_FRAMES, 0)
                    continue
                if is_file:
                    self._latest.fail("end of the video file")
                    return
                failures += 1
                if failures == 1:
                    log.warning("%r: read failed; waiting for it to come back", self)
                self._stop.wait(0.01)
                continue
            failures = 0
            now = time.monotonic()
            if cfg.detect_frozen or (cfg.detect_frozen is None and not is_file):
                digest = hashlib.blake2b(bgr[::4, ::4].tobytes(), digest_size=16).digest()
                if digest == last_digest:
                    if self._latest.frozen_since is None:
                        self._latest.frozen_since = now
                else:
                    self._latest.frozen_since = None
                last_digest = digest
            self._latest.publish(cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB), now)

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
            self._thread = None
        if self._capture is not None:
            self._capture.release()
            self._capture = None

    def __enter__(self) -> OpenCVCamera:
        self.open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
