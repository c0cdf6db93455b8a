"""The hil and emulated rigs: SO-101 arms on serial ports, cameras, and the mirroring twin.

Adapters turn the drivers (:mod:`hilrec.drivers.arm`, :mod:`hilrec.drivers.camera`) into the
loop's protocols (:mod:`hilrec.daemon.control.sources`). Emulated mode starts two ``hilrec emulate``
child processes (follower = the MuJoCo twin's physics, leader = the scripted operator's hand),
reads each one's pty path from its first stdout line (bounded wait), and then runs exactly the hil
code against those ports. Children, not threads: the emulated servos then compete with the loop
for the CPU as real ones would not, but never for this process's GIL, and a SIGKILLed daemon takes
them down with it (PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import zmq

from hilrec.daemon.control.rig import EpisodeHooks, Mirror, NoHooks, Rig, RigFactory, remote_leader
from hilrec.daemon.control.settings import CameraSettings, DaemonSettings
from hilrec.daemon.control.sources import Camera, JointReading, Leader, WriteResult
from hilrec.daemon.errors import BusPacketError, BusTimeoutError, CameraStalledError, ConfigError, DeviceError
from hilrec.daemon.wire.security import Security

if TYPE_CHECKING:
    from hilrec.drivers.arm import SO101Follower, SO101Leader
    from hilrec.drivers.emulated.sim_camera import SimCamera

log = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1


class ArmFollower:
    """An SO101Follower as the loop's follower; the clamp uses the observation just read."""

    def __init__(self, arm: SO101Follower) -> None:
        self.arm = arm
        self.description = repr(arm)
        self._present: np.ndarray | None = None

    def read(self) -> JointReading:
        reading = self.arm.get_observation()
        self._present = reading.values
        return JointReading(reading.values, reading.retries)

    def write(self, goal: np.ndarray) -> WriteResult:
        sent = self.arm.send_action(goal, present=self._present)
        return WriteResult(sent.sent, sent.clamped)

    def advance(self) -> None:
        pass  # the servos move on their own

    def close(self) -> None:
        self.arm.close()


class ArmLeader:
    """An SO101Leader (torque off, moved by a person or the emulated hand) as the loop's leader."""

    def __init__(self, arm: SO101Leader) -> None:
        self.arm = arm
        self.description = repr(arm)
        self._reads = 0

    def read(self, frame_index: int | None, observation: np.ndarray) -> JointReading | None:
        reading = self.arm.get_action()
        self._reads += 1
        return JointReading(reading.values, reading.retries)

    def status(self) -> dict[str, Any]:
        return {"source": "serial", "state": "live", "port": self.arm.config.port, "reads": self._reads}

    def close(self) -> None:
        self.arm.close()


class EmulatorProcess:
    """One ``hilrec emulate ROLE`` child; ``port`` is its pty, read from its first stdout line."""

    def __init__(
        self,
        role: str,
        *,
        calibration_out: Path,
        wire_timing: bool,
        motion: str,
        seed: int,
        faults: tuple[str, ...],
        timeout_s: float,
    ) -> None:
        command = [
            sys.executable,
            "-m",
            "hilrec.daemon.cli",
            "emulate",
            role,
            "--write-calibration",
            str(calibration_out),
            "--seed",
            str(seed),
        ]
        if motion != "auto":
            command += ["--motion", motion]
        if wire_timing:
            command.append("--wire-timing")
        for fault in faults:
            command += ["--fault", fault]
        self.role = role
        self.process = subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            preexec_fn=_child_setup,  # noqa: PLW1509 - only async-signal-safe calls (prctl, setpriority), before exec
        )
        self.port = self._first_line(timeout_s)

    def _first_line(self, timeout_s: float) -> str:
        assert self.process.stdout is not None
        deadline = time.monotonic() + timeout_s
        buffer = b""
        fd = self.process.stdout.fileno()
        while b"\n" not in buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or self.process.poll() is not None:
                self.stop()
                raise DeviceError(
                    f"emulated {self.role} did not report its port within {timeout_s:.0f} s "
                    f"(exit status {self.process.returncode})"
                )
            ready, _, _ = select.select([fd], [], [], remaining)
            if ready:
                chunk = os.read(fd, 4096)
                if not chunk:
                    continue
                buffer += chunk
        return buffer.split(b"\n", 1)[0].decode().strip()

    def stop(self, timeout_s: float = 5.0) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout_s)
        if self.process.stdout is not None:
            self.process.stdout.close()


