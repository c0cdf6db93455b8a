"""``hilrec coverage ROOT``: how much of the task a dataset covers, and where it leaves gaps.

For any LeRobot v3.0 dataset (only ``observation.state`` is needed):

- per-region counts on a grid over a pair of joints (``--pair``, else the two of largest
  variance; ``--bin`` units a cell, over the SO-101's joint range): the share of cells holding a
  state;
- over the cube's placed pose (x, y) where the hilrec sidecar has it;
- the share of episodes with recorded disturbances, and of frames with a push on them.

Against a test distribution (``--against ROOT`` for a dataset, or ``--against-seeds A:B`` for
scripted-operator roll-outs of those seeds on the twin, ``--pushes RATE`` per second), the test
coverage: the share of test states within ``--radius`` (0.5 by default) of some dataset state,
distances in units of the dataset's per-joint standard deviation. A KD-tree (scipy) answers that
in seconds for 100k x 100k states. The test states farthest from the data are listed with the
episode (or seed) and frame that reproduce them.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from scipy.spatial import cKDTree

from hilrec.daemon.dataset import load_episode_sidecar, load_episodes, load_info, read_episode
from hilrec.daemon.errors import DatasetError
from hilrec.daemon.so101 import JOINT_NAMES, STATE_KEY, arms_of, joint_names

DEFAULT_RADIUS = 0.5  # normalised distance, as in the offline-datasets lesson
DEFAULT_BIN = 10.0  # units (degrees for body joints, percent for the gripper)
CUBE_BIN_M = 0.01


@dataclass
class States:
    """Stacked states with where each came from: (episode or seed, frame)."""

    values: np.ndarray  # float64 (n, 6 per arm)
    origin: list[tuple[str, int, int]]  # ("episode" | "seed", number, frame) per row ranges
    names: tuple[str, ...] = JOINT_NAMES  # the joint of each column (two arms: left_..., right_...)
    cubes: list[tuple[float, float]] = field(default_factory=list)
    episodes: int = 0
    disturbed_episodes: int = 0
    pushed_frames: int = 0
    # Per origin, the frame its first row is (empty: every origin starts at frame 0).
    first_frames: list[int] = field(default_factory=list)

    def where(self, row: int) -> tuple[str, int, int]:
        for at in range(len(self.origin) - 1, -1, -1):
            kind, number, first = self.origin[at]
            if row >= first:
                return kind, number, row - first + (self.first_frames[at] if self.first_frames else 0)
        raise IndexError(row)


def dataset_states(root: Path) -> States:
    rows = load_episodes(root)
    if not rows:
        raise DatasetError(f"{root}: no episodes to measure")
    chunks: list[np.ndarray] = []
    names = joint_names(dataset_arms(root))
    states = States(values=np.empty((0, len(names))), origin=[], names=names)
    first = 0
    for row in rows:
        index = int(row["episode_index"])
        values = read_episode(root, index, [STATE_KEY])[STATE_KEY].astype(np.float64)
        chunks.append(values)
        states.origin.append(("episode", index, first))
        first += len(values)
        meta, _ = load_episode_sidecar(root, index)
        sim = (meta or {}).get("sim") or {}
        cube = sim.get("cube")
        if isinstance(cube, dict) and "x" in cube and "y" in cube:
            states.cubes.append((float(cube["x"]), float(cube["y"])))
        pushes = sim.get("disturbances") or []
        states.disturbed_episodes += bool(pushes)
        states.pushed_frames += len({int(p.get("frame", -1)) for p in pushes})
    states.values = np.concatenate(chunks)
    states.episodes = len(rows)
    return states


def dataset_arms(root: Path) -> int:
    """How many arms the dataset's ``observation.state`` columns stand for (1 when unnamed)."""
    names = ((load_info(root).get("features") or {}).get(STATE_KEY) or {}).get("names") or []
    return arms_of(names) or 1


