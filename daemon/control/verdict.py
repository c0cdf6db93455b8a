"""A verdict on every saved take, from a worker process that can never delay the loop.

Once an episode is saved (durable in the journal) the daemon hands its index to
:class:`VerdictWorker`. The worker is a separate process (``python -m
hilrec.daemon.control.verdict``) at the lowest CPU priority there is: ``SCHED_IDLE`` (granted to
any process on Linux), else ``nice 19``; it runs only on CPU time nothing else wants, so the loop
and its writer never wait for it. On a virtual machine the hypervisor does not know those
priorities, so while it works the worker is also held stopped around each tick (:class:`TickGate`).
It starts with the first take and keeps MuJoCo and the checkers imported between takes.

Per episode, in the worker: :func:`hilrec.daemon.control.judge.judge_episode` (the dataset rules
that concern that episode, then its sim or hardware replay).

The verdict (:class:`hilrec.daemon.dataset.EpisodeVerdict`), a one-sentence summary a
person can act on, and the details go back to the daemon, which publishes an ``episode_verdict``
event and stores them in the episode's sidecar under ``"verdict"`` (through the writer thread).
The protocol between the two processes is one JSON object per line on the worker's stdin/stdout.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any, Final

from hilrec.daemon import procs
from hilrec.daemon.control.judge import judge_episode, not_checked

log = logging.getLogger(__name__)

CLOSE_TIMEOUT_S: Final[float] = 5.0
GATE_GUARD_S: Final[float] = 0.004  # the worker is stopped this long before each tick deadline
GATE_RESUME_S: Final[float] = 0.010  # and continued this long after it (a tick's work: 2-8 ms)
_PREPARE: Final[str] = "prepare"  # on the worker's queue: start the process, judge nothing yet


# --- priority (in the worker) ----------------------------------------------------------------------


def lower_priority() -> str:
    """Put this process at the bottom of the CPU queue; say what was granted."""
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except (OSError, AttributeError) as exc:
        try:
            os.nice(19 - os.nice(0))
        except OSError as nice_exc:
            return f"normal (SCHED_IDLE refused: {exc}; nice refused: {nice_exc})"
        return f"nice 19 (SCHED_IDLE refused: {exc})"
    return "SCHED_IDLE"


# --- the worker process -------------------------------------------------------------------------------


def serve(requests: IO[str], replies: IO[str]) -> int:
    """The worker's body: a ``ready`` line, then one reply line per request line until EOF."""
    priority = lower_priority()
    _preload()
    _send(replies, {"type": "ready", "priority": priority, "pid": os.getpid()})
    for line in requests:
        if not line.strip():
            continue
        request = json.loads(line)
        index = int(request["episode_index"])
        try:
            reply = judge_episode(Path(request["root"]), index, mode=str(request["mode"]))
        except Exception as exc:
            log.exception("verdict of episode %d", index)
            reply = not_checked(index, f"the check failed: {type(exc).__name__}: {exc}")
        _send(replies, {"type": "verdict", **reply})
    return 0


def _preload() -> None:
    """Import what a verdict needs now, not while the first take waits for its verdict."""
    import importlib

    from hilrec.daemon.dataset import check_dataset

    del check_dataset
    for name in ("hilrec.daemon.replay.check", "hilrec.sim.replay"):
        importlib.import_module(name)


def _send(out: IO[str], message: dict[str, Any]) -> None:
    out.write(json.dumps(message, allow_nan=False, default=str) + "\n")
    out.flush()


def main() -> int:
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s verdict: %(message)s")
    # The replies get the original stdout; anything a library prints goes to stderr (the log).
    replies = os.fdopen(os.dup(sys.stdout.fileno()), "w", encoding="utf-8")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    return serve(sys.stdin, replies)


# --- the daemon side ---------------------------------------------------------------------------------


