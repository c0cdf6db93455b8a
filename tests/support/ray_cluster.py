"""The suite's local Ray cluster: started on loopback with 2 CPUs for the tests that ask for
``ray_address``, stopped after the last of them.

One definition for every test that asks for it (tests/conftest.py imports it): the fan-out and
replay tests used to define it once each, and since pytest keeps a session fixture per
definition, a worker that ran both started two clusters and kept both to the session's end.

The cluster is started by the first test that asks for an address and stopped after a test that
asked when the next one does not (tests/conftest.py's ``pytest_runtest_teardown``): under
``--dist loadgroup`` its users are one group, run one after another on one worker, so it runs
for them only; it cost 4 % of a core idle, for the minutes the worker ran other tests. A later
user starts it again.

It is stopped by its process group, never with ``ray stop``: that stops every Ray cluster of the
user on this machine, another test run's too.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Generator, Iterator
from pathlib import Path

import pytest

RAY = Path(sys.executable).with_name("ray")
START_TIMEOUT_S = 120.0
# SIGTERM first; what still runs after this (the GCS server ignores it while it flushes) is killed.
STOP_TIMEOUT_S = 5.0
# A process SIGKILLed is gone (or a zombie) within this: a member still running after it fails.
KILL_TIMEOUT_S = 10.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def running(pid: int) -> bool:
    """Whether ``pid`` still runs: a zombie has ended."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] not in ("Z", "X")


def group_members(pgid: int) -> list[int]:
    """The processes of group ``pgid`` still running."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if os.getpgid(int(entry.name)) == pgid and running(int(entry.name)):
                members.append(int(entry.name))
        except ProcessLookupError:
            continue
    return members


# Ray replaces a loopback node address by the host's own unless told it runs a one-machine
# cluster (its switch for macOS and Windows): with it every socket binds to 127.0.0.1, and the
# driver (this process) looks for the node there too.
LOOPBACK_ONLY = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0"}


class RayCluster:
    """One local cluster at a time: :meth:`address` starts it if it is not running."""

    def __init__(self) -> None:
        self._running: Generator[str, None, None] | None = None
        self._address: str | None = None

    @property
    def running(self) -> bool:
        return self._running is not None

    def address(self) -> str:
        if self._running is None:
            running = start_cluster()
            self._address = next(running)
            self._running = running
        assert self._address is not None
        return self._address

    def stop(self) -> None:
        running, self._running, self._address = self._running, None, None
        if running is not None:
            running.close()  # the generator's finally: the group stopped, its folder removed


CLUSTER = RayCluster()
# The session fixture's name: its users are one xdist group (tests/conftest.py).
CLUSTER_FIXTURE = "ray_cluster"


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[RayCluster]:
    import ray._private.ray_constants as constants  # the [ray] extra is in the test environment

    saved = {key: os.environ.get(key) for key in LOOPBACK_ONLY}
    os.environ.update(LOOPBACK_ONLY)  # for `ray start` and the processes it starts
    # Ray read the switch when it was first imported, maybe before this fixture (an earlier
    # test's `import ray`): this process's copy of it is set too, else ray.init looks for the
    # node at the host's address and waits there for good.
    was = constants.ENABLE_RAY_CLUSTER
    constants.ENABLE_RAY_CLUSTER = False
    try:
        yield CLUSTER
    finally:
        CLUSTER.stop()
        constants.ENABLE_RAY_CLUSTER = was
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@pytest.fixture
def ray_address(ray_cluster: RayCluster) -> str:
    return ray_cluster.address()


def uses_the_cluster(item: pytest.Item | None) -> bool:
    """Whether ``item`` asks for the cluster, itself or through ``ray_address``."""
    return item is not None and CLUSTER_FIXTURE in getattr(item, "fixturenames", ())


def stop_after_its_last_user(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """After ``item``: the cluster stops if ``item`` used it and the next test will not."""
    if uses_the_cluster(item) and not uses_the_cluster(nextitem):
        CLUSTER.stop()


def start_cluster() -> Generator[str, None, None]:
    """A generator: its first value is the address; closing it stops the cluster."""
    temp = Path(tempfile.mkdtemp(prefix="hilrec-ray-", dir="/tmp"))  # socket paths stay short
    port = free_port()
    env = dict(os.environ)
    argv = [
        str(RAY),
        "start",
        "--head",
        "--node-ip-address=127.0.0.1",
        f"--port={port}",
        "--num-cpus=2",
        "--include-dashboard=false",
        "--disable-usage-stats",
        f"--temp-dir={temp}",
        # Every fixed default port moved to a free one, so two test runs can share the machine.
        f"--ray-client-server-port={free_port()}",
        f"--dashboard-port={free_port()}",
        f"--dashboard-agent-listen-port={free_port()}",
        f"--dashboard-agent-grpc-port={free_port()}",
        f"--runtime-env-agent-port={free_port()}",
        f"--metrics-export-port={free_port()}",
    ]
    # Its own process group (its pid): every daemon it leaves running is in it, and is stopped
    # with it, also when `ray start` itself times out half-way.
    starter = subprocess.Popen(
        argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    try:
        try:
            output, _ = starter.communicate(timeout=START_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            starter.kill()
            output, _ = starter.communicate()
            raise AssertionError(f"ray start took over {START_TIMEOUT_S:.0f} s: {output}") from None
        assert starter.returncode == 0, output
        yield f"127.0.0.1:{port}"
    finally:
        _stop_group(starter.pid)
        shutil.rmtree(temp, ignore_errors=True)


def _stop_group(pgid: int) -> None:
    """SIGTERM to the group, SIGKILL to what runs on after :data:`STOP_TIMEOUT_S`; an error if
    anything still runs :data:`KILL_TIMEOUT_S` later."""
    with_signal = signal.SIGTERM
    terminated = time.monotonic() + STOP_TIMEOUT_S
    while members := group_members(pgid):
        now = time.monotonic()
        if now > terminated:
            with_signal = signal.SIGKILL
        assert now < terminated + KILL_TIMEOUT_S, f"Ray processes {members} survive SIGKILL"
        for pid in members:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, with_signal)
        time.sleep(0.2)  # polling the group until it is empty, not waiting for an outcome