def rollout_states(seeds: Iterable[int], *, fps: int = 25, push_rate: float = 0.0, arms: int = 1) -> States:
    """The scripted operator's episodes for ``seeds``, exactly as ``hilrec record --sim`` plays
    them (``arms=2``: the two-arm handover scene)."""
    from hilrec.sim.bimanual_operator import make_operator
    from hilrec.sim.bimanual_scene import BimanualSceneConfig
    from hilrec.sim.recorder import run_episode
    from hilrec.sim.scene import SceneConfig
    from hilrec.sim.twin import Twin

    class Collector:  # the recorder's frame loop, keeping the states instead of writing them
        def __init__(self) -> None:
            self.rows: list[np.ndarray] = []

        def add_frame(self, frame: dict[str, Any]) -> None:
            self.rows.append(np.asarray(frame[STATE_KEY], dtype=np.float64))

        def discard_episode(self) -> None:
            self.rows.clear()

    names = joint_names(arms)
    states = States(values=np.empty((0, len(names))), origin=[], names=names)
    chunks: list[np.ndarray] = []
    first = 0
    scene = SceneConfig() if arms == 1 else BimanualSceneConfig()
    with Twin(fps=fps, cameras=(), scene=scene) as twin:
        for seed in seeds:
            collector = Collector()
            operator = make_operator(seed, fps=fps, scene=twin.scene, units=twin.units)
            # The recorder's loop calls only add_frame and discard_episode of its sink.
            sink: Any = collector
            episode = run_episode(twin, operator, sink, seed=seed, task="coverage", push_rate=push_rate)
            chunks.append(np.stack(collector.rows))
            states.origin.append(("seed", seed, first))
            first += len(collector.rows)
            cube = episode.sidecar["sim"]["cube"]
            states.cubes.append((float(cube["x"]), float(cube["y"])))
            pushes = episode.sidecar["sim"]["disturbances"]
            states.disturbed_episodes += bool(pushes)
            states.pushed_frames += len(pushes)
            states.episodes += 1
    states.values = np.concatenate(chunks)
    return states


@dataclass
class Coverage:
    root: str
    states: int
    episodes: int
    pair: tuple[str, str]
    bin_size: float
    cells_occupied: int
    cells_total: int
    cube_cells_occupied: int
    disturbed_episode_share: float
    pushed_frame_share: float
    radius: float
    test_states: int = 0
    test_coverage: float | None = None
    farthest: list[dict[str, Any]] = field(default_factory=list)
    grid: np.ndarray | None = None
    extent: tuple[float, float, float, float] = (0.0, 0.0, 0.0, 0.0)

    @property
    def cell_share(self) -> float:
        return self.cells_occupied / self.cells_total if self.cells_total else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "root": self.root,
            "states": self.states,
            "episodes": self.episodes,
            "grid": {
                "pair": list(self.pair),
                "bin": self.bin_size,
                "cells_occupied": self.cells_occupied,
                "cells_total": self.cells_total,
                "share": self.cell_share,
            },
            "cube_cells_occupied": self.cube_cells_occupied,
            "disturbed_episode_share": self.disturbed_episode_share,
            "pushed_frame_share": self.pushed_frame_share,
            "test": None
            if self.test_coverage is None
            else {
                "states": self.test_states,
                "radius_std": self.radius,
                "coverage": self.test_coverage,
                "farthest": self.farthest,
            },
        }

    def format_text(self) -> str:
        lines = [
            f"{self.root}: {self.states} states in {self.episodes} episodes",
            f"  grid {self.pair[0]} x {self.pair[1]}, {self.bin_size:g}-unit cells: "
            f"{self.cells_occupied} of {self.cells_total} occupied ({self.cell_share:.1%})",
            f"  cube placements: {self.cube_cells_occupied} distinct {CUBE_BIN_M * 100:g} cm cells",
            f"  disturbances: {self.disturbed_episode_share:.0%} of episodes, "
            f"{self.pushed_frame_share:.2%} of frames pushed",
        ]
        if self.test_coverage is not None:
            lines.append(
                f"  test coverage: {self.test_coverage:.1%} of {self.test_states} test states within "
                f"{self.radius:g} std of a dataset state"
            )
            for far in self.farthest:
                lines.append(
                    f"    far: {far['kind']} {far['number']} frame {far['frame']} "
                    f"({far['distance_std']:.2f} std away)"
                )
        return "\n".join(lines)


