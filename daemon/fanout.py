"""Per-episode tasks run one way or another: in this process, in a process pool, or on Ray.

``record --sim``, ``replay`` and ``check --replay`` each cut their work into one task per episode
(a seed to record, an episode to replay) whose result the parent gathers in input order, so what
they write or report does not depend on how many processes ran it. :func:`run_tasks` is the one
place that hands the tasks out:

- ``workers=1`` and no Ray: in this process, one after another.
- ``workers=N``: ``N`` spawned processes. Each is a one-process
  :class:`~concurrent.futures.ProcessPoolExecutor` of its own, because a pool whose worker dies is
  broken as a whole (every pending future fails); with one pool per worker a SIGKILL fails only
  the task that worker held, the pool is replaced and the other tasks go on. Spawned, never
  forked: a forked MuJoCo or EGL context is undefined behaviour.
- ``ray_address``: Ray tasks on the cluster at that address (``ray.init(address=...)``); Ray is
  the optional ``[ray]`` extra, imported only here and only then.

A task's exception never escapes: its outcome carries it as text (``Type: message``), so one bad
episode does not lose the others; nor does a task that runs past ``timeout_s`` (its worker is
killed). Interrupting the parent (Ctrl-C) does escape, after the workers are stopped. A pool
worker dies with its parent (:mod:`hilrec.daemon.procs`), so a killed ``hilrec`` leaves none behind.
"""

from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import logging
import multiprocessing
import os
import signal
import socket
import time
from collections.abc import Callable, Sequence
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Any, Final, Generic, TypeVar

from hilrec.daemon import procs
from hilrec.daemon.errors import FanoutError

T = TypeVar("T")
R = TypeVar("R")

# A task that has not finished after this long is failed (its pool worker killed, its Ray task
# cancelled). It bounds a lost node or a wedged worker, not the work: one sim episode with video
# takes seconds to a minute.
TASK_TIMEOUT_S: Final[float] = 3600.0
# A pool worker told to stop that is still running after this long (its exit hooks wedged) is killed.
EXIT_TIMEOUT_S: Final[float] = 30.0
RAY_INSTALL_HINT: Final[str] = "pip install hilrec[ray]"
RAY_CONNECT_TIMEOUT_S: Final[float] = 5.0


@dataclass(frozen=True, kw_only=True)
class TaskOutcome(Generic[R]):
    """What became of one task: ``result`` on success, else ``error``."""

    index: int  # position in the input
    result: R | None  # None when failed
    error: str | None  # the worker's exception as text (type: message), None on success

    @property
    def ok(self) -> bool:
        return self.error is None


def run_tasks(
    func: Callable[[T], R],
    items: Sequence[T],
    *,
    workers: int = 1,
    ray_address: str | None = None,
    on_done: Callable[[TaskOutcome[R]], None] | None = None,
    timeout_s: float = TASK_TIMEOUT_S,
) -> list[TaskOutcome[R]]:
    """Run ``func`` on every item; the outcomes in input order, ``on_done`` in completion order.

    ``func`` must be a module-level function (it is pickled by reference into the workers), and
    its argument and result picklable. With ``ray_address`` the tasks go to Ray and ``workers``
    is not used: the cluster's resources decide how many run at once.

    With ``on_done`` the result is the callback's: the returned outcomes keep ``index`` and
    ``error`` but their ``result`` is None, so results as big as a recording are not all held at
    once. A task in a pool worker or on Ray that runs past ``timeout_s`` fails (its worker is
    killed, its Ray task cancelled); in this process (``workers=1``) nothing can stop it.
    """
    if workers < 1:
        raise FanoutError(f"workers must be at least 1, got {workers}")
    if not timeout_s > 0:
        raise FanoutError(f"timeout_s must be positive, got {timeout_s}")
    if not items:
        return []
    if ray_address is not None:
        return _run_ray(func, items, ray_address, on_done, timeout_s)
    if workers == 1:
        return _run_here(func, items, on_done)
    return _run_pool(func, items, min(workers, len(items)), on_done, timeout_s)


def describe(exc: BaseException) -> str:
    """An exception as one line of text: ``Type: message``."""
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _call(func: Callable[[T], R], item: T) -> tuple[R | None, str | None]:
    """``func(item)`` in a worker, its exception turned into text there: an exception crosses
    back to the parent only if it pickles, and one whose ``__init__`` takes other arguments than
    its message (most of hilrec's) does not."""
    try:
        return func(item), None
    except Exception as exc:  # noqa: BLE001 - a task's failure is its outcome
        return None, describe(exc)


