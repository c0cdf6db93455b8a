"""``hilrec rollout --ui``: the bench's web page (``hilrec ui``) as a child beside the session.

The page is its own process (:mod:`hilrec.daemon.ui`), a client of the daemon's sockets like
this session; it is started once the daemon serves, its output in a log beside the dataset, and
its address printed as soon as it listens (bounded: a page that does not come up is said, and
the session goes on without it). It gets SIGTERM when the session ends, or dies.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, Final

from hilrec.daemon import procs

READY_TIMEOUT_S: Final[float] = 30.0
STOP_TIMEOUT_S: Final[float] = 10.0
_ADDRESS = re.compile(r"hilrec ui: (http://\S+)")


class UiChild:
    def __init__(self, config: Path, log_path: Path, port: int) -> None:
        self.argv = [sys.executable, "-m", "hilrec.daemon.cli", "ui", "--config", str(config)]
        self.log_path = log_path
        self.port = port
        self.process: subprocess.Popen[bytes] | None = None
        self.address: str | None = None

    def start(self, out: IO[str], ready_timeout_s: float = READY_TIMEOUT_S) -> str | None:
        """Start it; its address once it listens, None (said on ``out``) if it does not."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            self.process = procs.start(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + ready_timeout_s
        while time.monotonic() < deadline and self.process.poll() is None:
            found = _ADDRESS.search(self.log_path.read_text(errors="replace"))
            if found:
                self.address = found.group(1)
                print(
                    f"rollout: the bench's page: {self.address} (its log: {self.log_path})",
                    file=out,
                    flush=True,
                )
                return self.address
            time.sleep(0.1)  # polling the child's log for its first line, bounded above
        print(f"rollout: the web page did not come up; see {self.log_path}", file=out, flush=True)
        return None

    def stop(self) -> None:
        if self.process is not None:
            procs.stop(self.process, STOP_TIMEOUT_S)
