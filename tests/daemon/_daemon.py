"""A daemon under test: a real ``hilrec daemon`` subprocess on free ports, driven over ZeroMQ only."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hilrec.daemon.errors import DaemonUnreachableError
from hilrec.daemon.wire.client import ControlClient, LeaderClient, TelemetryClient

START_TIMEOUT_S = 90.0
PORT_ATTEMPTS = 3
PORT_TAKEN = "Address already in use"
# Failed ticks in a row before an emulated arm counts as lost, in the tests (see emulated_config).
PATIENT_FAILED_TICKS = 50


def free_ports(n: int) -> list[int]:
    sockets = []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        sockets.append(s)
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def sim_config(
    root: Path,
    *,
    leader: str = "scripted",
    realtime: bool = True,
    size: tuple[int, int] | None = (48, 64),
    fps: int = 25,
    extra: str = "",
    dataset_extra: str = "",
) -> str:
    """``size``: the front camera's (height, width), or None for no camera."""
    camera = "" if size is None else f'[cameras.front]\nsource = "sim"\nheight = {size[0]}\nwidth = {size[1]}'
    return f"""
mode = "sim"
fps = {fps}
[dataset]
root = "{root}"
{dataset_extra}
[leader]
source = "{leader}"
watchdog_ms = 300
{camera}
[telemetry]
preview_hz = 5.0
preview_width = 32
[sim]
realtime = {"true" if realtime else "false"}
{extra}
"""


class Daemon:
    """Start with :meth:`start`; every wait below is bounded."""

    def __init__(self, tmp_path: Path, config: str, *, host: str = "127.0.0.1", zmq_extra: str = "") -> None:
        self.tmp_path = tmp_path
        self.host = host
        self._config, self._zmq_extra = config, zmq_extra
        # False once the ports are given, not picked here (a restart on another daemon's ports).
        self.repick_ports = True
        self._pick_ports()
        self.process: subprocess.Popen[bytes] | None = None
        self.client: ControlClient | None = None

    def _pick_ports(self) -> None:
        self.control_port, self.telemetry_port, self.leader_port = free_ports(3)
        self.config_path = self.tmp_path / f"daemon-{self.control_port}.toml"
        # A generous apply timeout: a shared, loaded CI machine may stall a tick for a while.
        zmq_table = (
            f'[zmq]\nhost = "{self.host}"\ncontrol_port = {self.control_port}\n'
            f"telemetry_port = {self.telemetry_port}\nleader_port = {self.leader_port}\n"
            f"apply_timeout_ms = 10000\n{self._zmq_extra}"
        )
        self.config_path.write_text(self._config + "\n" + zmq_table)
        self.log_path = self.tmp_path / f"daemon-{self.control_port}.log"

    @property
    def temp_dir(self) -> Path:
        return self.tmp_path / "daemon-tmp"

    @property
    def control(self) -> str:
        return f"tcp://127.0.0.1:{self.control_port}"

    def start(self, *, expect_ready: bool = True, args: tuple[str, ...] = ()) -> Daemon:
        """``args``: more flags of ``hilrec daemon``, e.g. ``("--resume",)``.

        A free port is picked by binding port 0 and letting it go, so on a machine running several
        test workers another process may take it before the daemon binds it (seen at three
        workers: "Address already in use"). A daemon that exits so at start is started again on
        other ports, up to :data:`PORT_ATTEMPTS` times; any other exit fails as before."""
        for _ in range(PORT_ATTEMPTS - 1):
            try:
                return self._start(expect_ready=expect_ready, args=args)
            except AssertionError:
                if not (self.repick_ports and self._lost_a_port()):
                    raise
                self.close()
                self._pick_ports()
        return self._start(expect_ready=expect_ready, args=args)

    def _lost_a_port(self) -> bool:
        return self.process is not None and self.process.poll() is not None and PORT_TAKEN in self.log()

    def _start(self, *, expect_ready: bool, args: tuple[str, ...]) -> Daemon:
        # Its temporary files (an emulated rig's calibrations) under the test's folder, where a
        # test can see what a killed daemon left.
        self.temp_dir.mkdir(exist_ok=True)
        env = dict(os.environ, MUJOCO_GL=os.environ.get("MUJOCO_GL", "egl"), TMPDIR=str(self.temp_dir))
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "hilrec.daemon.cli",
                    "daemon",
                    "--config",
                    str(self.config_path),
                    *args,
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
            )
        if expect_ready:
            self.client = ControlClient(self.control, timeout_ms=1000, retries=1)
            deadline = time.monotonic() + START_TIMEOUT_S
            while True:
                if self.process.poll() is not None:
                    raise AssertionError(f"daemon exited with {self.process.returncode}:\n{self.log()}")
                try:
                    self.client.request("status")
                    break
                except DaemonUnreachableError:
                    if time.monotonic() > deadline:
                        raise AssertionError(
                            f"daemon not serving after {START_TIMEOUT_S} s:\n{self.log()}"
                        ) from None
            self.client.timeout_ms, self.client.retries = 5000, 2
        return self

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def request(self, cmd: str, **args: Any) -> dict[str, Any]:
        assert self.client is not None
        return self.client.request(cmd, **args)

    def call(self, cmd: str, **args: Any) -> dict[str, Any]:
        reply = self.request(cmd, **args)
        assert reply["ok"], f"{cmd} refused: {reply}\n{self.log()}"
        return reply

    def wait_status(
        self, predicate: Callable[[dict[str, Any]], bool], timeout_s: float = 30.0, what: str = "condition"
    ) -> dict[str, Any]:
        """Poll status until ``predicate`` holds (each poll a bounded request)."""
        deadline = time.monotonic() + timeout_s
        status: dict[str, Any] = {}
        while time.monotonic() < deadline:
            status = self.call("status")
            if predicate(status):
                return status
            time.sleep(0.05)  # poll interval between bounded requests
        raise AssertionError(
            f"{what} not reached in {timeout_s} s; last status:\n{json.dumps(status, indent=1)}\n{self.log()}"
        )

    def wait_frames(self, n: int, timeout_s: float = 30.0) -> dict[str, Any]:
        return self.wait_status(
            lambda s: (s.get("episode") or {}).get("frames", 0) >= n,
            timeout_s,
            f"{n} frames in the open episode",
        )

    def wait_saved(self, n: int, timeout_s: float = 60.0) -> dict[str, Any]:
        return self.wait_status(
            lambda s: s["dataset"]["saved_this_session"] >= n and s["dataset"]["saving"] == 0,
            timeout_s,
            f"{n} saved episodes",
        )

    def telemetry(self, **kwargs: Any) -> TelemetryClient:
        return TelemetryClient(f"tcp://127.0.0.1:{self.telemetry_port}", **kwargs)

    def leader(self, **kwargs: Any) -> LeaderClient:
        return LeaderClient(f"tcp://127.0.0.1:{self.leader_port}", **kwargs)

    def signal(self, signum: int) -> None:
        assert self.process is not None
        self.process.send_signal(signum)

    def wait_exit(self, timeout_s: float = 60.0) -> int:
        assert self.process is not None
        try:
            return self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)
            raise AssertionError(f"daemon did not exit within {timeout_s} s:\n{self.log()}") from None

    def shutdown(self, timeout_s: float = 60.0) -> int:
        self.call("shutdown")
        return self.wait_exit(timeout_s)

    def close(self) -> None:
        if self.client is not None:
            self.client.close()
            self.client = None
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(10)


