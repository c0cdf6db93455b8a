"""``hilrec find-port``: which serial port is the arm's, as LeRobot's ``lerobot-find-port`` finds it.

Interactive (the default): list the serial ports, ask the person to unplug the arm's USB cable
and press Enter, list them again, and name the one that vanished. ``--list`` asks instead of
unplugging: every port is opened at 1 Mbps and probed (PING of ids 1..6, then a broadcast PING
for servos at other ids), and each is printed with the servo ids that answer on it.

The ports looked at are the machine's serial ports (pyserial's list, plus /dev/ttyACM*,
/dev/ttyUSB* and macOS's usbmodem/usbserial nodes), or only those matching ``--port`` (a path
or a glob, repeatable): an emulated arm's ``--link``, or a pty.

``--arm left|right`` (a two-arm bench: four boards) names the arm being unplugged in every line,
and the config section and ``--arm`` flag its port goes with.
"""

from __future__ import annotations

import argparse
import glob
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from hilrec.daemon.errors import BusError, BusTimeoutError, ConfigError, DeviceError, PortBusyError
from hilrec.daemon.so101 import ARM_SIDES, MOTOR_IDS
from hilrec.drivers.bus import BusConfig, FeetechBus
from hilrec.drivers.tables import MODEL_NUMBER_STS3215

EXIT_NOT_FOUND = 1
_USB_GLOBS = (
    "/dev/ttyACM*",
    "/dev/ttyUSB*",
    "/dev/tty.usbmodem*",
    "/dev/tty.usbserial*",
    "/dev/cu.usbmodem*",
    "/dev/cu.usbserial*",
)
# How long a vanished port may take to leave /dev after Enter (LeRobot sleeps 0.5 s).
_SETTLE_S = 2.0
# A probe waits this long for a late reply (a loaded host holds tty bytes; the bus's own
# patience is 1 s, too slow for ports where nothing answers).
_PROBE_PATIENCE_MS = 250.0
_BROADCAST_WINDOW_MS = 250.0


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "find-port",
        help="find an arm's serial port (unplug it), or list the ports with servos",
        description=__doc__.splitlines()[0],
    )
    parser.add_argument(
        "--list",
        action="store_true",
        help="do not ask to unplug: probe every port at 1 Mbps and name the servo ids answering on it",
    )
    parser.add_argument(
        "--port",
        action="append",
        default=[],
        metavar="PATH|GLOB",
        help="look only at these ports (repeatable); default: the machine's serial ports",
    )
    parser.add_argument(
        "--arm",
        choices=ARM_SIDES,
        default=None,
        help="which arm of a two-arm bench is unplugged (named in the answer); not with --list",
    )
    parser.set_defaults(func=run)


def serial_ports(patterns: Sequence[str] = ()) -> list[str]:
    """The ports that exist now: those matching ``patterns``, or the machine's serial ports."""
    if patterns:
        found = {path for pattern in patterns for path in glob.glob(os.path.expanduser(pattern))}
    else:
        from serial.tools import list_ports

        found = {port.device for port in list_ports.comports()}
        found.update(path for pattern in _USB_GLOBS for path in glob.glob(pattern))
    return sorted(found)


@dataclass
class PortReport:
    port: str
    ids: list[int] = field(default_factory=list)  # SO-101 ids 1..6 that answered a PING
    models: dict[int, int] = field(default_factory=dict)
    other_ids: list[int] = field(default_factory=list)  # answered the broadcast PING only
    garbled: int = 0
    problem: str | None = None

    def describe(self) -> str:
        if self.problem is not None:
            return f"{self.port}: {self.problem}"
        if not self.ids and not self.other_ids:
            noise = f" ({self.garbled} garbled replies)" if self.garbled else ""
            return f"{self.port}: no Feetech servo answers at 1 Mbps{noise}"
        parts = []
        if self.ids:
            missing = [sid for sid in MOTOR_IDS if sid not in self.ids]
            what = "an SO-101 arm" if not missing else f"ids {_ids(missing)} missing"
            parts.append(f"servo ids {_ids(self.ids)} ({what})")
        if self.other_ids:
            parts.append(f"also id(s) {_ids(self.other_ids)}, not SO-101 ids: run hilrec setup-motors")
        odd = {sid: m for sid, m in self.models.items() if m != MODEL_NUMBER_STS3215}
        if odd:
            parts.append(", ".join(f"id {sid} is model {m}, not an STS3215" for sid, m in odd.items()))
        if self.garbled:
            parts.append(f"{self.garbled} garbled broadcast replies (several servos at one id?)")
        return f"{self.port}: " + "; ".join(parts)


