"""The hil and emulated rigs: SO-101 arms on serial ports, cameras, and the mirroring twin.

Adapters turn the drivers (:mod:`hilrec.drivers.arm`, :mod:`hilrec.drivers.camera`) into the
loop's protocols (:mod:`hilrec.daemon.control.sources`). Emulated mode starts two ``hilrec emulate``
child processes (follower = the MuJoCo twin's physics, leader = the scripted operator's hand),
reads each one's pty path from its first stdout line (bounded wait), and then runs exactly the hil
code against those ports. Children, not threads: the emulated servos then compete with the loop
for the CPU as real ones would not, but never for this process's GIL, and a SIGKILLed daemon takes
them down with it (:mod:`hilrec.daemon.procs`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import zmq

from hilrec.daemon import procs
from hilrec.daemon.control.rig import EpisodeHooks, Mirror, NoHooks, Rig, RigFactory, remote_leader
from hilrec.daemon.control.sources import Camera, JointReading, Leader, WriteResult
from hilrec.daemon.errors import (
    BusPacketError,
    BusTimeoutError,
    CameraStalledError,
    ConfigError,
    DeviceError,
    HilrecError,
)
from hilrec.daemon.scratch import scratch_folder
from hilrec.daemon.wire.security import Security
from hilrec.daemon.wire.settings import CameraSettings, DaemonSettings
from hilrec.drivers.emulated.priority import raise_emulator_priority

if TYPE_CHECKING:
    from hilrec.drivers.arm import SO101Follower, SO101Leader
    from hilrec.drivers.emulated.sim_camera import SimCamera

log = logging.getLogger(__name__)

# The folder of an emulated daemon's calibration files (a SIGKILLed daemon's is swept by the next).
EMULATED_SCRATCH_PREFIX = "hilrec-emulated-"


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

    # Its own serial port, and no use for the observation: read while the follower is.
    concurrent = True

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
        env: dict[str, str] | None = None,
        hand: str = "grip",
        wait: bool = True,
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
        if role == "leader":
            command += ["--hand", hand]
        for fault in faults:
            command += ["--fault", fault]
        self.role = role
        self.process = procs.start(
            command,
            # A good share of the CPU (the standalone ``hilrec emulate`` applies the same
            # scheduling itself; unprivileged, the child says so when it applies it again).
            first=(raise_emulator_priority,),
            stdout=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            env=None if env is None else {**os.environ, **env},
        )
        self._timeout_s = timeout_s
        # wait=False: several emulators start at once and each is waited for (wait_port) after.
        self.port = self._first_line(timeout_s) if wait else ""

    def wait_port(self) -> str:
        """The pty's path, waiting (bounded) for the child to report it."""
        if not self.port:
            self.port = self._first_line(self._timeout_s)
        return self.port

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
        procs.stop(self.process, timeout_s, kill_wait_s=timeout_s)
        if self.process.stdout is not None:
            self.process.stdout.close()


OPEN_ATTEMPTS = 3


def open_with_retries(arm: SO101Follower | SO101Leader, *, key_prefix: str | None = None) -> None:
    """Open an arm, retrying a retryable bus error: opening is dozens of transactions, and one
    late reply (a loaded machine, a busy emulator) must not stop the daemon from starting.

    ``key_prefix`` (hil mode: ``"follower."``, or ``"arms.left.follower_"`` for one arm of a
    pair) names, in the error a person sees, the config key to check: ``<prefix>port`` for a port
    that will not open or servos that do not answer, ``<prefix>id`` / ``<prefix>calibration`` for
    a missing or bad calibration."""
    for attempt in range(1, OPEN_ATTEMPTS + 1):
        try:
            arm.open()
            return
        except (BusTimeoutError, BusPacketError) as exc:
            if attempt == OPEN_ATTEMPTS:
                raise _keyed(exc, arm, key_prefix) from exc
            log.warning("%r: open attempt %d failed (%s); retrying", arm, attempt, exc)
        except DeviceError as exc:
            raise _keyed(exc, arm, key_prefix) from exc


def _keyed(exc: DeviceError, arm: SO101Follower | SO101Leader, prefix: str | None) -> HilrecError:
    from hilrec.daemon.errors import ActionError, CalibrationError, ServoFaultError

    if prefix is None or isinstance(exc, ServoFaultError | ActionError):
        return exc
    if isinstance(exc, CalibrationError):
        key = f"{prefix}calibration" if arm.config.calibration is not None else f"{prefix}id"
    else:
        key = f"{prefix}port"
    return ConfigError(key, str(exc))


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


def rig_timestep(settings: DaemonSettings) -> float | None:
    """The physics step every twin of a hardware rig steps (the emulated follower's, the mirror);
    None for a hil rig without a mirror, which has no twin."""
    from hilrec.sim.twin import timestep_for

    has_twin = settings.mode == "emulated" or settings.twin.mirror
    return timestep_for(settings.fps, settings.twin.given_timestep) if has_twin else None


