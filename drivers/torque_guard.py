"""A guard that turns the torque of an arm's servos off when the process driving them dies.

A rollout keeps the leader under torque (following the follower). Its own ways out (a stop, a
fault, SIGTERM) let the torque go; a SIGKILL, an out-of-memory kill or a crash in C leaves no
``finally`` to run, and the servos would hold their last goal, stiff under the person's hand.
So the daemon starts this guard beside it, through :mod:`hilrec.daemon.procs` (the guard gets
SIGTERM when the daemon's thread that started it ends), with a pipe on its stdin:

- a line ``stand down`` on stdin: the daemon let the torque go itself; the guard ends without
  touching the port (the daemon still has it open);
- SIGTERM, or the end of its stdin (the daemon is gone): it opens the port, retrying while the
  dead process's hold on it is released, writes Torque_Enable 0 (and Lock 0) to every servo, and
  ends. An arm that is gone too (an emulated one, ending with the daemon) is given up on after
  ``open_timeout_s``.

From its start the guard holds the port open itself (never reading or writing it), so that the
device it turns off is the one the daemon had. A pty's number is free again once both of its
ends are closed, and an emulated arm's ends with its daemon: within ``open_timeout_s`` the next
terminal opened on the machine may get it (seen in the suite: a SIGKILLed daemon's guard wrote
its Torque_Enable packets into another test's terminal). Held open, the number stays taken
while the guard lives, and opening it after the emulator is gone fails instead.

Child side: ``python -m hilrec.drivers.torque_guard PORT [--open-timeout-s S]``; parent side:
:class:`TorqueGuard`.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

from hilrec.daemon import procs
from hilrec.daemon.errors import DeviceError
from hilrec.daemon.so101 import MOTOR_IDS

log = logging.getLogger(__name__)
STAND_DOWN = b"stand down\n"
READY = "guarding"
_STOP_SIGNALS = {signal.SIGTERM, signal.SIGINT}


class TorqueGuard:
    """The parent's handle on a guard child for ``port``; :meth:`stand_down` when letting go."""

    def __init__(self, port: str, *, open_timeout_s: float = 3.0, ready_timeout_s: float = 30.0) -> None:
        self.port = port
        self.process = procs.start(
            [
                sys.executable,
                "-m",
                "hilrec.drivers.torque_guard",
                port,
                "--open-timeout-s",
                str(open_timeout_s),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            first=(procs.normal_scheduling,),
        )
        self._await_ready(ready_timeout_s)

    @property
    def pid(self) -> int:
        return self.process.pid

    def _await_ready(self, timeout_s: float) -> None:
        """Until the guard says it is watching: a SIGKILL just after this is covered."""
        assert self.process.stdout is not None
        fd = self.process.stdout.fileno()
        deadline = time.monotonic() + timeout_s
        buffer = b""
        while b"\n" not in buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or self.process.poll() is not None:
                self.stand_down()
                raise DeviceError(
                    f"the torque guard for {self.port} did not start within {timeout_s:.0f} s "
                    f"(exit status {self.process.returncode})"
                )
            ready, _, _ = select.select([fd], [], [], remaining)
            if ready:
                chunk = os.read(fd, 256)
                if not chunk:
                    continue
                buffer += chunk

    def stand_down(self, timeout_s: float = 5.0) -> None:
        """The torque is off already: the guard ends without touching the port. Idempotent."""
        if self.process.stdin is not None and not self.process.stdin.closed:
            with contextlib.suppress(OSError, ValueError):
                self.process.stdin.write(STAND_DOWN)
                self.process.stdin.flush()
        procs.stop(self.process, timeout_s, signum=None)
        for stream in (self.process.stdin, self.process.stdout):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()


def torque_off(port: str, open_timeout_s: float) -> bool:
    """Open ``port`` (retrying until ``open_timeout_s``) and turn every servo's torque off."""
    from hilrec.drivers.bus import BusConfig, FeetechBus

    deadline = time.monotonic() + open_timeout_s
    while True:
        bus = FeetechBus(BusConfig(port=port))
        try:
            bus.open()
            break
        except DeviceError as exc:
            if time.monotonic() >= deadline:
                log.warning("torque guard: %s did not open (%s); its torque is not turned off", port, exc)
                return False
            time.sleep(0.05)  # the dead process's hold on the port is being released
    try:
        # One packet first (no reply), so the torque goes at once; then servo by servo, replied.
        bus.sync_write("Torque_Enable", dict.fromkeys(MOTOR_IDS, 0))
        bus.set_torque(MOTOR_IDS, enabled=False)
        return True
    except DeviceError as exc:
        log.warning("torque guard: turning the torque off on %s failed: %s", port, exc)
        return False
    finally:
        bus.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hilrec.drivers.torque_guard", description=__doc__)
    parser.add_argument("port")
    parser.add_argument("--open-timeout-s", type=float, default=3.0)
    args = parser.parse_args(argv)
    signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)
    with _held_open(args.port):
        print(READY, flush=True)
        return _guard(args.port, args.open_timeout_s)


@contextlib.contextmanager
def _held_open(port: str) -> Iterator[None]:
    """The port held open by this process (see the module's text); a port that cannot be opened
    is guarded by name only."""
    try:
        fd = os.open(port, os.O_RDWR | os.O_NOCTTY | os.O_NONBLOCK)
    except OSError as exc:
        log.warning("torque guard: %s could not be held open (%s); guarding it by name", port, exc)
        yield
        return
    try:
        yield
    finally:
        os.close(fd)


def _guard(port: str, open_timeout_s: float) -> int:
    stdin = sys.stdin.fileno()
    while True:
        readable, _, _ = select.select([stdin], [], [], 0.2)
        if readable:
            data = os.read(stdin, 64)
            if data.startswith(STAND_DOWN.strip()):
                return 0
            if not data:
                break  # the parent's end of the pipe closed: it is gone
        if signal.sigtimedwait(_STOP_SIGNALS, 0) is not None:
            break
    return 0 if torque_off(port, open_timeout_s) else 1


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    sys.exit(main())
