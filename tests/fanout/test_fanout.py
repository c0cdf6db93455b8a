"""run_tasks: the same outcomes in input order however the tasks run; a dead worker fails only its task."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _procs import spawn_workers, still_running_after
from _tasks import square_or_fail

from hilrec.daemon.cli import main
from hilrec.daemon.errors import FanoutError
from hilrec.daemon.fanout import TaskOutcome, run_tasks

HERE = Path(__file__).parent
# Long enough for a spawned worker to start and square a number on a loaded machine.
TIMEOUT_S = 10.0
START_WITHIN_S = 60.0
DEATH_WITHIN_S = 10.0


def test_in_process_keeps_order_and_turns_exceptions_into_outcomes() -> None:
    seen: list[int] = []
    outcomes = run_tasks(square_or_fail, [3, -1, 4])
    assert [o.index for o in outcomes] == [0, 1, 2]
    assert [o.result[0] if o.result else None for o in outcomes] == [9, None, 16]
    assert outcomes[1].error == "SimError: item -1 refused"
    assert {o.result[1] for o in outcomes if o.result} == {os.getpid()}
    run_tasks(square_or_fail, [3, -1, 4], on_done=lambda o: seen.append(o.index))
    assert seen == [0, 1, 2]


def test_pool_runs_in_other_processes_and_returns_input_order() -> None:
    items = list(range(7))
    outcomes = run_tasks(square_or_fail, items, workers=2)
    assert [o.result[0] for o in outcomes if o.result] == [i * i for i in items]
    pids = {o.result[1] for o in outcomes if o.result}
    assert os.getpid() not in pids
    assert len(pids) == 2


def test_a_killed_worker_fails_only_its_task() -> None:
    items = [1, 2, -9, 4, 5, -1, 7]
    outcomes = run_tasks(square_or_fail, items, workers=2)
    failed = {o.index: o.error for o in outcomes if not o.ok}
    assert set(failed) == {2, 5}
    assert "worker process died while running task 2" in (failed[2] or "")
    assert failed[5] == "SimError: item -1 refused"
    assert [o.result[0] for o in outcomes if o.result] == [1, 4, 16, 25, 49]


def test_an_error_that_does_not_unpickle_fails_only_its_task() -> None:
    outcomes = run_tasks(square_or_fail, [-2, 3], workers=2)
    assert outcomes[0].error == "CorruptDatasetError: item--2.parquet: no footer"
    assert outcomes[1].result is not None and outcomes[1].result[0] == 9


def test_bad_worker_count_is_refused() -> None:
    with pytest.raises(FanoutError, match="at least 1"):
        run_tasks(square_or_fail, [1], workers=0)


@pytest.mark.slow
def test_a_ray_address_where_nothing_listens_is_refused_at_once(tmp_path: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound, never listening: refused
        with pytest.raises(FanoutError, match="no Ray head answers there"):
            run_tasks(square_or_fail, [1], ray_address=f"127.0.0.1:{port}")
        # record --sim checks before it makes the destination: nothing is left to --resume.
        root = tmp_path / "ds"
        argv = ["record", "--sim", "--root", str(root), "--episodes", "1", "--ray", f"127.0.0.1:{port}"]
        assert main(argv) == 2
    assert not root.exists()


def test_missing_ray_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # what `import ray` sees where it is not installed
    with pytest.raises(FanoutError, match=r"pip install hilrec\[ray\]"):
        run_tasks(square_or_fail, [1], ray_address="127.0.0.1:1")


def test_with_on_done_the_results_are_the_callbacks_alone() -> None:
    done: list[TaskOutcome[tuple[int, int]]] = []
    outcomes = run_tasks(square_or_fail, [1, 2, -1, 4], workers=2, on_done=done.append)
    assert sorted((o.index, o.result[0] if o.result else None) for o in done) == [
        (0, 1),
        (1, 4),
        (2, None),
        (3, 16),
    ]
    # Kept once handed over, every result (a whole recording in record --sim) would be held twice.
    assert [(o.index, o.ok, o.result) for o in outcomes] == [
        (0, True, None),
        (1, True, None),
        (2, False, None),
        (3, True, None),
    ]
    assert outcomes[2].error == "SimError: item -1 refused"


@pytest.mark.slow  # > 5 s (make test-fast leaves it out)
def test_a_task_past_its_timeout_is_failed_and_its_worker_killed() -> None:
    outcomes = run_tasks(square_or_fail, [-5, 3, 4], workers=2, timeout_s=TIMEOUT_S)
    assert outcomes[0].error == f"task 0 gave no result within {TIMEOUT_S:g} s (timeout_s): worker killed"
    assert [o.result[0] if o.result else None for o in outcomes] == [None, 9, 16]


def test_a_worker_dead_between_tasks_costs_no_task() -> None:
    killed: list[int] = []

    def kill_the_worker(outcome: TaskOutcome[tuple[int, int]]) -> None:
        # After its task, before the next is handed to it: the slot's worker dies idle.
        if outcome.index == 0 and outcome.result is not None:
            pid = outcome.result[1]
            os.kill(pid, signal.SIGKILL)
            assert not still_running_after([pid], DEATH_WITHIN_S), f"worker {pid} survives SIGKILL"
            killed.append(pid)

    outcomes = run_tasks(square_or_fail, [1, 2, 3, 4, 5], workers=2, on_done=kill_the_worker)
    assert killed
    assert [(o.index, o.error) for o in outcomes] == [(i, None) for i in range(5)]


def test_pool_workers_die_with_their_parent(tmp_path: Path) -> None:
    # A parent that starts two pool workers busy for good, then is SIGKILLed.
    script = (
        "import sys; sys.path.insert(0, sys.argv[1]);"
        "from _tasks import square_or_fail; from hilrec.daemon.fanout import run_tasks;"
        "run_tasks(square_or_fail, [-5, -5], workers=2)"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), *sys.path])}
    parent = subprocess.Popen([sys.executable, "-c", script, str(HERE)], env=env, start_new_session=True)
    try:
        workers: list[int] = []
        deadline = time.monotonic() + START_WITHIN_S
        while len(workers) < 2:
            assert parent.poll() is None and time.monotonic() < deadline, "no two workers started"
            workers = spawn_workers(parent.pid)
            time.sleep(0.05)  # polling for the workers, bounded
    finally:
        parent.kill()
        parent.wait()
    alive = still_running_after(workers, DEATH_WITHIN_S)
    assert not alive, f"workers {alive} outlive their parent"
