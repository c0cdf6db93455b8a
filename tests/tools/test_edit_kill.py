"""SIGKILL an edit at named points and at random moments: the root is the source or the result.

Each trial copies the source dataset, starts a child process (forked by a fork server, so it
starts in milliseconds) that deletes episode 1 in place, and kills it: either when it reports reaching a
named step of the edit (the child stops there), or after a seeded random delay. Afterwards,
once :func:`hilrec.daemon.tools.edit.recover` has run (what the next ``hilrec edit`` does
first; it only acts after a kill inside the two-rename fallback), the root is exactly one of:

- the source, bit for bit (every file's sha256; the lock file aside), or
- the complete result: it passes ``hilrec check`` with no error and no warning and holds the
  kept episodes, bit-equal.

Never neither. The temp folders a killed edit leaves are removed by the next edit (its
:func:`~hilrec.daemon.tools.edit.clean_leftovers`), which then succeeds.
"""

from __future__ import annotations

import multiprocessing
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from test_edit import LENGTHS, assert_same_episode, tree_digest

from hilrec.daemon.dataset.check.checker import check_dataset
from hilrec.daemon.dataset.format.reader import load_episodes
from hilrec.daemon.tools import edit

# Real daemons, processes or kill loops: the slow tier (make test runs it; make test-fast does not).
pytestmark = pytest.mark.slow

# (step the child stops at, use the two-rename fallback)
NAMED = [
    ("locked", False),
    ("temp-created", False),
    ("data-written", False),
    ("videos-written", False),
    ("meta-written", False),
    ("sidecars-written", False),
    ("checked", False),
    ("exchanged", False),
    ("cleaned", False),
    ("checked", True),
    ("intent-written", True),
    ("renamed-old", True),
    ("exchanged", True),
]
RANDOM_TRIALS = 14
SEED = 20261201


def child(root: str, stop_at: str, fallback: bool, conn: multiprocessing.connection.Connection) -> None:
    if fallback:
        os.environ["HILREC_EDIT_NO_EXCHANGE"] = "1"

    def hook(name: str) -> None:
        conn.send(name)
        if name == stop_at:
            conn.send("STOPPED")
            signal.pause()

    conn.send("started")
    edit.delete_episodes(Path(root), [1], options=edit.Options(hook=hook))
    conn.send("DONE")


def run_trial(root: Path, stop_at: str, fallback: bool, delay: float | None) -> list[str]:
    # A fork server: children forked from a fresh single-threaded process (milliseconds each),
    # not from this one, whose threads (torch's, a writer's) a plain fork would copy mid-lock.
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(
        ["hilrec.daemon.tools.edit", "hilrec.daemon.dataset.check.checker", "test_edit_kill"]
    )
    parent, child_end = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=child, args=(str(root), stop_at, fallback, child_end), daemon=True)
    proc.start()
    child_end.close()
    seen: list[str] = []
    try:
        if delay is None:
            while "STOPPED" not in seen:
                assert parent.poll(30), f"the child never reached {stop_at}: {seen}"
                seen.append(parent.recv())
        else:
            assert parent.poll(30), "the child did not start"
            seen.append(parent.recv())
            # Note the steps it reports until the delay has passed, then kill it wherever it is.
            end = time.monotonic() + delay
            while (left := end - time.monotonic()) > 0:
                if parent.poll(left):
                    try:
                        seen.append(parent.recv())
                    except EOFError:
                        break
    finally:
        if proc.pid is not None:
            os.kill(proc.pid, signal.SIGKILL)
        proc.join(30)
        parent.close()
    return seen


def outcome(root: Path, source: Path, before: dict[str, str]) -> str:
    edit.recover(root)
    assert root.is_dir(), "the root is gone"
    if tree_digest(root) == before:
        return "source"
    report = check_dataset(root, strict=True)
    assert not report.failures, report.format_text()
    rows = load_episodes(root)
    assert [r["length"] for r in rows] == [n for i, n in enumerate(LENGTHS) if i != 1]
    for new, old in enumerate(i for i in range(len(LENGTHS)) if i != 1):
        assert_same_episode(source, old, root, new)
    return "result"


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # Written by a fresh process: the writer's encoder process, started from a pytest process
    # that has loaded torch (test_edit.py's LeRobot test), has been seen to stall.
    root = tmp_path_factory.mktemp("kill") / "src"
    code = (
        "import sys; from pathlib import Path; sys.path.insert(0, sys.argv[1]); "
        "from test_edit import make_dataset; make_dataset(Path(sys.argv[2]))"
    )
    subprocess.run(
        [sys.executable, "-c", code, str(Path(__file__).parent), str(root)],
        check=True,
        timeout=120,
        capture_output=True,
    )
    return root


def test_a_killed_edit_leaves_the_source_or_the_result(source: Path, tmp_path: Path) -> None:
    rng = random.Random(SEED)
    before = tree_digest(source)
    # How long an edit takes here, so the random kills spread over the whole of it.
    timing = tmp_path / "timing"
    shutil.copytree(source, timing, symlinks=True)
    started = time.monotonic()
    edit.delete_episodes(timing, [1])
    span = time.monotonic() - started
    trials: list[tuple[str, bool, float | None]] = [(s, f, None) for s, f in NAMED]
    trials += [("never", i % 3 == 2, rng.uniform(0.0, 0.8 * span)) for i in range(RANDOM_TRIALS)]
    results = []
    for number, (stop_at, fallback, delay) in enumerate(trials):
        root = tmp_path / f"trial-{number:02d}" / "ds"
        root.parent.mkdir()
        shutil.copytree(source, root, symlinks=True)
        seen = run_trial(root, stop_at, fallback, delay)
        state = outcome(root, source, before)
        last = next((s for s in reversed(seen) if s not in ("STOPPED",)), "-")
        results.append((stop_at, fallback, delay, last, state))
        # The next edit cleans what the killed one left, and works.
        if number % 4 == 0 or edit.temp_dirs(root):
            edit.clean_leftovers(root)
            assert not edit.temp_dirs(root), edit.temp_dirs(root)
        assert not list(root.parent.glob(f".{root.name}.hilrec-edit-*.json"))
    for stop_at, fallback, delay, last, state in results:
        when = f"after {delay:.3f} s" if delay is not None else f"at {stop_at}"
        print(f"{'fallback' if fallback else 'exchange'} killed {when:>16} (last step {last:>16}): {state}")
    assert len(results) >= 20
    states = {state for *_, state in results}
    assert states == {"source", "result"}, results
    # A later edit of a root a kill left behind succeeds and cleans up.
    last_root = tmp_path / f"trial-{len(trials) - 1:02d}" / "ds"
    edit.delete_episodes(last_root, [0])
    assert not edit.temp_dirs(last_root)
    assert check_dataset(last_root, strict=True).passed
    assert np.all([r["length"] > 0 for r in load_episodes(last_root)])
