"""Every benchmark at its smallest size (``python bench/bench_X.py --smoke``), so none can rot.

One test per bench file, so that ``pytest -n`` spreads them over its workers (``make test`` runs
them here; ``make bench-smoke`` still runs them one after another for people). A benchmark that
exits non-zero fails its test with the tail of what it printed. What a benchmark measures is
never judged here: only that it runs to the end on the current defaults.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCHES = sorted(path.name for path in (ROOT / "bench").glob("bench_*.py"))
# A generous bound: a smoke run takes seconds to a minute; only a hang reaches it.
SMOKE_TIMEOUT_S = 900
SHOWN_CHARS = 6000
# Flags that keep a run's files out of paths another run (another worker, another clone) shares.
PRIVATE_OUTPUT = {"bench_coverage_eval.py": "--out"}

pytestmark = pytest.mark.slow


def test_every_bench_file_is_smoked() -> None:
    assert len(BENCHES) >= 18, BENCHES  # a glob that finds nothing would smoke nothing


@pytest.mark.parametrize("bench", BENCHES)
def test_bench_smoke_runs_to_the_end(bench: str, tmp_path: Path) -> None:
    argv = [sys.executable, str(ROOT / "bench" / bench), "--smoke"]
    if bench in PRIVATE_OUTPUT:
        argv += [PRIVATE_OUTPUT[bench], str(tmp_path / "out")]
    try:
        done = subprocess.run(
            argv, cwd=ROOT, capture_output=True, text=True, timeout=SMOKE_TIMEOUT_S, check=False
        )
    except subprocess.TimeoutExpired as exc:
        shown = _tail(exc.stdout, exc.stderr)
        raise AssertionError(f"{bench} --smoke ran over {SMOKE_TIMEOUT_S} s:\n{shown}") from None
    assert done.returncode == 0, (
        f"{bench} --smoke exited {done.returncode}:\n{_tail(done.stdout, done.stderr)}"
    )


def _tail(stdout: str | bytes | None, stderr: str | bytes | None) -> str:
    def text(value: str | bytes | None) -> str:
        if isinstance(value, bytes):
            return value.decode(errors="replace")
        return value or ""

    out, err = text(stdout)[-SHOWN_CHARS:], text(stderr)[-SHOWN_CHARS:]
    return f"--- stdout (tail)\n{out}\n--- stderr (tail)\n{err}"
