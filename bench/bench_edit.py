"""Benchmark of `hilrec edit delete-episodes`: delete one episode of 50, against LeRobot's own.

Run: MUJOCO_GL=egl .venv/bin/python bench/bench_edit.py [--root DIR] [--episodes 50]
         [--size 128x96] [--delete 25] [--repeats 3] [--smoke]

A sim dataset is recorded first (`hilrec record --sim --root R --episodes 50 --seed 0 --cameras
front --size 128x96`, libsvtav1 as LeRobot encodes, unless --root names one already there). Then,
``repeats`` times each, on a fresh copy of it:

- hilrec, to a new folder (``--out``, as LeRobot writes one) and in place: the whole edit, root
  lock, result written beside, ``hilrec check`` of the result with every frame decoded, the
  atomic exchange; and once more with ``--quick-check`` (videos demuxed, not decoded);
- LeRobot 0.4.4: ``LeRobotDataset(repo_id, root=R)`` then ``dataset_tools.delete_episodes``
  (LeRobot's load is timed apart and not counted), when LeRobot is installed.

The table gives the median wall time and the 1-minute load average before and after each line,
since the machine is shared. hilrec's video files are cut by packet copy; LeRobot re-encodes the
files that lose an episode.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from _sim_dataset import record_sim_dataset

from hilrec.daemon.dataset.check.checker import check_dataset
from hilrec.daemon.dataset.format.reader import load_info
from hilrec.daemon.tools import edit


def timed(
    label: str, repeats: int, run: Callable[[Path], None], source: Path, work: Path
) -> tuple[str, float]:
    times = []
    load_before = os.getloadavg()[0]
    for i in range(repeats):
        copy = work / f"{label.replace(' ', '_')}-{i}"
        shutil.copytree(source, copy, symlinks=True)
        started = time.perf_counter()
        run(copy)
        times.append(time.perf_counter() - started)
    load_after = os.getloadavg()[0]
    median = statistics.median(times)
    line = (
        f"{label:<44} {median:8.2f} s  (runs {', '.join(f'{t:.2f}' for t in times)}; "
        f"load {load_before:.1f} -> {load_after:.1f})"
    )
    print(line, flush=True)
    return line, median


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=Path("build/bench-edit/sim50"))
    parser.add_argument("--episodes", type=int, default=50)
    parser.add_argument("--size", default="128x96", help="camera WxH (default 128x96)")
    parser.add_argument("--delete", type=int, default=25, help="the episode to delete")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--smoke", action="store_true", help="delete episode 1 of 3 at 64x48, once each")
    args = parser.parse_args()
    if args.smoke:
        args.episodes, args.size, args.delete, args.repeats = 3, "64x48", 1, 1
        args.root = args.root.with_name("sim3-smoke")
    if not (args.root / "meta/info.json").exists():
        args.root.parent.mkdir(parents=True, exist_ok=True)
        record_sim_dataset(args.root, args.episodes, args.size)
    info = load_info(args.root)
    print(
        f"dataset {args.root}: {info['total_episodes']} episodes, {info['total_frames']} frames, "
        f"cpus {os.cpu_count()}; deleting episode {args.delete}"
    )
    with tempfile.TemporaryDirectory(dir=args.root.parent) as tmp:
        work = Path(tmp)

        def hilrec_out(root: Path) -> None:
            edit.delete_episodes(root, [args.delete], out=root.with_name(root.name + "-out"))

        def hilrec_in_place(root: Path) -> None:
            edit.delete_episodes(root, [args.delete])

        def hilrec_quick(root: Path) -> None:
            edit.delete_episodes(root, [args.delete], options=edit.Options(decode=False))

        timed("hilrec edit delete-episodes --out", args.repeats, hilrec_out, args.root, work)
        timed("hilrec edit delete-episodes (in place)", args.repeats, hilrec_in_place, args.root, work)
        timed("hilrec edit delete-episodes --quick-check", args.repeats, hilrec_quick, args.root, work)
        try:
            from lerobot.datasets.dataset_tools import delete_episodes
            from lerobot.datasets.lerobot_dataset import LeRobotDataset
        except ImportError as exc:
            print(f"LeRobot not importable ({exc}): no comparison")
            return 0
        loads: list[float] = []

        def lerobot(root: Path) -> None:
            started = time.perf_counter()
            dataset = LeRobotDataset("bench/src", root=root, video_backend="pyav")
            loads.append(time.perf_counter() - started)
            delete_episodes(
                dataset, [args.delete], output_dir=root.with_name(root.name + "-out"), repo_id="bench/out"
            )

        timed("LeRobot delete_episodes (load included)", args.repeats, lerobot, args.root, work)
        print(f"{'  of which LeRobotDataset load':<44} {statistics.median(loads):8.2f} s")
        out = next(work.glob("LeRobot*-0-out"))
        report = check_dataset(out, workers=1)
        print(
            f"hilrec check of LeRobot's result: {len(report.errors)} error(s), "
            f"{len(report.warnings)} warning(s) ({sorted(report.rules_failed())})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
