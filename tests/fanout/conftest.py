"""A local Ray cluster for the fan-out tests: started on loopback with 2 CPUs, stopped after.

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
from collections.abc import Iterator
from pathlib import Path

import pytest

RAY = Path(sys.executable).with_name("ray")
# SIGTERM first; what still runs after this (the GCS server ignores it while it flushes) is killed.
STOP_TIMEOUT_S = 5.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def group_members(pgid: int) -> list[int]:
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if os.getpgid(int(entry.name)) == pgid:
                members.append(int(entry.name))
        except ProcessLookupError:
            continue
    return members


# Ray replaces a loopback node address by the host's own unless told it runs a one-machine
# cluster (its switch for macOS and Windows): with it every socket binds to 127.0.0.1, and the
# driver (this process) looks for the node there too.
LOOPBACK_ONLY = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0"}


@pytest.fixture(scope="session")
def ray_address() -> Iterator[str]:
    import ray._private.ray_constants as constants  # the [ray] extra is in the test environment

    saved = {key: os.environ.get(key) for key in LOOPBACK_ONLY}
    os.environ.update(LOOPBACK_ONLY)  # for `ray start` and the processes it starts
    # Ray read the switch when it was first imported, maybe before this fixture (an earlier
    # test's `import ray`): this process's copy of it is set too, else ray.init looks for the
    # node at the host's address and waits there for good.
    was = constants.ENABLE_RAY_CLUSTER
    constants.ENABLE_RAY_CLUSTER = False
    try:
        yield from _cluster()
    finally:
        constants.ENABLE_RAY_CLUSTER = was
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _cluster() -> Iterator[str]:
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
    # Its own process group: every daemon it leaves running is in it, and is stopped with it.
    started = subprocess.run(
        argv, env=env, capture_output=True, text=True, start_new_session=True, timeout=120, check=False
    )
    pgid = _pgid_of_session(started, temp)
    try:
        assert started.returncode == 0, started.stdout + started.stderr
        yield f"127.0.0.1:{port}"
    finally:
        _stop_group(pgid)
        shutil.rmtree(temp, ignore_errors=True)


def _pgid_of_session(started: subprocess.CompletedProcess[str], temp: Path) -> int:
    """The process group ``ray start`` ran in (its pid, gone by now): found from a daemon of it."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if str(temp).encode() in cmdline:
            return os.getpgid(int(entry.name))
    raise AssertionError(f"no Ray process runs with {temp}: {started.stdout}{started.stderr}")


def _stop_group(pgid: int) -> None:
    with_signal = signal.SIGTERM
    deadline = time.monotonic() + STOP_TIMEOUT_S
    while members := group_members(pgid):
        if time.monotonic() > deadline:
            with_signal = signal.SIGKILL
        for pid in members:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, with_signal)
        time.sleep(0.2)  # polling the group until it is empty, not waiting for an outcome
    assert not group_members(pgid)
