"""hilrec check: every rule catches the corruption it is for, names file/episode/key/rule, and
the checker never touches what it checks.

Each test copies a valid dataset, breaks it in exactly one way, and asserts that the failure the
break must produce is reported (consequential failures, e.g. stats that no longer match an edited
column, may come with it) with its rule's severity and fix, and that ``hilrec check`` exits
non-zero for an error (a warning: zero, and non-zero with ``--strict``).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import av
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from _frames import write_dataset

from hilrec.daemon.cli import main as cli_main
from hilrec.daemon.dataset.check import journal as checks_journal
from hilrec.daemon.dataset.check.checker import (
    EDIT_PART,
    EDIT_UNFINISHED,
    RULES,
    CheckReport,
    check_dataset,
)
from hilrec.daemon.dataset.check.common import Severity
from hilrec.daemon.dataset.writer.dataset_writer import DatasetWriter

CAM = "observation.images.front"
DATA = "data/chunk-000/file-000.parquet"
EPISODES = "meta/episodes/chunk-000/file-000.parquet"
TASKS = "meta/tasks.parquet"
INFO = "meta/info.json"
STATS = "meta/stats.json"
VIDEO = f"videos/{CAM}/chunk-000/file-000.mp4"
LENGTHS = [12, 9, 14]  # rows of episode 1 are 12 .. 20 of the data file


@pytest.fixture(scope="module")
def valid_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("valid") / "ds"
    write_dataset(DatasetWriter.create, root, LENGTHS, cameras=("front",))
    return root


@pytest.fixture
def broken(valid_root: Path, tmp_path: Path) -> Path:
    """A private copy of the valid dataset, for one test to break."""
    root = tmp_path / "ds"
    shutil.copytree(valid_root, root)
    return root


# --- helpers -----------------------------------------------------------------------------------


def rewrite_parquet(path: Path, edit: Callable[[pa.Table], pa.Table]) -> None:
    table = pq.read_table(path)
    pq.write_table(edit(table), path)


def set_cells(table: pa.Table, column: str, rows: dict[int, Any]) -> pa.Table:
    values = table.column(column).to_pylist()
    for row, value in rows.items():
        values[row] = value
    field = table.schema.field(column)
    return table.set_column(table.schema.get_field_index(column), field, pa.array(values, type=field.type))


def edit_json(path: Path, edit: Callable[[dict], None]) -> None:
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data, indent=2))


def remux_without(path: Path, drop_packet: int) -> None:
    """Copy the video stream without re-encoding, leaving out one packet (one frame)."""
    out_path = path.with_name("remux.mp4")
    with av.open(str(path)) as src, av.open(str(out_path), "w") as dst:
        stream = src.streams.video[0]
        out = dst.add_stream_from_template(stream, opaque=True)
        out.time_base = stream.time_base
        for number, packet in enumerate(src.demux(stream)):
            if packet.dts is None or number == drop_packet:
                continue
            packet.stream = out
            dst.mux(packet)
    out_path.replace(path)


def run_check(root: Path, capsys: pytest.CaptureFixture[str], *flags: str) -> tuple[int, dict]:
    rc = cli_main(["check", str(root), "--json", *flags])
    return rc, json.loads(capsys.readouterr().out)


def assert_fails(
    root: Path,
    capsys: pytest.CaptureFixture[str],
    rule: str,
    file: str,
    *,
    episode: int | None = None,
    key: str | None = None,
) -> dict:
    assert rule in RULES
    rc, report = run_check(root, capsys)
    if RULES[rule].severity is Severity.WARNING:
        assert rc == 0 and report["passed"] is True
        rc, report = run_check(root, capsys, "--strict")
    assert rc == 1 and report["passed"] is False
    hits = [
        f
        for f in report["failures"]
        if f["rule"] == rule
        and f["file"] == file
        and (episode is None or f["episode"] == episode)
        and (key is None or f["key"] == key)
    ]
    assert hits, f"no [{rule}] failure for {file} episode {episode} key {key}; got:\n" + "\n".join(
        json.dumps(f) for f in report["failures"]
    )
    assert hits[0]["severity"] == RULES[rule].severity and hits[0]["fix"] == RULES[rule].fix
    return hits[0]


def tree_state(root: Path) -> dict[str, tuple[bytes, int]]:
    return {
        p.relative_to(root).as_posix(): (p.read_bytes(), p.stat().st_mtime_ns)
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


# --- the valid dataset ---------------------------------------------------------------------------


@pytest.mark.slow
def test_valid_dataset_passes_every_rule(valid_root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, report = run_check(valid_root, capsys)
    assert report["failures"] == []
    assert rc == 0 and report["passed"] is True
    assert report["summary"]["episodes"] == 3 and report["summary"]["frames"] == sum(LENGTHS)


def test_text_report_names_rule_file_episode_and_key(
    broken: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rewrite_parquet(broken / DATA, lambda t: set_cells(t, "timestamp", {15: 0.5}))
    rc = cli_main(["check", str(broken)])
    text = capsys.readouterr().out
    assert rc == 1
    assert f"ERROR [timestamp.grid] {DATA}, episode 1, key 'timestamp'" in text
    assert "(fix: hilrec repair)" in text
    assert text.rstrip().endswith("FAILED")


@pytest.mark.slow  # > 5 s (make test-fast leaves it out)
def test_console_command_exit_codes(valid_root: Path, broken: Path) -> None:
    (broken / INFO).write_text("{ not json")
    ok = subprocess.run(
        [sys.executable, "-m", "hilrec.daemon.cli", "check", str(valid_root)],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    bad = subprocess.run(
        [sys.executable, "-m", "hilrec.daemon.cli", "check", str(broken), "--json"],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "PASSED" in ok.stdout
    assert bad.returncode == 1
    failure = json.loads(bad.stdout)["failures"][0]
    assert failure["rule"] == "file.unreadable" and failure["file"] == INFO


def test_check_never_modifies_the_dataset(valid_root: Path, broken: Path) -> None:
    rewrite_parquet(broken / DATA, lambda t: set_cells(t, "index", {20: 99}))
    for root in (valid_root, broken):
        before = tree_state(root)
        report = check_dataset(root)
        assert isinstance(report, CheckReport)
        assert tree_state(root) == before  # same files, same bytes, same mtimes


# --- one test per rule ---------------------------------------------------------------------------


@pytest.mark.parametrize("file", [DATA, EPISODES, TASKS])
def test_parquet_without_footer_is_reported_unreadable(
    broken: Path, file: str, capsys: pytest.CaptureFixture[str]
) -> None:
    data = (broken / file).read_bytes()
    (broken / file).write_bytes(data[: len(data) - 64])
    failure = assert_fails(broken, capsys, "file.unreadable", file)
    assert "parquet" in failure["message"].lower()


def test_an_empty_folder_is_named_so_with_nothing_else_reported(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # What a writer killed between creating the folder and taking its lock leaves.
    root = tmp_path / "ds"
    root.mkdir()
    failure = assert_fails(root, capsys, "root.empty", ".")
    assert "empty" in failure["message"]
    _, report = run_check(root, capsys)
    assert [f["rule"] for f in report["failures"]] == ["root.empty"]  # no advice to repair it
    assert list(root.iterdir()) == []


def test_missing_info_json(broken: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (broken / INFO).unlink()
    assert_fails(broken, capsys, "file.unreadable", INFO)


def test_info_fields_codebase_version(broken: Path, capsys: pytest.CaptureFixture[str]) -> None:
    edit_json(broken / INFO, lambda info: info.update(codebase_version="v2.1"))
    assert_fails(broken, capsys, "info.fields", INFO, key="codebase_version")


def test_info_fields_default_column_dtype(broken: Path, capsys: pytest.CaptureFixture[str]) -> None:
    edit_json(broken / INFO, lambda info: info["features"]["frame_index"].update(dtype="int32"))
    assert_fails(broken, capsys, "info.fields", INFO, key="frame_index")


def test_info_totals(broken: Path, capsys: pytest.CaptureFixture[str]) -> None:
    edit_json(broken / INFO, lambda info: info.update(total_frames=info["total_frames"] + 1))
    assert_fails(broken, capsys, "info.totals", INFO, key="total_frames")


def test_schema_missing_column(broken: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rewrite_parquet(broken / DATA, lambda t: t.drop_columns(["observation.state"]))
    assert_fails(broken, capsys, "schema.columns", DATA, key="observation.state")


def test_schema_dtype(broken: Path, capsys: pytest.CaptureFixture[str]) -> None:
    def widen(table: pa.Table) -> pa.Table:
        i = table.schema.get_field_index("action")
        return table.set_column(i, "action", table.column("action").cast(pa.list_(pa.float64(), 6)))

    rewrite_parquet(broken / DATA, widen)
    assert_fails(broken, capsys, "schema.dtype", DATA, key="action")


def test_schema_shape_row_too_short(broken: Path, capsys: pytest.CaptureFixture[str]) -> None:
    def shorten(table: pa.Table) -> pa.Table:
        values = table.column("action").to_pylist()
        values[13] = values[13][:5]
        i = table.schema.get_field_index("action")
        return table.set_column(i, "action", pa.array(values, type=pa.list_(pa.float32())))

    rewrite_parquet(broken / DATA, shorten)
    failure = assert_fails(broken, capsys, "schema.shape", DATA, key="action")
    assert "5 values" in failure["message"]


def test_schema_shape_declared_wrong(broken: Path, capsys: pytest.CaptureFixture[str]) -> None:
    edit_json(broken / INFO, lambda info: info["features"]["action"].update(shape=[7]))
    assert_fails(broken, capsys, "schema.shape", DATA, key="action")


@pytest.mark.slow
def test_non_finite_value(broken: Path, capsys: pytest.CaptureFixture[str]) -> None:
    def poison(table: pa.Table) -> pa.Table:
        row = table.column("observation.state")[25].as_py()
        row[2] = float("nan")
        return set_cells(table, "observation.state", {25: row})

    rewrite_parquet(broken / DATA, poison)
    assert_fails(broken, capsys, "data.finite", DATA, episode=2, key="observation.state")


def test_index_not_contiguous(broken: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rewrite_parquet(broken / DATA, lambda t: set_cells(t, "index", {21: 22}))
    failure = assert_fails(broken, capsys, "index.contiguous", DATA, episode=2, key="index")
    assert "row 21" in failure["message"]


def test_episode_index_split_block(broken: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rewrite_parquet(broken / DATA, lambda t: set_cells(t, "episode_index", {16: 2}))
    assert_fails(broken, capsys, "episode_index.contiguous", DATA, episode=2)


def test_episode_without_metadata_row(broken: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rewrite_parquet(broken / EPISODES, lambda t: t.slice(0, 2))
    assert_fails(broken, capsys, "episode_index.contiguous", DATA, episode=2)


def test_dropped_row(broken: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rewrite_parquet(broken / DATA, lambda t: pa.concat_tables([t.slice(0, 16), t.slice(17)]))
    assert_fails(broken, capsys, "frame_index.contiguous", DATA, episode=1, key="frame_index")
    assert_fails(broken, capsys, "episodes.range", EPISODES, episode=1, key="length")


def test_frame_index_not_contiguous(broken: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rewrite_parquet(broken / DATA, lambda t: set_cells(t, "frame_index", {14: 7}))
    failure = assert_fails(broken, capsys, "frame_index.contiguous", DATA, episode=1, key="frame_index")
    assert "row 14" in failure["message"]


def test_timestamp_off_grid(broken: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Row 15 is frame 3 of episode 1 (t = 0.12 s); 0.5 ms off the 40 ms grid.
    rewrite_parquet(broken / DATA, lambda t: set_cells(t, "timestamp", {15: 0.1205}))
    failure = assert_fails(broken, capsys, "timestamp.grid", DATA, episode=1, key="timestamp")
    assert "row 15" in failure["message"]


def test_timestamp_within_tolerance_passes(broken: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rewrite_parquet(broken / DATA, lambda t: set_cells(t, "timestamp", {15: 0.12005}))
    _rc, report = run_check(broken, capsys)
    assert "timestamp.grid" not in {f["rule"] for f in report["failures"]}


def test_unknown_task_index(broken: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rewrite_parquet(broken / DATA, lambda t: set_cells(t, "task_index", {18: 7}))
    assert_fails(broken, capsys, "tasks.unknown", DATA, episode=1, key="task_index")


def test_duplicate_task_string(broken: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rewrite_parquet(broken / TASKS, lambda t: set_cells(t, "__index_level_0__", {1: "pick up the cube"}))
    assert_fails(broken, capsys, "tasks.table", TASKS)


def test_episode_tasks_disagree_with_rows(broken: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rewrite_parquet(broken / EPISODES, lambda t: set_cells(t, "tasks", {0: ["fold the towel"]}))
    assert_fails(broken, capsys, "tasks.episode", EPISODES, episode=0, key="tasks")


def test_episode_range_from_index(broken: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rewrite_parquet(broken / EPISODES, lambda t: set_cells(t, "dataset_from_index", {1: 13}))
    assert_fails(broken, capsys, "episodes.range", EPISODES, episode=1, key="dataset_from_index")


def test_episode_range_data_file(broken: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rewrite_parquet(broken / EPISODES, lambda t: set_cells(t, "data/file_index", {2: 1}))
    assert_fails(broken, capsys, "episodes.range", EPISODES, episode=2, key="data/file_index")


def test_video_missing(broken: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (broken / VIDEO).unlink()
    assert_fails(broken, capsys, "video.file", VIDEO, episode=0, key=CAM)


def test_video_to_timestamp(broken: Path, capsys: pytest.CaptureFixture[str]) -> None:
    column = f"videos/{CAM}/to_timestamp"
    rewrite_parquet(
        broken / EPISODES, lambda t: set_cells(t, column, {1: t.column(column)[1].as_py() + 0.04})
    )
    assert_fails(broken, capsys, "video.range", EPISODES, episode=1, key=CAM)


def test_video_from_timestamp_off_frame(broken: Path, capsys: pytest.CaptureFixture[str]) -> None:
    column = f"videos/{CAM}/from_timestamp"
    rewrite_parquet(
        broken / EPISODES, lambda t: set_cells(t, column, {2: t.column(column)[2].as_py() + 0.02})
    )
    assert_fails(broken, capsys, "video.timestamps", VIDEO, episode=2, key=CAM)


def test_video_frame_missing(broken: Path, capsys: pytest.CaptureFixture[str]) -> None:
    remux_without(broken / VIDEO, drop_packet=LENGTHS[0] + 5)  # frame 5 of episode 1
    failure = assert_fails(broken, capsys, "video.frame_count", VIDEO, episode=1, key=CAM)
    assert f"{LENGTHS[1] - 1} frames" in failure["message"]
    assert_fails(broken, capsys, "video.timestamps", VIDEO, episode=1, key=CAM)


def test_wrong_fps_in_info(broken: Path, capsys: pytest.CaptureFixture[str]) -> None:
    edit_json(broken / INFO, lambda info: info.update(fps=30))
    assert_fails(broken, capsys, "video.fps", VIDEO, key=CAM)
    assert_fails(broken, capsys, "timestamp.grid", DATA, episode=0, key="timestamp")


def test_wrong_video_fps_in_feature_info(broken: Path, capsys: pytest.CaptureFixture[str]) -> None:
    edit_json(broken / INFO, lambda info: info["features"][CAM]["info"].update({"video.fps": 30}))
    assert_fails(broken, capsys, "video.fps", INFO, key=CAM)


def test_video_size(broken: Path, capsys: pytest.CaptureFixture[str]) -> None:
    edit_json(broken / INFO, lambda info: info["features"][CAM].update(shape=[90, 128, 3]))
    failure = assert_fails(broken, capsys, "video.size", VIDEO, key=CAM)
    assert "96x128" in failure["message"] and "90x128" in failure["message"]


def test_episode_stats_mean_edited(broken: Path, capsys: pytest.CaptureFixture[str]) -> None:
    def edit(table: pa.Table) -> pa.Table:
        mean = table.column("stats/action/mean")[0].as_py()
        mean[3] *= 1.0001
        return set_cells(table, "stats/action/mean", {0: mean})

    rewrite_parquet(broken / EPISODES, edit)
    failure = assert_fails(broken, capsys, "stats.episode", EPISODES, episode=0, key="action")
    assert failure["message"].startswith("mean[3]")


def test_episode_stats_quantile_outside_bracket(broken: Path, capsys: pytest.CaptureFixture[str]) -> None:
    def edit(table: pa.Table) -> pa.Table:
        q50 = table.column("stats/observation.state/q50")[2].as_py()
        maximum = table.column("stats/observation.state/max")[2].as_py()
        q50[0] = maximum[0]
        return set_cells(table, "stats/observation.state/q50", {2: q50})

    rewrite_parquet(broken / EPISODES, edit)
    failure = assert_fails(broken, capsys, "stats.episode", EPISODES, episode=2, key="observation.state")
    assert failure["message"].startswith("q50[0]")


def test_episode_stats_count(broken: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rewrite_parquet(broken / EPISODES, lambda t: set_cells(t, "stats/action/count", {1: [10]}))
    failure = assert_fails(broken, capsys, "stats.episode", EPISODES, episode=1, key="action")
    assert failure["severity"] == "error" and failure["fix"] == "hilrec edit recompute-stats"


@pytest.mark.slow
def test_default_column_stats_are_a_warning(broken: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rewrite_parquet(broken / EPISODES, lambda t: set_cells(t, "stats/timestamp/count", {1: [10]}))
    edit_json(broken / STATS, lambda s: s["index"].update(max=[s["index"]["max"][0] + 5]))
    failure = assert_fails(broken, capsys, "stats.default_columns", EPISODES, episode=1, key="timestamp")
    assert failure["severity"] == "warning" and failure["fix"] == "hilrec edit recompute-stats"
    assert_fails(broken, capsys, "stats.default_columns", STATS, key="index")


def test_episode_image_stats_edited(broken: Path, capsys: pytest.CaptureFixture[str]) -> None:
    column = f"stats/{CAM}/mean"

    def edit(table: pa.Table) -> pa.Table:
        mean = table.column(column)[1].as_py()
        mean[1][0][0] = min(1.0, mean[1][0][0] + 0.1)
        return set_cells(table, column, {1: mean})

    rewrite_parquet(broken / EPISODES, edit)
    failure = assert_fails(broken, capsys, "stats.episode", EPISODES, episode=1, key=CAM)
    assert "mean[channel 1]" in failure["message"]


def test_dataset_stats_edited(broken: Path, capsys: pytest.CaptureFixture[str]) -> None:
    edit_json(
        broken / STATS,
        lambda s: s["observation.state"]["std"].__setitem__(4, s["observation.state"]["std"][4] * 1.001),
    )
    failure = assert_fails(broken, capsys, "stats.dataset", STATS, key="observation.state")
    assert failure["message"].startswith("std[4]")


def test_dataset_stats_missing(broken: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (broken / STATS).unlink()
    assert_fails(broken, capsys, "stats.dataset", STATS)


@pytest.mark.slow
def test_multi_file_dataset_passes_and_failures_name_the_right_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "ds"
    # Tiny size limits: every episode rolls over to a new data and metadata file, and with
    # chunks_size 2 into a second chunk.
    write_dataset(
        DatasetWriter.create,
        root,
        [10, 7, 12, 5],
        cameras=("front",),
        data_files_size_in_mb=0.002,
        chunks_size=2,
    )
    files = sorted(p.relative_to(root).as_posix() for p in (root / "data").rglob("*.parquet"))
    assert len(files) == 4 and files[-1] == "data/chunk-001/file-001.parquet"
    rc, report = run_check(root, capsys)
    assert rc == 0 and report["failures"] == []
    third = root / files[2]
    rewrite_parquet(third, lambda t: set_cells(t, "index", {4: t.column("index")[4].as_py() + 100}))
    failure = assert_fails(root, capsys, "index.contiguous", files[2], episode=2, key="index")
    assert "row 4 " in failure["message"]


def test_every_rule_has_a_test() -> None:
    source = Path(__file__).read_text()
    # The journal's rule is tested with the journal's module; an unfinished edit's rules with the
    # edit that leaves one (tests/tools/test_edit_rerun.py, which kills edits halfway).
    owned_elsewhere = set(checks_journal.RULES) | {EDIT_UNFINISHED, EDIT_PART}
    untested = [
        rule
        for rule in RULES
        if rule not in owned_elsewhere and f'"{rule}"' not in source.split("# --- one test")[1]
    ]
    assert untested == []
