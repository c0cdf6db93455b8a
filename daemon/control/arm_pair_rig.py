"""The two-arm rig (``[arms.left]``, ``[arms.right]``): two followers, two leaders, the two-arm twin.

hil mode opens the four arms on the ports of the config; emulated mode first starts four
``hilrec emulate`` children (a follower and a leader per side: each follower's servos a one-arm
twin's physics, each leader the scripted operator's hand), all at once, then waits for each one's
port, and runs the hil code against them. The arms become the loop's one follower and one leader
(:mod:`hilrec.daemon.control.arm_pair`), 12 joints in LeRobot's ``bi_so_follower`` order, and the
mirror is the two-arm twin (:mod:`hilrec.sim.bimanual_scene`) following both followers.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hilrec.daemon.control.arm_pair import FollowerPair, LeaderPair, named
from hilrec.daemon.control.hardware import (
    EMULATED_SCRATCH_PREFIX,
    ArmFollower,
    ArmLeader,
    EmulatorProcess,
    _twin_fields,
    dataclass_dict,
    open_camera,
    open_with_retries,
    rig_timestep,
)
from hilrec.daemon.control.rig import EpisodeHooks, Mirror, NoHooks, Rig, RigFactory
from hilrec.daemon.control.sources import Camera
from hilrec.daemon.errors import ConfigError, DeviceError
from hilrec.daemon.scratch import scratch_folder
from hilrec.daemon.so101 import MOTORS, NormMode, Role, joint_names
from hilrec.daemon.wire.settings import ArmSettings, DaemonSettings

if TYPE_CHECKING:
    from hilrec.drivers.arm import SO101Follower, SO101Leader

# (side, role) -> (port, calibration file or None for LeRobot's directory)
Port = tuple[str, Path | None]
Ports = dict[tuple[str, Role], Port]
_ROLES = (Role.FOLLOWER, Role.LEADER)
# The right arm's emulated operator plans other seeds than the left's, so the arms move apart.
_SEED_STRIDE = 1000


def arm_pair_rig_factory(settings: DaemonSettings) -> RigFactory:
    def build(stack: contextlib.ExitStack) -> tuple[Rig, EpisodeHooks]:
        from hilrec.sim.bimanual_scene import BimanualSceneConfig
        from hilrec.sim.twin import Twin

        timestep = rig_timestep(settings)
        devices: dict[str, Any] = {}
        if settings.mode == "emulated":
            ports = _start_emulators(settings, stack, timestep, devices)
        else:
            ports = {
                (side, role): (getattr(arm, f"{role}_port"), getattr(arm, f"{role}_calibration"))
                for side, arm in settings.arm_pairs()
                for role in _ROLES
            }
        followers, leaders = [], []
        for side, arm in settings.arm_pairs():
            followers.append(_open_follower(settings, stack, side, arm, ports[side, Role.FOLLOWER]))
            leaders.append(_open_leader(settings, stack, side, arm, ports[side, Role.LEADER]))
            for role in _ROLES:
                devices.setdefault(f"{side}_{role}", {})["port"] = ports[side, role][0]
        follower = FollowerPair(*(ArmFollower(a) for a in followers))
        leader = LeaderPair(*(ArmLeader(a) for a in leaders))
        stack.callback(follower.close)
        stack.callback(leader.close)
        mirror = None
        if settings.twin.mirror:
            twin = Twin(fps=settings.fps, cameras=(), scene=BimanualSceneConfig(timestep=timestep))
            mirror = Mirror(stack.enter_context(twin))
        cameras: dict[str, Camera] = {}
        for name, cam in settings.cameras.items():
            camera = open_camera(name, cam, mirror, settings.fps)
            stack.callback(camera.close)
            cameras[name] = camera
        rig = Rig(
            follower=follower,
            leader=leader,
            cameras=cameras,
            mirror=mirror,
            dataset_fields={
                **pair_dataset_fields(settings, followers, leaders),
                **_twin_fields(mirror, timestep, settings.fps),
            },
            devices=devices,
            joints=len(joint_names(settings.arm_count)),
        )
        return rig, NoHooks()

    return build


def _start_emulators(
    settings: DaemonSettings, stack: contextlib.ExitStack, timestep: float | None, devices: dict[str, Any]
) -> Ports:
    """Four ``hilrec emulate`` children, started together and then waited for (each start is
    seconds of imports and planning), stopped by ``stack``; their calibrations in a workdir."""
    from hilrec.drivers.emulated.motion import TIMESTEP_ENV

    emu = settings.emulated
    workdir = scratch_folder(stack, EMULATED_SCRATCH_PREFIX)
    started: dict[tuple[str, Role], tuple[EmulatorProcess, Path]] = {}
    for i, (side, arm) in enumerate(settings.arm_pairs()):
        for role in _ROLES:
            calibration = workdir / f"{side}_{role}.json"
            follower = role is Role.FOLLOWER
            emulator = EmulatorProcess(
                str(role),
                calibration_out=calibration,
                wire_timing=emu.wire_timing,
                motion="twin" if follower else emu.leader_motion,
                seed=emu.seed + i * _SEED_STRIDE,
                faults=arm.follower_faults if follower else arm.leader_faults,
                timeout_s=emu.start_timeout_s,
                env={TIMESTEP_ENV: repr(timestep)} if follower and timestep is not None else None,
                wait=False,
            )
            stack.callback(emulator.stop)
            started[side, role] = (emulator, calibration)
    ports: Ports = {}
    for (side, role), (emulator, calibration) in started.items():
        try:
            ports[side, role] = (emulator.wait_port(), calibration)
        except DeviceError as exc:
            raise named(exc, f"{side} {role}") from exc
        devices[f"{side}_{role}"] = {"emulator_pid": emulator.process.pid}
    return ports


def _open_follower(
    settings: DaemonSettings, stack: contextlib.ExitStack, side: str, arm: ArmSettings, at: Port
) -> SO101Follower:
    from hilrec.drivers.arm import FollowerConfig, SO101Follower

    faults = settings.faults
    follower = SO101Follower(
        FollowerConfig(
            port=at[0],
            id=arm.arm_id(side, Role.FOLLOWER),
            calibration=at[1],
            body_mode=settings.follower.body_mode,
            read_retries=faults.bus_retries,
            reply_timeout_ms=faults.bus_reply_timeout_ms or None,
            max_relative_target=arm.max_relative_target,
            tolerated_status=settings.follower.tolerated_status,
        )
    )
    _open(settings, follower, side, Role.FOLLOWER)
    stack.callback(follower.close)
    return follower


def _open_leader(
    settings: DaemonSettings, stack: contextlib.ExitStack, side: str, arm: ArmSettings, at: Port
) -> SO101Leader:
    from hilrec.drivers.arm import LeaderConfig, SO101Leader

    faults = settings.faults
    leader = SO101Leader(
        LeaderConfig(
            port=at[0],
            id=arm.arm_id(side, Role.LEADER),
            calibration=at[1],
            body_mode=settings.follower.body_mode,
            read_retries=faults.bus_retries,
            reply_timeout_ms=faults.bus_reply_timeout_ms or None,
        )
    )
    _open(settings, leader, side, Role.LEADER)
    stack.callback(leader.close)
    return leader


def _open(settings: DaemonSettings, arm: SO101Follower | SO101Leader, side: str, role: Role) -> None:
    """Open one arm; an error names the arm and, in hil mode, the key of the config to check."""
    try:
        open_with_retries(arm, key_prefix=f"arms.{side}.{role}_" if settings.mode == "hil" else None)
    except ConfigError as exc:
        raise ConfigError(exc.key, f"{side} {role}: {exc.problem}") from exc
    except DeviceError as exc:
        raise named(exc, f"{side} {role}") from exc


def pair_dataset_fields(
    settings: DaemonSettings, followers: list[SO101Follower], leaders: list[SO101Leader]
) -> dict[str, Any]:
    """Units (one body mode for both arms) and each arm's calibration, by its column prefix."""
    body = settings.follower.body_mode
    joints = {name: (mode if mode == NormMode.RANGE_0_100 else body) for name, (_, mode) in MOTORS.items()}
    calibration: dict[str, Any] = {}
    for (side, _), follower, leader in zip(settings.arm_pairs(), followers, leaders, strict=True):
        calibration[f"{side}_follower"] = {n: dataclass_dict(c) for n, c in follower.calibration.items()}
        calibration[f"{side}_leader"] = {n: dataclass_dict(c) for n, c in leader.calibration.items()}
    return {
        "units": {"body_norm_mode": body, "joints": joints, "arms": [s for s, _ in settings.arm_pairs()]},
        "calibration": calibration,
    }