class TickGate:
    """Lets the worker process run only between the loop's ticks, whatever it is doing.

    SCHED_IDLE keeps the worker off a CPU the loop wants *inside* this machine; it does not stop a
    hypervisor from running the worker's virtual CPU while the loop's waits for a physical one
    (measured: ticks 20 ms late while the worker ran, on the shared 2-core VM). So while a
    verdict is being made, the worker is sent SIGSTOP :data:`GATE_GUARD_S` before each tick's
    deadline and SIGCONT :data:`GATE_RESUME_S` after it, when the tick's work is done: it keeps
    about two thirds of each period. A gate thread that wakes late only lets the worker run a
    little into a tick, as it would without the gate; the worker always ends continued.
    """

    def __init__(self, pid: int, grid: Callable[[], tuple[float, float] | None]) -> None:
        self._pid = pid
        self._grid = grid
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="hilrec-verdict-gate", daemon=True)
        self.ticks = 0

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> int:
        """End the gating, the worker continued; how many ticks it was held off."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(2.0)
        self._signal(signal.SIGCONT)
        return self.ticks

    def _run(self) -> None:
        while not self._stop.is_set():
            grid = self._grid()
            if grid is None:  # no tick yet: nothing to keep clear
                self._stop.wait(0.05)
                continue
            deadline, period = grid
            now = time.monotonic()
            ahead = deadline + math.ceil((now + GATE_GUARD_S - deadline) / period) * period
            if self._stop.wait(max(0.0, ahead - GATE_GUARD_S - time.monotonic())):
                return
            self._signal(signal.SIGSTOP)
            self.ticks += 1
            self._stop.wait(max(0.0, ahead + GATE_RESUME_S - time.monotonic()))
            self._signal(signal.SIGCONT)

    def _signal(self, signum: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(self._pid, signum)


class VerdictWorker:
    """Starts the worker process, feeds it saved episodes in order, hands back its verdicts.

    ``on_verdict(verdict)`` runs on the ``hilrec-verdict`` thread with the verdict's dict
    (``episode_index``, ``verdict``, ``summary``, ``details``, ``take_end_to_verdict_s``).
    """

    def __init__(
        self,
        *,
        root: Path,
        mode: str,
        on_verdict: Callable[[dict[str, Any]], None],
        command: list[str] | None = None,
        tick_grid: Callable[[], tuple[float, float] | None] | None = None,
    ) -> None:
        self.root = Path(root)
        self.mode = mode
        self._on_verdict = on_verdict
        # (a tick deadline, the period) of the loop, monotonic: with it the worker runs only
        # between ticks (TickGate); without it, whenever the CPU scheduler lets it.
        self._tick_grid = tick_grid
        self.gated_ticks = 0
        self._command = command or [sys.executable, "-m", "hilrec.daemon.control.verdict"]
        self._queue: queue.Queue[tuple[int, float] | str | None] = queue.Queue()
        self._lock = threading.Lock()
        self._prepared = False
        self._closed = False
        self._idle = threading.Condition(self._lock)
        self._pending = 0
        self.done = 0
        self.last: dict[str, Any] | None = None
        self.priority = "not started"
        self.error: str | None = None
        self._process: subprocess.Popen[str] | None = None
        self._thread = threading.Thread(target=self._run, name="hilrec-verdict", daemon=True)

    def start(self) -> None:
        """Start the ``hilrec-verdict`` thread (call from a thread at normal priority: the thread,
        and the worker process it starts, inherit it).

        The process itself starts with the first take (:meth:`prepare`), or the first saved
        episode: a daemon that never records never pays for a worker that imports MuJoCo.
        """
        self._thread.start()

    def prepare(self) -> None:
        """A take has begun: start the worker now, so it is ready when the take is saved."""
        with self._lock:
            if self._prepared:
                return
            self._prepared = True
        self._queue.put(_PREPARE)

    def submit(self, episode_index: int, ended_at: float | None = None) -> None:
        """Judge ``episode_index`` (saved); ``ended_at``: when its take ended (monotonic)."""
        with self._lock:
            self._pending += 1
        self._queue.put((episode_index, time.monotonic() if ended_at is None else ended_at))

    @property
    def pending(self) -> int:
        with self._lock:
            return self._pending

    def drain(self, timeout_s: float) -> bool:
        """Wait until every submitted episode has its verdict; False at the timeout."""
        deadline = time.monotonic() + timeout_s
        with self._idle:
            while self._pending:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._idle.wait(remaining)
        return True

    def close(self) -> None:
        """Stop the worker (what is still pending gets no verdict)."""
        with self._lock:
            self._closed = True  # a worker the thread has not started yet never starts
            process = self._process
        if process is not None:
            with contextlib.suppress(OSError):
                os.kill(process.pid, signal.SIGCONT)  # in case a gate left it stopped
            if process.stdin is not None:
                with contextlib.suppress(OSError):
                    process.stdin.close()  # EOF: the worker's loop ends
        # After the EOF: the worker's parent is the hilrec-verdict thread, and its death signal
        # comes when that thread ends.
        self._queue.put(None)
        if process is not None:
            procs.stop(process, CLOSE_TIMEOUT_S, signum=None, kill_wait_s=CLOSE_TIMEOUT_S)
        if self._thread.is_alive():
            self._thread.join(5.0)

    def status(self) -> dict[str, Any]:
        with self._lock:
            return {
                "priority": self.priority,
                "gated": self._tick_grid is not None,
                "gated_ticks": self.gated_ticks,
                "pending": self._pending,
                "done": self.done,
                "last": self.last,
                "error": self.error,
            }

    # --- the hilrec-verdict thread ---------------------------------------------------------------

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            if self._process is None and self.error is None:
                self._spawn()
            process = self._process
            if isinstance(item, str):  # _PREPARE: the process is all it asked for
                continue
            index, ended_at = item
            reply = None
            if self.error is None and process is not None and process.stdin and process.stdout:
                gate = self._gate(process.pid)
                try:
                    _send(process.stdin, {"root": str(self.root), "episode_index": index, "mode": self.mode})
                    reply = self._read(process.stdout)
                except (OSError, ValueError) as exc:  # gone, or a reply that is not text
                    self._fail(f"the verdict worker is gone ({exc})")
                finally:
                    if gate is not None:
                        self.gated_ticks += gate.stop()
                if reply is None and self.error is None:
                    self._fail(f"the verdict worker stopped (exit status {process.poll()})")
            if reply is None:
                reply = not_checked(index, f"the verdict worker is not running: {self.error}")
            reply.pop("type", None)
            reply["take_end_to_verdict_s"] = round(time.monotonic() - ended_at, 3)
            try:
                self._on_verdict(reply)
            except Exception:
                log.exception("handing over the verdict of episode %d failed", index)
            with self._idle:
                self._pending -= 1
                self.done += 1
                self.last = {k: reply[k] for k in ("episode_index", "verdict", "summary")}
                self._idle.notify_all()

    def _spawn(self) -> None:
        """Start the worker process and wait for its ``ready`` (the imports, gated like a verdict)."""
        try:
            # Outside the lock: a fork of the whole daemon may take a while on a loaded machine,
            # and status() and the writer's submit() must not wait for it.
            process = procs.start(
                self._command,
                # SIGKILL: a tick gate may hold it stopped; a stopped process handles no SIGTERM.
                death_signal=signal.SIGKILL,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=None,  # the daemon's own stderr: its log
                text=True,
                bufsize=1,
            )
        except OSError as exc:
            self._fail(f"the verdict worker could not start ({exc})")
            return
        with self._lock:
            closed = self._closed
            if not closed:
                self._process = process
        if closed:  # close() ran while it started: it stopped no process, so this one stops here
            procs.stop(process, 0.0, kill_wait_s=CLOSE_TIMEOUT_S)
            self._fail("the daemon is stopping")
            return
        assert process.stdout is not None
        gate = self._gate(process.pid)
        try:
            ready = self._read(process.stdout)
        except ValueError as exc:  # not text
            ready = None
            log.error("verdict worker said something unreadable: %s", exc)
        finally:
            if gate is not None:
                self.gated_ticks += gate.stop()
        if ready is None or ready.get("type") != "ready":
            self._fail(f"the verdict worker did not start (exit status {process.poll()})")
            return
        self.priority = str(ready.get("priority"))
        log.info("verdict worker pid %s at %s", ready.get("pid"), self.priority)

    def _gate(self, pid: int) -> TickGate | None:
        """A started gate on ``pid`` when the loop has a tick grid to keep clear; else None."""
        if self._tick_grid is None:
            return None
        gate = TickGate(pid, self._tick_grid)
        gate.start()
        return gate

    def _read(self, stream: IO[str]) -> dict[str, Any] | None:
        line = stream.readline()
        if not line:
            return None
        try:
            message = json.loads(line)
        except ValueError:
            log.error("verdict worker said %r", line[:200])
            return None
        return message if isinstance(message, dict) else None

    def _fail(self, message: str) -> None:
        log.error("%s; episodes get no verdict", message)
        self.error = message


if __name__ == "__main__":
    sys.exit(main())
