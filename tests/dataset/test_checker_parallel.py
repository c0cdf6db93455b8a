"""hilrec check decodes on several processes and reports exactly what the serial run reports.

The dataset has two cameras and several episodes per video file (and a second video file), with
findings planted in both the decoded (image stats) and the demuxed (timestamps) checks, so the
comparison covers the findings the pool's results turn into as well as the order they come in.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from _frames import write_dataset

from hilrec.daemon.cli import main as cli_main
from hilrec.daemon.dataset.check.checker import check_dataset
from hilrec.daemon.dataset.check.common import resolve_workers, run_in_pool
from hilrec.daemon.dataset.writer.dataset_writer import DatasetWriter

CAMS = ("front", "wrist")
EPISODES = "meta/episodes/chunk-000/file-000.parquet"
LENGTHS = [11, 7, 13, 9, 10, 8]


@pytest.fixture(scope="module")
def broken_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("parallel") / "ds"
    # A small video file limit: a take is about 2 KB a camera (a little more while staged), so
    # each file holds two or three takes and every camera rolls over into more files.
    write_dataset(DatasetWriter.create, root, LENGTHS, cameras=CAMS, video_files_size_in_mb=0.006)
    table = pq.read_table(root / EPISODES)
    for column, row, delta in (
        ("stats/observation.images.front/mean", 1, 0.2),
        ("stats/observation.images.wrist/mean", 4, -0.2),
    ):
        values = table.column(column).to_pylist()
        values[row][0][0][0] = min(1.0, max(0.0, values[row][0][0][0] + delta))
        field = table.schema.field(column)
        table = table.set_column(
            table.schema.get_field_index(column), field, pa.array(values, type=field.type)
        )
    column = "videos/observation.images.wrist/from_timestamp"
    values = table.column(column).to_pylist()
    values[2] += 0.02  # off the frame grid: video.timestamps, and episode 2 is not decoded
    table = table.set_column(
        table.schema.get_field_index(column), table.schema.field(column), pa.array(values)
    )
    pq.write_table(table, root / EPISODES)
    return root


@pytest.mark.slow
def test_video_files_are_shared_and_split(broken_root: Path) -> None:
    files = sorted(p.relative_to(broken_root).as_posix() for p in broken_root.rglob("*.mp4"))
    assert len(files) > len(CAMS)  # more than one file per camera
    assert len(files) < len(CAMS) * len(LENGTHS)  # and files shared by several episodes


@pytest.mark.slow
def test_parallel_findings_equal_serial(broken_root: Path) -> None:
    serial = check_dataset(broken_root, workers=1)
    parallel = check_dataset(broken_root, workers=2)
    more = check_dataset(broken_root, workers=5)
    assert [asdict(f) for f in parallel.failures] == [asdict(f) for f in serial.failures]
    assert [asdict(f) for f in more.failures] == [asdict(f) for f in serial.failures]
    planted = {(f.rule, f.episode, f.key) for f in serial.failures}
    assert ("stats.episode", 1, "observation.images.front") in planted
    assert ("stats.episode", 4, "observation.images.wrist") in planted
    assert ("video.timestamps", 2, "observation.images.wrist") in planted


@pytest.mark.slow
def test_cli_workers_flag(broken_root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    reports = []
    for workers in ("1", "2"):
        assert cli_main(["check", str(broken_root), "--json", "--workers", workers]) == 1
        reports.append(json.loads(capsys.readouterr().out)["failures"])
    assert reports[0] == reports[1]
    with pytest.raises(SystemExit):
        cli_main(["check", str(broken_root), "--workers", "0"])
    capsys.readouterr()
    valid = tmp_path / "valid"
    write_dataset(DatasetWriter.create, valid, [6, 5, 7], cameras=("front",))
    shutil.rmtree(valid / "hilrec", ignore_errors=True)  # the journal is not under test here
    assert cli_main(["check", str(valid), "--workers", "2"]) == 0


def test_pool_keeps_the_order_of_its_items() -> None:
    items = list(range(-40, 0))
    assert run_in_pool(abs, items, 2) == [abs(i) for i in items]
    assert run_in_pool(abs, items, 1) == [abs(i) for i in items]
    assert resolve_workers(None) >= 1 and resolve_workers(0) == 1 and resolve_workers(3) == 3


def test_seeking_to_an_episode_decodes_what_decoding_from_the_start_does(broken_root: Path) -> None:
    """Each episode is decoded from the key frame before it; the frames are those a decode from
    the file's first frame gives."""
    from hilrec.daemon.dataset.check.video import DecodeJob, _decode_span
    from hilrec.daemon.dataset.format import reader
    from hilrec.daemon.dataset.format.paths import video_file_path

    info = reader.load_info(broken_root)
    key = "observation.images.front"
    for row in reader.load_episodes(broken_root):
        start = float(row[f"videos/{key}/from_timestamp"])
        job = DecodeJob(
            path=str(video_file_path(broken_root, info, row, key)),
            start=start,
            end=float(row[f"videos/{key}/to_timestamp"]),
            sample_ts=tuple(start + i / info["fps"] for i in range(row["length"])),
            factor=1,
        )
        seeked, whole = _decode_span(job, seek=True), _decode_span(job, seek=False)
        assert seeked is not None and whole is not None
        assert len(seeked) == len(whole) == row["length"]
        for (a, *_), (b, *_) in zip(seeked, whole, strict=True):
            assert np.array_equal(a, b)
