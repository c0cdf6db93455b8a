"""What bus fault rate each client survives: hilrec's SO-101 follower against LeRobot 0.4.4's.

Both drive the same emulated STS3215 chain (``hilrec.drivers.emulated``) with injected faults:
a share of replies dropped and a share corrupted (5:2, as in the issue's "drop 5% + corrupt 2%"
at a total of 7%). For each total rate, in one run, side by side:

- opens: how many of ``--opens`` tries open the arm (ping, check, configure, torque on);
- cycles: how many of ``--cycles`` control cycles (read Present_Position, write Goal_Position)
  fail, as each client's follower does it: hilrec's ``get_observation`` + ``send_action``
  (bus retries 2, as the daemon's default); LeRobot's ``sync_read`` + ``sync_write`` as its
  ``SOFollower`` calls them (``num_retry=0``).

Run: ``.venv/bin/python bench/bench_bus_faults.py`` (about a minute; ``--smoke``: seconds).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from hilrec.daemon.errors import HilrecError
from hilrec.daemon.so101 import MOTORS, Role
from hilrec.drivers.arm import FollowerConfig, SO101Follower
from hilrec.drivers.calibration import save_calibration
from hilrec.drivers.emulated.emulator import EmulatedArm, EmulatorConfig
from hilrec.drivers.emulated.faults import parse_fault


def emulator(total: float) -> EmulatedArm:
    faults = (
        ()
        if total == 0
        else (parse_fault(f"drop:p={total * 5 / 7:.4f}"), parse_fault(f"corrupt:p={total * 2 / 7:.4f}"))
    )
    return EmulatedArm(EmulatorConfig(role=Role.FOLLOWER, faults=faults, motion="servo"))


def hilrec_client(
    arm: EmulatedArm, calibration: Path
) -> tuple[Callable[[], None], Callable[[], None], Callable[[], None]]:
    follower = SO101Follower(FollowerConfig(port=arm.device_path, calibration=calibration))

    def cycle() -> None:
        reading = follower.get_observation()
        follower.send_action(reading.values, present=reading.values)

    return follower.open, cycle, follower.close


def lerobot_client(
    arm: EmulatedArm, _: Path
) -> tuple[Callable[[], None], Callable[[], None], Callable[[], None]]:
    from lerobot.motors import Motor, MotorCalibration, MotorNormMode
    from lerobot.motors.feetech import FeetechMotorsBus

    calibration = {
        name: MotorCalibration(
            id=c.id,
            drive_mode=c.drive_mode,
            homing_offset=c.homing_offset,
            range_min=c.range_min,
            range_max=c.range_max,
        )
        for name, c in arm.frame.calibration.items()
    }
    motors = {name: Motor(mid, "sts3215", MotorNormMode(str(mode))) for name, (mid, mode) in MOTORS.items()}
    bus = FeetechMotorsBus(port=arm.device_path, motors=motors, calibration=calibration)

    def open_() -> None:
        bus.connect()
        bus.configure_motors()
        bus.enable_torque()

    def cycle() -> None:
        present = bus.sync_read("Present_Position")  # SOFollower.get_observation
        bus.sync_write("Goal_Position", present)  # SOFollower.send_action

    def close() -> None:
        if bus.is_connected:
            bus.disconnect(disable_torque=False)

    return open_, cycle, close


def measure(
    make: Callable, total: float, opens: int, cycles: int, workdir: Path
) -> tuple[int, int, int, float]:
    opened = failed_cycles = ran_cycles = 0
    took = 0.0
    for attempt in range(opens):
        arm = emulator(total)
        with arm:
            calibration = workdir / f"cal-{os.getpid()}-{attempt}.json"
            save_calibration(arm.frame.calibration, calibration)
            open_, cycle, close = make(arm, calibration)
            try:
                open_()
            except (HilrecError, ConnectionError, RuntimeError, OSError):
                close()
                continue
            opened += 1
            if attempt == 0:  # the cycles run once, on the first open that worked
                began = time.monotonic()
                for _ in range(cycles):
                    ran_cycles += 1
                    try:
                        cycle()
                    except (HilrecError, ConnectionError, RuntimeError, OSError):
                        failed_cycles += 1
                took = time.monotonic() - began
            close()
    return opened, failed_cycles, ran_cycles, took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rates", default="0,0.02,0.07,0.15,0.3")
    parser.add_argument("--opens", type=int, default=5)
    parser.add_argument("--cycles", type=int, default=250)
    parser.add_argument("--smoke", action="store_true", help="the 7%% rate only, one open, 20 cycles")
    args = parser.parse_args()
    if args.smoke:
        args.rates, args.opens, args.cycles = "0.07", 1, 20
    print(f"load average before: {os.getloadavg()[0]:.2f}")
    print("| faults (drop+corrupt) | client | opens ok | failed cycles | cycle ms (mean) |")
    print("|---|---|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as tmp:
        for total in (float(r) for r in args.rates.split(",")):
            for name, make in (("hilrec", hilrec_client), ("LeRobot 0.4.4", lerobot_client)):
                opened, failed, ran, took = measure(make, total, args.opens, args.cycles, Path(tmp))
                mean = f"{took / ran * 1000:.2f}" if ran else "-"
                cycles = f"{failed} of {ran}" if ran else "(never opened first time)"
                print(f"| {total:.0%} | {name} | {opened} of {args.opens} | {cycles} | {mean} |", flush=True)
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
