"""Benchmark of the MuJoCo twin: recording speed, rendering, replay checking, operator success.

Run: MUJOCO_GL=egl .venv/bin/python bench/bench_sim.py [--episodes 20] [--seeds 100] [--smoke]
     MUJOCO_GL=egl .venv/bin/python bench/bench_sim.py --compare-fps 30 25 [--repeats 5]

Prints one table. Targets (issue 3): recording without cameras >= 100x real time; with one
640x480 camera >= 25 frames/s; replay check >= 2000 frames/s; scripted operator >= 90 % success
over 100 seeds. "x real time" is simulated seconds (frames / fps) over wall seconds: of the
``record()`` call for the main row (twin, writer creation and the writer modules' import, every
episode, finalize; mujoco, pyarrow and av are already imported by then, and the scene compiled),
and of a whole ``hilrec record`` process (python start-up and every import) for the row below.
Rendering is compared side by side with MuJoCo's default setup on the shipped meshes (shadows,
reflections, 4x multisampling), the peer the 25 frames/s target was set against.

``--compare-fps 30 25`` instead records at each rate side by side (runs interleaved, so a change
of load on a shared machine hits both alike), each with the physics step the twin chooses for it
(30 fps: 7 x 1/210 s, 25 fps: 8 x 5 ms): the median over ``--repeats`` runs of ``record()``'s x
real time without cameras and its frames/s with one 640x480 camera, the load average around each
run, and the scripted operator's success over ``--seeds`` seeds at each rate.
"""

from __future__ import annotations

import argparse
import copy
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("MUJOCO_GL", "egl")
os.environ.setdefault("PYOPENGL_PLATFORM", "egl")
os.environ.setdefault("LP_NUM_THREADS", "1")  # as hilrec.sim.render sets it, for every row

import mujoco
import numpy as np

from hilrec.sim.episode import (
    act_and_step,
    operator_action,
    outcome_of,
    push_schedule,
    pushes_by_frame,
)
from hilrec.sim.operator import ScriptedOperator
from hilrec.sim.recorder import RecordConfig, record
from hilrec.sim.replay import replay_check
from hilrec.sim.scene import SceneConfig, compile_scene
from hilrec.sim.twin import Twin

ROWS: list[tuple[str, str, str]] = []


def row(name: str, value: str, target: str = "") -> None:
    ROWS.append((name, value, target))
    print(f"  {name}: {value}", file=sys.stderr, flush=True)


def sim_loop(seeds: range, push_rate: float = 0.0, fps: int = 25) -> tuple[list[float], int, int]:
    """Twin + operator only. Returns per-episode speed (x real time), successes, frames."""
    speeds, successes, frames = [], 0, 0
    with Twin(fps=fps, cameras=()) as twin:
        for seed in seeds:
            began = time.perf_counter()
            start = twin.reset(seed)
            operator = ScriptedOperator(seed, fps=fps, units=twin.units)
            operator.reset(start)
            pushes = pushes_by_frame(push_schedule(seed, operator.num_frames, twin.fps, push_rate))
            for frame in range(operator.num_frames):
                action = operator_action(twin, operator, frame, twin.observe())
                act_and_step(twin, action, pushes.get(frame, ()))
            successes += outcome_of(twin).success
            frames += operator.num_frames
            speeds.append(operator.num_frames / twin.fps / (time.perf_counter() - began))
    return speeds, successes, frames


def bench_record(
    workdir: Path, episodes: int, cameras: tuple[str, ...], fps: int = 25, tag: str = ""
) -> tuple[Path, float, float, list[int]]:
    """(root, wall s, CPU s of every thread, frames per episode) of one ``record`` run."""
    root = workdir / f"rec-{'-'.join(cameras) or 'none'}{tag}"
    cpu = time.process_time()
    summary = record(
        RecordConfig(root=root, episodes=episodes, seed=1000, cameras=cameras, fps=fps), progress=False
    )
    return (root, summary.wall_seconds, time.process_time() - cpu, [e.frames for e in summary.episodes])


def bench_record_process(workdir: Path, episodes: int) -> tuple[float, int]:
    """(wall s, frames) of a whole ``hilrec record --sim --cameras none`` process: interpreter
    start-up, every import, the recording and the finalized dataset."""
    root = workdir / "rec-process"
    began = time.perf_counter()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "hilrec.daemon.cli",
            "record",
            "--sim",
            "--root",
            str(root),
            "--episodes",
            str(episodes),
            "--seed",
            "1000",
            "--cameras",
            "none",
            "--no-progress",
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=600,
    )
    seconds = time.perf_counter() - began
    frames = re.search(r"(\d+) frames", done.stdout)
    if frames is None:
        raise SystemExit(f"hilrec record printed no frame count: {done.stdout!r}")
    return seconds, int(frames.group(1))