def follower_port(
    settings: DaemonSettings, stack: contextlib.ExitStack, workdir: Path | None, timestep: float | None
) -> tuple[str, Path | None, dict[str, Any]]:
    """The follower's port and calibration file: hil mode's from the config; emulated mode's from
    a ``hilrec emulate follower`` child started here (stopped by ``stack``), its calibration
    written into ``workdir``. Also what the rig's devices say of it (the child's pid)."""
    if settings.mode != "emulated":
        return settings.follower.port, settings.follower.calibration, {}
    from hilrec.drivers.emulated.motion import TIMESTEP_ENV

    assert workdir is not None
    emu = settings.emulated
    calibration = workdir / "follower.json"
    emulator = EmulatorProcess(
        "follower",
        calibration_out=calibration,
        wire_timing=emu.wire_timing,
        motion="twin",
        seed=emu.seed,
        faults=emu.follower_faults,
        timeout_s=emu.start_timeout_s,
        env={TIMESTEP_ENV: repr(timestep)} if timestep is not None else None,
    )
    stack.callback(emulator.stop)
    return emulator.port, calibration, {"emulator_pid": emulator.process.pid}


def open_follower(
    settings: DaemonSettings, stack: contextlib.ExitStack, port: str, calibration: Path | None
) -> SO101Follower:
    """The settings' follower arm on ``port``, open (torque on, holding where it stands) and
    closed by ``stack`` (torque off)."""
    from hilrec.drivers.arm import FollowerConfig, SO101Follower

    faults = settings.faults
    arm = SO101Follower(
        FollowerConfig(
            port=port,
            id=settings.follower.id,
            calibration=calibration,
            body_mode=settings.follower.body_mode,
            read_retries=faults.bus_retries,
            reply_timeout_ms=faults.bus_reply_timeout_ms or None,
            max_relative_target=settings.follower.max_relative_target,
            tolerated_status=settings.follower.tolerated_status,
        )
    )
    open_with_retries(arm, key_prefix=None if settings.mode == "emulated" else "follower.")
    stack.callback(arm.close)
    return arm


def hardware_rig_factory(
    settings: DaemonSettings, context: zmq.Context[Any], security: Security
) -> RigFactory:
    if settings.arm_count == 2:
        from hilrec.daemon.control.arm_pair_rig import arm_pair_rig_factory

        return arm_pair_rig_factory(settings)

    def build(stack: contextlib.ExitStack) -> tuple[Rig, EpisodeHooks]:
        from hilrec.drivers.arm import LeaderConfig, SO101Leader

        faults = settings.faults
        reply_timeout = faults.bus_reply_timeout_ms or None
        follower_port, leader_port = settings.follower.port, settings.leader.port
        follower_cal, leader_cal = settings.follower.calibration, settings.leader.calibration
        devices: dict[str, Any] = {}
        from hilrec.sim.scene import SceneConfig

        # Every twin of the rig (the emulated follower's, the mirror) steps the same physics step
        # (settings checked that it makes whole frames); a hil rig without a mirror has none.
        timestep = rig_timestep(settings)
        if settings.mode == "emulated":
            follower_port, follower_cal, leader_port, leader_cal = _start_emulators(
                settings, stack, timestep, devices
            )
        follower_arm = open_follower(settings, stack, follower_port, follower_cal)
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
            open_with_retries(leader_arm, key_prefix=None if settings.mode == "emulated" else "leader.")
            stack.callback(leader_arm.close)
            leader = ArmLeader(leader_arm)
        else:
            remote = remote_leader(settings, context, security)
            stack.callback(remote.close)
            leader = remote
        from hilrec.sim.twin import Twin

        mirror_scene = SceneConfig(timestep=timestep)
        mirror = (
            Mirror(stack.enter_context(Twin(fps=settings.fps, cameras=(), scene=mirror_scene)))
            if settings.twin.mirror
            else None
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
            dataset_fields={
                **dataset_fields(settings, follower_arm, leader),
                **_twin_fields(mirror, timestep, settings.fps),
            },
            devices=devices,
        )
        return rig, NoHooks()

    return build


def _start_emulators(
    settings: DaemonSettings, stack: contextlib.ExitStack, timestep: float | None, devices: dict[str, Any]
) -> tuple[str, Path, str, Path | None]:
    """Emulated mode's arms: ``hilrec emulate`` children (stopped by ``stack``), with their
    ports and the calibrations they write; the rig's devices get their pids."""
    emu = settings.emulated
    leader_port, leader_cal = settings.leader.port, settings.leader.calibration  # a remote leader's
    workdir = scratch_folder(stack, EMULATED_SCRATCH_PREFIX)
    follower_port_, follower_cal, devices["follower"] = follower_port(settings, stack, workdir, timestep)
    assert follower_cal is not None
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
            hand=emu.leader_hand,
        )
        stack.callback(leader_emu.stop)
        leader_port = leader_emu.port
        devices["leader"] = {"emulator_pid": leader_emu.process.pid}
    return follower_port_, follower_cal, leader_port, leader_cal


def _twin_fields(mirror: Mirror | None, timestep: float | None, fps: int) -> dict[str, Any]:
    """The twin's physics step beside a hardware dataset: ``hilrec replay`` replays at it
    (:func:`hilrec.daemon.replay.engine.timestep_for`)."""
    if mirror is not None:
        return {"twin": mirror.twin.physics_info()}
    return {} if timestep is None else {"twin": {"timestep": timestep, "fps": fps}}


def dataset_fields(settings: DaemonSettings, follower_arm: Any, leader: Leader | None) -> dict[str, Any]:
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