def measure(
    data: States,
    root: str,
    *,
    test: States | None = None,
    pair: Sequence[str] | None = None,
    bin_size: float = DEFAULT_BIN,
    radius: float = DEFAULT_RADIUS,
    farthest: int = 5,
) -> Coverage:
    values, names = data.values, data.names
    if test is not None and test.names != names:
        raise DatasetError(
            f"the test states are of {len(test.names)} joints, the dataset's of {len(names)}: "
            "compare one-arm with one-arm and two-arm with two-arm"
        )
    if pair is None:
        order = np.argsort(values.var(axis=0))[::-1]
        chosen = (names[int(order[0])], names[int(order[1])])
    else:
        if len(pair) != 2 or any(p not in names for p in pair):
            raise DatasetError(f"--pair takes two of {', '.join(names)}, got {list(pair)}")
        chosen = (pair[0], pair[1])
    grid, extent = _grid(values, names, chosen, bin_size)
    cubes = {(math.floor(x / CUBE_BIN_M), math.floor(y / CUBE_BIN_M)) for x, y in data.cubes}
    result = Coverage(
        root=root,
        states=len(values),
        episodes=data.episodes,
        pair=chosen,
        bin_size=bin_size,
        cells_occupied=int(np.count_nonzero(grid)),
        cells_total=int(grid.size),
        cube_cells_occupied=len(cubes),
        disturbed_episode_share=data.disturbed_episodes / data.episodes if data.episodes else 0.0,
        pushed_frame_share=data.pushed_frames / len(values) if len(values) else 0.0,
        radius=radius,
        grid=grid,
        extent=extent,
    )
    if test is not None:
        scale = values.std(axis=0)
        scale[scale == 0] = 1.0  # a joint that never moved: distances in its own units
        tree = cKDTree(values / scale)
        distance, _ = tree.query(test.values / scale, k=1)
        result.test_states = len(test.values)
        result.test_coverage = float(np.mean(distance <= radius))
        for row in np.argsort(distance)[::-1][:farthest]:
            kind, number, frame = test.where(int(row))
            result.farthest.append(
                {"kind": kind, "number": number, "frame": frame, "distance_std": float(distance[row])}
            )
    return result


def _grid(
    values: np.ndarray, names: tuple[str, ...], pair: tuple[str, str], bin_size: float
) -> tuple[np.ndarray, tuple[float, float, float, float]]:
    from hilrec.sim.units import default_units_map

    low, high = default_units_map().units_limits()
    arms = len(names) // len(JOINT_NAMES)  # every arm is the same SO-101, with the same range
    low, high = np.tile(low, arms), np.tile(high, arms)
    i, j = names.index(pair[0]), names.index(pair[1])
    edges = [np.arange(float(low[k]), float(high[k]) + bin_size, bin_size) for k in (i, j)]
    counts, _, _ = np.histogram2d(values[:, i], values[:, j], bins=edges)
    return counts, (edges[0][0], edges[0][-1], edges[1][0], edges[1][-1])


def plot(result: Coverage, data: States, test: States | None, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 5.2))
    assert result.grid is not None
    masked = np.ma.masked_equal(result.grid.T, 0)
    image = left.imshow(masked, origin="lower", extent=result.extent, aspect="auto", cmap="viridis")
    fig.colorbar(image, ax=left, label="dataset states per cell")
    if test is not None:
        i, j = (data.names.index(p) for p in result.pair)
        left.scatter(
            test.values[::7, i], test.values[::7, j], s=2, c="tab:red", alpha=0.4, label="test states"
        )
        left.legend(loc="upper right")
    left.set_xlabel(f"{result.pair[0]}"), left.set_ylabel(f"{result.pair[1]}")
    left.set_title(f"joint space: {result.cell_share:.1%} of {result.bin_size:g}-unit cells occupied")
    if data.cubes:
        xs, ys = zip(*data.cubes, strict=True)
        right.scatter(xs, ys, s=14, label="dataset cube placements")
    if test is not None and test.cubes:
        xs, ys = zip(*test.cubes, strict=True)
        right.scatter(xs, ys, s=14, marker="x", c="tab:red", label="test placements")
    right.set_xlabel("cube x (m)"), right.set_ylabel("cube y (m)")
    right.set_aspect("equal", adjustable="datalim")
    right.legend(loc="upper right", fontsize=8)
    title = "cube placements" if data.cubes else "no cube placements in the sidecars"
    right.set_title(title)
    suptitle = f"{result.root}: {result.states} states, {result.episodes} episodes"
    if result.test_coverage is not None:
        suptitle += f"; test coverage {result.test_coverage:.1%} within {result.radius:g} std"
    fig.suptitle(suptitle, fontsize=11)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
