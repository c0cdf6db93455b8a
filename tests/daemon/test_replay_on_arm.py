"""``hilrec replay ROOT --on-arm``: an emulated take played back on an emulated follower (STS3215
chain on a pty, started from a daemon config as the daemon starts it), measured, recorded."""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _daemon import check_passes, emulated_config, run_cli
from support import wait_until

from hilrec.daemon.dataset import (
    DatasetWriter,
    FrameFlag,
    load_dataset_sidecar,
    load_episode_sidecar,
    read_episode,
    update_dataset_sidecar,
)
from hilrec.daemon.so101 import ACTION_KEY, JOINT_NAMES, ROBOT_TYPE, STATE_KEY, BodyMode, so101_features

FPS = 25
FRAMES = 60
MAX_STEP = 8.0  # the config's max_relative_target (degrees / 0..100 per command)
RAMP_SPEED = 40.0
# A raised pose, away from the emulated follower's rest pose and from the table and the cube.
CENTRE = np.array([0.0, -50.0, 30.0, 40.0, 0.0, 40.0])
AMPLITUDE = np.array([20.0, 12.0, 15.0, 15.0, 30.0, 20.0])


# The replay's own reads wait this long for each reply (the config's default is 10 ms on top of
# the wire time, three attempts): a loaded host held one past all three in a clean-clone run at
# four workers, and the lag fit, which needs every frame's reading, then had none. What is tested
# is the approach, the playback and the fit, not how punctual the pty is.
REPLY_TIMEOUT_MS = 250.0


def config_text(root: Path, *, follower: str = "") -> str:
    extra = f"[follower]\nmax_relative_target = {MAX_STEP}\n{follower}"
    return emulated_config(root, extra=extra, bus_reply_timeout_ms=REPLY_TIMEOUT_MS)


def path(frames: int) -> np.ndarray:
    t = np.arange(frames) / FPS
    return (CENTRE + AMPLITUDE * np.sin(2 * np.pi * t / 2.4)[:, None]).astype(np.float32)


# The fixture's own reads of the emulated follower are asked again for this long: on a loaded host
# the pty held a reply past all three of the bus's attempts (a clean-clone run at three workers),
# and the take is the instrument here, not what is tested.
READ_PATIENCE_S = 5.0


def observe(arm: Any) -> np.ndarray:
    from hilrec.daemon.errors import BusTimeoutError

    reading = wait_until(
        arm.get_observation, READ_PATIENCE_S, what="the follower's reading", retry_on=(BusTimeoutError,)
    )
    return np.asarray(reading.values)


def record_take(root: Path, config: Path) -> None:
    """One take on the emulated follower as the daemon records one: read, then command, paced."""
    from hilrec.daemon.control.clock import TickPacer
    from hilrec.daemon.control.hardware import dataset_fields, follower_port, open_follower, rig_timestep
    from hilrec.daemon.wire.settings import load_settings

    settings = load_settings(config)
    goals = path(FRAMES)
    with contextlib.ExitStack() as stack:
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        port, calibration, _ = follower_port(settings, stack, workdir, rig_timestep(settings))
        arm = open_follower(settings, stack, port, calibration)
        pacer = TickPacer(1.0 / FPS)
        for _ in range(4 * FPS):  # walk to the start (max_relative_target per tick) and settle
            pacer.next_tick()
            arm.send_action(goals[0], present=observe(arm))
        states, actions = [], []
        for goal in goals:
            pacer.next_tick()
            state = observe(arm)
            states.append(state)
            actions.append(arm.send_action(goal, present=state).sent)
        fields = dataset_fields(settings, arm, None)
    with DatasetWriter.create(root, fps=FPS, features=so101_features(), robot_type=ROBOT_TYPE) as writer:
        for state, action in zip(states, actions, strict=True):
            writer.add_frame({STATE_KEY: state, ACTION_KEY: action, "task": "wave"})
        writer.save_episode()
    update_dataset_sidecar(root, fields)