OPEN_ATTEMPTS = 3


def open_with_retries(arm: SO101Follower | SO101Leader) -> None:
    """Open an arm, retrying a retryable bus error: opening is dozens of transactions, and one
    late reply (a loaded machine, a busy emulator) must not stop the daemon from starting."""
    for attempt in range(1, OPEN_ATTEMPTS + 1):
        try:
            arm.open()
            return
        except (BusTimeoutError, BusPacketError) as exc:
            if attempt == OPEN_ATTEMPTS:
                raise
            log.warning("%r: open attempt %d failed (%s); retrying", arm, attempt, exc)


EMULATOR_NICE = -10


def _child_setup() -> None:
    """In the emulator child before exec: die with the daemon, and get a good share of the CPU."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    with contextlib.suppress(OSError):
        # Never SCHED_FIFO, even when started from the real-time loop thread: a Python process
        # with library thread pools that spin-wait can livelock a core under a FIFO policy.
        os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
        # Emulated servos stand in for hardware, which does not wait for the host's CPU.
        os.nice(EMULATOR_NICE)


FIRST_RENDER_GRACE_S = 60.0


class FreshCamera:
    """A camera whose frames older than ``stall_s`` count as a stall (CameraStalledError)."""

    def __init__(self, camera: SimCamera, stall_s: float) -> None:
        self.camera = camera
        self.name, self.height, self.width = camera.name, camera.height, camera.width
        self.stall_s = stall_s

    def read_latest(self) -> np.ndarray:
        frame = self.camera.latest()
        age = time.monotonic() - frame.captured_at
        if age > self.stall_s:
            raise CameraStalledError(
                f"camera '{self.name}': no new frame for {age * 1000:.0f} ms "
                f"(limit {self.stall_s * 1000:.0f} ms)"
            )
        return frame.image

    def close(self) -> None:
        self.camera.close()


def open_camera(name: str, cam: CameraSettings, mirror: Mirror | None, fps: int) -> Camera:
    """Open one camera and wait for its first frame (OpenCV's open reads one)."""
    from hilrec.drivers.camera import CameraConfig, OpenCVCamera
    from hilrec.drivers.emulated.sim_camera import SimCamera

    stall_s = cam.stall_ms / 1000.0
    if cam.source == "twin":
        from hilrec.sim.twin import Twin

        if mirror is None:
            raise ConfigError(
                f"cameras.{name}.source",
                "a 'twin' camera films the mirroring twin; it needs twin.mirror = true",
            )
        renderer = Twin(fps=fps, cameras=(name,), image_size=(cam.height, cam.width), scene=mirror.twin.scene)
        # The first render builds the GL context (seconds on a loaded machine), so the driver's
        # own freshness limit is generous and ours is applied per read.
        camera = SimCamera(
            name=name,
            snapshot=mirror.snapshot,
            renderer=renderer,
            fps=cam.fps,
            stall_timeout_s=FIRST_RENDER_GRACE_S,
        )
        camera.open()
        return FreshCamera(camera, stall_s)
    source = cam.device if cam.source == "opencv" else str(cam.path)
    opencv = OpenCVCamera(
        CameraConfig(
            name=name,
            source=source,
            width=cam.width,
            height=cam.height,
            fps=float(cam.fps) if cam.source == "opencv" else None,
            fourcc=cam.fourcc or None,
            stall_timeout_s=stall_s,
            realtime=True,
            loop=cam.loop,
        )
    )
    opencv.open()
    return opencv


def hardware_rig_factory(
    settings: DaemonSettings, context: zmq.Context[Any], security: Security
) -> RigFactory:
    def build(stack: contextlib.ExitStack) -> tuple[Rig, EpisodeHooks]:
        from hilrec.drivers.arm import FollowerConfig, LeaderConfig, SO101Follower, SO101Leader

        faults = settings.faults
        reply_timeout = faults.bus_reply_timeout_ms or None
        follower_port, leader_port = settings.follower.port, settings.leader.port
        follower_cal, leader_cal = settings.follower.calibration, settings.leader.calibration
        devices: dict[str, Any] = {}
        if settings.mode == "emulated":
            emu = settings.emulated
            workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="hilrec-emulated-")))
            follower_cal = workdir / "follower.json"
            follower_emu = EmulatorProcess(
                "follower",
                calibration_out=follower_cal,
                wire_timing=emu.wire_timing,
                motion="twin",
                seed=emu.seed,
                faults=emu.follower_faults,
                timeout_s=emu.start_timeout_s,
            )
            stack.callback(follower_emu.stop)
            follower_port = follower_emu.port
            devices["follower"] = {"emulator_pid": follower_emu.process.pid}
            if settings.leader.source == "serial":
                leader_cal = workdir / "leader.json"
                motion = {"operator": "operator", "wave": "wave", "servo": "servo"}[emu.leader_motion]
                leader_emu = EmulatorProcess(
                    "leader",
                    calibration_out=leader_cal,
                    wire_timing=emu.wire_timing,
                    motion=motion,
                    seed=emu.seed,
                    faults=emu.leader_faults,
                    timeout_s=emu.start_timeout_s,
                )
                stack.callback(leader_emu.stop)
                leader_port = leader_emu.port
                devices["leader"] = {"emulator_pid": leader_emu.process.pid}
        follower_arm = SO101Follower(
            FollowerConfig(
                port=follower_port,
                id=settings.follower.id,
                calibration=follower_cal,
                body_mode=settings.follower.body_mode,
                read_retries=faults.bus_retries,
                reply_timeout_ms=reply_timeout,
                max_relative_target=settings.follower.max_relative_target,
                tolerated_status=settings.follower.tolerated_status,
            )
        )
        open_with_retries(follower_arm)
        stack.callback(follower_arm.close)
        follower = ArmFollower(follower_arm)
        leader: Leader
        if settings.leader.source == "serial":
            leader_arm = SO101Leader(
                LeaderConfig(
                    port=leader_port,
                    id=settings.leader.id,
                    calibration=leader_cal,
                    body_mode=settings.follower.body_mode,
                    read_retries=faults.bus_retries,
                    reply_timeout_ms=reply_timeout,
                )
            )
            open_with_retries(leader_arm)
            stack.callback(leader_arm.close)
            leader = ArmLeader(leader_arm)
        else:
            remote = remote_leader(settings, context, security)
            stack.callback(remote.close)
            leader = remote
        from hilrec.sim.twin import Twin

        mirror = (
            Mirror(stack.enter_context(Twin(fps=settings.fps, cameras=()))) if settings.twin.mirror else None
        )
        cameras: dict[str, Camera] = {}
        for name, cam in settings.cameras.items():
            camera = open_camera(name, cam, mirror, settings.fps)
            stack.callback(camera.close)
            cameras[name] = camera
        devices.setdefault("follower", {})["port"] = follower_port
        if settings.leader.source == "serial":
            devices.setdefault("leader", {})["port"] = leader_port
        rig = Rig(
            follower=follower,
            leader=leader,
            cameras=cameras,
            mirror=mirror,
            dataset_fields=_dataset_fields(settings, follower_arm, leader),
            devices=devices,
        )
        return rig, NoHooks()

    return build


def _dataset_fields(settings: DaemonSettings, follower_arm: Any, leader: Leader) -> dict[str, Any]:
    """What a hardware dataset says about its units and calibration (for ``hilrec replay``)."""
    from hilrec.daemon.so101 import MOTORS

    body = settings.follower.body_mode
    joints = {name: (mode if mode == "range_0_100" else body) for name, (_, mode) in MOTORS.items()}
    calibration = {"follower": {name: dataclass_dict(cal) for name, cal in follower_arm.calibration.items()}}
    leader_arm = getattr(leader, "arm", None)
    if leader_arm is not None:
        calibration["leader"] = {name: dataclass_dict(cal) for name, cal in leader_arm.calibration.items()}
    return {"units": {"body_norm_mode": body, "joints": joints}, "calibration": calibration}


def dataclass_dict(value: Any) -> dict[str, Any]:
    import dataclasses

    return dataclasses.asdict(value)
