"""compat-latest (a), host side: hilrec writes datasets, and says what its own reader reads back.

Runs on the host venv (the Python hilrec is developed on). For every dataset it writes
``<name>/`` and ``<name>.expected.npz``: the numeric columns of every episode as
``hilrec.daemon.dataset.format.reader.read_episode`` returns them, every video frame as
``read_episode_frames`` decodes it, and the metadata LeRobot should report. ``root_load.py``
(inside the Python 3.13 root) then loads each dataset with LeRobot 0.6.1 and compares.

Usage: host_write.py OUT
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "dataset"))
from _frames import write_dataset

from hilrec.daemon.dataset.format import reader
from hilrec.daemon.dataset.writer.dataset_writer import DatasetWriter

LENGTHS = [14, 9, 11]
SIZE = (48, 64)  # (height, width)


def write_all(out: Path) -> list[Path]:
    roots = []
    # The recorder as a user runs it: the MuJoCo twin, the scripted operator, one camera.
    sim = out / "sim_front"
    hilrec = Path(sys.executable).with_name("hilrec")
    subprocess.run(
        [
            *(str(hilrec), "record", "--sim", "--root", str(sim), "--episodes", "2"),
            *("--cameras", "front", "--size", f"{SIZE[1]}x{SIZE[0]}", "--no-progress"),
        ],
        check=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    roots.append(sim)
    # The writer directly: two cameras (libsvtav1), none, libx264, and files that roll over.
    variants: dict[str, dict[str, Any]] = {
        "writer_two_cameras": {"cameras": ("front", "wrist")},
        "writer_plain": {"cameras": ()},
        "writer_h264": {"cameras": ("front",), "video_codec": "libx264"},
        "writer_rollover": {
            "cameras": ("front",),
            "data_files_size_in_mb": 0.001,
            "video_files_size_in_mb": 0.001,
        },
    }
    for name, kwargs in variants.items():
        root = out / name
        write_dataset(DatasetWriter.create, root, LENGTHS, image_size=SIZE, **kwargs)
        roots.append(root)
    # Re-spelled for LeRobot 0.6's merge by `hilrec edit for-lerobot`: it must load there too.
    respelled = out / "writer_two_cameras_for_lerobot_06"
    subprocess.run(
        [
            *(str(hilrec), "edit", "for-lerobot", str(out / "writer_two_cameras")),
            *("--version", "0.6", "--out", str(respelled)),
        ],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    roots.append(respelled)
    return roots


def expected(root: Path) -> None:
    info = reader.load_info(root)
    episodes = reader.load_episodes(root)
    numeric = [k for k, ft in info["features"].items() if ft["dtype"] not in ("video", "image")]
    videos = [k for k, ft in info["features"].items() if ft["dtype"] == "video"]
    arrays: dict[str, np.ndarray] = {}
    per_episode = [reader.read_episode(root, e["episode_index"]) for e in episodes]
    for key in numeric:
        arrays[f"column/{key}"] = np.concatenate([cols[key] for cols in per_episode])
    for key in videos:
        arrays[f"video/{key}"] = np.concatenate(
            [reader.read_episode_frames(root, e["episode_index"], key) for e in episodes]
        )
    np.savez(root.with_name(root.name + ".expected.npz"), allow_pickle=False, **arrays)
    meta = {
        "fps": info["fps"],
        "robot_type": info["robot_type"],
        "total_episodes": info["total_episodes"],
        "total_frames": info["total_frames"],
        "features": list(info["features"]),
        "numeric": numeric,
        "video_keys": videos,
        "tasks": reader.load_task_list(root),
        "episode_tasks": [e["tasks"] for e in episodes],
        "lengths": [e["length"] for e in episodes],
        "files": sorted(
            str(p.relative_to(root)) for p in root.rglob("*") if p.suffix in (".parquet", ".mp4")
        ),
    }
    root.with_name(root.name + ".expected.json").write_text(json.dumps(meta, indent=1))


def main() -> None:
    out = Path(sys.argv[1])
    for root in write_all(out):
        expected(root)
        print(f"wrote {root.name}: {reader.load_info(root)['total_frames']} frames")


if __name__ == "__main__":
    main()
