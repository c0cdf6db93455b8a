"""run_tasks: the same outcomes in input order however the tasks run; a dead worker fails only its task."""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

import pytest
from _tasks import square_or_fail

from hilrec.daemon.cli import main
from hilrec.daemon.errors import FanoutError
from hilrec.daemon.fanout import TaskOutcome, run_tasks


def test_in_process_keeps_order_and_turns_exceptions_into_outcomes() -> None:
    seen: list[int] = []
    outcomes = run_tasks(square_or_fail, [3, -1, 4], on_done=lambda o: seen.append(o.index))
    assert [o.index for o in outcomes] == [0, 1, 2]
    assert [o.result[0] if o.result else None for o in outcomes] == [9, None, 16]
    assert outcomes[1].error == "SimError: item -1 refused"
    assert {o.result[1] for o in outcomes if o.result} == {os.getpid()}
    assert seen == [0, 1, 2]


def test_pool_runs_in_other_processes_and_returns_input_order() -> None:
    done: list[TaskOutcome[tuple[int, int]]] = []
    items = list(range(7))
    outcomes = run_tasks(square_or_fail, items, workers=2, on_done=done.append)
    assert [o.result[0] for o in outcomes if o.result] == [i * i for i in items]
    pids = {o.result[1] for o in outcomes if o.result}
    assert os.getpid() not in pids
    assert len(pids) == 2
    assert sorted(o.index for o in done) == list(range(7))


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
