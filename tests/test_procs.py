"""hilrec's child processes (daemon/procs.py): they die with their parent, even one that died
before the child could ask, and a stop ends them within its deadline.

The parent-death cases run in a driver process of their own that makes itself a *subreaper*
(PR_SET_CHILD_SUBREAPER, as a container's init or ``systemd --user`` is): an orphan is then
adopted by the driver, not by init, so its parent's pid is not 1, and the driver can wait for it
and read how it ended. Every wait is bounded.
"""

from __future__ import annotations

import json
import multiprocessing
import signal
import subprocess
import sys
import textwrap
import time
from typing import Any

import pytest

from hilrec.daemon import procs

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux's parent-death signal")

BOUND_S = 30.0

# The driver: a subreaper that starts PARENT, learns the grandchild's pid from a pipe, SIGKILLs
# PARENT, then waits for the adopted grandchild and prints how it ended as JSON.
DRIVER = textwrap.dedent(
    """
    import ctypes, json, os, select, signal, subprocess, sys, time

    PR_SET_CHILD_SUBREAPER = 36
    assert ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    bound = float(sys.argv[2])
    r, w = os.pipe()
    parent = subprocess.Popen([sys.executable, "-c", sys.argv[1], str(w)], pass_fds=(w,))
    os.close(w)
    ready, _, _ = select.select([r], [], [], bound)
    line = os.read(r, 64).decode() if ready else ""
    if not line.strip():
        parent.kill()
        print(json.dumps({"error": "no grandchild pid", "parent": parent.wait()}))
        sys.exit(0)
    child = int(line.split()[0])
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait()
    deadline = time.monotonic() + bound
    while True:
        pid, status = os.waitpid(child, os.WNOHANG)  # adopted: ours to wait for
        if pid == child:
            break
        if time.monotonic() > deadline:
            os.kill(child, signal.SIGKILL)
            os.waitpid(child, 0)
            print(json.dumps({"alive_after_s": bound}))
            sys.exit(0)
        time.sleep(0.01)
    print(json.dumps({
        "exit": os.WEXITSTATUS(status) if os.WIFEXITED(status) else None,
        "signal": os.WTERMSIG(status) if os.WIFSIGNALED(status) else None,
    }))
    """
)

# PARENT, in the first case: its child's pre-exec step announces the child and waits (bounded)
# until PARENT is dead, so the prctl comes after the parent died, every time.
DIES_BEFORE_THE_PRCTL = textwrap.dedent(
    """
    import os, sys, time
    from hilrec.daemon import procs

    w, me = int(sys.argv[1]), os.getpid()

    def announce_then_outlive_the_parent():
        os.write(w, b"%d\\n" % os.getpid())
        deadline = time.monotonic() + 30
        while os.getppid() == me and time.monotonic() < deadline:
            time.sleep(0.005)

    procs.start(
        [sys.executable, "-c", "import time; time.sleep(60)"],
        first=(announce_then_outlive_the_parent,),
        pass_fds=(w,),
    )
    time.sleep(60)  # never reached in the test: Popen waits for the exec, and PARENT is killed first
    """
)

# PARENT, in the second case: the child is started and running when PARENT is killed.
DIES_AFTER_THE_START = textwrap.dedent(
    """
    import os, sys, time
    from hilrec.daemon import procs

    w = int(sys.argv[1])
    child = procs.start([sys.executable, "-c", "import time; time.sleep(60)"])
    os.write(w, b"%d\\n" % child.pid)
    time.sleep(60)
    """
)


def drive(parent_code: str) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-c", DRIVER, parent_code, str(BOUND_S)],
        capture_output=True,
        text=True,
        timeout=3 * BOUND_S,
        check=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_parent_killed_before_its_childs_prctl_leaves_no_child() -> None:
    """The child compares its parent with the pid taken in the parent before the fork: the
    orphan's new parent is the subreaper (not 1), and the child exits before its exec."""
    ended = drive(DIES_BEFORE_THE_PRCTL)
    assert ended == {"exit": procs.ORPHAN_EXIT, "signal": None}, ended


def test_a_child_gets_its_death_signal_when_the_parent_is_killed() -> None:
    ended = drive(DIES_AFTER_THE_START)
    assert ended == {"exit": None, "signal": int(signal.SIGTERM)}, ended


@pytest.mark.parametrize("parent_is_mine", [True, False])
def test_die_with_checks_the_parent_it_was_given(parent_is_mine: bool) -> None:
    """A pool worker is told its parent's pid; one whose parent is another is orphaned already."""
    code = (
        "import os, sys; from hilrec.daemon import procs; "
        f"procs.die_with(os.getppid() if {parent_is_mine} else 0); print('alive')"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=BOUND_S
    )
    if parent_is_mine:
        assert (done.returncode, done.stdout.strip()) == (0, "alive"), done.stderr
    else:
        assert (done.returncode, done.stdout) == (procs.ORPHAN_EXIT, ""), done.stderr


