"""``hilrec check ROOT | head``: the reader leaves early; hilrec ends quietly (cli.main), with no
BrokenPipeError traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_edit import make_dataset


@pytest.mark.slow  # > 5 s (make test-fast leaves it out)
def test_check_into_a_closed_pipe_ends_quietly(tmp_path: Path) -> None:
    root = make_dataset(tmp_path / "ds")
    read_end, write_end = os.pipe()
    os.close(read_end)  # head has read its lines and exited
    try:
        done = subprocess.run(
            [sys.executable, "-m", "hilrec.daemon.cli", "check", str(root), "--json"],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=300,
            check=False,
        )
    finally:
        os.close(write_end)
    assert "Traceback" not in done.stderr and "BrokenPipeError" not in done.stderr, done.stderr
    assert done.returncode == 141, done.stderr
