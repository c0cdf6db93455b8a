"""hilrec's child processes: each started to die with its parent, each stopped within a deadline.

Every child hilrec starts (the emulated arms, the daemon under ``collect``, the display, the
verdict worker, pool workers, the encoder processes) goes through this module, so these hold for
all of them:

- **Dying with the parent.** Linux sends a child its parent-death signal (``PR_SET_PDEATHSIG``)
  when the thread that forked it ends, so a SIGKILLed ``hilrec`` leaves no child running. A
  parent that dies *before* the child's ``prctl`` sends nothing, so after the ``prctl`` the child
  compares its parent with the pid the parent had, taken in the parent before the fork, and exits
  if they differ. Comparing with 1 would be wrong under a subreaper (a container's init,
  ``systemd --user``), which adopts the orphan instead of init; reading the parent's pid in the
  child would be too late (an orphan reads its new parent).
- **Nothing that can deadlock between fork and exec.** :func:`parent_death_hook` loads libc in the
  parent; the hook the child runs makes system calls only (``prctl``, ``getppid``, ``_exit`` and
  the caller's own steps, such as a scheduling policy), no import, no lock.
- **A death signal comes more than once.** When a multi-threaded parent dies, each of its
  threads that exits hands the child on to the next and sends the signal again: a burst of
  SIGTERMs. A handler that calls ``threading.Event.set`` can be entered again while the outer call
  holds the event's lock, and then waits for it forever (a display outlived its SIGKILLed daemon
  this way). :func:`stop_on_signals` sets the event from a thread instead, so its handler takes
  no lock.
- **A bounded stop.** :func:`stop` asks (a signal, or nothing when the caller asked another way,
  e.g. by closing the child's stdin), waits up to a deadline, then SIGKILLs and waits a bounded
  time more: a wedged child never holds its parent.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final, Protocol

PR_SET_PDEATHSIG: Final[int] = 1
# After SIGKILL, how long a stop waits for the kernel to end the child (one stuck in a D state
# may take longer: the stop then returns without it rather than hang).
KILL_WAIT_S: Final[float] = 5.0
# The exit status of a child whose parent died before it could ask to die with it.
ORPHAN_EXIT: Final[int] = 1

Step = Callable[[], object]  # a pre-exec step; what it returns is ignored


def _prctl() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl: Callable[..., int] = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    return prctl


def normal_scheduling() -> None:
    """A pre-exec step: the child runs at the normal scheduler, whatever the forking thread ran
    at (SVT-AV1 raises a thread that opens it to FIFO 99, and a child inherits that), so a viewer
    or a helper never goes before the loop."""
    with contextlib.suppress(OSError):
        os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))


def parent_death_hook(signum: int = signal.SIGTERM, *, first: Sequence[Step] = ()) -> Step | None:
    """A ``preexec_fn`` for :class:`subprocess.Popen`: the child gets ``signum`` when this
    process (the thread calling Popen) dies. Call it in the parent, right before Popen: it takes
    this process's pid now. ``first`` are the child's other pre-exec steps, run before the
    ``prctl`` (system calls only). None where Linux's parent-death signal is not available and
    there are no steps."""
    prctl = _prctl()
    parent = os.getpid()
    steps = tuple(first)
    if prctl is None:
        if not steps:
            return None

        def steps_only() -> None:
            for step in steps:
                step()

        return steps_only

    def hook() -> None:
        for step in steps:
            step()
        prctl(PR_SET_PDEATHSIG, int(signum), 0, 0, 0)
        if os.getppid() != parent:  # the parent died before the prctl: no signal will come
            os._exit(ORPHAN_EXIT)

    return hook


def die_with(parent: int, signum: int = signal.SIGKILL) -> None:
    """In a child that was not started through a pre-exec hook (a multiprocessing worker, an
    interpreter that sets itself up): get ``signum`` when ``parent`` dies. ``parent`` is the pid
    the parent passed down (its ``os.getpid()``); if it is not this process's parent any more,
    the parent is gone already and this process exits."""
    prctl = _prctl()
    if prctl is None:
        return
    prctl(PR_SET_PDEATHSIG, int(signum), 0, 0, 0)
    if os.getppid() != parent:
        os._exit(ORPHAN_EXIT)


def stop_on_signals(
    stop: threading.Event,
    signals: Sequence[int] = (signal.SIGINT, signal.SIGTERM),
    *,
    note: Callable[[int], None] | None = None,
) -> None:
    """Set ``stop`` when one of ``signals`` arrives, however many arrive and however they nest.
    Call it from the main thread. ``note`` is told the signal number first, inside the handler,
    so it must take no lock either (assigning an attribute is fine).

    A child forked without exec inherits the handler but not the thread that sets ``stop``:
    there the handler gives the signal its default action, so the child ends as it would have
    without this, and the parent is not told."""
    if threading.current_thread() is not threading.main_thread():
        raise ValueError("stop_on_signals() must be called from the main thread")
    owner = os.getpid()
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_write, False)

    def handler(signum: int, _frame: object) -> None:
        if os.getpid() != owner:
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        try:
            if note is not None:
                note(signum)
        finally:
            with contextlib.suppress(BlockingIOError):  # a full pipe: the setter is awake already
                os.write(wake_write, b"\0")

    def setter() -> None:
        while os.read(wake_read, 64):
            stop.set()

    threading.Thread(target=setter, name="hilrec-stop-on-signal", daemon=True).start()
    for signum in signals:
        signal.signal(signum, handler)


def start(
    argv: Sequence[str],
    *,
    death_signal: int = signal.SIGTERM,
    first: Sequence[Step] = (),
    **popen: Any,
) -> subprocess.Popen[Any]:
    """Start ``argv`` as a child that gets ``death_signal`` when this thread's process dies.
    ``popen`` goes to :class:`subprocess.Popen` as given (``start_new_session``, pipes, env...);
    ``first`` are further pre-exec steps (see :func:`parent_death_hook`). Call it from a thread
    that lives as long as the child should (Linux sends the signal when the forking thread ends)."""
    hook = parent_death_hook(death_signal, first=first)
    # The hook makes system calls only (libc is loaded above, in the parent), so no lock is
    # taken between fork and exec and another thread of this process cannot deadlock it.
    return subprocess.Popen(list(argv), preexec_fn=hook, **popen)  # noqa: PLW1509


class Child(Protocol):
    """What :func:`stop` needs of a child: :class:`subprocess.Popen`, or :class:`PoolChild`."""

    @property
    def pid(self) -> int: ...

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...

    def send_signal(self, sig: int) -> None: ...

    def kill(self) -> None: ...


@dataclass(frozen=True)
class Stopped:
    """How a child ended: its exit status (None if it outlived even the SIGKILL's wait), and
    whether it had to be killed because it did not end by the deadline."""

    returncode: int | None
    killed: bool


def stop(
    child: Child,
    timeout_s: float,
    *,
    signum: int | None = signal.SIGTERM,
    kill_wait_s: float = KILL_WAIT_S,
) -> Stopped:
    """Send ``signum`` (None: send nothing, the caller asked another way), wait up to
    ``timeout_s`` for the child to end, then SIGKILL it and wait up to ``kill_wait_s`` more."""
    if child.poll() is not None:
        return Stopped(child.poll(), killed=False)
    if signum is not None:
        with contextlib.suppress(ProcessLookupError):
            child.send_signal(signum)
    try:
        return Stopped(child.wait(timeout_s), killed=False)
    except subprocess.TimeoutExpired:
        pass
    with contextlib.suppress(ProcessLookupError):
        child.kill()
    with contextlib.suppress(subprocess.TimeoutExpired):
        child.wait(kill_wait_s)
    return Stopped(child.poll(), killed=True)


class PoolChild:
    """A :class:`multiprocessing.Process` (a pool's worker) seen as a :class:`Child`."""

    def __init__(self, process: Any) -> None:
        self._process = process

    @property
    def pid(self) -> int:
        return int(self._process.pid)

    def poll(self) -> int | None:
        code = self._process.exitcode
        return None if code is None else int(code)

    def wait(self, timeout: float | None = None) -> int:
        self._process.join(timeout)
        code = self.poll()
        if code is None:
            raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout or 0.0)
        return code

    def send_signal(self, sig: int) -> None:
        os.kill(self.pid, sig)

    def kill(self) -> None:
        self._process.kill()
