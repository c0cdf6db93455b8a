"""Suite-wide settings: offscreen MuJoCo on Mesa EGL, no hub access for LeRobot, and no test
leaving real-time threads behind for the next."""

import contextlib
import os
import signal
from collections.abc import Iterator

import pytest

# One session fixture for the whole suite: the fan-out and the replay tests share the cluster.
from support.ray_cluster import (  # noqa: F401  (fixtures, found by their names here)
    CLUSTER_FIXTURE,
    ray_address,
    ray_cluster,
    stop_after_its_last_user,
)

from hilrec.daemon.dataset.video.codec_threads import thread_ids

os.environ.setdefault("MUJOCO_GL", "egl")
os.environ.setdefault("PYOPENGL_PLATFORM", "egl")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

# A run started in the background by a script (`pytest ... &` without job control, nohup-like
# launchers) inherits SIGINT ignored, and Python keeps it so: every Ctrl-C a test sends, to this
# process or to a child that inherits the disposition through exec, would vanish. Python's own
# handler here: a caught signal is reset to the default on exec, so children get it too.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

REAL_TIME_POLICIES = (os.SCHED_FIFO, os.SCHED_RR)


def put_back_real_time_threads() -> list[int]:
    """Every thread of this process that runs real-time, put back to SCHED_OTHER; their ids.

    SVT-AV1 raises the thread that opens it to SCHED_FIFO 99 where it may (root here), and a
    child inherits its creator's policy: after a test that encodes AV1 in this process (LeRobot's
    own writer does), every later test's children, the busy loops that load the machine among
    them, started at FIFO 99, above the emulators they were to compete with (CI failed so).
    """
    moved = []
    for tid in thread_ids():
        with contextlib.suppress(OSError):  # a thread that has just ended
            if os.sched_getscheduler(tid) in REAL_TIME_POLICIES:
                os.sched_setscheduler(tid, os.SCHED_OTHER, os.sched_param(0))
                moved.append(tid)
    return moved


@pytest.fixture(autouse=True)
def _no_real_time_left_behind() -> Iterator[None]:
    put_back_real_time_threads()
    yield
    put_back_real_time_threads()


def _one_worker_group(item: pytest.Item) -> str | None:
    """The xdist group that keeps ``item`` on the worker that already built its fixtures.

    Under ``pytest -n`` every worker builds the session and module fixtures its own tests ask for:
    a Ray cluster, a recorded dataset, a live daemon. A test that uses one of this suite's session
    fixtures is grouped by that fixture (one build for the run), a test that uses a module fixture
    by its module (one build per module); every other test goes to whichever worker is free.
    """
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return None
    if CLUSTER_FIXTURE in info.names_closure:
        # First the fixture that runs processes: its users, one run of them on one worker, share
        # one cluster (a test that also reads a session dataset would otherwise go by that).
        return f"session:{CLUSTER_FIXTURE}"
    module_scoped = False
    for name in info.names_closure:
        for fixturedef in info.name2fixturedefs.get(name, ()):
            if not fixturedef.baseid.startswith("tests"):
                continue  # pytest's own and plugins' (tmp_path_factory, ...): cheap
            if fixturedef.scope == "session":
                return f"session:{name}"
            module_scoped = module_scoped or fixturedef.scope in ("module", "class", "package")
    return f"module:{_module_of(item)}" if module_scoped else None


def _module_of(item: pytest.Item) -> str:
    return item.nodeid.split("::", 1)[0]


def _run_order(items: list[pytest.Item]) -> list[pytest.Item]:
    """The modules with a slow test first, then the fast ones, each in collection order.

    In plain collection order the browser test started in the last minute and the suite ended on
    it alone (27 s between the first and the last worker to finish); with the fast tests last the
    workers ended within 6 s of each other. Their 50 CPU-s are small enough to fill that end."""
    slow_modules = {_module_of(item) for item in items if item.get_closest_marker("slow")}
    return sorted(items, key=lambda item: _module_of(item) not in slow_modules)


def pytest_configure(config: pytest.Config) -> None:
    # xdist would put the groups with the most tests first whatever the order given it.
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


# Before xdist's own hook, which reads the groups into the node ids it schedules by: after it, the
# markers came too late and no test was grouped (a module's live daemon was built on each worker
# that ran one of its tests, and a test that read what the module's earlier tests left failed).
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("xdist_group") is None and (group := _one_worker_group(item)):
            item.add_marker(pytest.mark.xdist_group(group))
    items[:] = _run_order(items)


# Last: after pytest's own teardown of the test's fixtures, so a stop that fails cannot keep them
# from being torn down.
@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    stop_after_its_last_user(item, nextitem)
