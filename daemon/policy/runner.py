"""Where a policy's inference runs: in its own process beside the loop, or in line (the twin).

:class:`ProcessRunner` starts the policy in a *spawned* process (its own interpreter, so torch's
threads and a crash stay there) and talks to it over a pipe. :meth:`submit` never blocks: it
leaves the observation in a one-slot mailbox, newest wins, and a feeder thread sends it when the
process is idle; a reader thread takes the answers. So the loop only swaps references under a
lock, whatever the policy costs. The process's death (a crash, SIGKILL, an out-of-memory kill) is
seen as the pipe's end of file and reported by :attr:`ProcessRunner.dead`, with its exit code.

:class:`InlineRunner` asks the policy in the caller's thread: ``hilrec record --sim --policy``
uses it so that a twin episode is deterministic and runs faster than real time.

Both hand back :class:`Answer` objects, the raw output and the tick of its observation; the
caller checks and indexes them (:mod:`hilrec.daemon.policy.chunks`).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import pickle
import signal
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any, Protocol

import numpy as np

from hilrec.daemon.errors import PolicyError
from hilrec.daemon.policy.load import TASK_KEY, EvalPolicy, LeRobotPolicy, act_chunk, load_policy
from hilrec.daemon.so101 import IMAGE_PREFIX, NUM_JOINTS, STATE_KEY

READY_TIMEOUT_S = 120.0  # torch and a LeRobot checkpoint take seconds to import and load


@dataclass(frozen=True, slots=True)
class Answer:
    """A policy's reply to the observation of ``tick``: its output, or why it gave none."""

    tick: int
    output: Any
    latency_s: float
    error: str | None = None


class Runner(Protocol):
    name: str

    def submit(self, tick: int, observation: Mapping[str, Any], *, reset: bool = False) -> None:
        """Ask for a chunk from this observation (``reset``: a new episode starts here)."""
        ...

    def answers(self) -> list[Answer]:
        """The answers that arrived since the last call, oldest first; never blocks."""
        ...

    @property
    def busy(self) -> bool: ...

    @property
    def dead(self) -> str | None:
        """Why the policy can no longer answer, or None while it can."""
        ...

    def close(self) -> None: ...


def ask(policy: EvalPolicy, observation: Mapping[str, Any]) -> tuple[Any, float, str | None]:
    """One inference: (output, seconds it took, None), or (None, seconds, why) if it raised."""
    began = time.perf_counter()
    try:
        output = act_chunk(policy, observation)
    except Exception as exc:  # noqa: BLE001 - a policy's bug is a refused answer, never the loop's end
        return None, time.perf_counter() - began, f"the policy raised {type(exc).__name__}: {exc}"
    return output, time.perf_counter() - began, None


class InlineRunner:
    """The policy asked in the caller's thread; its answer is ready when :meth:`submit` returns."""

    def __init__(self, policy: EvalPolicy) -> None:
        self.policy = policy
        self.name = policy.name
        self._ready: list[Answer] = []

    def submit(self, tick: int, observation: Mapping[str, Any], *, reset: bool = False) -> None:
        if reset:
            self.policy.reset()
        output, took, error = ask(self.policy, observation)
        self._ready.append(Answer(tick=tick, output=output, latency_s=took, error=error))

    def answers(self) -> list[Answer]:
        ready, self._ready = self._ready, []
        return ready

    @property
    def busy(self) -> bool:
        return False

    @property
    def dead(self) -> str | None:
        return None

    def close(self) -> None:
        pass


