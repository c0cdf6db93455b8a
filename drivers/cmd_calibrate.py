"""``hilrec calibrate follower|leader --port PORT --id ID``: LeRobot's procedure, LeRobot's file.

Interactive by default (Enter at each step, as LeRobot asks); ``--yes`` takes the arm as already
at the middle and ``--duration`` records ranges for that many seconds, so scripts and tests run it
against an emulated arm (``hilrec emulate leader --motion sweep``).
"""

from __future__ import annotations

import argparse
import select
import sys
import time
from pathlib import Path

from hilrec.drivers.bus import BusConfig, FeetechBus
from hilrec.drivers.calibration import lerobot_calibration_path, save_calibration
from hilrec.drivers.calibrator import Calibrator

_FULL_TURN_NOTE = "wrist_roll is a full-turn joint: it is not recorded (0..4095, as LeRobot)"


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "calibrate", help="calibrate an SO-101 arm (LeRobot's procedure)", description=__doc__.splitlines()[0]
    )
    parser.add_argument("role", choices=("follower", "leader"))
    parser.add_argument("--port", required=True, help="serial port of the arm, e.g. /dev/ttyACM0")
    parser.add_argument("--id", default="so101", help="arm id: the file is <id>.json (default so101)")
    parser.add_argument(
        "--output", type=Path, default=None, help="write here instead of LeRobot's calibration directory"
    )
    parser.add_argument(
        "--yes",
        action="store_true",
        help="do not wait for Enter: the arm is already in the middle of its range",
    )
    parser.add_argument(
        "--duration",
        type=float,
        default=None,
        help="record ranges of motion for this many seconds instead of until Enter",
    )
    parser.set_defaults(func=run)


def _enter_pressed() -> bool:
    readable, _, _ = select.select([sys.stdin], [], [], 0)
    return bool(readable) and sys.stdin.readline() is not None


def run(args: argparse.Namespace) -> int:
    output = args.output or lerobot_calibration_path(args.role, args.id)
    with FeetechBus(BusConfig(port=args.port)) as bus:
        calibrator = Calibrator(bus)
        calibrator.prepare()
        if not args.yes:
            input(f"Move the {args.role} to the middle of its range of motion and press ENTER...")
        offsets = calibrator.set_middle()
        print("homing offsets:", ", ".join(f"{k} {v}" for k, v in offsets.items()))
        print(f"Move every joint through its entire range of motion ({_FULL_TURN_NOTE}).")
        if args.duration is None:
            print("Recording positions. Press ENTER to stop...")
            until = _enter_pressed
        else:
            deadline = time.monotonic() + args.duration
            print(f"Recording positions for {args.duration:g} s...")

            def until() -> bool:
                return time.monotonic() >= deadline

        mins, maxes = calibrator.record_ranges(until)
        calibration = calibrator.finish(mins, maxes, source=str(output))
    save_calibration(calibration, output)
    for name, cal in calibration.items():
        print(f"{name:<14} offset {cal.homing_offset:>5}  range {cal.range_min:>4}..{cal.range_max}")
    print(f"Calibration saved to {output}")
    return 0
