"""SIGKILL an edit with ``--out`` halfway: ``check`` says what the folder is, the rerun finishes it.

``split`` killed after its first part left TRAIN complete, VAL missing and a rerun refused
("--out exists and is not empty"); ``merge --out M`` killed early left M holding a stale lock,
and ``check M`` advised ``hilrec repair``. Each trial here copies nothing (``--out`` edits never
touch their source), starts the edit in a forked child and kills it at a named step or after a
seeded random delay. Then ``check`` of every output names the command to run again (never
``hilrec repair``), and that same command, run again, leaves every output complete: it passes
``check --strict`` with the episodes it should hold, and no record of the edit is left.
"""

from __future__ import annotations

import multiprocessing
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path

import pytest
from test_edit import LENGTHS, assert_same_episode, tree_digest

from hilrec.daemon.dataset.check.checker import check_dataset
from hilrec.daemon.dataset.format.edit_intent import EDIT_INTENT_PATH
from hilrec.daemon.dataset.format.reader import load_episodes
from hilrec.daemon.errors import DatasetStateError
from hilrec.daemon.tools import edit
from hilrec.daemon.tools.edit_swap import Hook

# Real daemons, processes or kill loops: the slow tier (make test runs it; make test-fast does not).
pytestmark = pytest.mark.slow

SEED = 20261202
RANDOM_KILLS = 10
SPLIT_GROUPS = ([0, 1, 2, 3], [4, 5])


def run(kind: str, src: Path, outs: list[Path], hook: Hook = None) -> None:
    options = edit.Options(hook=hook)
    if kind == "split":
        edit.split(src, outs, lists=[list(g) for g in SPLIT_GROUPS], options=options)
    else:
        edit.merge([src, src.parent / "other"], outs[0], options=options)


def child(kind: str, src: str, outs: list[str], stop_at: str, conn: Connection) -> None:
    def hook(name: str) -> None:
        conn.send(name)
        if name == stop_at:
            conn.send("STOPPED")
            signal.pause()

    conn.send("started")
    run(kind, Path(src), [Path(o) for o in outs], hook)
    conn.send("DONE")


def killed(
    kind: str,
    src: Path,
    outs: list[Path],
    stop_at: str,
    delay: float | None,
    while_stopped: Callable[[], None] | None = None,
) -> list[str]:
    """Run the edit in a child and SIGKILL it at ``stop_at`` (or after ``delay`` seconds);
    ``while_stopped`` runs while the child waits at ``stop_at``, still alive."""
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["hilrec.daemon.tools.edit", "hilrec.daemon.dataset.check.checker"])
    parent, child_end = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=child, args=(kind, str(src), [str(o) for o in outs], stop_at, child_end))
    proc.start()
    child_end.close()
    seen: list[str] = []
    try:
        if delay is None:
            while "STOPPED" not in seen:
                assert parent.poll(60), f"the child never reached {stop_at}: {seen}"
                seen.append(parent.recv())
            if while_stopped is not None:
                while_stopped()
        else:
            assert parent.poll(60), "the child did not start"
            seen.append(parent.recv())
            end = time.monotonic() + delay
            while (left := end - time.monotonic()) > 0 and "DONE" not in seen:
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


def advice(out: Path) -> str:
    """What ``hilrec check`` says of a folder a killed edit left (empty: missing, or clean)."""
    if not out.exists():
        return ""
    report = check_dataset(out, strict=True)
    text = report.format_text()
    assert "hilrec repair" not in text, text
    if not any(out.iterdir()):
        # Killed between the folder's mkdir and its lock file (seen once in ten random kills):
        # nothing in it can name the edit, and check says what an empty root is (rule root.empty).
        assert {f.rule for f in report.failures} == {"root.empty"}, text
        return text
    if report.failures:
        assert {f.rule for f in report.failures} <= {"edit.unfinished", "edit.part"}, text
        assert "run that command again" in text and "hilrec edit" in text, text
    return text