def _ids(ids: Sequence[int]) -> str:
    return ", ".join(str(i) for i in ids)


def probe(port: str) -> PortReport:
    """PING ids 1..6 and broadcast on ``port`` at 1 Mbps; never raises for a port's trouble."""
    report = PortReport(port)
    config = BusConfig(port=port, retries=1, patience_ms=_PROBE_PATIENCE_MS)
    try:
        with FeetechBus(config) as bus:
            for servo_id in MOTOR_IDS:
                try:
                    report.models[servo_id] = bus.ping(servo_id)
                    report.ids.append(servo_id)
                except BusTimeoutError:
                    continue
            heard = bus.broadcast_ping(_BROADCAST_WINDOW_MS)
            report.other_ids = [sid for sid in heard.ids if sid not in MOTOR_IDS]
            # Six servos answering one broadcast collide on a real bus: only noise on its own.
            report.garbled = heard.garbled if not report.ids else 0
    except PortBusyError:
        report.problem = "busy: another process owns it (a running daemon, calibrate or LeRobot?)"
    except BusError as exc:
        report.problem = exc.problem
    except DeviceError as exc:
        report.problem = str(exc)
    return report


def run(args: argparse.Namespace) -> int:
    if args.list:
        if args.arm is not None:
            raise ConfigError("--arm", "--list probes every port and unplugs none: leave --arm out")
        return _list(args.port)
    return _unplug(args.port, args.arm)


def _list(patterns: Sequence[str]) -> int:
    ports = serial_ports(patterns)
    if not ports:
        print(_no_ports(patterns))
        return EXIT_NOT_FOUND
    print(f"Probing {len(ports)} port(s) at 1 Mbps (PING ids 1..6, then a broadcast PING)...")
    found = 0
    for port in ports:
        report = probe(port)
        found += bool(report.ids or report.other_ids)
        print(report.describe(), flush=True)
    if not found:
        print(
            "No port has a servo answering. Is the arm's power supply on (USB alone does not power "
            "the servos)? New servos are all id 1: set them up with hilrec setup-motors."
        )
        return EXIT_NOT_FOUND
    return 0


def _no_ports(patterns: Sequence[str]) -> str:
    if patterns:
        return f"No port matches {', '.join(patterns)}."
    return "No serial port found. Is the arm's controller board plugged in over USB?"


def _unplug(patterns: Sequence[str], arm: str | None = None) -> int:
    whose = "the arm's" if arm is None else f"the {arm} arm's"
    print(f"Finding all available ports for {whose} controller board.")
    before = serial_ports(patterns)
    if not before:
        print(_no_ports(patterns))
        return EXIT_NOT_FOUND
    print("Ports before disconnecting:", ", ".join(before))
    print(f"Remove the USB cable from {whose} controller board and press Enter when done.", flush=True)
    try:
        sys.stdin.readline()
    except KeyboardInterrupt:
        return 130
    # The kernel removes the node a moment after the unplug: look again until it has changed.
    deadline = time.monotonic() + _SETTLE_S
    while True:
        after = serial_ports(patterns)
        gone = sorted(set(before) - set(after))
        if gone or time.monotonic() >= deadline:
            break
        time.sleep(0.1)  # bounded poll of /dev; nothing to wait on but the directory
    if len(gone) == 1:
        _found(gone[0], arm)
        return 0
    if not gone:
        print(
            "Could not detect the port: no port disappeared. Unplug the USB cable (not the power "
            f"supply) and run again. Ports now: {', '.join(after) or 'none'}"
        )
    else:
        print(f"Could not detect the port: more than one port disappeared ({', '.join(gone)}).")
    return EXIT_NOT_FOUND


def _found(port: str, arm: str | None) -> None:
    if arm is None:
        print(f"The port of this arm is '{port}'")
        print("Reconnect the USB cable.")
        print(
            f"Use it as follower.port or leader.port in the daemon's config (configs/hil.toml), "
            f"and for hilrec setup-motors / calibrate --port {port}."
        )
        return
    print(f"The port of the {arm} arm is '{port}'")
    print("Reconnect the USB cable.")
    print(
        f"Use it as the {arm} arm's follower or leader port ([arms.{arm}] in the daemon's config, "
        f"configs/bimanual-hil.toml), and for hilrec setup-motors / calibrate --arm {arm} --port {port}."
    )
