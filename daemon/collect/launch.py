"""The daemon collect talks to: one it starts (a child ``hilrec daemon``) or one already running.

A started daemon is a child process ``hilrec daemon --config FILE [--root DIR] [--resume]`` in a
session of its own (a Ctrl-C in collect's terminal reaches collect only; collect decides what
the daemon does), its stdout and stderr going to a log file whose name collect prints. Every wait
is bounded: the daemon must answer ``status`` within ``start_timeout_s`` or collect stops with the
end of its log; at the end it is asked to shut down and given ``stop_timeout_s`` to finalize and
exit before it is killed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Final

from hilrec.daemon import procs
from hilrec.daemon.cli import error_prefix
from hilrec.daemon.errors import DaemonUnreachableError, HilrecError
from hilrec.daemon.wire.client import ControlClient
from hilrec.daemon.wire.display_child import DisplayChild

START_TIMEOUT_S: Final[float] = 120.0
STOP_TIMEOUT_S: Final[float] = 180.0
LOG_TAIL_CHARS: Final[int] = 3000
DISPLAY_READY_TIMEOUT_S: Final[float] = 60.0
DAEMON_ERROR_PREFIX: Final[str] = error_prefix("daemon")
KILL_WAIT_S: Final[float] = 10.0


@dataclass(frozen=True)
class Endpoints:
    control: str
    telemetry: str

    @classmethod
    def from_settings(cls, settings: Any) -> Endpoints:
        """Loopback endpoints of the daemon a config describes (collect runs beside it)."""
        from hilrec.daemon.errors import ConfigError

        zmq = settings.zmq
        if getattr(zmq, "curve", None) is not None:
            raise ConfigError(
                "zmq.curve", "collect drives a daemon on this machine; run it on a config without CURVE keys"
            )
        return cls(
            control=f"tcp://127.0.0.1:{zmq.control_port}",
            telemetry=f"tcp://127.0.0.1:{zmq.telemetry_port}",
        )


class DaemonProcess:
    """A ``hilrec daemon`` child. ``start()`` returns once it serves control requests."""

    def __init__(
        self,
        config: Path,
        *,
        endpoints: Endpoints,
        log_path: Path,
        root: Path | None,
        resume: bool,
        display_off: bool = False,
        extra: Sequence[str] = (),
    ) -> None:
        self.config = config
        self.endpoints = endpoints
        self.log_path = log_path
        self.argv = [sys.executable, "-m", "hilrec.daemon.cli", "daemon", "--config", str(config)]
        if root is not None:
            self.argv += ["--root", str(root)]
        if resume:
            self.argv.append("--resume")
        if display_off:  # collect runs the display itself: not the config's [display] too
            self.argv.append("--no-display")
        self.argv += extra  # hilrec rollout's policy flags
        self.process: subprocess.Popen[bytes] | None = None

    def spawn(self) -> None:
        """Start the child; call it before the ZeroMQ context exists. It gets SIGTERM when collect
        dies (:mod:`hilrec.daemon.procs`), and then saves and finalizes."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ)
        env.setdefault("MUJOCO_GL", "egl")
        env.setdefault("PYOPENGL_PLATFORM", "egl")
        with self.log_path.open("ab") as log:
            self.process = procs.start(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,  # Ctrl-C in collect's terminal is collect's to handle
            )

    def wait_ready(self, client: ControlClient, timeout_s: float = START_TIMEOUT_S) -> dict[str, Any]:
        """The daemon's first status reply, once it serves; HilrecError with its log if it does not."""
        assert self.process is not None, "spawn() first"
        deadline = time.monotonic() + timeout_s
        while True:
            if self.process.poll() is not None:
                raise HilrecError(
                    f"the daemon exited with status {self.process.returncode} before serving: "
                    f"{self.log_error()}"
                )
            try:
                return client.call("status")
            except DaemonUnreachableError:
                if time.monotonic() > deadline:
                    self.kill()
                    raise HilrecError(
                        f"the daemon did not answer within {timeout_s:.0f} s; its log "
                        f"{self.log_path} ends:\n{self.log_tail()}"
                    ) from None

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def shutdown(self, client: ControlClient, timeout_s: float = STOP_TIMEOUT_S) -> int | None:
        """Ask it to finish (it saves, finalizes, exits); its exit status, None if it had to be killed."""
        if self.process is None:
            return None
        asked = False
        if self.process.poll() is None:
            try:
                client.request("shutdown")
                asked = True
            except DaemonUnreachableError:
                pass  # SIGTERM then: the daemon saves and finalizes on it too
        ended = procs.stop(
            self.process, timeout_s, signum=None if asked else signal.SIGTERM, kill_wait_s=KILL_WAIT_S
        )
        return None if ended.killed else ended.returncode

    def kill(self) -> None:
        if self.process is not None:
            procs.stop(self.process, 0.0, signum=None, kill_wait_s=KILL_WAIT_S)

    def log_error(self) -> str:
        """The daemon's own error line (the cause, first), then where its whole log is; the log's
        end when it printed no error line (a crash)."""
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return f"it left no log ({self.log_path})"
        said = [ln for ln in lines if ln.startswith(DAEMON_ERROR_PREFIX)]
        if said:
            return f"{said[-1].removeprefix(DAEMON_ERROR_PREFIX)}\n(its whole log: {self.log_path})"
        return f"it printed no error; its log {self.log_path} ends:\n{self.log_tail()}"

    def log_tail(self) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return text[-LOG_TAIL_CHARS:]


def default_log_path(root: Path, what: str = "daemon") -> Path:
    """Beside the dataset, never in it: a new root must stay empty until the daemon creates it."""
    root = root.resolve()
    return root.parent / f"{root.name}.{what}.log"


class LiveDisplay:
    """collect's ``hilrec display`` child (``--display rerun``), its output in a log file. It is
    waited for (bounded) until it receives telemetry, so a take's first frames are in the view;
    one that fails is reported on the terminal and the session goes on without it."""

    def __init__(self, argv: list[str], log_path: Path) -> None:
        self.log_path = log_path
        self._argv = argv
        self._log: IO[str] | None = None
        self.child: DisplayChild | None = None

    def start(self, out: IO[str], ready_timeout_s: float = DISPLAY_READY_TIMEOUT_S) -> bool:
        """Start it and wait until it receives; True when it does."""
        try:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            self._log = self.log_path.open("a", encoding="utf-8")
        except OSError as exc:
            print(f"collect: cannot write the display's log: {exc}; the session goes on without it", file=out)
            return False
        self.child = DisplayChild(self._argv, output=self._log).start()
        print(f"collect: starting the rerun display; its log: {self.log_path}", file=out, flush=True)
        deadline = time.monotonic() + ready_timeout_s
        while not self.child.wait_receiving(min(0.5, max(0.0, deadline - time.monotonic()))):
            if self.child.returncode is not None or time.monotonic() >= deadline:
                problem = self.child.problem or (
                    f"the rerun display receives nothing after {ready_timeout_s:.0f} s; it goes on trying"
                )
                print(f"collect: {problem}; the session goes on without it", file=out, flush=True)
                return False
        return True

    def stop(self, out: IO[str]) -> None:
        """SIGINT, and up to 30 s for the view to be flushed (then killed); what went wrong, said."""
        if self.child is None:
            return
        problem = self.child.stop()
        if problem is not None:
            print(f"collect: {problem}", file=out, flush=True)
        if self._log is not None:
            self._log.close()
