"""What a new user meets first: calibrating into a folder, the ids the daemon expects, what a
missing calibration or a wrong, silent port says, and an emulator that keeps its timing."""

from __future__ import annotations

import json
import os
import pty
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hilrec.daemon.cli import main
from hilrec.daemon.control.hardware import open_with_retries
from hilrec.daemon.errors import BusTimeoutError, CalibrationError, ConfigError
from hilrec.daemon.so101 import Role
from hilrec.daemon.wire.settings import FollowerSettings, LeaderSettings
from hilrec.drivers.arm import ArmConfig, FollowerConfig, SO101Follower, SO101Leader
from hilrec.drivers.bus import BusConfig, FeetechBus
from hilrec.drivers.calibration import DEFAULT_ARM_IDS, ArmCalibration, load_calibration, save_calibration
from hilrec.drivers.calibrator import SILENT_LIMIT_S, Calibrator
from hilrec.drivers.emulated.emulator import EmulatedArm
from hilrec.drivers.emulated.faults import Fault
from hilrec.drivers.emulated.priority import EMULATOR_NICE
from hilrec.sim.units import emulated_calibration


def calibrate(*args: str) -> int:
    return main(["calibrate", *args, "--yes", "--duration", "2.5"])


@pytest.fixture
def calibration_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "lerobot-calibration"
    monkeypatch.setenv("HF_LEROBOT_CALIBRATION", str(root))
    return root


@pytest.fixture
def silent_pty() -> Iterator[str]:
    master, slave = pty.openpty()
    yield os.ttyname(slave)
    os.close(master)
    os.close(slave)


# --- calibrate --output -----------------------------------------------------------------------


@pytest.mark.slow
def test_calibrate_into_a_folder_writes_id_json(emulate, tmp_path: Path) -> None:
    emu = emulate("leader", motion="sweep", factory_fresh=True)
    folder = tmp_path / "cal"
    folder.mkdir()
    assert calibrate("leader", "--port", emu.port, "--output", str(folder)) == 0
    assert sorted(p.name for p in folder.iterdir()) == ["so101_leader.json"]  # no temp file left
    load_calibration(folder / "so101_leader.json")
    fresh = emulate("leader", motion="sweep", factory_fresh=True)
    assert calibrate("leader", "--port", fresh.port, "--id", "blue", "--output", f"{tmp_path}/new/") == 0
    assert (tmp_path / "new" / "blue.json").is_file()


def test_a_bad_output_is_refused_before_the_arm_is_touched(emulate, tmp_path: Path, capsys) -> None:
    emu = emulate("leader", motion="sweep", factory_fresh=True)
    (tmp_path / "file").write_text("not a folder")
    assert calibrate("leader", "--port", emu.port, "--output", str(tmp_path / "file" / "cal.json")) == 2
    assert "is not a folder" in capsys.readouterr().err
    with emu.paused():
        assert [s.log.offset_writes for s in emu.servos] == [0] * 6
        assert [s.log.torque_writes for s in emu.servos] == [[]] * 6


def test_a_failed_save_leaves_no_temp_file(tmp_path: Path) -> None:
    calibration = ArmCalibration.from_mapping(emulated_calibration())
    (tmp_path / "taken.json").mkdir()
    with pytest.raises(CalibrationError, match="cannot write"):
        save_calibration(calibration, tmp_path / "taken.json")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["taken.json"]


# --- one source for the arm ids ---------------------------------------------------------------


def test_default_ids_are_the_daemons() -> None:
    assert DEFAULT_ARM_IDS[Role.FOLLOWER] == FollowerSettings().id == "so101_follower"
    assert DEFAULT_ARM_IDS[Role.LEADER] == LeaderSettings(source="serial").id == "so101_leader"
    assert SO101Follower(FollowerConfig(port="/dev/null")).calibration_path.name == "so101_follower.json"
    assert SO101Leader(ArmConfig(port="/dev/null")).calibration_path.name == "so101_leader.json"


