"""The native writer: layout, columns, metadata, validation and lifecycle."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import av
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from hilrec.daemon.dataset.format.reader import column_to_numpy, load_task_list
from hilrec.daemon.dataset.format.sidecar import load_dataset_sidecar, load_episode_sidecar
from hilrec.daemon.dataset.format.stats import STAT_KEYS
from hilrec.daemon.dataset.writer.dataset_writer import DatasetWriter
from hilrec.daemon.errors import DatasetError, DatasetStateError, FeatureSpecError, FrameError
from hilrec.daemon.so101 import POSITION_NAMES, so101_features

FPS = 25
H, W = 48, 64
CAM = "observation.images.front"


def make_frame(rng: np.random.Generator, task: str = "pick the cube") -> dict:
    # Smooth gradients plus a moving offset: compressible, so decoded frames stay close.
    base = np.linspace(0, 200, W, dtype=np.float32)[None, :, None]
    image = np.clip(base + rng.integers(0, 40) + np.zeros((H, W, 3), np.float32), 0, 255)
    return {
        "action": rng.normal(size=6).astype(np.float32),
        "observation.state": rng.normal(size=6).astype(np.float32),
        CAM: image.astype(np.uint8),
        "task": task,
    }


def write_dataset(root: Path, lengths: list[int], *, seed: int = 0, **kwargs) -> list[list[dict]]:
    rng = np.random.default_rng(seed)
    episodes = []
    with DatasetWriter.create(
        root, fps=FPS, features=so101_features({"front": (H, W)}), robot_type="so_follower", **kwargs
    ) as writer:
        for number, length in enumerate(lengths):
            task = "pick the cube" if number % 2 == 0 else "place the cube"
            frames = [make_frame(rng, task) for _ in range(length)]
            for frame in frames:
                writer.add_frame(frame)
            assert writer.save_episode(sidecar={"seed": number}, arrays={"tick": np.arange(length)}) == number
            episodes.append(frames)
    return episodes


def read_data(root: Path) -> dict[str, np.ndarray]:
    files = sorted((root / "data").glob("chunk-*/file-*.parquet"))
    tables = [pq.read_table(f) for f in files]
    return {
        name: np.concatenate([column_to_numpy(t.column(name)) for t in tables])
        for name in tables[0].column_names
    }


def episode_rows(root: Path) -> list[dict]:
    rows = []
    for path in sorted((root / "meta/episodes").glob("chunk-*/file-*.parquet")):
        rows.extend(pq.read_table(path).to_pylist())
    return rows


@pytest.mark.slow
def test_columns_are_bit_equal_and_timestamps_on_the_grid(tmp_path: Path) -> None:
    root = tmp_path / "ds"
    episodes = write_dataset(root, [30, 17, 22])
    data = read_data(root)
    flat = [f for ep in episodes for f in ep]
    assert np.array_equal(data["action"], np.stack([f["action"] for f in flat]))
    assert np.array_equal(data["observation.state"], np.stack([f["observation.state"] for f in flat]))
    assert data["action"].dtype == np.float32
    frame_index = np.concatenate([np.arange(len(ep)) for ep in episodes])
    assert np.array_equal(data["frame_index"], frame_index)
    assert np.array_equal(data["timestamp"], (frame_index / FPS).astype(np.float32))
    assert np.array_equal(data["index"], np.arange(len(flat)))
    assert np.array_equal(data["episode_index"], np.repeat([0, 1, 2], [30, 17, 22]))
    assert np.array_equal(data["task_index"], np.repeat([0, 1, 0], [30, 17, 22]))
    assert load_task_list(root) == ["pick the cube", "place the cube"]


@pytest.mark.slow
def test_metadata_matches_lerobot_v30(tmp_path: Path) -> None:
    root = tmp_path / "ds"
    write_dataset(root, [30, 17])
    info = json.loads((root / "meta/info.json").read_text())
    assert info["codebase_version"] == "v3.0"
    assert (info["total_episodes"], info["total_frames"], info["total_tasks"]) == (2, 47, 2)
    assert info["splits"] == {"train": "0:2"}
    assert list(info["features"]) == [
        "action",
        "observation.state",
        CAM,
        "timestamp",
        "frame_index",
        "episode_index",
        "index",
        "task_index",
    ]
    assert info["features"]["action"]["names"] == POSITION_NAMES
    video = info["features"][CAM]["info"]
    assert video == {
        "video.height": H,
        "video.width": W,
        "video.codec": "av1",
        "video.pix_fmt": "yuv420p",
        "video.is_depth_map": False,
        "video.fps": FPS,
        "video.channels": 3,
        "has_audio": False,
    }
    schema = pq.read_schema(root / "data/chunk-000/file-000.parquet")
    action_type = schema.field("action").type
    assert pa.types.is_fixed_size_list(action_type) and action_type.list_size == 6
    assert action_type.value_type == pa.float32()
    assert b"huggingface" in schema.metadata
    rows = episode_rows(root)
    assert [r["episode_index"] for r in rows] == [0, 1]
    assert rows[1]["dataset_from_index"] == 30 and rows[1]["dataset_to_index"] == 47
    assert rows[1]["tasks"] == ["place the cube"]
    assert rows[0][f"videos/{CAM}/from_timestamp"] == 0.0
    assert rows[1][f"videos/{CAM}/from_timestamp"] == pytest.approx(30 / FPS)
    assert rows[1][f"videos/{CAM}/to_timestamp"] == pytest.approx(47 / FPS)
    for feature in info["features"]:
        for stat in STAT_KEYS:
            assert f"stats/{feature}/{stat}" in rows[0]
    assert np.asarray(rows[0][f"stats/{CAM}/mean"]).shape == (3, 1, 1)
    stats = json.loads((root / "meta/stats.json").read_text())
    assert stats["index"]["count"] == [47] and stats["index"]["max"] == [46]
    assert np.asarray(stats[CAM]["q50"]).shape == (3, 1, 1)


@pytest.mark.slow
def test_every_episode_has_its_frames_in_the_video_on_the_grid(tmp_path: Path) -> None:
    root = tmp_path / "ds"
    episodes = write_dataset(root, [30, 17, 22])
    rows = episode_rows(root)
    with av.open(str(root / f"videos/{CAM}/chunk-000/file-000.mp4")) as container:
        decoded = [(frame.time, frame.to_ndarray(format="rgb24")) for frame in container.decode(video=0)]
    assert len(decoded) == 69
    for row, frames in zip(rows, episodes, strict=True):
        start = row[f"videos/{CAM}/from_timestamp"]
        for i, original in enumerate(frames):
            time, image = decoded[row["dataset_from_index"] + i]
            assert abs(time - (start + i / FPS)) < 1e-4
            assert np.abs(image.astype(int) - original[CAM].astype(int)).mean() < 6


@pytest.mark.slow
def test_sidecars_and_provenance_are_written(tmp_path: Path) -> None:
    root = tmp_path / "ds"
    write_dataset(root, [5, 6])
    meta, arrays = load_episode_sidecar(root, 1)
    assert meta is not None and meta["seed"] == 1 and np.array_equal(arrays["tick"], np.arange(6))
    dataset = load_dataset_sidecar(root)
    assert dataset is not None
    provenance = dataset["writer"]
    assert provenance["video"]["codec"] == "libsvtav1" and provenance["video"]["crf"] == 30


@pytest.mark.slow
def test_files_roll_over_by_size_and_chunk(tmp_path: Path) -> None:
    root = tmp_path / "ds"
    write_dataset(
        root, [40, 40, 40, 40], data_files_size_in_mb=0.004, video_files_size_in_mb=0.0005, chunks_size=2
    )
    data_files = sorted(p.relative_to(root).as_posix() for p in (root / "data").rglob("*.parquet"))
    assert data_files[:3] == [
        "data/chunk-000/file-000.parquet",
        "data/chunk-000/file-001.parquet",
        "data/chunk-001/file-000.parquet",
    ]
    rows = episode_rows(root)
    refs = [(r["data/chunk_index"], r["data/file_index"]) for r in rows]
    assert refs == sorted(refs) and len(set(refs)) > 1
    video_refs = [(r[f"videos/{CAM}/chunk_index"], r[f"videos/{CAM}/file_index"]) for r in rows]
    assert len(set(video_refs)) > 1
    previous_rows: list[dict[str, Any] | None] = [None, *rows[:-1]]
    for previous, row in zip(previous_rows, rows, strict=True):
        ref = (row[f"videos/{CAM}/chunk_index"], row[f"videos/{CAM}/file_index"])
        starts_file = previous is None or ref != (
            previous[f"videos/{CAM}/chunk_index"],
            previous[f"videos/{CAM}/file_index"],
        )
        expected = 0.0 if starts_file or previous is None else previous[f"videos/{CAM}/to_timestamp"]
        assert row[f"videos/{CAM}/from_timestamp"] == pytest.approx(expected)
        with av.open(str(root / f"videos/{CAM}/chunk-{ref[0]:03d}/file-{ref[1]:03d}.mp4")) as c:
            assert c.streams.video[0].frames > 0
    assert read_data(root)["index"].tolist() == list(range(160))


@pytest.mark.slow
def test_reopen_appends_after_the_saved_episodes(tmp_path: Path) -> None:
    root = tmp_path / "ds"
    write_dataset(root, [10, 12])
    rng = np.random.default_rng(5)
    with DatasetWriter.open(root) as writer:
        assert writer.num_episodes == 2
        for _ in range(7):
            writer.add_frame(make_frame(rng, "a third task"))
        assert writer.save_episode() == 2
    data = read_data(root)
    assert data["index"].tolist() == list(range(29))
    assert data["task_index"][-1] == 2
    rows = episode_rows(root)
    assert rows[2][f"videos/{CAM}/from_timestamp"] == pytest.approx(22 / FPS)


@pytest.mark.parametrize(
    "change, key",
    [
        ({"action": np.zeros(6)}, "action"),  # float64, not float32
        ({"action": np.zeros(5, np.float32)}, "action"),  # wrong shape
        ({"observation.state": np.full(6, np.inf, np.float32)}, "observation.state"),
        ({CAM: np.zeros((H, W), np.uint8)}, CAM),
        ({CAM: np.zeros((H, W, 3), np.float32)}, CAM),
        ({"timestamp": np.float32(0.0)}, "timestamp"),  # reserved
        ({"index": 3}, "index"),
        ({"velocity": np.zeros(6, np.float32)}, "velocity"),  # not declared
        ({"task": ""}, "task"),
        ({"task": "bad \ud800"}, "task"),  # a lone surrogate: no UTF-8 for it in tasks.parquet
        ({"task": "two\nlines"}, "task"),
        ({"task": 3}, "task"),
    ],
)
@pytest.mark.slow
def test_bad_frames_are_refused_naming_the_key(tmp_path: Path, change: dict, key: str) -> None:
    rng = np.random.default_rng(0)
    with DatasetWriter.create(
        tmp_path / "ds", fps=FPS, features=so101_features({"front": (H, W)}), robot_type="so_follower"
    ) as writer:
        writer.add_frame(make_frame(rng))
        with pytest.raises(FrameError) as caught:
            writer.add_frame({**make_frame(rng), **change})
        assert caught.value.key == key
        missing = make_frame(rng)
        del missing["observation.state"]
        with pytest.raises(FrameError, match=r"observation.state"):
            writer.add_frame(missing)
        assert writer.save_episode() == 0
    assert json.loads((tmp_path / "ds/meta/info.json").read_text())["total_frames"] == 1


def test_bad_feature_specs_are_refused(tmp_path: Path) -> None:
    for features, key in [
        ({"frame_index": {"dtype": "int64", "shape": [1], "names": None}}, "frame_index"),
        ({"a/b": {"dtype": "float32", "shape": [2], "names": None}}, "a/b"),
        ({"x": {"dtype": "float13", "shape": [2], "names": None}}, "x"),
        ({"cam": {"dtype": "video", "shape": [47, 64, 3], "names": None}}, "cam"),
    ]:
        with pytest.raises(FeatureSpecError) as caught:
            DatasetWriter.create(tmp_path / "bad", fps=FPS, features=features, robot_type=None)
        assert caught.value.key == key


@pytest.mark.slow
def test_lifecycle_rules(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    root = tmp_path / "ds"
    writer = DatasetWriter.create(
        root, fps=FPS, features=so101_features({"front": (H, W)}), robot_type="so_follower"
    )
    with pytest.raises(DatasetStateError):
        writer.save_episode()
    writer.add_frame(make_frame(rng))
    with pytest.raises(DatasetStateError, match="open"):
        writer.finalize()
    writer.discard_episode()
    assert not writer.episode_open
    for _ in range(3):
        writer.add_frame(make_frame(rng))
    assert writer.save_episode() == 0
    writer.finalize()
    writer.finalize()
    with pytest.raises(DatasetStateError):
        writer.add_frame(make_frame(rng))
    assert read_data(root)["frame_index"].tolist() == [0, 1, 2]
    with pytest.raises(DatasetStateError, match="not empty"):
        DatasetWriter.create(root, fps=FPS, features=so101_features(), robot_type=None)
    with pytest.raises(DatasetError, match="fps"):
        DatasetWriter.create(tmp_path / "x", fps=0, features=so101_features(), robot_type=None)


@pytest.mark.slow
def test_an_exception_in_the_block_discards_only_the_open_episode(tmp_path: Path) -> None:
    rng = np.random.default_rng(2)
    root = tmp_path / "ds"
    with (
        pytest.raises(RuntimeError),
        DatasetWriter.create(
            root, fps=FPS, features=so101_features({"front": (H, W)}), robot_type="so_follower"
        ) as writer,
    ):
        for _ in range(4):
            writer.add_frame(make_frame(rng))
        writer.save_episode()
        for _ in range(6):
            writer.add_frame(make_frame(rng))
        raise RuntimeError("operator pressed stop")
    info = json.loads((root / "meta/info.json").read_text())
    assert (info["total_episodes"], info["total_frames"]) == (1, 4)
    assert not list((root / "hilrec/journal").glob(".episode-*"))


def test_leaving_the_block_with_an_open_episode_refuses_but_keeps_saved_ones(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    root = tmp_path / "ds"
    with (
        pytest.raises(DatasetStateError),
        DatasetWriter.create(root, fps=FPS, features=so101_features(), robot_type=None) as writer,
    ):
        writer.add_frame({k: v for k, v in make_frame(rng).items() if k != CAM})
        writer.save_episode()
        writer.add_frame({k: v for k, v in make_frame(rng).items() if k != CAM})
    assert json.loads((root / "meta/info.json").read_text())["total_episodes"] == 1


@pytest.mark.slow
def test_lerobot_loads_the_rows_and_metadata(tmp_path: Path) -> None:
    from lerobot.datasets.lerobot_dataset import LeRobotDatasetMetadata
    from lerobot.datasets.utils import get_hf_features_from_features, load_nested_dataset

    root = tmp_path / "ds"
    episodes = write_dataset(root, [12, 9])
    meta = LeRobotDatasetMetadata("hilrec/test", root=root)
    assert meta.total_episodes == 2 and meta.get_task_index("place the cube") == 1
    assert meta.episodes[1]["dataset_from_index"] == 12
    hf = load_nested_dataset(root / "data", features=get_hf_features_from_features(meta.features))
    assert len(hf) == 21
    assert np.array_equal(np.asarray(hf[13]["action"], dtype=np.float32), episodes[1][1]["action"])


@pytest.fixture()
def file_size_limit():
    """Lower RLIMIT_FSIZE for this process: writes past it fail with EFBIG, as on a full disk."""
    import resource
    import signal

    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    previous = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)

    def limit(size: int | None) -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft if size is None else size, hard))

    yield limit
    resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    signal.signal(signal.SIGXFSZ, previous)


@pytest.mark.slow
def test_a_failed_write_keeps_the_episode_for_a_retry(tmp_path: Path, file_size_limit) -> None:
    rng = np.random.default_rng(4)
    root = tmp_path / "ds"
    features = so101_features()
    frames = [{k: v for k, v in make_frame(rng).items() if k != CAM} for _ in range(3000)]
    writer = DatasetWriter.create(root, fps=FPS, features=features, robot_type=None)
    for frame in frames:
        writer.add_frame(frame)
    file_size_limit(4096)
    try:
        with pytest.raises(DatasetError, match=r"episode 0 failed .* kept with its 3000 frames"):
            writer.save_episode(sidecar={"take": "T0"})
        assert not writer.episode_open and writer.failed_saves == [0]
        assert any("episode 0 (3000 frames) is not saved yet" in p for p in writer.problems())
        with pytest.raises(DatasetError, match="episode 0 still cannot be saved"):
            writer.retry_failed(timeout=60)
    finally:
        file_size_limit(None)
    # Saved by this call, or a moment before by the commit thread's own retry.
    assert writer.retry_failed(timeout=60) in ([0], [])
    assert writer.failed_saves == [] and writer.num_episodes == 1
    writer.wait_consolidated()
    assert writer.problems() == []
    # The merge into LeRobot's files fails too while the "disk" is full, and is retried later.
    small = [{k: v for k, v in make_frame(rng).items() if k != CAM} for _ in range(3)]
    for frame in small:
        writer.add_frame(frame)
    file_size_limit(20_000)
    try:
        assert writer.save_episode() == 1
        with pytest.raises(DatasetError, match=r"merging saved episodes \[1\]"):
            writer.wait_consolidated(timeout=60)
        assert any("merging saved episodes [1]" in p for p in writer.problems())
    finally:
        file_size_limit(None)
    # Meanwhile LeRobot's files are as they were, whole: episode 0 only.
    assert json.loads((root / "meta/info.json").read_text())["total_episodes"] == 1
    assert [r["episode_index"] for r in episode_rows(root)] == [0]
    assert not list(root.rglob("*.hilrec-new"))
    writer.finalize()
    data = read_data(root)
    assert np.array_equal(data["action"], np.stack([f["action"] for f in frames + small]))
    assert json.loads((root / "meta/info.json").read_text())["total_episodes"] == 2
    sidecar, _ = load_episode_sidecar(root, 0)
    assert sidecar is not None and sidecar["take"] == "T0"


@pytest.mark.slow
def test_a_forgotten_finalize_still_leaves_a_dataset_that_loads(tmp_path: Path) -> None:
    import subprocess
    import sys

    root = tmp_path / "ds"
    script = (
        "import sys, numpy as np\n"
        "from hilrec.daemon.dataset.writer.dataset_writer import DatasetWriter\n"
        "from hilrec.daemon.so101 import so101_features\n"
        "w = DatasetWriter.create(sys.argv[1], fps=25, features=so101_features({'front': (32, 48)}),\n"
        "                         robot_type=None, video_codec='libx264')\n"
        "for n in (6, 4):\n"
        "    for i in range(n):\n"
        "        w.add_frame({'action': np.full(6, i, np.float32), 'observation.state':\n"
        "                     np.zeros(6, np.float32), 'observation.images.front':\n"
        "                     np.full((32, 48, 3), 9 * i, np.uint8), 'task': 't'})\n"
        "    w.save_episode()\n"
        "# no finalize(): the interpreter exits with the merge still queued\n"
    )
    subprocess.run([sys.executable, "-c", script, str(root)], check=True, timeout=120)
    info = json.loads((root / "meta/info.json").read_text())
    assert (info["total_episodes"], info["total_frames"]) == (2, 10)
    assert read_data(root)["frame_index"].tolist() == [0, 1, 2, 3, 4, 5, 0, 1, 2, 3]


@pytest.mark.slow
def test_writing_and_merging_never_import_pandas(tmp_path: Path) -> None:
    # pyarrow imports pandas behind pa.array() and pyarrow.dataset: half a second holding the GIL,
    # which a recording must not pay. Two tasks, two episodes, reopened: every merge path runs.
    import subprocess
    import sys

    script = (
        "import sys, numpy as np\n"
        "from hilrec.daemon.dataset.writer.dataset_writer import DatasetWriter\n"
        "from hilrec.daemon.so101 import so101_features\n"
        "w = DatasetWriter.create(sys.argv[1], fps=25, features=so101_features({}), robot_type=None)\n"
        "for n, task in ((5, 'a'), (3, 'b')):\n"
        "    for i in range(n):\n"
        "        w.add_frame({'action': np.full(6, i, np.float32),\n"
        "                     'observation.state': np.zeros(6, np.float32), 'task': task})\n"
        "    w.save_episode(sidecar={'n': n}, arrays={'x': np.arange(n)})\n"
        "w.finalize()\n"
        "with DatasetWriter.open(sys.argv[1]) as w:\n"
        "    w.add_frame({'action': np.ones(6, np.float32),\n"
        "                 'observation.state': np.zeros(6, np.float32), 'task': 'c'})\n"
        "    w.save_episode()\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'pandas')[:3])\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "ds")],
        check=True,
        timeout=120,
        capture_output=True,
        text=True,
    )
    assert done.stdout.strip() == "[]"
    assert load_task_list(tmp_path / "ds") == ["a", "b", "c"]
    assert [r["length"] for r in episode_rows(tmp_path / "ds")] == [5, 3, 1]


def test_episode_and_task_tables_equal_what_pyarrow_builds_from_python(tmp_path: Path) -> None:
    from hilrec.daemon.dataset.format.features import validate_features
    from hilrec.daemon.dataset.format.layout import episodes_schema, episodes_table, tasks_table

    features = validate_features(so101_features({"front": (H, W)}))
    schema = episodes_schema(features)
    rng = np.random.default_rng(3)

    def value(field: pa.Field) -> object:
        if not pa.types.is_list(field.type):
            return int(rng.integers(0, 1000)) if field.type == pa.int64() else float(rng.random())
        inner = field.type.value_type
        if pa.types.is_list(inner):
            return rng.random((3, 1, 1))  # image stats, as numpy
        if pa.types.is_string(inner):
            return ["pick", "plàce"]
        values: np.ndarray = np.arange(6) if inner == pa.int64() else rng.random(6)
        return values.tolist()

    rows: list[dict[str, Any]] = [{field.name: value(field) for field in schema} for _ in range(4)]
    as_lists = {
        field.name: [
            r[field.name].tolist() if isinstance(r[field.name], np.ndarray) else r[field.name] for r in rows
        ]
        for field in schema
    }
    expected = pa.Table.from_pydict(as_lists, schema=schema)
    assert episodes_table(rows, features).equals(expected, check_metadata=True)
    tasks = ["pick up the cube", "Würfel in die Schale", ""]
    table = tasks_table(tasks)
    assert table.equals(
        pa.Table.from_pydict({"task_index": [0, 1, 2], "__index_level_0__": tasks}, schema=table.schema),
        check_metadata=True,
    )


def test_saves_that_do_not_wait_commit_in_order_and_a_failed_one_is_kept(
    tmp_path: Path, file_size_limit
) -> None:
    rng = np.random.default_rng(5)
    root = tmp_path / "ds"
    features = so101_features()
    episodes = [
        [{k: v for k, v in make_frame(rng).items() if k != CAM} for _ in range(n)] for n in (4, 3, 3000, 5)
    ]
    # A long merge interval: the saved episodes wait in the journal until finalize() merges them.
    writer = DatasetWriter.create(root, fps=FPS, features=features, robot_type=None, merge_interval_s=600)
    futures = []
    for number, frames in enumerate(episodes[:2]):
        for frame in frames:
            writer.add_frame(frame)
        futures.append(writer.save_episode_nowait(sidecar={"n": number}, arrays={"x": np.arange(3)}))
    assert [f.result(timeout=60) for f in futures] == [0, 1]
    assert writer.num_episodes == 2
    assert sorted(p.name for p in (root / "hilrec/journal").iterdir()) == ["episode-000000", "episode-000001"]
    sidecar, _ = load_episode_sidecar(root, 1)
    assert sidecar is not None and sidecar["n"] == 1
    assert json.loads((root / "meta/info.json").read_text())["total_episodes"] == 0
    for frame in episodes[2]:
        writer.add_frame(frame)
    file_size_limit(4096)
    try:
        failed = writer.save_episode_nowait(sidecar={"n": 2})
        with pytest.raises(DatasetError, match=r"episode 2 failed .* kept with its 3000 frames"):
            failed.result(timeout=60)
        # The next take records as usual (it used to be refused: "an earlier save failed").
        for frame in episodes[3]:
            writer.add_frame(frame)
    finally:
        file_size_limit(None)
    # Its save commits the kept episode first, in order.
    assert writer.save_episode_nowait(sidecar={"n": 3}).result(timeout=60) == 3
    assert writer.failed_saves == []
    writer.finalize()
    info = json.loads((root / "meta/info.json").read_text())
    assert (info["total_episodes"], info["total_frames"]) == (4, 3012)
    data = read_data(root)
    assert np.array_equal(data["action"], np.stack([f["action"] for ep in episodes for f in ep]))
    assert not list((root / "hilrec/journal").glob(".episode-*"))
    for n in range(4):
        sidecar, _ = load_episode_sidecar(root, n)
        assert sidecar is not None and sidecar["n"] == n


def test_a_save_that_fails_otherwise_stops_the_line_and_keeps_those_before(tmp_path: Path) -> None:
    rng = np.random.default_rng(6)
    root = tmp_path / "ds"
    written = 0

    def hook(step: str) -> None:
        nonlocal written
        if step == "episode-written":
            written += 1
            if written == 2:
                raise RuntimeError("a bug in the commit")

    episodes = [[{k: v for k, v in make_frame(rng).items() if k != CAM} for _ in range(n)] for n in (4, 3)]
    writer = DatasetWriter.create(root, fps=FPS, features=so101_features(), robot_type=None, hook=hook)
    futures = []
    for frames in episodes:
        for frame in frames:
            writer.add_frame(frame)
        futures.append(writer.save_episode_nowait())
    assert futures[0].result(timeout=60) == 0
    with pytest.raises(DatasetError, match=r"episode 1 failed .* frames are lost"):
        futures[1].result(timeout=60)
    with pytest.raises(DatasetError, match="an earlier save failed"):
        writer.add_frame(episodes[0][0])
    with pytest.raises(DatasetError, match="episode 1 failed"):
        writer.finalize()
    info = json.loads((root / "meta/info.json").read_text())
    assert (info["total_episodes"], info["total_frames"]) == (1, 4)
    assert not list((root / "hilrec/journal").glob(".episode-*"))
    with DatasetWriter.open(root) as reopened:
        reopened.add_frame(episodes[0][0])
        assert reopened.save_episode() == 1


def test_a_bad_task_string_is_refused_and_never_poisons_the_root(tmp_path: Path) -> None:
    rng = np.random.default_rng(7)
    root = tmp_path / "ds"
    writer = DatasetWriter.create(root, fps=FPS, features=so101_features(), robot_type=None)

    def frame(task: object) -> dict:
        return {**{k: v for k, v in make_frame(rng).items() if k != CAM}, "task": task}

    good = "pick the cube"
    for _ in range(3):
        writer.add_frame(frame(good))
    with pytest.raises(FrameError) as refused:
        writer.add_frame(frame("bad \ud800"))  # mid-episode, after the fast path saw a good task
    assert refused.value.key == "task" and "not valid Unicode" in refused.value.problem
    assert "'\\ud800'" in str(refused.value)  # shown escaped, printable
    assert writer.save_episode() == 0
    with pytest.raises(FrameError, match="task"):
        writer.add_frame(frame("bad \ud800"))  # as the first frame of an episode
    assert not writer.episode_open
    writer.add_frame(frame("place the cube"))
    assert writer.save_episode() == 1
    writer.wait_consolidated(timeout=60)
    writer.finalize()
    assert load_task_list(root) == ["pick the cube", "place the cube"]
    with DatasetWriter.open(root) as reopened:
        reopened.add_frame(frame(good))
        assert reopened.save_episode() == 2


@pytest.mark.parametrize("step", ["renamed meta/episodes/chunk-000/file-000.parquet", "intent-done"])
@pytest.mark.slow
def test_a_failed_merge_keeps_lerobot_files_whole_and_is_retried(tmp_path: Path, step: str) -> None:
    """A merge that fails (here: an OSError at one of its steps while the "disk is full") leaves
    LeRobot's files as they were before it (or as after it, when it failed past its last rename),
    never in between; the journal keeps the episodes, the failure is reported with their indices,
    and the merge is retried on its own until it works. No row is lost or merged twice."""
    import threading

    rng = np.random.default_rng(8)
    root = tmp_path / "ds"
    disk_full = threading.Event()

    def hook(name: str) -> None:
        if name == step and disk_full.is_set():
            raise OSError(28, "No space left on device (simulated)")

    features = so101_features({"front": (H, W)})
    episodes = [[make_frame(rng) for _ in range(n)] for n in (6, 5, 4)]
    writer = DatasetWriter.create(
        root, fps=FPS, features=features, robot_type=None, video_codec="libx264", hook=hook
    )

    def record(frames: list[dict]) -> int:
        for frame in frames:
            writer.add_frame(frame)
        return writer.save_episode()

    assert record(episodes[0]) == 0
    writer.wait_consolidated(timeout=60)
    disk_full.set()
    assert record(episodes[1]) == 1
    if step == "intent-done":
        writer.wait_consolidated(timeout=60)  # failed after its last rename: merged all the same
        assert writer.problems() == []
        merged = 2
    else:
        with pytest.raises(DatasetError, match=r"merging saved episodes \[1\] into LeRobot") as failed:
            writer.wait_consolidated(timeout=60)
        assert "No space left on device (simulated)" in str(failed.value)
        assert any("merging saved episodes [1]" in p for p in writer.problems())
        merged = 1
    assert json.loads((root / "meta/info.json").read_text())["total_episodes"] == merged
    assert [r["episode_index"] for r in episode_rows(root)] == list(range(merged))
    assert read_data(root)["index"].tolist() == list(range(sum(len(e) for e in episodes[:merged])))
    journal = sorted(p.name for p in (root / "hilrec/journal").glob("episode-*"))
    assert journal == ["episode-000000", "episode-000001"]
    assert not list(root.rglob("*.hilrec-new")) and not list(root.rglob("*.hilrec-old"))
    disk_full.clear()
    # Retried on its own after its back-off: no save, no explicit retry.
    writer.wait_consolidated(timeout=60, retry=False)
    assert writer.problems() == []
    assert record(episodes[2]) == 2
    writer.finalize()
    assert [r["episode_index"] for r in episode_rows(root)] == [0, 1, 2]
    data = read_data(root)
    assert data["index"].tolist() == list(range(15))
    assert np.array_equal(data["action"], np.stack([f["action"] for ep in episodes for f in ep]))
    with av.open(str(root / f"videos/{CAM}/chunk-000/file-000.mp4")) as container:
        assert container.streams.video[0].frames == 15


@pytest.mark.parametrize("encoder", ["thread", "process"])
@pytest.mark.slow
def test_a_discard_under_libsvtav1_prints_nothing(
    tmp_path: Path, encoder: str, capfd: pytest.CaptureFixture[str]
) -> None:
    """SVT-AV1 writes "deinit called without sending EOS!" to fd 2 when an encoder is freed
    unflushed; a discarded take (and the writer closed after it) must not. capfd captures fd 2,
    which the encoder processes inherit."""
    rng = np.random.default_rng(11)
    capfd.readouterr()
    with DatasetWriter.create(
        tmp_path / "ds",
        fps=FPS,
        features=so101_features({"front": (H, W)}),
        robot_type="so_follower",
        video_encoder=encoder,
    ) as writer:
        for _ in range(3):
            for _ in range(15):
                writer.add_frame(make_frame(rng))
            writer.discard_episode()
        for _ in range(10):
            writer.add_frame(make_frame(rng))
        writer.save_episode()
    _out, err = capfd.readouterr()
    assert "Svt" not in err and "EOS" not in err, err
    assert writer.num_episodes == 1