def bench_writer_alone(workdir: Path, lengths: list[int]) -> tuple[float, float]:
    """(wall s, CPU s) of the native writer taking the same episodes' rows, nothing else."""
    from hilrec.daemon.dataset.writer.dataset_writer import DatasetWriter
    from hilrec.daemon.so101 import ROBOT_TYPE
    from hilrec.sim.features import sim_features

    row_values = np.zeros(6, dtype=np.float32)
    began, cpu = time.perf_counter(), time.process_time()
    with DatasetWriter.create(
        workdir / "writer-alone", fps=25, features=sim_features({}), robot_type=ROBOT_TYPE
    ) as writer:
        for length in lengths:
            for _ in range(length):
                writer.add_frame({"action": row_values, "observation.state": row_values, "task": "t"})
            writer.save_episode(sidecar={"sim": {}}, arrays={"initial_state": np.zeros(110)})
    return time.perf_counter() - began, time.process_time() - cpu


def render_times(model: mujoco.MjModel, state: np.ndarray, *, shadows: bool, frames: int = 30) -> float:
    """Median seconds per 640x480 frame of the front camera at a twin state."""
    data = mujoco.MjData(model)
    mujoco.mj_setState(model, data, state, mujoco.mjtState.mjSTATE_INTEGRATION)
    mujoco.mj_forward(model, data)
    renderer = mujoco.Renderer(model, height=480, width=640)
    try:
        times = []
        for _ in range(frames + 2):
            began = time.perf_counter()
            renderer.update_scene(data, camera="front")
            for flag in (
                mujoco.mjtRndFlag.mjRND_SHADOW,
                mujoco.mjtRndFlag.mjRND_REFLECTION,
                mujoco.mjtRndFlag.mjRND_SKYBOX,
            ):
                renderer.scene.flags[flag] = int(shadows)
            renderer.render()
            times.append(time.perf_counter() - began)
        return statistics.median(times[2:])
    finally:
        renderer.close()


def bench_render() -> None:
    scene = SceneConfig()
    with Twin(cameras=()) as twin:
        twin.reset(0)
        state = twin.get_state()  # the render variants share the physics model's state layout
    full = compile_scene(scene, "full")
    print(
        f"  meshes: full {int(full.mesh_facenum.sum())} triangles, fast "
        f"{int(compile_scene(scene, 'fast').mesh_facenum.sum())}",
        file=sys.stderr,
    )
    default = copy.copy(full)  # MuJoCo's defaults: 4096 shadow map, 4x MSAA, shadow-casting light
    default.vis.quality.shadowsize = 4096
    default.vis.quality.offsamples = 4
    default.light_castshadow[:] = 1
    baseline = render_times(default, state, shadows=True, frames=6)
    no_shadow = render_times(full, state, shadows=False, frames=10)
    fast = render_times(compile_scene(scene, "fast"), state, shadows=False)
    row(
        "render 640x480, shipped meshes, MuJoCo defaults (shadows, 4x MSAA)",
        f"{1 / baseline:.1f} frames/s (median {baseline * 1000:.0f} ms)",
    )
    row(
        "render 640x480, shipped meshes, no shadows/reflections/MSAA",
        f"{1 / no_shadow:.1f} frames/s ({baseline / no_shadow:.1f}x defaults)",
    )
    row(
        "render 640x480, simplified meshes (hilrec default)",
        f"{1 / fast:.1f} frames/s ({baseline / fast:.1f}x defaults)",
        ">= 25 frames/s",
    )