def assert_complete(src: Path, kind: str, outs: list[Path]) -> None:
    groups = SPLIT_GROUPS if kind == "split" else (list(range(len(LENGTHS))),)
    for out, group in zip(outs, groups, strict=True):
        report = check_dataset(out, strict=True)
        assert not report.failures, report.format_text()
        assert not (out / EDIT_INTENT_PATH).exists()
        assert [r["length"] for r in load_episodes(out)][: len(group)] == [LENGTHS[e] for e in group]
        for new, old in enumerate(group):
            assert_same_episode(src, old, out, new)
    assert not edit.temp_dirs(outs[0])


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("rerun")
    code = (
        "import sys; from pathlib import Path; sys.path.insert(0, sys.argv[1]); "
        "from test_edit import make_dataset; make_dataset(Path(sys.argv[2])); "
        "make_dataset(Path(sys.argv[3]), (7, 5), offset=10)"
    )
    here = str(Path(__file__).parent)
    subprocess.run(
        [sys.executable, "-c", code, here, str(base / "src"), str(base / "other")],
        check=True,
        timeout=180,
        capture_output=True,
    )
    return base / "src"


def outs_for(tmp_path: Path, kind: str, name: str) -> list[Path]:
    folder = tmp_path / name
    folder.mkdir()
    return [folder / "train", folder / "val"] if kind == "split" else [folder / "merged"]


def test_a_split_killed_after_its_first_part_is_finished_by_the_same_command(
    source: Path, tmp_path: Path
) -> None:
    before = tree_digest(source)
    outs = outs_for(tmp_path, "split", "named")
    killed("split", source, outs, "part-written", None)
    train, val = outs
    assert not val.exists()
    said = advice(train)
    assert "part (1 of 2)" in said and "hilrec edit split" in said and "--episodes 0-3 4-5" in said, said
    assert check_dataset(train).passed  # a warning: the part itself is whole
    run("split", source, outs)
    assert_complete(source, "split", outs)
    assert tree_digest(source) == before


def test_a_merge_killed_before_it_wrote_is_named_by_check_and_finished_by_the_same_command(
    source: Path, tmp_path: Path
) -> None:
    outs = outs_for(tmp_path, "merge", "named")
    killed("merge", source, outs, "temp-created", None)
    [merged] = outs
    said = advice(merged)
    assert "not a dataset yet" in said and "hilrec edit merge" in said and str(merged) in said, said
    assert not check_dataset(merged).passed
    run("merge", source, outs)
    report = check_dataset(merged, strict=True)
    assert not report.failures, report.format_text()
    assert len(load_episodes(merged)) == len(LENGTHS) + 2