def check_passes(root: Path) -> None:
    """``hilrec check``'s checks, in this process (the CLI adds only printing and the exit code)."""
    from hilrec.daemon.dataset.check.checker import check_dataset

    report = check_dataset(root)
    assert report.passed, report.format_text()


def run_cli(*args: str, timeout_s: float = 300.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hilrec.daemon.cli", *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )


def write_test_video(path: Path, *, frames: int, size: tuple[int, int] = (48, 64), fps: int = 25) -> Path:
    """A small MPEG-4 file of a drifting smooth gradient (a video-file camera source).

    Smooth content keeps the lossy round trip's pixel statistics close to the recorded ones, as
    a camera image does; a thin bright line would put quantiles on a compression edge."""
    import cv2
    import numpy as np

    height, width = size
    yy, xx = np.mgrid[0:height, 0:width]
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter.fourcc(*"mp4v"), fps, (width, height))
    for i in range(frames):
        # A triangle wave, not a sawtooth: a wrap from 255 to 0 is a hard edge the codec smears.
        phase = (xx * 2 + yy + i * 3) % 510
        base = np.where(phase < 255, phase, 510 - phase)
        image = np.stack([base, (base + 85) % 256 // 2 + 64, 255 - base], axis=-1).astype(np.uint8)
        writer.write(image)
    writer.release()
    return path


def emulated_config(
    root: Path,
    *,
    cameras: str = "",
    faults: str = "",
    extra: str = "",
    on_device_lost: str = "save",
    bus_reply_timeout_ms: float | None = None,
) -> str:
    """An emulated-mode config. ``faults``: the emulators' (under ``[emulated]``).

    A shared machine stalls the emulators' pty now and then (its flip-buffer work runs on a
    kernel worker at normal priority: bench/bench_emulator_replies.py), for longer than the
    default's five failed ticks (about 200 ms) under a loaded ``make test``: failed reads mark
    their frames, and only two seconds of them count as a lost arm. A killed emulator is lost at
    once (its port is gone), which is how the tests lose one."""
    reply = "" if bus_reply_timeout_ms is None else f"bus_reply_timeout_ms = {bus_reply_timeout_ms}\n"
    return f"""
mode = "emulated"
fps = 25
[dataset]
root = "{root}"
[leader]
source = "serial"
[telemetry]
preview_hz = 0.0
[faults]
on_device_lost = "{on_device_lost}"
max_failed_ticks = {PATIENT_FAILED_TICKS}
{reply}[emulated]
leader_motion = "operator"
{faults}
{cameras}
{extra}
"""