@pytest.fixture(scope="module")
def take(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    work = tmp_path_factory.mktemp("on-arm")
    config = work / "emulated.toml"
    config.write_text(config_text(work / "unused"))
    root = work / "take"
    record_take(root, config)
    return root, config


@pytest.mark.slow
def test_plays_the_take_on_the_arm_after_reaching_its_first_state_and_records_it(
    take: tuple[Path, Path], tmp_path: Path
) -> None:
    root, config = take
    out = tmp_path / "replayed"
    result = run_cli(
        "replay", str(root), "--on-arm", "--config", str(config), "--episode", "0",
        "--record", str(out), "--ramp-speed", str(RAMP_SPEED), "--json",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    recorded_state = read_episode(root, 0)[STATE_KEY]
    first = recorded_state[0]

    # The approach: it started away from the first state, and playback began only once there.
    approach = doc["approach"]
    assert np.max(np.abs(np.array(approach["start"]) - first)) > 20.0
    assert approach["error_max"] <= 3.0
    assert np.allclose(approach["target"], first)
    assert doc["played"] == doc["frames"] == FRAMES and doc["complete"] and doc["interrupted"] is None

    # A consistent take replays with small, finite errors per joint, and a lag near zero.
    for name in JOINT_NAMES:
        e = doc["joints"][name]
        assert np.isfinite(e["rms"]) and np.isfinite(e["max"]), name
        assert e["rms"] < 3.0 and e["max"] < 8.0, (name, e)
    assert doc["lag"]["frames"] is not None and abs(doc["lag"]["frames"]) < 1.0, doc["lag"]

    # The record: one command per frame, each within max_relative_target of the reading it was
    # clamped against and inside the calibrated range; the clamps counted are the frames flagged.
    columns = read_episode(out, 0)
    sent, measured = columns[ACTION_KEY], columns[STATE_KEY]
    assert len(sent) == FRAMES
    assert np.all(np.abs(sent.astype(np.float64) - measured) <= MAX_STEP + 1e-3)
    _assert_in_range(out, sent)
    meta, arrays = load_episode_sidecar(out, 0)
    assert meta is not None
    flags = arrays["frame_flags"]
    assert doc["clamped"]["count"] == int(np.count_nonzero(flags & int(FrameFlag.CLAMPED)))
    ramp_goal, ramp_present = arrays["ramp_goal"], arrays["ramp_present"]
    assert len(ramp_goal) == approach["ramp_ticks"] > 0
    assert np.all(np.abs(ramp_goal.astype(np.float64) - ramp_present) <= MAX_STEP + 1e-3)
    assert np.all(np.abs(np.diff(ramp_goal, axis=0)) <= RAMP_SPEED / FPS + 1e-3)
    _assert_in_range(out, ramp_goal)
    assert meta["arm_replay"]["replay_of"] == {"root": str(root), "episode_index": 0}
    check_passes(out)


def _assert_in_range(root: Path, values: np.ndarray) -> None:
    from hilrec.drivers.calibration import ArmCalibration

    sidecar = load_dataset_sidecar(root)
    assert sidecar is not None
    cal = ArmCalibration.from_mapping(sidecar["calibration"]["follower"], source="test")
    for row in values:
        ticks = cal.units_to_ticks([float(v) for v in row], BodyMode.DEGREES)
        for name, tick in zip(JOINT_NAMES, ticks, strict=True):
            assert cal[name].range_min <= tick <= cal[name].range_max, (name, row)


def test_without_on_arm_the_flags_of_the_arm_are_refused(take: tuple[Path, Path]) -> None:
    root, _ = take
    result = run_cli("replay", str(root), "--episode", "0")
    assert result.returncode == 2
    assert "--episode" in result.stderr and "--on-arm" in result.stderr


@pytest.mark.slow
def test_bad_input_is_refused_naming_what_before_the_arm_moves(
    take: tuple[Path, Path], tmp_path: Path
) -> None:
    root, config = take
    out = run_cli("replay", str(root), "--on-arm", "--config", str(config), "--episode", "3")
    assert out.returncode == 2 and "--episode 3" in out.stderr and "1 episode(s)" in out.stderr, out.stderr

    hil = tmp_path / "hil.toml"
    hil.write_text(
        f'mode = "hil"\n[dataset]\nroot = "{tmp_path / "x"}"\n[follower]\nport = "/dev/hilrec-no-such-port"\n'
        f'calibration = "{tmp_path / "cal.json"}"\n[leader]\nsource = "remote"\n'
    )
    sidecar = load_dataset_sidecar(root)
    assert sidecar is not None
    (tmp_path / "cal.json").write_text(json.dumps(sidecar["calibration"]["follower"]))
    out = run_cli("replay", str(root), "--on-arm", "--config", str(hil), "--episode", "0")
    assert out.returncode == 2 and "follower.port" in out.stderr and "no-such-port" in out.stderr, out.stderr

    other = tmp_path / "other"
    features = so101_features()
    features[ACTION_KEY] = {**features[ACTION_KEY], "names": [f"motor_{i}" for i in range(6)]}
    with DatasetWriter.create(other, fps=FPS, features=features, robot_type=ROBOT_TYPE) as writer:
        for _ in range(3):
            writer.add_frame(
                {STATE_KEY: np.zeros(6, np.float32), ACTION_KEY: np.zeros(6, np.float32), "task": "t"}
            )
        writer.save_episode()
    out = run_cli("replay", str(other), "--on-arm", "--config", str(config), "--episode", "0")
    assert out.returncode == 2 and "'action' names" in out.stderr, out.stderr

    m100 = tmp_path / "m100.toml"
    m100.write_text(config_text(tmp_path / "y", follower='body_mode = "range_m100_100"\n'))
    out = run_cli("replay", str(root), "--on-arm", "--config", str(m100), "--episode", "0")
    assert out.returncode == 2 and "follower.body_mode" in out.stderr, out.stderr


@pytest.mark.slow
def test_ctrl_c_stops_the_playback_with_the_torque_off_and_says_what_was_played(
    take: tuple[Path, Path], tmp_path: Path
) -> None:
    root, config = take
    process = subprocess.Popen(
        [sys.executable, "-m", "hilrec.daemon.cli", "replay", str(root), "--on-arm",
         "--config", str(config), "--episode", "0", "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        assert process.stderr is not None
        deadline = time.monotonic() + 120.0
        seen = ""
        while "playing episode 0" not in seen:
            assert time.monotonic() < deadline, seen
            ready, _, _ = select.select([process.stderr], [], [], 1.0)
            if ready:
                line = process.stderr.readline()
                assert line, f"exited before the playback: {seen}"
                seen += line
        os.kill(process.pid, signal.SIGINT)
        stdout, stderr = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 130, stderr
    doc = json.loads(stdout)
    assert doc["interrupted"] == "playback" and 0 <= doc["played"] < FRAMES
    assert not doc["complete"]