@pytest.mark.slow
def test_the_missing_calibration_error_names_the_command_that_fixes_it(
    emulate, calibration_dir: Path
) -> None:
    emu: EmulatedArm = emulate("follower", motion="sweep", factory_fresh=True)
    arm = SO101Follower(FollowerConfig(port=emu.port, id=FollowerSettings().id))
    with pytest.raises(ConfigError) as caught:
        open_with_retries(arm, key_prefix="follower.")
    message = str(caught.value)
    command = f"hilrec calibrate follower --port {emu.port} --id so101_follower"
    assert "follower.id" in message and command in message, message
    # Following it, word for word, fixes it.
    assert calibrate(*command.split()[2:]) == 0
    open_with_retries(arm, key_prefix="follower.")
    arm.close()
    explicit = SO101Follower(FollowerConfig(port=emu.port, calibration=calibration_dir / "x" / "f.json"))
    with pytest.raises(ConfigError, match=r"follower\.calibration.*--output .*f\.json"):
        open_with_retries(explicit, key_prefix="follower.")


# --- port errors --------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_silent_port_fails_in_seconds_naming_the_arm_key_and_checks(
    silent_pty: str, tmp_path: Path
) -> None:
    calibration = save_calibration(ArmCalibration.from_mapping(emulated_calibration()), tmp_path / "f.json")
    arm = SO101Follower(FollowerConfig(port=silent_pty, calibration=calibration, reply_timeout_ms=10.0))
    # How soon (was 21 s: three opens of six pings' patience each) is bench/bench_give_up.py's.
    with pytest.raises(ConfigError) as caught:
        open_with_retries(arm, key_prefix="follower.")
    message = str(caught.value)
    assert message.startswith("config key 'follower.port'"), message
    for words in (
        "SO-101 follower 'so101_follower'",
        silent_pty,
        "no servo answers",
        "power supply",
        "hilrec find-port",
        "hilrec setup-motors follower",
    ):
        assert words in message, (words, message)


@pytest.mark.slow
def test_calibrate_on_a_silent_port_or_new_servos_says_what_to_check(
    silent_pty: str, emulate, tmp_path: Path, capsys
) -> None:
    assert calibrate("follower", "--port", silent_pty, "--output", str(tmp_path)) == 2  # how soon: a bench
    err = capsys.readouterr().err
    assert "no servo answers" in err and "power supply" in err and "hilrec find-port" in err
    new = emulate("follower", new_servos=True)  # not set up yet: only id 1 answers
    assert calibrate("follower", "--port", new.port, "--output", str(tmp_path)) == 2
    err = capsys.readouterr().err
    assert "servo(s) 2 (shoulder_lift), 3 (elbow_flex)" in err and "hilrec setup-motors follower" in err
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize(
    ("port", "words"),
    [("/dev/null", "not a serial port"), ("/dev/ttyACM97", "no such port")],
)
def test_a_port_that_is_not_an_arm_says_what_to_do(port: str, words: str, tmp_path: Path) -> None:
    calibration = save_calibration(ArmCalibration.from_mapping(emulated_calibration()), tmp_path / "f.json")
    arm = SO101Leader(ArmConfig(port=port, calibration=calibration))
    with pytest.raises(ConfigError) as caught:
        open_with_retries(arm, key_prefix="leader.")
    message = str(caught.value)
    assert message.startswith("config key 'leader.port'") and words in message and "find-port" in message
    assert "Inappropriate ioctl" not in message


@pytest.mark.slow
def test_missing_servos_are_named_with_what_to_check(emulate, tmp_path: Path) -> None:
    emu = emulate("follower")
    emu.inject(Fault(kind="missing", servo_id=1))
    calibration = save_calibration(emu.frame.calibration, tmp_path / "f.json")
    with pytest.raises(
        ConfigError, match=r"follower\.port.*servo\(s\) 1 \(shoulder_pan\) do not answer.*setup"
    ):
        open_with_retries(
            SO101Follower(FollowerConfig(port=emu.port, calibration=calibration)), key_prefix="follower."
        )


# --- wrist_roll: LeRobot's full-turn range ----------------------------------------------------------


@pytest.mark.slow
def test_the_emulated_calibration_is_what_lerobots_procedure_writes_for_wrist_roll(
    emulate, tmp_path: Path
) -> None:
    emu = emulate("leader", motion="sweep", factory_fresh=True)
    wrist = emu.frame.calibration["wrist_roll"]
    assert (wrist.range_min, wrist.range_max) == (0, 4095)
    assert calibrate("leader", "--port", emu.port, "--output", str(tmp_path / "l.json")) == 0
    assert json.loads((tmp_path / "l.json").read_text()) == json.loads(emu.frame.calibration.to_json())


