"""compat-latest (b), inside the root: LeRobot 0.6.1 writes, ``hilrec check`` (Python 3.13) checks.

Each case writes a dataset through LeRobot 0.6.1's own API (``LeRobotDataset.create`` /
``add_frame`` / ``save_episode`` / ``finalize``, ``LeRobotDataset.resume``, its annotation
pipeline's writer), with SO-101 features built by LeRobot's ``hw_to_dataset_features``, loads it
back with LeRobot (so the case is a dataset LeRobot itself accepts), then runs ``hilrec check`` on
it, the command installed in this venv, and demands exit 0.

Last, LeRobot's merge (``aggregate_datasets``) of hilrec's datasets from (a), with each other and
with LeRobot's own (after ``hilrec edit for-lerobot --version 0.6``), ``hilrec edit merge`` of
hilrec's and LeRobot's, and ``hilrec check`` on every result.

Usage: root_write.py DIR [HILREC_DATASETS_DIR]
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
import numpy as np
from _frames import FPS, episode_frames
from root_common import Results, warnings_logged

from hilrec.daemon.so101 import ROBOT_TYPE, so101_features

MOTORS = ("shoulder_pan", "shoulder_lift", "elbow_flex", "wrist_flex", "wrist_roll", "gripper")
LENGTHS = [14, 9, 11]
SIZE = (48, 64)  # (height, width)
REPO = "lerobot061"


def lerobot_features(cameras: tuple[str, ...], video: bool = True) -> dict[str, dict[str, Any]]:
    """The features lerobot-record builds for an SO-101 follower with these cameras."""
    from lerobot.utils.feature_utils import hw_to_dataset_features

    motors: dict[str, Any] = {f"{m}.pos": float for m in MOTORS}
    observation: dict[str, Any] = {**motors, **dict.fromkeys(cameras, (*SIZE, 3))}
    return {
        **hw_to_dataset_features(motors, "action", use_video=video),
        **hw_to_dataset_features(observation, "observation", use_video=video),
    }


def record(root: Path, cameras: tuple[str, ...], *, episodes: range, ds: Any = None, **create: Any) -> Any:
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    if ds is None:
        video = create.pop("use_videos", True)
        ds = LeRobotDataset.create(
            f"{REPO}/{root.name}",
            fps=FPS,
            root=root,
            robot_type=ROBOT_TYPE,
            features=lerobot_features(cameras, video),
            use_videos=video,
            video_backend="pyav",
            **create,
        )
    for episode in episodes:
        for frame in episode_frames(
            episode, LENGTHS[episode % len(LENGTHS)], cameras=cameras, image_size=SIZE
        ):
            ds.add_frame(dict(frame))
        ds.save_episode()
    ds.finalize()
    return ds


def annotate(root: Path) -> None:
    """What ``lerobot-annotate`` writes, minus the VLM: subtask/plan rows (``language_persistent``),
    a ``say`` tool call (``language_events``), the two language features and ``tools`` in info.json.
    Staged and written by LeRobot 0.6.1's own annotation writer."""
    from lerobot.annotations.steerable_pipeline.executor import Executor
    from lerobot.annotations.steerable_pipeline.reader import iter_episodes
    from lerobot.annotations.steerable_pipeline.staging import EpisodeStaging
    from lerobot.annotations.steerable_pipeline.writer import LanguageColumnsWriter, speech_atom

    staging = root.parent / f"{root.name}.staging"
    records = list(iter_episodes(root))
    for rec in records:
        middle = rec.frame_timestamps[len(rec.frame_timestamps) // 2]
        subtasks = [
            {"role": "assistant", "content": "reach the cube", "style": "subtask", "timestamp": 0.0},
            {"role": "assistant", "content": "lift the cube", "style": "subtask", "timestamp": middle},
            {"role": "assistant", "content": "reach, then lift", "style": "plan", "timestamp": 0.0},
        ]
        EpisodeStaging(staging, rec.episode_index).write("plan", subtasks)
        EpisodeStaging(staging, rec.episode_index).write(
            "interjections", [speech_atom(rec.frame_timestamps[1], "on it")]
        )
    LanguageColumnsWriter().write_all(records, staging, root)
    Executor._ensure_annotation_metadata_in_info(root)
    shutil.rmtree(staging)


def case_resumed(root: Path) -> None:
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    record(root, ("front",), episodes=range(2))
    record(
        root,
        ("front",),
        episodes=range(2, 3),
        ds=LeRobotDataset.resume(f"{REPO}/{root.name}", root=root, video_backend="pyav"),
    )


def case_tools(root: Path) -> None:
    from lerobot.datasets.dataset_metadata import LeRobotDatasetMetadata
    from lerobot.datasets.language import SAY_TOOL_SCHEMA

    record(root, (), episodes=range(3))
    LeRobotDatasetMetadata(f"{REPO}/{root.name}", root=root).tools = [SAY_TOOL_SCHEMA]


def case_annotated(root: Path) -> None:
    record(root, ("front",), episodes=range(3))
    annotate(root)


def rgb(vcodec: str) -> Any:
    from lerobot.configs import RGBEncoderConfig

    return RGBEncoderConfig(vcodec=vcodec)


CASES: dict[str, Callable[[Path], Any]] = {
    # the lerobot-record defaults: libsvtav1 (crf 30, g 2, preset 12), PNG staging, then encode
    "video_av1": lambda r: record(r, ("front",), episodes=range(3)),
    "video_h264": lambda r: record(r, ("front",), episodes=range(3), rgb_encoder=rgb("h264")),
    "two_cameras_parallel_encoding": lambda r: record(r, ("front", "wrist"), episodes=range(3)),
    "streaming_encoding": lambda r: record(r, ("front",), episodes=range(3), streaming_encoding=True),
    "plain": lambda r: record(r, (), episodes=range(3)),
    "images_in_parquet": lambda r: record(r, ("front",), episodes=range(2), use_videos=False),
    "resumed": case_resumed,
    "tools_in_info": case_tools,
    "annotated_subtasks": case_annotated,
}


def merge(results: Results, name: str, sources: list[Path], out: Path) -> None:
    """LeRobot 0.6.1's ``aggregate_datasets`` (``lerobot-edit-dataset merge``) on ``sources``,
    then ``hilrec check`` on what it wrote."""
    from lerobot.configs import VIDEO_ENCODER_INFO_KEYS
    from lerobot.datasets.aggregate import aggregate_datasets

    first = json.loads((sources[0] / "meta/info.json").read_text())["features"]
    for source in sources[1:]:
        other = json.loads((source / "meta/info.json").read_text())["features"]
        for key, spec in first.items():
            a = {k: v for k, v in (spec.get("info") or {}).items() if k not in VIDEO_ENCODER_INFO_KEYS}
            b = {
                k: v
                for k, v in (other.get(key, {}).get("info") or {}).items()
                if k not in VIDEO_ENCODER_INFO_KEYS
            }
            if a != b:
                only = sorted(set(a.items()) ^ set(b.items()), key=str)
                print(f"note: {name}: {key} info differs beyond the encoder settings: {only}")

    def run() -> bool:
        ids = [f"{REPO}/{p.parent.name}-{p.name}" for p in sources]
        aggregate_datasets(ids, f"{REPO}/{out.name}", roots=sources, aggr_root=out)
        return True

    if results.run(f"{name}: LeRobot merges them", run):
        results.check(f"{name}: LeRobot merges them", True)
        hilrec_check(results, name, out)


def hilrec_check(results: Results, name: str, root: Path) -> None:
    hilrec = Path(sys.executable).with_name("hilrec")
    done = subprocess.run([str(hilrec), "check", str(root)], capture_output=True, text=True, check=False)
    output = (done.stdout + done.stderr).strip()
    print("\n".join(f"    | {line}" for line in output.splitlines()))
    results.check(f"{name}: hilrec check exits 0", done.returncode == 0, f"exit {done.returncode}")


def main() -> None:
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    av.logging.set_level(av.logging.ERROR)  # the encoders' chatter
    results = Results()
    base = Path(sys.argv[1])
    ours, theirs = so101_features({"front": SIZE}), lerobot_features(("front",))

    def columns(features: dict[str, Any]) -> list[tuple[Any, ...]]:
        return [(k, v["dtype"], list(v["shape"]), v["names"]) for k, v in features.items()]

    results.check(
        "hilrec's SO-101 features are LeRobot 0.6.1's (keys, order, dtype, shape, names)",
        columns(ours) == columns(theirs),
        f"\n  hilrec: {columns(ours)}\n  lerobot: {columns(theirs)}",
    )
    for key in theirs:
        if theirs[key].get("info") != ours.get(key, {}).get("info"):
            print(
                f"note: {key}: LeRobot 0.6.1 creates it with info {theirs[key].get('info')}, "
                f"hilrec with {ours.get(key, {}).get('info')}"
            )
    for name, write in CASES.items():
        root = base / name
        with warnings_logged() as logged:
            if results.run(f"{name}: LeRobot writes", lambda: write(root) or True) is None:  # noqa: B023
                continue
        print(
            f"-- {name}: written by LeRobot 0.6.1" + (f" (warnings: {'; '.join(logged)})" if logged else "")
        )
        ds = results.run(
            f"{name}: LeRobot loads it back",
            lambda: LeRobotDataset(f"{REPO}/{root.name}", root=root, video_backend="pyav"),  # noqa: B023
        )
        if ds is not None:
            item = ds[len(ds) - 1]
            results.check(
                f"{name}: LeRobot loads it back ({ds.num_episodes} episodes, {ds.num_frames} frames)",
                np.asarray(item["action"]).shape == (6,),
                f"last item {sorted(item)}",
            )
        hilrec_check(results, name, root)
    if len(sys.argv) > 2:  # the datasets hilrec wrote for (a)
        merges(results, base, Path(sys.argv[2]))
    results.finish()


def merges(results: Results, base: Path, hilrec_dir: Path) -> None:
    """Merging hilrec's datasets with LeRobot 0.6.1's, as a user of 0.6.1 does: hilrec writes
    LeRobot 0.4.4's spelling of the video info, which 0.6.1's merge refuses beside its own;
    ``hilrec edit for-lerobot --version 0.6`` re-spells it, or ``hilrec edit merge`` reads both."""
    from lerobot.datasets.aggregate import aggregate_datasets
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    two = hilrec_dir / "writer_two_cameras"
    merge(results, "merge_hilrec_with_hilrec", [two, two], base / "merged_hilrec_hilrec")
    lerobot_two = base / "two_cameras_parallel_encoding"

    def refused() -> bool:
        ids = [f"{REPO}/{p.name}" for p in (two, lerobot_two)]
        try:
            aggregate_datasets(ids, f"{REPO}/refused", roots=[two, lerobot_two], aggr_root=base / "refused")
        except ValueError as exc:
            return "Same features is expected" in str(exc)
        return False

    results.check(
        "merge_hilrec_0.4_spelling_with_lerobot: LeRobot 0.6.1 refuses it (why for-lerobot exists)",
        bool(results.run("merge_hilrec_0.4_spelling_with_lerobot", refused)),
    )
    respelled = base / "hilrec_for_lerobot_06"
    if hilrec_run(
        results,
        "hilrec edit for-lerobot --version 0.6",
        ["edit", "for-lerobot", str(two), "--version", "0.6", "--out", str(respelled)],
    ):
        merge(results, "merge_hilrec_with_lerobot", [respelled, lerobot_two], base / "merged_hilrec_lerobot")
    ours = base / "hilrec_merged_with_lerobot"
    if hilrec_run(
        results,
        "hilrec edit merge (a 0.4-spelled hilrec and a LeRobot 0.6.1 dataset) --lerobot 0.6",
        ["edit", "merge", str(two), str(lerobot_two), "--out", str(ours), "--lerobot", "0.6"],
    ):
        ds = results.run(
            "hilrec_merged_with_lerobot: LeRobot loads it",
            lambda: LeRobotDataset(f"{REPO}/{ours.name}", root=ours, video_backend="pyav"),
        )
        if ds is not None:
            item = ds[len(ds) - 1]
            results.check(
                f"hilrec_merged_with_lerobot: {ds.num_episodes} episodes, {ds.num_frames} frames",
                ds.num_episodes == 6 and np.asarray(item["observation.images.wrist"]).shape == (3, *SIZE),
                f"{ds.num_episodes} episodes, last item {sorted(item)}",
            )
        merge(results, "merge_hilrec_merged_with_lerobot", [ours, lerobot_two], base / "merged_again")


def hilrec_run(results: Results, name: str, args: list[str]) -> bool:
    """``hilrec ARGS...`` (this venv's, Python 3.13); a check that it exits 0."""
    hilrec = Path(sys.executable).with_name("hilrec")
    done = subprocess.run([str(hilrec), *args], capture_output=True, text=True, check=False)
    output = (done.stdout + done.stderr).strip()
    print("\n".join(f"    | {line}" for line in output.splitlines()[-6:]))
    return results.check(f"{name}: exits 0", done.returncode == 0, f"exit {done.returncode}")


if __name__ == "__main__":
    main()
