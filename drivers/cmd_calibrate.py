"""``hilrec calibrate follower|leader --port PORT --id ID``: LeRobot's procedure, LeRobot's file.

Interactive by default (Enter at each step, as LeRobot asks); ``--yes`` takes the arm as already
at the middle and ``--duration`` records ranges for that many seconds, so scripts and tests run it
against an emulated arm (``hilrec emulate leader --motion sweep``).

The file goes where the daemon looks for it: LeRobot's calibration directory, ``<id>.json``, with
the id the daemon's config expects by default (``so101_follower`` / ``so101_leader``). ``--output``
takes a file or a folder (then ``<folder>/<id>.json``, as LeRobot's ``calibration_dir``); it is
checked before the arm is touched.

``--arm left|right`` calibrates one side of a two-arm bench as LeRobot's ``bi_so_follower`` /
``bi_so_leader`` do: the file is ``<id>_left.json`` / ``<id>_right.json`` (``--id`` is then the
pair's id, as LeRobot's ``--robot.id``), so the two sides never share a file, and every line
printed names the side.
"""

from __future__ import annotations

import argparse
import select
import sys
import time

from hilrec.daemon.errors import CalibrationError, FlagError
from hilrec.daemon.so101 import ARM_SIDES, Role
from hilrec.drivers.arm import check_servos
from hilrec.drivers.bus import BusConfig, FeetechBus
from hilrec.drivers.calibration import (
    DEFAULT_ARM_IDS,
    arm_calibration_id,
    calibration_output,
    default_arm_id,
    lerobot_calibration_path,
    save_calibration,
)
from hilrec.drivers.calibrator import Calibrator

# The narrowest SO-101 travel (the gripper's) is over 1000 ticks; a range below this one was
# not moved through, and a daemon would clamp that joint to almost nothing.
MIN_RANGE_TICKS = 200
_FULL_TURN_NOTE = "wrist_roll is a full-turn joint: it is not recorded (0..4095, as LeRobot)"


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "calibrate", help="calibrate an SO-101 arm (LeRobot's procedure)", description=__doc__.splitlines()[0]
    )
    parser.add_argument("role", choices=("follower", "leader"))
    parser.add_argument("--port", required=True, help="serial port of the arm, e.g. /dev/ttyACM0")
    defaults = " / ".join(f"{role}: {arm_id}" for role, arm_id in DEFAULT_ARM_IDS.items())
    parser.add_argument(
        "--id",
        default=None,
        help=f"arm id: the file is <id>.json (default {defaults}, the daemon's follower.id / leader.id); "
        "with --arm, the pair's id: the file is <id>_<arm>.json",
    )
    parser.add_argument(
        "--arm",
        choices=ARM_SIDES,
        default=None,
        help="which arm of a two-arm bench (LeRobot's bi_so_follower / bi_so_leader): its own file",
    )
    parser.add_argument(
        "--output",
        default=None,
        metavar="FILE|FOLDER",
        help="write here instead of LeRobot's calibration directory; a folder gets <id>.json",
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


def _record(
    calibrator: Calibrator, args: argparse.Namespace, prompt: str, *, again: bool = False
) -> tuple[dict[str, int], dict[str, int]]:
    print(prompt)
    if args.duration is None:
        print("Recording positions. Press ENTER to stop...")
        until = _enter_pressed
    else:
        deadline = time.monotonic() + args.duration
        print(f"Recording positions for {args.duration:g} s...")

        def until() -> bool:
            return time.monotonic() >= deadline

    ranges = calibrator.record_ranges(until, every_joint=not again)
    if calibrator.missed_samples:
        missed = calibrator.missed_samples
        print(f"{missed} sample(s) had no reply and were skipped; the ranges are from the rest")
    return ranges


def _narrow(mins: dict[str, int], maxes: dict[str, int]) -> str | None:
    """What is wrong with ranges too narrow to be a joint's travel; None when all are wide enough."""
    narrow = [
        f"{name} {mins[name]}..{maxes[name]}" for name in mins if maxes[name] - mins[name] < MIN_RANGE_TICKS
    ]
    if not narrow:
        return None
    return (
        f"joint(s) barely moved: {', '.join(narrow)} (less than {MIN_RANGE_TICKS} ticks, "
        f"{MIN_RANGE_TICKS * 360 / 4096:.0f} degrees): their range of motion was not recorded"
    )


def _arm_id(args: argparse.Namespace) -> str:
    if args.arm is None:
        return str(args.id or default_arm_id(args.role))
    if args.id is not None and args.id.endswith(tuple(f"_{side}" for side in ARM_SIDES)):
        # The pair's id is wanted: `--id bench_left --arm left` would write bench_left_left.json.
        raise FlagError(
            "--id",
            f"{args.id!r} already names a side; with --arm give the pair's id "
            f"(LeRobot's --robot.id), e.g. {args.id.rsplit('_', 1)[0]!r}",
        )
    return arm_calibration_id(args.id or default_arm_id(args.role), args.arm)


def run(args: argparse.Namespace) -> int:
    arm_id = _arm_id(args)
    who = args.role if args.arm is None else f"{args.arm} {args.role}"
    side = "" if args.arm is None else f"{who}: "  # one arm's lines stay as they were
    # Before any servo is touched: a bad path must not cost the person the whole procedure.
    output = (
        calibration_output(args.output, arm_id)
        if args.output is not None
        else calibration_output(lerobot_calibration_path(args.role, arm_id), arm_id)
    )
    with FeetechBus(BusConfig(port=args.port)) as bus:
        error, _ = check_servos(bus, who=f"SO-101 {who} on {args.port}", role=Role(args.role))
        if error is not None:
            raise error
        calibrator = Calibrator(bus)
        calibrator.prepare()
        if not args.yes:
            input(f"Move the {who} to the middle of its range of motion and press ENTER...")
        offsets = calibrator.set_middle()
        print("homing offsets:", ", ".join(f"{k} {v}" for k, v in offsets.items()))
        mins, maxes = _record(
            calibrator, args, f"Move every joint through its entire range of motion ({_FULL_TURN_NOTE})."
        )
        while narrow := _narrow(mins, maxes):
            print(f"WARNING: {side}{narrow}")
            if args.duration is not None:
                raise CalibrationError(
                    f"{side}{narrow}; run it again and move every joint (an emulated arm moves by itself "
                    "with `hilrec emulate ... --motion sweep`)"
                )
            answer = input("Press ENTER to record the ranges again (they add up), or type keep and ENTER: ")
            if answer.strip().lower() == "keep":
                break
            more_mins, more_maxes = _record(
                calibrator, args, "Move those joints through their entire range.", again=True
            )
            mins = {k: min(v, more_mins[k]) for k, v in mins.items()}
            maxes = {k: max(v, more_maxes[k]) for k, v in maxes.items()}
        calibration = calibrator.finish(mins, maxes, source=str(output))
    for name, cal in calibration.items():
        print(f"{name:<14} offset {cal.homing_offset:>5}  range {cal.range_min:>4}..{cal.range_max}")
    try:
        save_calibration(calibration, output)
    except CalibrationError:
        # The servos hold it already; the person must not lose it: print the file itself.
        print(f"The {who}'s calibration could not be saved to {output}; its content is:", file=sys.stderr)
        print(calibration.to_json(), file=sys.stderr)
        raise
    print(f"Calibration {side and f'of the {who} '}saved to {output}")
    return 0