def _finish(
    outcomes: list[TaskOutcome[R] | None],
    outcome: TaskOutcome[R],
    on_done: Callable[[TaskOutcome[R]], None] | None,
) -> None:
    if on_done is None:
        outcomes[outcome.index] = outcome
        return
    # Stored without its result before the callback runs: the callback has it, and an
    # exception from it must not leave a whole recording held here either.
    outcomes[outcome.index] = dataclasses.replace(outcome, result=None)
    on_done(outcome)


def _gathered(outcomes: list[TaskOutcome[R] | None]) -> list[TaskOutcome[R]]:
    done = [o for o in outcomes if o is not None]
    if len(done) != len(outcomes):
        raise FanoutError(f"{len(outcomes) - len(done)} task(s) ended with no outcome")
    return done


def _run_here(
    func: Callable[[T], R], items: Sequence[T], on_done: Callable[[TaskOutcome[R]], None] | None
) -> list[TaskOutcome[R]]:
    outcomes: list[TaskOutcome[R] | None] = [None] * len(items)
    for index, item in enumerate(items):
        result, error = _call(func, item)
        _finish(outcomes, TaskOutcome(index=index, result=result, error=error), on_done)
    return _gathered(outcomes)


# --- process pool ------------------------------------------------------------------------------


def _worker_init(parent: int) -> None:
    # Ctrl-C reaches the whole foreground process group; only the parent decides what it means
    # (keep what is saved, stop the workers), so a worker must not die of it half-way.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # SIGKILL when the parent dies: else a killed ``hilrec`` leaves its workers recording into a
    # dataset nobody adopts, for good. ``parent`` is the pid the parent took before the spawn.
    procs.die_with(parent, signal.SIGKILL)


def _new_slot() -> cf.ProcessPoolExecutor:
    # Workers are started by submit(), on the thread that calls run_tasks: PDEATHSIG follows
    # that thread, which outlives them.
    return cf.ProcessPoolExecutor(
        max_workers=1,
        mp_context=multiprocessing.get_context("spawn"),
        initializer=_worker_init,
        initargs=(os.getpid(),),
    )


def _slot_lost(slot: cf.ProcessPoolExecutor) -> bool:
    """Whether the slot's worker died while it held no task (the pool may not know yet)."""
    processes: dict[int, Any] = getattr(slot, "_processes", None) or {}
    return any(not process.is_alive() for process in list(processes.values()))


def _stop_slot(slot: cf.ProcessPoolExecutor, *, kill: bool) -> None:
    """Stop the slot's worker: at once with ``kill``, else after its exit hooks, but killed all
    the same once :data:`EXIT_TIMEOUT_S` has passed (a wedged exit must not hold the parent)."""
    # Python 3.14 has ProcessPoolExecutor.kill_workers(); before it the only handle on the
    # worker processes is the pool's own table (gone after shutdown()).
    processes = [procs.PoolChild(p) for p in (getattr(slot, "_processes", None) or {}).values()]
    if kill:
        for process in processes:
            procs.stop(process, 0.0, signum=None)
    slot.shutdown(wait=False, cancel_futures=True)
    deadline = time.monotonic() + EXIT_TIMEOUT_S
    for process in processes:
        procs.stop(process, max(0.0, deadline - time.monotonic()), signum=None)


def _run_pool(
    func: Callable[[T], R],
    items: Sequence[T],
    workers: int,
    on_done: Callable[[TaskOutcome[R]], None] | None,
    timeout_s: float,
) -> list[TaskOutcome[R]]:
    outcomes: list[TaskOutcome[R] | None] = [None] * len(items)
    queue = list(range(len(items)))[::-1]  # popped from the end: input order
    slots = [_new_slot() for _ in range(workers)]
    idle = list(range(workers))
    running: dict[cf.Future[tuple[R | None, str | None]], tuple[int, int, float]] = {}
    # running: future -> (slot, item, deadline)

    def replace_slot(slot: int) -> None:
        _stop_slot(slots[slot], kill=True)
        slots[slot] = _new_slot()

    def submit(slot: int, index: int) -> cf.Future[tuple[R | None, str | None]]:
        if _slot_lost(slots[slot]):
            replace_slot(slot)
        try:
            return slots[slot].submit(_call, func, items[index])
        except BrokenProcessPool:  # its worker died between tasks: the task has not run
            replace_slot(slot)
            return slots[slot].submit(_call, func, items[index])

    failed = True
    try:
        while queue or running:
            while queue and idle:
                slot, index = idle.pop(), queue.pop()
                running[submit(slot, index)] = (slot, index, time.monotonic() + timeout_s)
            first_deadline = min(deadline for _, _, deadline in running.values())
            wait_s = max(0.0, first_deadline - time.monotonic())
            done, _ = cf.wait(running, timeout=wait_s, return_when=cf.FIRST_COMPLETED)
            now = time.monotonic()
            expired = [f for f, (_, _, deadline) in running.items() if f not in done and deadline <= now]
            for future in sorted([*done, *expired], key=lambda f: running[f][1]):
                slot, index, _ = running.pop(future)
                if future in done:
                    outcome = _pool_outcome(future, index)
                    if isinstance(future.exception(), BrokenProcessPool):
                        replace_slot(slot)
                else:
                    replace_slot(slot)  # the only way to stop a task in a worker is its worker
                    error = f"task {index} gave no result within {timeout_s:g} s (timeout_s): worker killed"
                    outcome = TaskOutcome(index=index, result=None, error=error)
                idle.append(slot)
                _finish(outcomes, outcome, on_done)
        failed = False
    finally:
        for executor in slots:
            _stop_slot(executor, kill=failed)
    return _gathered(outcomes)