SAMPLES = 150  # 10 ms apart at least: the hand's sweep takes 0.8 s


@pytest.mark.slow
def test_a_reply_lost_while_ranges_are_recorded_skips_that_sample(emulate) -> None:
    """Seen under load: one sample with no reply after the bus's three attempts ended the whole
    calibration (LeRobot's does the same), and the person would start it again."""
    emu = emulate("leader", motion="sweep", factory_fresh=True)
    samples: list[dict[str, int]] = []

    def lose_two_samples_at_the_fifth(
        mins: dict[str, int], now: dict[str, int], maxes: dict[str, int]
    ) -> None:
        samples.append(now)
        if len(samples) == 5:  # the bus tries three times a sample: six drops lose two samples
            emu.inject(Fault(kind="drop", servo_id=2, count=6))

    with FeetechBus(BusConfig(port=emu.port)) as bus:
        calibrator = Calibrator(bus)
        calibrator.prepare()
        calibrator.set_middle()  # the emulated hand sweeps once the offsets are written
        mins, maxes = calibrator.record_ranges(
            lambda: len(samples) >= SAMPLES, on_sample=lose_two_samples_at_the_fifth
        )
    assert calibrator.missed_samples == 2
    assert len(samples) == SAMPLES and all(maxes[j] > mins[j] for j in mins)  # the sweep, from the rest


@pytest.mark.slow
def test_an_arm_silent_while_ranges_are_recorded_ends_them_naming_the_register(emulate) -> None:
    emu = emulate("leader", motion="sweep", factory_fresh=True)
    with FeetechBus(BusConfig(port=emu.port)) as bus:
        calibrator = Calibrator(bus)
        emu.inject(Fault(kind="drop", servo_id=2))
        began = time.monotonic()
        with pytest.raises(BusTimeoutError, match="Present_Position"):
            calibrator.record_ranges(lambda: False)
    assert SILENT_LIMIT_S <= time.monotonic() - began < SILENT_LIMIT_S + 5.0
    assert calibrator.missed_samples > 0


# --- the standalone emulator's priority ---------------------------------------------------------------


def _thread_nices(pid: int) -> list[int]:
    nices = []
    for stat in Path(f"/proc/{pid}/task").glob("*/stat"):
        fields = stat.read_text().rsplit(")", 1)[1].split()
        nices.append(int(fields[16]))  # field 19 of stat, counted after "pid (comm)"
    return nices


def _emulate(prefix: list[str]) -> tuple[list[int], str]:
    child = subprocess.Popen(
        [*prefix, sys.executable, "-m", "hilrec.daemon.cli", "emulate", "follower", "--motion", "servo"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline().startswith("/dev/")  # serving: its threads exist
        nices = _thread_nices(child.pid)
    finally:
        child.terminate()
        _, err = child.communicate(timeout=10)
    return nices, err


def _may_raise_priority(prefix: list[str]) -> bool:
    probe = f"import os; os.setpriority(os.PRIO_PROCESS, 0, {EMULATOR_NICE})"
    done = subprocess.run([*prefix, sys.executable, "-c", probe], check=False, capture_output=True)
    return done.returncode == 0


@pytest.mark.slow
def test_standalone_emulator_runs_at_the_daemons_emulator_priority() -> None:
    nices, err = _emulate([])
    if _may_raise_priority([]):
        assert nices and set(nices) == {EMULATOR_NICE}, nices  # every thread, the server's too
    else:
        assert f"could not set nice {EMULATOR_NICE}" in err


@pytest.mark.skipif(shutil.which("setpriv") is None, reason="needs setpriv to drop CAP_SYS_NICE")
def test_without_the_privilege_the_emulator_says_what_it_lacks() -> None:
    unprivileged = ["setpriv", "--inh-caps=-sys_nice", "--bounding-set=-sys_nice", "--"]
    if _may_raise_priority(unprivileged):
        pytest.skip("RLIMIT_NICE allows nice -10 without the capability")
    nices, err = _emulate(unprivileged)
    assert set(nices) == {os.getpriority(os.PRIO_PROCESS, 0)}  # left as inherited (a CI may run under nice)
    assert "could not set nice -10" in err and "CAP_SYS_NICE" in err
