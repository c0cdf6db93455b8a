"""``hilrec emulate follower|leader``: six STS3215 on a pseudo-terminal until interrupted.

Prints the pty's device path on the first line of stdout (``--link`` also makes a symlink to it),
so any Feetech client can open it: ``hilrec daemon``, ``hilrec calibrate``, LeRobot, the raw SDK.

It runs with the scheduling the daemon's emulator children get (nice -10, and real-time priority
1 for the thread that answers the bus; see :mod:`hilrec.drivers.emulated.priority`), and warns
when it cannot. ``--new-servos`` is an arm
being put together for ``hilrec setup-motors``: only the gripper's new servo (id 1) is connected;
each Enter on this command's stdin (or a SIGUSR1) connects the next one alone, in LeRobot's
order, and after shoulder_pan the whole chain.
"""

from __future__ import annotations

import argparse
import logging
import os
import select
import signal
import sys
import threading
from pathlib import Path
from typing import get_args

from hilrec.daemon.errors import ConfigError
from hilrec.drivers.calibration import save_calibration
from hilrec.drivers.emulated.emulator import EmulatedArm, EmulatorConfig, MotionKind
from hilrec.drivers.emulated.faults import describe, parse_fault
from hilrec.drivers.emulated.hand import HandScript
from hilrec.drivers.emulated.priority import raise_emulator_priority, raise_serving_thread

log = logging.getLogger(__name__)


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "emulate", help="emulate an SO-101 arm on a pseudo-terminal", description=__doc__.splitlines()[0]
    )
    parser.add_argument("role", choices=("follower", "leader"))
    parser.add_argument(
        "--link", type=Path, default=None, help="also make the port reachable at this path (a symlink)"
    )
    parser.add_argument(
        "--wire-timing",
        action="store_true",
        help="answer at the wire speed of the servos' baud rate (1 Mbps)",
    )
    parser.add_argument(
        "--fault",
        action="append",
        default=[],
        metavar="KIND[:k=v,...]",
        help="inject a fault: drop, corrupt, late, echo, overload, voltage, "
        "missing, vanish; e.g. drop:id=3,count=2 or vanish:after_s=5",
    )
    parser.add_argument(
        "--calibration",
        type=Path,
        default=None,
        help="the arm's calibration (default: the twin's emulated calibration)",
    )
    parser.add_argument(
        "--write-calibration",
        type=Path,
        default=None,
        metavar="FILE",
        help="write the emulated arm's calibration file here for clients",
    )
    parser.add_argument(
        "--motion",
        choices=get_args(MotionKind),
        default="auto",
        help="auto: follower = MuJoCo twin, leader = scripted operator",
    )
    parser.add_argument(
        "--factory-fresh",
        action="store_true",
        help="start with factory EEPROM (no homing offsets; ids 1..6), to calibrate",
    )
    parser.add_argument(
        "--new-servos",
        action="store_true",
        help="six new servos, all at id 1, connected one at a time for setup-motors: "
        "Enter on stdin (or SIGUSR1) connects the next one (gripper first), then the whole chain",
    )
    parser.add_argument(
        "--hand",
        type=_hand,
        default=HandScript(),
        metavar="grip|rest|push[:after_s=S]",
        help="when the scripted hand holds a leader and pushes against its torque: always (grip), "
        "only while the torque is off (rest), or also S seconds after the torque came on (push)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.set_defaults(func=run)


# SIGTERM (also the parent-death signal a dying daemon sends) and SIGINT end the emulator. They
# are blocked and then taken with sigtimedwait, never handled: a Python handler runs on the main
# thread between bytecodes, and one that sets an Event while that thread is inside Event.wait
# waits forever for the lock its own thread holds (7 orphaned emulators in 42 daemon kills).
_STOP_SIGNALS = {signal.SIGTERM, signal.SIGINT}
_NEXT_SIGNAL = signal.SIGUSR1


def run(args: argparse.Namespace) -> int:
    # Before any thread: they inherit the signal mask and the nice value.
    signals = _STOP_SIGNALS | ({_NEXT_SIGNAL} if args.new_servos else set())
    signal.pthread_sigmask(signal.SIG_BLOCK, signals)
    # Threads that imports started earlier (numpy's BLAS pool) do not block them, and a signal
    # the kernel hands to one of those would kill the process by default (exit -15 instead of a
    # clean stop). A handler that only sets a flag makes such a delivery a stop request too.
    stop_requested = [False]

    def request_stop(signum: int, _frame: object) -> None:
        stop_requested[0] = signum in _STOP_SIGNALS or stop_requested[0]

    for signum in signals:
        signal.signal(signum, request_stop)
    problem = raise_emulator_priority(all_threads=True)
    if problem is not None:
        log.warning("emulated %s: %s", args.role, problem)
    config = EmulatorConfig(
        role=args.role,
        link=args.link,
        wire_timing=args.wire_timing,
        faults=tuple(parse_fault(text) for text in args.fault),
        calibration=args.calibration,
        motion=args.motion,
        seed=args.seed,
        factory_fresh=args.factory_fresh,
        new_servos=args.new_servos,
        hand=args.hand,
    )
    arm = EmulatedArm(config)
    if args.write_calibration is not None:
        save_calibration(arm.frame.calibration, args.write_calibration)
    before = set(threading.enumerate())
    with arm:
        for thread in set(threading.enumerate()) - before:  # the thread that answers the bus
            problem = raise_serving_thread(thread.native_id) if thread.native_id is not None else None
            if problem is not None:
                log.warning("emulated %s: %s", args.role, problem)
        print(arm.device_path, flush=True)
        log.info(
            "emulated %s: %s%s; faults: %s",
            args.role,
            arm.device_path,
            f" (link {args.link})" if args.link else "",
            ", ".join(describe(f) for f in config.faults) or "none",
        )
        if args.new_servos:
            log.info("emulated %s: only the gripper's servo is connected; Enter connects the next", args.role)
        stdin = sys.stdin.fileno() if args.new_servos and sys.stdin is not None else None
        while not arm.vanished.is_set() and not stop_requested[0]:
            if stdin is not None:
                readable, _, _ = select.select([stdin], [], [], 0.25)
                data = os.read(stdin, 4096) if readable else b""
                if readable and not data:
                    stdin = None  # end of input: SIGUSR1 still works
                for _ in range(data.count(b"\n")):
                    _connected(arm.connect_next())
            received = signal.sigtimedwait(signals, 0 if stdin is not None else 0.5)
            if received is not None and received.si_signo == _NEXT_SIGNAL:
                _connected(arm.connect_next())
            elif received is not None:
                break
    return 0


def _hand(text: str) -> HandScript:
    try:
        return HandScript.parse(text)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(exc.problem) from None


def _connected(what: str) -> None:
    print("connected: " + ("the whole chain" if what == "all" else f"the {what} servo only"), flush=True)
