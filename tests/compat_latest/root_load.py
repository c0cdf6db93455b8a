"""compat-latest (a), inside the root: LeRobot 0.6.1 loads what hilrec wrote.

For every ``<name>.expected.json`` written by host_write.py, opens ``<name>/`` with
``LeRobotDataset(repo_id, root=...)`` (video_backend="pyav": LeRobot's own PyAV decoder and its
timestamp tolerance check) and compares with what hilrec's reader gave on the host: metadata,
every numeric column bit for bit, and every item ``ds[i]``, its decoded video frames included.

Usage: root_load.py DIR
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
from root_common import Results, warnings_logged


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def check_dataset(results: Results, root: Path, meta: dict[str, Any], expected: Any) -> None:
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    name = root.name
    with warnings_logged() as logged:
        ds = LeRobotDataset(f"hilrec/{name}", root=root, video_backend="pyav")
    results.check(
        f"{name}: opens, {ds.num_episodes} episodes, {ds.num_frames} frames",
        (ds.num_episodes, ds.num_frames, ds.fps)
        == (meta["total_episodes"], meta["total_frames"], meta["fps"]),
        f"LeRobot says {(ds.num_episodes, ds.num_frames, ds.fps)}",
    )
    results.check(
        f"{name}: no warning while loading",
        not logged,
        "; ".join(logged),
    )
    results.check(f"{name}: robot_type", ds.meta.robot_type == meta["robot_type"], str(ds.meta.robot_type))
    results.check(
        f"{name}: features and their order",
        list(ds.meta.features) == meta["features"],
        f"{list(ds.meta.features)} != {meta['features']}",
    )
    results.check(f"{name}: video keys", ds.meta.video_keys == meta["video_keys"], str(ds.meta.video_keys))
    tasks = [ds.meta.tasks.iloc[i].name for i in range(len(ds.meta.tasks))]
    results.check(f"{name}: tasks", tasks == meta["tasks"], f"{tasks} != {meta['tasks']}")
    lengths = [int(n) for n in ds.meta.episodes["length"]]
    episode_tasks = [list(t) for t in ds.meta.episodes["tasks"]]
    results.check(
        f"{name}: episode lengths and tasks",
        lengths == meta["lengths"] and episode_tasks == meta["episode_tasks"],
        f"{lengths}, {episode_tasks}",
    )
    results.check(f"{name}: stats load", ds.meta.stats is not None and "action" in ds.meta.stats, "no stats")

    columns = ds.hf_dataset.with_format("numpy")[:]
    bad = [
        key for key in meta["numeric"] if not same_bits(np.asarray(columns[key]), expected[f"column/{key}"])
    ]
    results.check(f"{name}: numeric columns bit-equal ({len(meta['numeric'])})", not bad, f"differ: {bad}")

    item_problems: list[str] = []
    worst = 0
    for i in range(len(ds)):
        item = ds[i]
        for key in meta["numeric"]:
            got = item[key].numpy()
            want = expected[f"column/{key}"][i]
            if not same_bits(got.reshape(np.shape(want)), np.asarray(want)):
                item_problems.append(f"ds[{i}][{key}] = {got} != {want}")
        task_index = int(expected["column/task_index"][i])
        if item["task"] != meta["tasks"][task_index]:
            item_problems.append(f"ds[{i}]['task'] = {item['task']!r}")
        for key in meta["video_keys"]:
            image = item[key]
            decoded = (image.numpy().transpose(1, 2, 0) * 255.0).round().astype(np.uint8)
            want = expected[f"video/{key}"][i]
            if decoded.shape != want.shape:
                item_problems.append(f"ds[{i}][{key}] shape {decoded.shape} != {want.shape}")
                continue
            worst = max(worst, int(np.abs(decoded.astype(np.int16) - want).max()))
    results.check(
        f"{name}: every ds[i] ({len(ds)} items) matches hilrec's reader",
        not item_problems,
        "; ".join(item_problems[:5]),
    )
    if meta["video_keys"]:
        results.check(
            f"{name}: LeRobot's decoded frames equal hilrec's reader's (max |diff| {worst} levels)",
            worst == 0,
            f"max |diff| {worst} of 255",
        )


def main() -> None:
    results = Results()
    base = Path(sys.argv[1])
    for meta_path in sorted(base.glob("*.expected.json")):
        name = meta_path.name.removesuffix(".expected.json")
        meta = json.loads(meta_path.read_text())
        expected = np.load(base / f"{name}.expected.npz")
        results.run(f"{name}: load", lambda: check_dataset(results, base / name, meta, expected))  # noqa: B023
    results.finish()


if __name__ == "__main__":
    main()
