"""``hilrec setup-motors follower|leader --port P``: give each servo its id and baud rate.

LeRobot's ``lerobot-setup-motors`` procedure (``SOFollower.setup_motors`` and
``MotorsBus.setup_motor`` in LeRobot 0.4.4): every new STS3215 ships as id 1, so the servos are
set one at a time. For each joint, from the gripper (id 6) back to shoulder_pan (id 1), the
person connects the controller board to that servo only and presses Enter; then:

1. the servo is found: a broadcast PING at each baud rate the SDK can open (1 Mbps first) must
   be answered by exactly one servo, an STS3215 (model 777);
2. at that baud rate, torque off and Lock 0: ID and Baud_Rate live in EEPROM, which the servo
   ignores writes to while Lock is 1;
3. ID is written (the servo acknowledges under its old id), then Baud_Rate = 1 Mbps under the
   new id;
4. at 1 Mbps the servo is pinged under its new id and its ID register read back, then Lock 1.

A servo that cannot be found is asked for again (Enter retries, Ctrl-C stops), as are two
servos answering at once and a servo this run has just set (Enter pressed before the cable was
moved on: it would silently get the next id). ``--joints`` sets only some joints (e.g. one replaced servo).
``--arm left|right`` names the side of a two-arm bench in every line, and in the calibrate
command it ends with (LeRobot's bi_so_follower / bi_so_leader sides).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence

from hilrec.daemon.errors import ConfigError, DeviceError, HilrecError
from hilrec.daemon.so101 import ARM_SIDES, JOINT_NAMES, MOTORS
from hilrec.drivers.bus import BusConfig, FeetechBus
from hilrec.drivers.tables import BAUD_RATES, MODEL_NUMBER_STS3215

TARGET_BAUDRATE = 1_000_000
# Baud_Rate register values the SDK's PortHandler can open (it refuses 76800), 1 Mbps first.
SEARCH_BAUDRATES: tuple[int, ...] = tuple(rate for _, rate in sorted(BAUD_RATES.items()) if rate != 76_800)
_BAUD_INDEX = {rate: index for index, rate in BAUD_RATES.items()}
_FIND_WINDOW_MS = 300.0


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "setup-motors",
        help="give each new servo of an arm its id and baud rate, one at a time",
        description=__doc__.splitlines()[0],
    )
    parser.add_argument("role", choices=("follower", "leader"))
    parser.add_argument(
        "--port", required=True, help="serial port of the arm's controller board (hilrec find-port)"
    )
    parser.add_argument(
        "--joints",
        default=",".join(reversed(JOINT_NAMES)),
        help="the joints to set, in this order, comma-separated",
    )
    parser.add_argument(
        "--arm",
        choices=ARM_SIDES,
        default=None,
        help="which arm of a two-arm bench this is (named in every prompt and in the calibrate step)",
    )
    parser.set_defaults(func=run)


def find_single_servo(port: str) -> tuple[int, int]:
    """(baud rate, id) of the one servo on ``port``; DeviceError if none or several answer."""
    for rate in SEARCH_BAUDRATES:
        with FeetechBus(BusConfig(port=port, baudrate=rate)) as bus:
            heard = bus.broadcast_ping(_FIND_WINDOW_MS)
            if heard.answers > 1 or heard.garbled:
                ids = ", ".join(map(str, heard.ids)) or "garbled"
                raise DeviceError(
                    f"more than one servo answers at {_rate(rate)} ({heard.answers} replies, ids {ids}, "
                    f"{heard.garbled} garbled): connect the board to this one servo only"
                )
            if heard.ids:
                servo_id = heard.ids[0]
                model = bus.read(servo_id, "Model_Number")
                if model != MODEL_NUMBER_STS3215:
                    raise DeviceError(
                        f"the servo found (id {servo_id}, {_rate(rate)}) is model {model}, not an STS3215 "
                        f"({MODEL_NUMBER_STS3215}): is the right servo connected?"
                    )
                return rate, servo_id
    rates = ", ".join(_rate(r) for r in SEARCH_BAUDRATES)
    raise DeviceError(
        f"no servo answers on {port} at any baud rate ({rates}): is the board powered, and its "
        "cable plugged into this servo?"
    )


def _rate(rate: int) -> str:
    if rate % 1_000_000 == 0:
        return f"{rate // 1_000_000} Mbps"
    return f"{rate // 1000} kbps" if rate % 1000 == 0 else f"{rate} bps"


def setup_servo(port: str, target_id: int, just_set: Mapping[int, str] | None = None) -> tuple[int, int]:
    """Give the one connected servo id ``target_id`` and 1 Mbps; returns where it was found.

    ``just_set``: the ids this run gave, and their joints. The servo still connected is one of
    them when the cable was not moved on; it is refused, not given a second id.
    """
    rate, found_id = find_single_servo(port)
    joint = (just_set or {}).get(found_id)
    if joint is not None and found_id != target_id:
        raise DeviceError(
            f"the servo connected is the '{joint}' motor, given id {found_id} just now: connect the "
            "board to the next motor only (unplug the cable from this one)"
        )
    with FeetechBus(BusConfig(port=port, baudrate=rate)) as bus:
        bus.set_torque([found_id], enabled=False)  # Torque_Enable 0, then Lock 0: EEPROM writable
        if found_id != target_id:
            bus.write(found_id, "ID", target_id)  # acknowledged under the old id
        bus.write(target_id, "Baud_Rate", _BAUD_INDEX[TARGET_BAUDRATE])
    with FeetechBus(BusConfig(port=port, baudrate=TARGET_BAUDRATE)) as bus:
        bus.ping(target_id)
        stored = bus.read(target_id, "ID")
        if stored != target_id:
            raise DeviceError(f"port {port}: the servo reads back id {stored}, not {target_id}")
        bus.write(target_id, "Lock", 1)  # EEPROM protected again
    return rate, found_id


def _joints(text: str) -> list[str]:
    joints = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in joints if name not in MOTORS]
    if unknown or not joints:
        raise ConfigError(
            "--joints", f"unknown joint(s) {unknown or text!r}; joints: {', '.join(JOINT_NAMES)}"
        )
    return joints


def _ask(prompt: str) -> None:
    print(prompt, flush=True)
    if not sys.stdin.readline():
        raise HilrecError("stdin closed: setup-motors needs a person pressing Enter")


def run(args: argparse.Namespace) -> int:
    joints: Sequence[str] = _joints(args.joints)
    # One arm's lines stay as they were; a side of a pair is named in each.
    board = "the controller board" if args.arm is None else f"the {args.arm} {args.role}'s controller board"
    side = "" if args.arm is None else f"{args.arm} {args.role}: "
    arm_flag = "" if args.arm is None else f" --arm {args.arm}"
    just_set: dict[int, str] = {}
    for joint in joints:
        target = MOTORS[joint][0]
        _ask(f"Connect {board} to the '{joint}' motor only and press Enter.")
        while True:
            try:
                rate, found = setup_servo(args.port, target, just_set)
                break
            except DeviceError as exc:  # none, two at once, a bus error: the person fixes it
                print(f"{side}'{joint}': {exc}", flush=True)
                _ask(f"Fix it, then press Enter to try the '{joint}' motor again (Ctrl-C stops).")
        print(
            f"{side}'{joint}' motor id set to {target} (was id {found} at {_rate(rate)}), baud rate 1 Mbps",
            flush=True,
        )
        just_set[target] = joint
    print(
        f"Done. Chain the servos together and calibrate: hilrec calibrate {args.role}{arm_flag} "
        f"--port {args.port}",
        flush=True,
    )
    return 0