def _started(code: str, **popen: Any) -> subprocess.Popen[str]:
    """A python child that prints 'ready' once set up (its signal dispositions in place)."""
    child = procs.start([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, **popen)
    assert child.stdout is not None
    assert child.stdout.readline().strip() == "ready"
    return child


def test_stop_asks_with_sigterm_first() -> None:
    child = _started("import time; print('ready', flush=True); time.sleep(60)")
    assert procs.stop(child, BOUND_S) == procs.Stopped(-signal.SIGTERM, killed=False)


def test_stop_kills_a_child_that_ignores_the_ask_once_the_deadline_passes() -> None:
    child = _started(
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "print('ready', flush=True); time.sleep(60)"
    )
    assert procs.stop(child, 0.2) == procs.Stopped(-signal.SIGKILL, killed=True)


def test_stop_without_a_signal_waits_for_the_ask_made_another_way() -> None:
    child = _started(
        "import sys; print('ready', flush=True); sys.stdin.read(); sys.exit(3)", stdin=subprocess.PIPE
    )
    assert child.stdin is not None
    child.stdin.close()  # EOF: the child's own way of being asked to end
    assert procs.stop(child, BOUND_S, signum=None) == procs.Stopped(3, killed=False)


def test_stop_of_a_child_that_has_ended_reports_its_status() -> None:
    child = procs.start([sys.executable, "-c", "raise SystemExit(4)"])
    child.wait(BOUND_S)
    assert procs.stop(child, 0.0) == procs.Stopped(4, killed=False)


def test_stop_ends_a_pool_worker_too() -> None:
    process = multiprocessing.get_context("spawn").Process(target=time.sleep, args=(60,))
    process.start()
    try:
        ended = procs.stop(procs.PoolChild(process), BOUND_S)
    finally:
        if process.is_alive():
            process.kill()
        process.join(BOUND_S)
    assert ended == procs.Stopped(-signal.SIGTERM, killed=False)


# A handler entered while the event's lock is held: what a second death signal does to a first
# handler that is inside ``Event.set`` (a SIGKILLed multi-threaded parent sends one per thread).
NESTED_SIGNAL = textwrap.dedent(
    """
    import os, signal, sys, threading
    from hilrec.daemon import procs

    stop = threading.Event()
    if sys.argv[1] == "stop_on_signals":
        procs.stop_on_signals(stop)
    else:
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
    print("ready", flush=True)
    with stop._cond:  # the lock Event.set takes, held by this thread as by the outer handler
        os.kill(os.getpid(), signal.SIGTERM)  # CPython runs the handler before kill returns
    print("stopped" if stop.wait(10) else "not stopped", flush=True)
    """
)


@pytest.mark.parametrize("handler", ["stop_on_signals", "event_set"])
@pytest.mark.slow
def test_a_signal_that_nests_in_a_handler_still_stops(handler: str) -> None:
    # A loaded machine can only make the hanging case look more hung, so its bound is short.
    bound_s = BOUND_S if handler == "stop_on_signals" else 3.0
    try:
        done = subprocess.run(
            [sys.executable, "-c", NESTED_SIGNAL, handler],
            check=False,
            capture_output=True,
            text=True,
            timeout=bound_s,
        )
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else exc.stdout or ""
        # Hung in the handler, not still starting on a loaded machine.
        outcome = "hung" if out.strip() == "ready" else f"not started in {bound_s} s"
    else:
        outcome = done.stdout.strip().removeprefix("ready").strip() or done.stderr
    # Event.set straight from the handler waits forever for a lock its own thread holds.
    assert outcome == ("stopped" if handler == "stop_on_signals" else "hung")


def test_a_forked_child_ends_on_the_signal_and_the_parent_is_not_stopped() -> None:
    code = textwrap.dedent(
        """
        import os, signal, threading
        from hilrec.daemon import procs

        stop = threading.Event()
        procs.stop_on_signals(stop)
        pid = os.fork()
        if pid == 0:
            os.kill(os.getpid(), signal.SIGTERM)
            os._exit(7)  # reached only if the signal did not end the child
        _, status = os.waitpid(pid, 0)
        print(os.WTERMSIG(status) if os.WIFSIGNALED(status) else -1, stop.wait(0.5), flush=True)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=BOUND_S
    )
    assert done.stdout.split() == [str(int(signal.SIGTERM)), "False"], done.stderr


def test_stop_on_signals_outside_the_main_thread_is_refused_before_it_starts_anything() -> None:
    import threading

    errors: list[BaseException] = []
    before = threading.active_count()

    def install() -> None:
        try:
            procs.stop_on_signals(threading.Event())
        except ValueError as exc:
            errors.append(exc)

    thread = threading.Thread(target=install)
    thread.start()
    thread.join(BOUND_S)
    assert len(errors) == 1 and "main thread" in str(errors[0])
    assert threading.active_count() == before