class ProcessRunner:
    """The policy in a spawned process; see the module's text."""

    def __init__(
        self,
        spec: str,
        *,
        device: str = "cpu",
        threads: int = 1,
        ready_timeout_s: float = READY_TIMEOUT_S,
        wait: bool = True,
    ) -> None:
        """Start the policy's process; with ``wait`` (else call :meth:`await_ready`), until it
        has loaded (PolicyError when it cannot)."""
        self.name = spec
        context = multiprocessing.get_context("spawn")
        self._conn, child = context.Pipe(duplex=True)
        self._process = context.Process(
            target=serve, args=(spec, device, threads, child), name="hilrec-policy", daemon=True
        )
        self._process.start()
        child.close()  # the child's death is then this end's EOF
        self._lock = threading.Condition()
        self._mailbox: tuple[int, Mapping[str, Any], bool] | None = None
        self._busy = False
        self._closing = False
        self._ready: list[Answer] = []
        self._dead: str | None = None
        self._ready_timeout_s = ready_timeout_s
        if wait:
            self.await_ready()

    def await_ready(self) -> None:
        """Wait until the policy has loaded, then start serving it (PolicyError if it fails)."""
        self._await_ready(self._ready_timeout_s)
        self._reader = threading.Thread(target=self._read, name="hilrec-policy-read", daemon=True)
        self._feeder = threading.Thread(target=self._feed, name="hilrec-policy-feed", daemon=True)
        self._reader.start()
        self._feeder.start()

    @property
    def pid(self) -> int | None:
        return self._process.pid

    def _await_ready(self, timeout_s: float) -> None:
        try:
            if not self._conn.poll(timeout_s):
                self._stop_process()
                raise PolicyError(f"policy {self.name} did not load within {timeout_s:.0f} s")
            kind, detail = self._conn.recv()
        except (EOFError, OSError):
            self._process.join(5.0)
            raise PolicyError(
                f"policy process for {self.name} exited while loading (exit code {self._process.exitcode})"
            ) from None
        if kind != "ready":
            self._stop_process()
            raise PolicyError(f"policy {self.name} could not be loaded: {detail}")

    def submit(self, tick: int, observation: Mapping[str, Any], *, reset: bool = False) -> None:
        with self._lock:
            # A reset must reach the policy even if a newer observation replaces this one.
            keep_reset = reset or (self._mailbox is not None and self._mailbox[2])
            self._mailbox = (tick, observation, keep_reset)
            self._lock.notify_all()

    def answers(self) -> list[Answer]:
        with self._lock:
            ready, self._ready = self._ready, []
        return ready

    @property
    def busy(self) -> bool:
        with self._lock:
            return self._busy or self._mailbox is not None

    @property
    def dead(self) -> str | None:
        with self._lock:
            return self._dead

    def wait(self, timeout_s: float) -> bool:
        """Block until an answer is waiting or the process has died (never call it from the
        loop: benches and tests use it to start from a first chunk); False on timeout."""
        with self._lock:
            return self._lock.wait_for(lambda: bool(self._ready) or self._dead is not None, timeout_s)

    def _feed(self) -> None:
        while True:
            with self._lock:
                while not self._closing and self._dead is None and (self._busy or self._mailbox is None):
                    self._lock.wait()
                if self._closing or self._dead is not None or self._mailbox is None:
                    return
                message = ("obs", *self._mailbox)
                self._mailbox = None
                self._busy = True
            try:
                self._conn.send(message)
            except (OSError, ValueError):  # the reader says why
                return

    def _read(self) -> None:
        while True:
            try:
                kind, tick, output, took, error = self._conn.recv()
            except (EOFError, OSError):
                self._process.join(2.0)
                with self._lock:
                    if not self._closing:
                        self._dead = (
                            f"the policy process {self.name} (pid {self._process.pid}) ended "
                            f"(exit code {self._process.exitcode}); the arm holds"
                        )
                    self._lock.notify_all()
                return
            with self._lock:
                if kind == "answer":
                    self._ready.append(Answer(tick=tick, output=output, latency_s=took, error=error))
                self._busy = False
                self._lock.notify_all()

    def close(self) -> None:
        with self._lock:
            self._closing = True
            self._lock.notify_all()
        with contextlib.suppress(OSError, ValueError):
            self._conn.send(("stop", 0, None, False))
        self._process.join(5.0)
        self._stop_process()
        self._conn.close()

    def _stop_process(self) -> None:
        if self._process.is_alive():
            self._process.kill()
            self._process.join(5.0)


def warm_up(policy: EvalPolicy) -> None:
    """One inference on a blank observation of the shapes a LeRobot policy wants, before it
    says ready: torch's first call costs seconds (kernels, allocator, threads), and paid in a
    take it would leave the first chunk seconds stale."""
    wants = policy.wants
    if not isinstance(policy, LeRobotPolicy) or wants.cameras is None:
        return
    height, width = wants.image_size or (480, 640)
    blank: dict[str, Any] = {STATE_KEY: np.zeros(NUM_JOINTS, np.float32), TASK_KEY: ""}
    for camera in wants.cameras:
        blank[IMAGE_PREFIX + camera] = np.zeros((height, width, 3), np.uint8)
    ask(policy, blank)
    policy.reset()


def serve(spec: str, device: str, threads: int, conn: Connection) -> None:
    """The policy process: load, say ready, then answer each observation until told to stop."""
    # Ctrl-C at the terminal reaches the whole process group: the parent decides when this ends.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # Started from the loop's thread, this process may have inherited SCHED_FIFO: inference
    # at real-time priority would starve the very loop it serves.
    with contextlib.suppress(OSError, AttributeError):
        os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
    try:
        policy = load_policy(spec, device=device)
    except Exception as exc:  # noqa: BLE001 - said to the parent, which raises it as a PolicyError
        conn.send(("failed", f"{type(exc).__name__}: {exc}"))
        return
    if isinstance(policy, LeRobotPolicy):
        import torch

        # Measured on the bench's 2 cores: torch's default of one thread per core made a tiny
        # ACT 3-10x slower than one thread, fighting the loop and the encoders for both cores.
        torch.set_num_threads(threads)
    warm_up(policy)
    conn.send(("ready", policy.name))
    while True:
        try:
            kind, tick, observation, reset = conn.recv()
        except (EOFError, OSError, KeyboardInterrupt):
            return
        if kind != "obs":
            return
        if reset:
            policy.reset()
        output, took, error = ask(policy, observation)
        try:
            conn.send(("answer", tick, output, took, error))
        except (pickle.PicklingError, TypeError, AttributeError) as exc:
            conn.send(("answer", tick, None, took, f"its output cannot be sent ({exc})"))
        except (OSError, ValueError):
            return