@pytest.mark.parametrize("left", ["half-written record", "record folder only"])
def test_a_merge_killed_while_it_wrote_its_record_is_named_by_check(
    source: Path, tmp_path: Path, left: str
) -> None:
    """Killed between its lock and its record's rename: the folder holds the lock and the record's
    temporary file (or its empty folder). check said "not a LeRobot dataset root (fix: hilrec
    repair)"; it names the command, and the command run again finishes it."""
    outs = outs_for(tmp_path, "merge", left.replace(" ", "-"))
    killed("merge", source, outs, "out-intent-written", None)
    [merged] = outs
    record = merged / EDIT_INTENT_PATH
    text = record.read_bytes()
    record.unlink()
    if left == "half-written record":
        (record.parent / f".{record.name}.tmp-4242").write_bytes(text[: len(text) // 2])
    said = advice(merged)
    assert "holds only the lock file of `hilrec edit merge`" in said, said
    run("merge", source, outs)
    assert_complete(source, "merge", outs)


def test_a_split_killed_while_it_removed_its_parts_records_is_finished_by_the_same_command(
    source: Path, tmp_path: Path
) -> None:
    """Killed after TRAIN's record was removed and before VAL's: the same command said "--out
    TRAIN exists and is not empty" (seen once in ten random kills). VAL's record says every part
    was written, so TRAIN is kept as done."""
    outs = outs_for(tmp_path, "split", "finishing")
    killed("split", source, outs, "record-removed", None)
    train, val = outs
    assert not (train / EDIT_INTENT_PATH).exists() and (val / EDIT_INTENT_PATH).exists()
    written = tree_digest(train)
    run("split", source, outs)
    assert_complete(source, "split", outs)
    assert tree_digest(train) == written  # kept, not written again


@pytest.mark.parametrize("kind", ["split", "merge"])
def test_the_same_command_after_a_finished_run_is_refused_and_writes_nothing(
    source: Path, tmp_path: Path, kind: str
) -> None:
    outs = outs_for(tmp_path, kind, "finished")
    run(kind, source, outs)
    written = [tree_digest(out) for out in outs]
    # No record is left to prove the folder is this command's: a dataset is never written over.
    with pytest.raises(DatasetStateError, match="exists and is not empty"):
        run(kind, source, outs)
    assert [tree_digest(out) for out in outs] == written


@pytest.mark.parametrize("kind", ["split", "merge"])
def test_an_output_left_empty_by_a_kill_as_it_was_made_is_named_and_finished(
    source: Path, tmp_path: Path, kind: str
) -> None:
    outs = outs_for(tmp_path, kind, "empty")
    outs[0].mkdir()  # what a kill between the lock's mkdir and its file leaves
    assert "not a dataset: the folder is empty" in advice(outs[0])
    run(kind, source, outs)
    assert_complete(source, kind, outs)


def test_a_part_of_another_edit_or_of_changed_inputs_is_refused_not_overwritten(
    source: Path, tmp_path: Path
) -> None:
    outs = outs_for(tmp_path, "split", "other")
    killed("split", source, outs, "part-written", None)
    with pytest.raises(DatasetStateError, match=r"part \(1 of 2\).*this is `hilrec edit split"):
        edit.split(source, outs, lists=[[0, 1], [2, 3]])
    assert (outs[0] / EDIT_INTENT_PATH).exists()


def test_a_second_edit_to_a_folder_a_live_edit_is_building_is_refused_and_leaves_it(
    source: Path, tmp_path: Path
) -> None:
    outs = outs_for(tmp_path, "merge", "live")
    [merged] = outs

    def second() -> None:
        held = sorted(p.relative_to(merged).as_posix() for p in merged.rglob("*"))
        with pytest.raises(DatasetStateError, match="is being written by"):
            run("merge", source, outs)
        assert sorted(p.relative_to(merged).as_posix() for p in merged.rglob("*")) == held

    killed("merge", source, outs, "temp-created", None, while_stopped=second)
    run("merge", source, outs)  # the first was killed: the same command finishes it
    assert not check_dataset(merged, strict=True).failures


@pytest.mark.parametrize("kind", ["split", "merge"])
def test_ten_random_kills_each_leave_what_check_names_and_the_rerun_finishes(
    source: Path, tmp_path: Path, kind: str
) -> None:
    rng = random.Random(f"{SEED}-{kind}")
    timing = outs_for(tmp_path, kind, "timing")
    started = time.monotonic()
    run(kind, source, timing)
    span = time.monotonic() - started
    states: list[str] = []
    for trial in range(RANDOM_KILLS):
        outs = outs_for(tmp_path, kind, f"trial-{trial}")
        seen = killed(kind, source, outs, "never", rng.uniform(0.0, span))
        said = [advice(out) for out in outs]
        states.append(
            f"last step {seen[-1]}: " + " | ".join(s.splitlines()[-1] if s else "missing" for s in said)
        )
        try:
            run(kind, source, outs)
        except DatasetStateError as exc:
            # Killed once it had removed its records (seen when the child outran the timing run):
            # the edit was finished, and a finished output is never written over.
            assert "exists and is not empty" in str(exc), exc
            assert not any((out / EDIT_INTENT_PATH).exists() for out in outs)
        assert_complete(source, kind, outs)
    print("\n".join(states))
    assert len(states) == RANDOM_KILLS
