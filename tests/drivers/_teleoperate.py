"""LeRobot's own ``lerobot-teleoperate`` against two standalone ``hilrec emulate`` arms: the
harness the driver test (does it follow?) and bench/bench_lerobot_clients.py (how often does it
fail on a loaded machine?) share.

Before each run the leader is put in a new pose, as a person would (its servos hold a goal with
torque on, then torque off); the run must bring the follower there.

LeRobot runs in a login session of its own weighted as nice -10 against the others (its sched
autogroup), at nice -10 inside it, where this process may set that: what is measured is the
emulator's reply timing, not whether LeRobot's own process gets a CPU. The Feetech SDK gives
up once 34 ms have passed since it sent, checking the clock after a read that found nothing,
so a client descheduled past that moment fails with the reply already in its buffer ("There is
no status packet!"); a real servo would not help it. That failure is a matter of timing on the
machine, which is why its rate is the benchmark's to report, not a test's to assert."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import scservo_sdk as scs
from support import wait_until

from hilrec.drivers.calibration import ArmCalibration, load_calibration
from hilrec.drivers.emulated.priority import EMULATOR_NICE, EMULATOR_RT_PRIORITY
from hilrec.drivers.tables import REGISTER

# LeRobot 0.4.4's ``lerobot-teleoperate``: its console script's ``main``, run with one change of
# speed only. Its CLI (draccus) reads each config field's help from the class's source, and
# Python 3.11's ``inspect.getsource`` parses the whole module again for every field: half of each
# start (9.2 -> 4.9 CPU-s for ``--help``, whose 835 lines come out the same). The source of a class
# does not change while the process runs, so it is kept the first time it is read.
TELEOPERATE = [
    sys.executable,
    "-c",
    "import functools, inspect, sys\n"
    "inspect.getsource = functools.lru_cache(maxsize=None)(inspect.getsource)\n"
    "from lerobot.scripts.lerobot_teleoperate import main\n"
    "sys.argv[0] = 'lerobot-teleoperate'\n"
    "sys.exit(main())",
]
# LeRobot's first loop already sends the leader's pose, and the follower is read once it has
# settled: two seconds of loops (at least 20) show it follows; five cost the suite 3 s of a busy
# client and two emulators per run.
TELEOP_TIME_S = 2.0
RUN_TIMEOUT_S = 120.0
SETTLE_TIMEOUT_S = 10.0
BAUD = 1_000_000
# The harness's own raw-SDK transactions are asked again for this long: a loaded host stalls the
# pty for hundreds of milliseconds at times (five attempts in a row failed beside make test).
HARNESS_PATIENCE_S = 5.0
BODY = slice(0, 5)  # the gripper's units are 0..100, not degrees
NO_STATUS_PACKET = "There is no status packet"
# LeRobot's motor check at connect pings each servo once: a ping whose reply the host held past
# the timeout lists that servo as missing. A wrong model number is no timing matter.
MISSING_MOTOR = "Missing motor IDs:"
WRONG_MODEL = "Motors with incorrect model numbers:"
# LeRobot's units (degrees; the gripper 0..100): one leader pose per run, all near the rest pose.
POSES = (
    (30.0, -20.0, 20.0, 40.0, 25.0, 40.0),
    (-25.0, -55.0, 70.0, 75.0, -20.0, 10.0),
    (20.0, -30.0, 35.0, 45.0, 30.0, 30.0),
    (-30.0, -45.0, 55.0, 65.0, -15.0, 15.0),
)


class Arm:
    """One ``hilrec emulate ROLE`` process; its calibration written where LeRobot looks."""

    def __init__(self, role: str, calibration_dir: Path, *motion: str, side: str | None = None) -> None:
        self.role = role if side is None else f"{side} {role}"
        # One arm of a pair: the file LeRobot's bi_so_follower / bi_so_leader read for that side
        # of the pair id ``emulated_<role>``, ``<id>_<side>.json``.
        self.pair_id = f"emulated_{role}"
        self.id = self.pair_id if side is None else f"{self.pair_id}_{side}"
        self.calibration_path = calibration_dir / f"{self.id}.json"
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "hilrec.daemon.cli",
                "emulate",
                role,
                "--wire-timing",
                "--write-calibration",
                str(self.calibration_path),
                *motion,
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert self.process.stdout is not None
        self.port = self.process.stdout.readline().strip()  # its first line; the test timeout bounds it
        assert self.port.startswith("/dev/"), self.stop()
        self.calibration: ArmCalibration = load_calibration(self.calibration_path)

    def read(self, register: str = "Present_Position") -> np.ndarray:
        """Six registers in LeRobot's units, read with the raw SDK while no other client has the
        port open. A read is retried: this process, too, may miss a reply on a loaded machine
        (it is LeRobot's reads that are under test)."""
        with self._sdk() as (port, handler):
            ticks = [
                self._retried(lambda m=motor: handler.read2ByteTxRx(port, m.id, REGISTER[register].address))
                for motor in self.calibration.motors.values()
            ]
        return self.calibration.ticks_to_units(ticks)

    def _retried(self, transaction: Any) -> Any:
        deadline = time.monotonic() + HARNESS_PATIENCE_S
        attempts = 0
        while True:
            *values, result, _error = transaction()
            attempts += 1
            if result == scs.COMM_SUCCESS:
                return values[0] if values else None
            assert time.monotonic() < deadline, (
                f"{self.role}: {result} after {attempts} attempts in {HARNESS_PATIENCE_S} s"
            )

    def place(self, pose: tuple[float, ...]) -> None:
        """Hold ``pose`` with torque on until the servos stand there, then let go (torque off)."""
        goals = self.calibration.units_to_ticks(pose)
        self._write_all("Torque_Enable", [1] * len(goals))
        self._write_all("Goal_Position", goals)
        wait_until(
            lambda: np.abs(self.read() - np.asarray(pose))[BODY].max() <= 1.0,
            SETTLE_TIMEOUT_S,
            what=f"the {self.role} to reach {pose}",
        )
        self._write_all("Torque_Enable", [0] * len(goals))

    def _write_all(self, register: str, values: list[int]) -> None:
        size = REGISTER[register].size
        with self._sdk() as (port, handler):
            for motor, value in zip(self.calibration.motors.values(), values, strict=True):
                write = handler.write1ByteTxRx if size == 1 else handler.write2ByteTxRx
                self._retried(lambda w=write, m=motor, v=value: w(port, m.id, REGISTER[register].address, v))

    @contextlib.contextmanager
    def _sdk(self) -> Iterator[tuple[Any, Any]]:
        port = scs.PortHandler(self.port)
        assert port.openPort() and port.setBaudRate(BAUD)
        try:
            yield port, scs.PacketHandler(0)
        finally:
            port.closePort()

    def stop(self) -> str:
        if self.process.poll() is None:
            self.process.terminate()
        _, err = self.process.communicate(timeout=10)
        return err


def teleoperate(follower: Arm, leader: Arm) -> subprocess.CompletedProcess[str]:
    return _run_client(
        [
            *TELEOPERATE,
            "--robot.type=so101_follower",
            f"--robot.port={follower.port}",
            f"--robot.id={follower.id}",
            f"--robot.calibration_dir={follower.calibration_path.parent}",
            # The follower keeps its last goal afterwards, so where it went can be read back.
            "--robot.disable_torque_on_disconnect=false",
            "--teleop.type=so101_leader",
            f"--teleop.port={leader.port}",
            f"--teleop.id={leader.id}",
            f"--teleop.calibration_dir={leader.calibration_path.parent}",
            f"--teleop_time_s={TELEOP_TIME_S}",
        ]
    )


def teleoperate_pair(followers: Sequence[Arm], leaders: Sequence[Arm]) -> subprocess.CompletedProcess[str]:
    """``lerobot-teleoperate --robot.type=bi_so_follower --teleop.type=bi_so_leader``, as its own
    docstring runs it: left and right ports, one id per pair (each side's file ``<id>_<side>``)."""
    robot = [f"--robot.left_arm_config.port={followers[0].port}"]
    robot += [f"--robot.right_arm_config.port={followers[1].port}"]
    # The followers keep their last goals afterwards, so where they went can be read back.
    robot += [f"--robot.{side}_arm_config.disable_torque_on_disconnect=false" for side in ("left", "right")]
    return _run_client(
        [
            *TELEOPERATE,
            "--robot.type=bi_so_follower",
            f"--robot.id={followers[0].pair_id}",
            f"--robot.calibration_dir={followers[0].calibration_path.parent}",
            *robot,
            "--teleop.type=bi_so_leader",
            f"--teleop.id={leaders[0].pair_id}",
            f"--teleop.calibration_dir={leaders[0].calibration_path.parent}",
            f"--teleop.left_arm_config.port={leaders[0].port}",
            f"--teleop.right_arm_config.port={leaders[1].port}",
            f"--teleop_time_s={TELEOP_TIME_S}",
        ]
    )


def _run_client(command: list[str]) -> subprocess.CompletedProcess[str]:
    with subprocess.Popen(
        command,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
        start_new_session=True,  # its own autogroup, weighted below
        preexec_fn=_client_scheduling,  # noqa: PLW1509 - system calls only, before exec
    ) as process:
        try:
            out, err = process.communicate(timeout=RUN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            out, err = process.communicate()
    return subprocess.CompletedProcess(command, process.returncode, out, err)


def may_be_real_time() -> bool:
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(EMULATOR_RT_PRIORITY))
    except PermissionError:
        return False
    os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
    return True


def _client_scheduling() -> None:
    with contextlib.suppress(PermissionError):
        os.setpriority(os.PRIO_PROCESS, 0, EMULATOR_NICE)
    with contextlib.suppress(OSError):
        fd = os.open("/proc/self/autogroup", os.O_WRONLY)
        try:
            os.write(fd, str(EMULATOR_NICE).encode())
        finally:
            os.close(fd)


def settled(follower: Arm, pose: np.ndarray) -> np.ndarray:
    """The follower's pose once it stands at ``pose`` (bounded wait: it may still be moving)."""
    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    while True:
        present = follower.read()
        if np.abs(present - pose)[BODY].max() < 3.0 or time.monotonic() > deadline:
            return present


@dataclass(frozen=True)
class Run:
    """One ``lerobot-teleoperate`` run from a fresh leader pose, and where the follower went."""

    done: subprocess.CompletedProcess[str]
    target: np.ndarray  # the leader's pose, read back
    goal: np.ndarray  # the follower's Goal_Position after the run
    present: np.ndarray  # the follower's Present_Position once settled (or at the wait's end)

    @property
    def output(self) -> str:
        return self.done.stdout + self.done.stderr

    @property
    def missed_a_reply(self) -> bool:
        return missed_a_reply(self.output)

    @property
    def loops(self) -> int:
        return self.output.count("Teleop loop time")


def missed_a_reply(output: str) -> bool:
    """LeRobot's client (one attempt per read or ping) lost a reply to the host's timing: a read
    with no status packet, or a ping at connect that found a servo missing."""
    return NO_STATUS_PACKET in output or (MISSING_MOTOR in output and WRONG_MODEL not in output)


def run_pose(follower: Arm, leader: Arm, pose: tuple[float, ...]) -> Run:
    """Put the leader in ``pose``, teleoperate for TELEOP_TIME_S, read where the follower went."""
    leader.place(pose)
    target = leader.read()
    assert np.abs(follower.read() - target)[BODY].max() > 10.0, f"the follower is already at {pose}"
    done = teleoperate(follower, leader)
    goal = follower.read("Goal_Position")
    return Run(done=done, target=target, goal=goal, present=settled(follower, target))


def real_time_threads(arm: Arm) -> tuple[int, int]:
    """(threads at SCHED_FIFO, threads) of the emulator process: only its bus thread is real-time."""
    policies = [os.sched_getscheduler(int(t)) for t in os.listdir(f"/proc/{arm.process.pid}/task")]
    return policies.count(os.SCHED_FIFO), len(policies)


@contextlib.contextmanager
def emulated_pair(calibration_dir: Path) -> Iterator[tuple[Arm, Arm]]:
    """The follower (the MuJoCo twin) and the leader, whose joints stay where they are put (no
    scripted hand), so where the follower must end up is known; both stopped on the way out."""
    started: list[Arm] = []
    try:
        started.append(Arm("follower", calibration_dir))
        started.append(Arm("leader", calibration_dir, "--motion", "servo"))
        yield started[0], started[1]
    finally:
        for arm in started:
            arm.stop()


@contextlib.contextmanager
def cpu_load(processes: int | None = None) -> Iterator[int]:
    """Busy loops in other processes, one fewer than the cores unless told, at the default nice
    (not above the emulators: see tests/conftest.py), for as long as the block runs."""
    count = processes if processes is not None else max(1, (os.cpu_count() or 2) - 1)
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    try:
        for process in busy:
            assert os.sched_getscheduler(process.pid) == os.SCHED_OTHER, "a real-time busy loop"
        yield len(busy)
    finally:
        for process in busy:
            process.kill()
            process.wait(10)


@contextlib.contextmanager
def emulated_pairs(calibration_dir: Path) -> Iterator[tuple[list[Arm], list[Arm]]]:
    """Four ``hilrec emulate`` arms, a two-arm bench: the left and right followers (each its own
    MuJoCo twin) and leaders (their joints stay where they are put); stopped on the way out."""
    started: list[Arm] = []
    try:
        for side in ("left", "right"):
            started.append(Arm("follower", calibration_dir, side=side))
            started.append(Arm("leader", calibration_dir, "--motion", "servo", side=side))
        yield started[0::2], started[1::2]
    finally:
        for arm in started:
            arm.stop()