def _pool_outcome(future: cf.Future[tuple[R | None, str | None]], index: int) -> TaskOutcome[R]:
    exc = future.exception()
    if exc is None:
        result, error = future.result()
        return TaskOutcome(index=index, result=result, error=error)
    if isinstance(exc, BrokenProcessPool):
        died = f"worker process died while running task {index} (killed, out of memory or crashed)"
        return TaskOutcome(index=index, result=None, error=f"{died}: {describe(exc)}")
    return TaskOutcome(index=index, result=None, error=describe(exc))


# --- Ray ---------------------------------------------------------------------------------------


def check_ray_address(address: str) -> None:
    """FanoutError unless Ray is installed and something listens at ``address`` (``host:port``;
    ``auto`` and ``ray://`` addresses are left to Ray). ``ray.init`` itself retries an address
    where nothing listens for minutes; a caller checks first, before it makes anything."""
    try:
        import ray  # noqa: F401 - only whether it is there
    except ImportError as exc:
        raise FanoutError(f"--ray {address}: Ray is not installed ({exc}); {RAY_INSTALL_HINT}") from exc
    host, sep, port = address.rpartition(":")
    if address == "auto" or "://" in address:
        return
    if not sep or not host or not port.isdigit():
        raise FanoutError(f"--ray {address}: expected HOST:PORT of the cluster's head, or 'auto'")
    try:
        socket.create_connection((host, int(port)), timeout=RAY_CONNECT_TIMEOUT_S).close()
    except OSError as exc:
        raise FanoutError(
            f"--ray {address}: no Ray head answers there ({exc.strerror or exc}); start one with "
            f"'ray start --head --port {port}' on {host}, or check the address"
        ) from None


def _run_ray(
    func: Callable[[T], R],
    items: Sequence[T],
    address: str,
    on_done: Callable[[TaskOutcome[R]], None] | None,
    timeout_s: float,
) -> list[TaskOutcome[R]]:
    check_ray_address(address)
    import ray
    import ray.exceptions

    try:
        ray.init(address=address, log_to_driver=False, logging_level=logging.WARNING)
    except (ConnectionError, ValueError, RuntimeError) as exc:
        raise FanoutError(f"--ray {address}: cannot join the Ray cluster: {describe(exc)}") from exc
    outcomes: list[TaskOutcome[R] | None] = [None] * len(items)
    try:
        # No retries: a task whose worker died fails like a pool worker's, and the caller says
        # which items to run again, instead of Ray re-running an episode behind its back.
        remote: Any = ray.remote(max_retries=0)(_call)
        index_of = {remote.remote(func, item): index for index, item in enumerate(items)}
        pending = list(index_of)
        while pending:
            done, pending = ray.wait(pending, num_returns=1, timeout=timeout_s)
            if not done:
                for ref in pending:
                    ray.cancel(ref, force=True)
                    error = f"no result from the Ray cluster at {address} within {timeout_s:g} s (timeout_s)"
                    _finish(outcomes, TaskOutcome(index=index_of.pop(ref), result=None, error=error), on_done)
                break
            for ref in done:
                # Dropped from the table once read: the object store frees a result nobody refers to.
                index = index_of.pop(ref)
                _finish(outcomes, _ray_outcome(ray, ref, index, timeout_s), on_done)
            del done
    finally:
        ray.shutdown()
    return _gathered(outcomes)


def _ray_outcome(ray: Any, ref: Any, index: int, timeout_s: float) -> TaskOutcome[Any]:
    try:
        result, error = ray.get(ref, timeout=timeout_s)
        return TaskOutcome(index=index, result=result, error=error)
    except ray.exceptions.RayError as exc:  # the worker died, the node was lost, a timeout
        return TaskOutcome(index=index, result=None, error=f"Ray task {index}: {describe(exc)}")
