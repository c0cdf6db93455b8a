"""``hilrec display`` as a child process, beside the daemon (``[display]``) or ``hilrec collect``
(``--display rerun``).

A process, not a thread: the display only subscribes to the telemetry socket, so the loop gains
no work and never waits for rerun (a subscriber that falls behind loses messages, nothing else).
The child runs in a session of its own (a Ctrl-C in the terminal is its parent's to handle) and
gets SIGTERM when its parent dies (:mod:`hilrec.daemon.procs`), on which it flushes and ends as on
SIGINT.
:meth:`DisplayChild.stop` sends SIGINT and waits for the flush, so an ``.rrd`` is complete.

A display that fails is reported (its exit status and the end of its output) and never stops
the daemon or the session.
"""

from __future__ import annotations

import collections
import logging
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import IO, Final

from hilrec.daemon import procs
from hilrec.daemon.wire.settings import DisplaySettings, RerunViewer

log = logging.getLogger(__name__)

STOP_TIMEOUT_S: Final[float] = 30.0
KILL_WAIT_S: Final[float] = 10.0
RECEIVING: Final[str] = "hilrec display: receiving"
TAIL_LINES: Final[int] = 20


def no_screen() -> str | None:
    """Why rerun's native viewer cannot open a window here, or None when there is a screen."""
    if os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"):
        return None
    return "there is no screen for rerun's viewer here (neither DISPLAY nor WAYLAND_DISPLAY is set)"


def display_argv(
    telemetry: str, viewer: RerunViewer, *, rrd: Path | None = None, web_port: int = 9090
) -> list[str]:
    """The ``hilrec display`` command line for the telemetry socket at ``telemetry`` (loopback,
    without CURVE: the callers refuse CURVE configs)."""
    argv = [sys.executable, "-m", "hilrec.daemon.cli", "display", "--telemetry", telemetry]
    if viewer is RerunViewer.RRD:
        assert rrd is not None, "an rrd viewer needs its file"
        argv += ["--rrd", str(rrd)]
    elif viewer is RerunViewer.SPAWN:
        argv.append("--spawn")
    else:
        argv += ["--serve", "--web-port", str(web_port)]
    return argv


def settings_argv(telemetry: str, display: DisplaySettings) -> list[str] | None:
    """The command line a config's ``[display]`` asks for; None when it asks for none."""
    if display.rerun is None:
        return None
    return display_argv(telemetry, display.rerun, rrd=display.rrd, web_port=display.web_port)


class DisplayChild:
    """One ``hilrec display`` child; its output goes line by line to ``output`` (a log file or
    a logger), its last lines kept for :attr:`problem`."""

    def __init__(self, argv: list[str], *, output: Callable[[str], None] | IO[str]) -> None:
        self.argv = argv
        self._output = output
        self.process: subprocess.Popen[str] | None = None
        self.receiving = threading.Event()
        self._tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
        self._reader: threading.Thread | None = None
        self._stopping = False

    def start(self) -> DisplayChild:
        """Start the child; call it from the thread that lives as long as the parent (Linux
        sends the death signal when the thread that forked the child ends)."""
        env = dict(os.environ)
        try:
            self.process = procs.start(
                self.argv,
                first=(procs.normal_scheduling,),  # a viewer never goes before the loop
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                env=env,
                start_new_session=True,
            )
        except OSError as exc:
            self._tail.append(f"could not start {self.argv[0]}: {exc}")
            return self
        self._reader = threading.Thread(target=self._read, name="hilrec-display-output", daemon=True)
        self._reader.start()
        return self

    def wait_receiving(self, timeout_s: float) -> bool:
        """True once the display has its first telemetry message; False if it exits or the
        time runs out first."""
        if self.process is None:
            return False
        return self.receiving.wait(timeout_s)

    @property
    def returncode(self) -> int | None:
        """None while it runs; -1 when it could not be started."""
        return -1 if self.process is None else self.process.poll()

    @property
    def problem(self) -> str | None:
        """Why the display is not running, with the end of its output; None while it runs or
        after a clean exit."""
        code = -1 if self.process is None else self.process.poll()
        if code is None or code == 0:
            return None
        if self._reader is not None:
            self._reader.join(5.0)  # the last lines, written before it exited
        status = "could not start" if self.process is None else f"exited with status {code}"
        tail = "\n".join(self._tail)
        return f"the rerun display {status}" + (f"; its output ends:\n{tail}" if tail else "")

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> str | None:
        """SIGINT, then up to ``timeout_s`` for the flush, then SIGKILL. What went wrong (it
        could not start, was killed with its view cut short, or exited with an error), or None."""
        process = self.process
        if process is None:
            return self.problem
        self._stopping = True
        if procs.stop(process, timeout_s, signum=signal.SIGINT, kill_wait_s=KILL_WAIT_S).killed:
            return (
                f"the rerun display did not stop within {timeout_s:.0f} s and was killed; "
                "its view may lack the end"
            )
        if self._reader is not None:
            self._reader.join(5.0)
        if not self.receiving.is_set() and process.returncode != 0:
            # Stopped before it had received anything (a daemon that failed at once): its exit
            # status is the interrupt's, not a fault of its own worth reporting.
            return None
        return self.problem

    def _read(self) -> None:
        assert self.process is not None and self.process.stdout is not None
        with self.process.stdout as stream:
            for raw in stream:
                line = raw.rstrip("\n")
                self._tail.append(line)
                if RECEIVING in line:
                    self.receiving.set()
                self._write(line)
        code = self.process.wait()
        if code != 0 and not self._stopping:
            self._write(f"hilrec display exited with status {code}")

    def _write(self, line: str) -> None:
        if callable(self._output):
            self._output(line)
        else:
            self._output.write(line + "\n")
            self._output.flush()
