"""How long each command takes to give up on something that is not there, against its target.

The tests check what each of these says (the key to fix, what to check); how soon it says it is
a timing outcome on a shared machine, so it is measured here, ``--repeats`` times each (median
and max wall seconds, the load average around the runs):

- ``hilrec ctl status`` with no daemon on the port: target < 2 s (it once waited 3 x 2 s for a reply);
- opening a follower on a silent port (``open_with_retries``, 10 ms reply timeout): target < 5 s
  (it once took 21 s: three opens of six pings' patience each);
- ``hilrec calibrate follower`` on a silent port: target < 5 s;
- ``hilrec find-port --list`` of one silent port: target < 20 s (about 2 s a silent port, not the
  bus's full patience);
- ``hilrec collect``'s live display when its program cannot start: target < 10 s of a 30 s
  ready wait (the old code spun the whole wait).

Run: ``.venv/bin/python bench/bench_give_up.py [--repeats 5] [--smoke]``
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import pty
import shutil
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from hilrec.daemon.cli import main as cli
from hilrec.daemon.collect.launch import LiveDisplay
from hilrec.daemon.control.hardware import open_with_retries
from hilrec.daemon.errors import ConfigError
from hilrec.drivers.arm import FollowerConfig, SO101Follower
from hilrec.drivers.calibration import ArmCalibration, save_calibration
from hilrec.sim.units import emulated_calibration


@contextlib.contextmanager
def silent_pty() -> Iterator[str]:
    """A serial port nothing answers on (a pty whose other end nobody serves)."""
    master, slave = pty.openpty()
    try:
        yield os.ttyname(slave)
    finally:
        os.close(master)
        os.close(slave)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def quietly(call: Callable[[], object], out: io.StringIO | None = None) -> object:
    with contextlib.redirect_stdout(out or io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        return call()


def ctl_no_daemon(_work: Path) -> None:
    code = quietly(lambda: cli(["ctl", "status", "--port", str(free_port())]))
    assert code == 3, f"ctl status with no daemon: exit {code}, not 3"


def open_silent_port(work: Path) -> None:
    calibration = save_calibration(ArmCalibration.from_mapping(emulated_calibration()), work / "f.json")
    with silent_pty() as port:
        arm = SO101Follower(FollowerConfig(port=port, calibration=calibration, reply_timeout_ms=10.0))
        try:
            open_with_retries(arm, key_prefix="follower.")
        except ConfigError:
            return
    raise AssertionError("a follower opened on a silent port")


def calibrate_silent_port(work: Path) -> None:
    with silent_pty() as port:
        code = quietly(
            lambda: cli(
                ["calibrate", "follower", "--port", port, "--output", str(work), "--yes", "--duration", "2.5"]
            )
        )
    assert code == 2, f"calibrate on a silent port: exit {code}, not 2"


def find_port_silent(_work: Path) -> None:
    with silent_pty() as port:
        out = io.StringIO()
        quietly(lambda: cli(["find-port", "--list", "--port", port]), out)
    assert "no Feetech servo answers" in out.getvalue(), out.getvalue()


def display_cannot_start(work: Path) -> None:
    out = io.StringIO()
    display = LiveDisplay([str(work / "no-such-program")], work / "display.log")
    assert display.start(out, ready_timeout_s=30.0) is False
    display.stop(out)


CASES: tuple[tuple[str, Callable[[Path], None], float], ...] = (
    ("ctl status, no daemon", ctl_no_daemon, 2.0),
    ("open a follower on a silent port", open_silent_port, 5.0),
    ("calibrate on a silent port", calibrate_silent_port, 5.0),
    ("find-port --list, one silent port", find_port_silent, 20.0),
    ("live display that cannot start", display_cannot_start, 10.0),
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--smoke", action="store_true", help="each case once")
    args = parser.parse_args(argv)
    repeats = 1 if args.smoke else args.repeats
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    print(f"# bench_give_up: {repeats} run(s) a case, load average {os.getloadavg()[0]:.2f} before\n")
    print("| case | median s | max s | target s | met |")
    print("|---|---:|---:|---:|---|")
    missed = 0
    for name, case, target in CASES:
        times = []
        for _ in range(repeats):
            work = Path(tempfile.mkdtemp(prefix="bench-give-up-"))
            try:
                began = time.monotonic()
                case(work)
                times.append(time.monotonic() - began)
            finally:
                shutil.rmtree(work, ignore_errors=True)
        met = max(times) < target
        missed += not met
        print(
            f"| {name} | {statistics.median(times):.2f} | {max(times):.2f} | < {target:g} | "
            f"{'yes' if met else 'NO'} |",
            flush=True,
        )
    print(f"\nload average after: {os.getloadavg()[0]:.2f}; {missed} target(s) missed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