def compare_fps(workdir: Path, rates: list[int], args: argparse.Namespace) -> None:
    """Record at each of ``rates`` side by side: medians of x real time (no cameras) and frames/s
    (one 640x480 camera) over ``args.repeats`` interleaved runs, with the load around them."""
    speed: dict[int, list[float]] = {fps: [] for fps in rates}
    camera_fps: dict[int, list[float]] = {fps: [] for fps in rates}
    loads: list[float] = []
    for repeat in range(args.repeats):
        order = rates if repeat % 2 == 0 else rates[::-1]  # neither rate always runs first
        for fps in order:
            loads.append(os.getloadavg()[0])
            root, seconds, _, lengths = bench_record(workdir, args.episodes, (), fps, f"-{fps}-{repeat}")
            speed[fps].append(sum(lengths) / fps / seconds)
            shutil.rmtree(root, ignore_errors=True)
            loads.append(os.getloadavg()[0])
            root, seconds, _, lengths = bench_record(
                workdir, args.camera_episodes, ("front",), fps, f"-{fps}-{repeat}"
            )
            camera_fps[fps].append(sum(lengths) / seconds)
            shutil.rmtree(root, ignore_errors=True)
        print(f"  repeat {repeat + 1}/{args.repeats} done", file=sys.stderr, flush=True)
    loads.append(os.getloadavg()[0])
    for fps in rates:
        with Twin(fps=fps, cameras=()) as twin:
            step = f"{twin.substeps} x {twin.timestep * 1000:.3f} ms"
        row(
            f"{fps} fps ({step}) record --cameras none: x real time, median of {args.repeats}",
            f"{statistics.median(speed[fps]):.0f}x (runs {', '.join(f'{v:.0f}' for v in speed[fps])})",
            ">= 100x real time",
        )
        runs = ", ".join(f"{v:.1f}" for v in camera_fps[fps])
        row(
            f"{fps} fps ({step}) record --cameras front 640x480: frames/s, median of {args.repeats}",
            f"{statistics.median(camera_fps[fps]):.1f} (runs {runs})",
            ">= 25 frames/s",
        )
    for fps in rates:
        _, successes, _ = sim_loop(range(args.seeds), fps=fps)
        row(
            f"{fps} fps scripted operator success, seeds 0..{args.seeds - 1}",
            f"{successes}/{args.seeds} ({100 * successes / args.seeds:.0f} %)",
            ">= 90 %",
        )
    row(
        "1-minute load average around the recording runs",
        f"median {statistics.median(loads):.1f}, min {min(loads):.1f}, max {max(loads):.1f} "
        f"({os.cpu_count()} CPUs)",
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=20, help="episodes per recording run")
    parser.add_argument("--camera-episodes", type=int, default=3)
    parser.add_argument("--seeds", type=int, default=100, help="seeds for the success rate")
    parser.add_argument(
        "--compare-fps",
        type=int,
        nargs="+",
        default=None,
        metavar="FPS",
        help="only record at these rates side by side (e.g. 30 25), each at its chosen timestep",
    )
    parser.add_argument("--repeats", type=int, default=5, help="runs per rate with --compare-fps")
    parser.add_argument("--smoke", action="store_true", help="one episode of each kind, one seed")
    args = parser.parse_args()
    if args.smoke:
        args.episodes, args.camera_episodes, args.seeds, args.repeats = 1, 1, 1, 1
    workdir = Path(tempfile.mkdtemp(prefix="bench_sim_"))
    print(
        f"bench_sim: MuJoCo {mujoco.__version__}, {os.cpu_count()} CPUs, "
        f"load average {os.getloadavg()[0]:.1f}",
        file=sys.stderr,
    )
    if args.compare_fps:
        try:
            compare_fps(workdir, args.compare_fps, args)
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
        return print_table()
    try:
        speeds, _, _ = sim_loop(range(2000, 2000 + args.episodes))
        row(
            "sim loop, no cameras, no writer (twin + operator)",
            f"{statistics.median(speeds):.0f}x real time (median of {len(speeds)} episodes)",
        )

        root, seconds, cpu, lengths = bench_record(workdir, args.episodes, ())
        frames = sum(lengths)
        row(
            "hilrec record --sim --cameras none: record() (twin, writer, episodes, finalize)",
            f"{frames / 25 / seconds:.0f}x real time ({frames} frames in {seconds:.2f} s, CPU {cpu:.2f} s)",
            ">= 100x real time",
        )
        seconds, cpu = bench_writer_alone(workdir, lengths)
        row(
            "  of which: native DatasetWriter alone on the same rows",
            f"{seconds:.2f} s (CPU {cpu:.2f} s) = {frames / 25 / seconds:.0f}x real time",
        )
        seconds, frames_process = bench_record_process(workdir, args.episodes)
        row(
            "  the same as a whole hilrec record process (python start-up, imports)",
            f"{frames_process / 25 / seconds:.0f}x real time ({frames_process} frames in {seconds:.2f} s)",
        )

        began = time.perf_counter()
        report = replay_check(root)
        seconds_replay = time.perf_counter() - began
        assert report.passed, report.format_text()
        row(
            "hilrec check --replay (replay_check, reading included)",
            f"{frames / seconds_replay:.0f} frames/s, all {len(report.episodes)} bit-exact",
            ">= 2000 frames/s",
        )

        bench_render()
        _, seconds, cpu, lengths = bench_record(workdir, args.camera_episodes, ("front",))
        frames = sum(lengths)
        row(
            "hilrec record --sim --cameras front 640x480 (render + encode + write)",
            f"{frames / seconds:.1f} frames/s ({frames} frames in {seconds:.1f} s, CPU {cpu:.1f} s)",
            ">= 25 frames/s",
        )

        _, successes, _ = sim_loop(range(args.seeds))
        row(
            f"scripted operator success, seeds 0..{args.seeds - 1}",
            f"{successes}/{args.seeds} ({100 * successes / args.seeds:.0f} %)",
            ">= 90 %",
        )
        _, successes, _ = sim_loop(range(args.seeds), push_rate=0.5)
        row(
            "scripted operator success with 0.5 pushes/s (re-plans when the cube is knocked), "
            f"seeds 0..{args.seeds - 1}",
            f"{successes}/{args.seeds} ({100 * successes / args.seeds:.0f} %)",
        )
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print(
        f"load average at the end {os.getloadavg()[0]:.1f} (2 CPUs shared with other work)", file=sys.stderr
    )
    return print_table()


def print_table() -> int:
    width = max(len(name) for name, _, _ in ROWS)
    value_width = max(len(value) for _, value, _ in ROWS)
    print(f"{'measurement':<{width}}  {'result':<{value_width}}  target")
    print("-" * (width + value_width + 12))
    for name, value, target in ROWS:
        print(f"{name:<{width}}  {value:<{value_width}}  {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
