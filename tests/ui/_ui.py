"""A ``hilrec ui`` under test: the real sub-command in a subprocess, reached over HTTP only."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _daemon import Daemon, free_ports

START_TIMEOUT_S = 60.0
ARTIFACTS = Path(__file__).parent / "artifacts"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
TOKEN = "bench-token-0123456789abcdef"


def chromium() -> str:
    path = shutil.which("chromium")
    if path is None:
        pytest.fail("Debian's chromium is needed: apt-get update && apt-get install -y chromium")
    return path


class Ui:
    """``hilrec ui --config CONFIG --port P [--host H] [--token T]``; every wait is bounded."""

    def __init__(
        self, config: Path, log_dir: Path, *, host: str = "127.0.0.1", token: str | None = None
    ) -> None:
        self.config = config
        self.host = host
        self.token = token
        [self.port] = free_ports(1)
        self.log_path = log_dir / f"ui-{self.port}.log"
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        cmd = [sys.executable, "-m", "hilrec.daemon.cli", "ui", "--config", str(self.config)]
        cmd += ["--host", self.host, "--port", str(self.port)]
        return cmd + (["--token", self.token] if self.token is not None else [])

    def start(self) -> Ui:
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(
                self.command(), stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ)
            )
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if self.process.poll() is not None:
                raise AssertionError(f"hilrec ui exited with {self.process.returncode}:\n{self.log()}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return self
            except OSError:
                if time.monotonic() > deadline:
                    raise AssertionError(
                        f"hilrec ui not listening after {START_TIMEOUT_S} s:\n{self.log()}"
                    ) from None
                time.sleep(0.1)  # poll interval between bounded connection attempts

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def printed_url(self) -> str:
        """The URL ``hilrec ui`` printed at start, token included (as a person copies it)."""
        deadline = time.monotonic() + START_TIMEOUT_S
        while (found := re.search(r"^hilrec ui: (http://\S+)", self.log(), re.MULTILINE)) is None:
            if time.monotonic() > deadline:
                raise AssertionError(f"hilrec ui printed no URL in {START_TIMEOUT_S} s:\n{self.log()}")
            time.sleep(0.05)  # poll interval between reads of the log
        return found.group(1)

    def printed_token(self) -> str:
        return self.printed_url().split("?token=", 1)[1]

    def close(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)


def on_the_same_ports(first: Daemon, first_config: str, tmp_path: Path, config: str) -> Daemon:
    """A second daemon that takes over ``first``'s sockets (a restart with another config)."""
    second = Daemon(tmp_path, config)
    zmq_table = first.config_path.read_text().removeprefix(first_config + "\n")
    second.config_path.write_text(config + "\n" + zmq_table)
    second.control_port, second.telemetry_port, second.leader_port = (
        first.control_port,
        first.telemetry_port,
        first.leader_port,
    )
    second.repick_ports = False
    return second
