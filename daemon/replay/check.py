"""Replay-check a dataset recorded on hardware (real or emulated): load, replay, judge, report.

For each episode: read ``action`` and ``observation.state``, turn them into the twin's units
(:mod:`hilrec.daemon.replay.units`), drive the twin from the first recorded state with the
actions (:mod:`hilrec.daemon.replay.engine`), and judge the two trajectories
(:mod:`hilrec.daemon.replay.analysis`). Anything that stops an episode from being checked
(unknown units, a frame rate the twin cannot step, missing columns, a twin that blew up) makes it
``not_replayable`` with the reason, never a pass.

Episodes are independent (each starts the twin afresh from its own first state), so with
``workers > 1`` or a Ray address they replay as tasks of :func:`hilrec.daemon.fanout.run_tasks`,
one per episode, each on a twin of its own; the results are gathered in episode order, so the
check is the same whichever way it ran.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from hilrec.daemon.dataset import FrameFlag, load_dataset_sidecar, load_episode_sidecar, reader
from hilrec.daemon.errors import HilrecError, ReplayError
from hilrec.daemon.replay.analysis import analyse
from hilrec.daemon.replay.engine import ReplayEngine
from hilrec.daemon.replay.metrics import approach_end
from hilrec.daemon.replay.results import (
    BODY,
    EXIT_CODES,
    SEVERITY,
    EpisodeResult,
    ReplayVerdict,
    Trajectories,
    to_json,
    worst,
)
from hilrec.daemon.replay.settings import ReplaySettings
from hilrec.daemon.replay.units import ColumnUnits, resolve_units
from hilrec.daemon.so101 import ACTION_KEY, POSITION_NAMES, STATE_KEY, position_names

log = logging.getLogger(__name__)

# Episode-sidecar arrays of hilrec's recorder (hilrec.daemon.control.episode): the leader's reading
# before any clamp (NaN where there was none) and the per-frame flags (FrameFlag bits).
LEADER_ARRAY = "leader"
FLAGS_ARRAY = "frame_flags"
SLOTS_ARRAY = "tick_slot"  # the pacer's slot of each row: rows are (slot difference) / fps apart

# (fps, dataset sidecar, settings) -> the engine to replay on, for a caller that brings its own.
EngineFactory = Callable[[int, Mapping[str, Any] | None, ReplaySettings], ReplayEngine]


@dataclass
class DatasetCheck:
    """The check of one dataset: what it was checked with, and one result per chosen episode."""

    root: Path
    fps: int
    robot_type: str | None
    units: ColumnUnits | None
    settings: ReplaySettings
    settings_source: str
    results: list[EpisodeResult] = field(default_factory=list)
    twin: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def worst_verdict(self) -> ReplayVerdict:
        return worst([r.verdict for r in self.results])

    @property
    def exit_status(self) -> int:
        return EXIT_CODES[self.worst_verdict]

    def counts(self) -> dict[str, int]:
        return {v.value: sum(1 for r in self.results if r.verdict is v) for v in SEVERITY}

    def to_document(self) -> dict[str, Any]:
        frames = sum(r.frames for r in self.results if r.verdict is not ReplayVerdict.NOT_REPLAYABLE)
        return {
            "dataset": {"root": str(self.root), "fps": self.fps, "robot_type": self.robot_type},
            "units": self.units.describe()
            if self.units is not None
            else {"body": None, "gripper": None, "source": "unknown", "calibration": None},
            "twin": self.twin,
            "settings_source": self.settings_source,
            "settings": dataclasses.asdict(self.settings),
            "worst_verdict": self.worst_verdict.value,
            "exit_status": self.exit_status,
            "exit_codes": {v.value: c for v, c in EXIT_CODES.items()},
            "counts": self.counts(),
            "frames_replayed": frames,
            "seconds": round(self.seconds, 3),
            "episodes": [to_json(r) for r in self.results],
        }


def parse_episode_spec(specs: Iterable[str]) -> list[int]:
    """``["0", "3,5-7"]`` -> ``[0, 3, 5, 6, 7]`` (order kept, duplicates dropped)."""
    out: list[int] = []
    for spec in specs:
        for raw in str(spec).split(","):
            part = raw.strip()
            if not part:
                continue
            try:
                if "-" in part[1:]:
                    a, b = part.split("-", 1)
                    lo, hi = int(a), int(b)
                    if hi < lo:
                        raise ValueError
                    items = range(lo, hi + 1)
                else:
                    items = range(int(part), int(part) + 1)
            except ValueError:
                raise ReplayError(f"--episodes: {part!r} is not an index or a range like 3-7") from None
            for i in items:
                if i < 0:
                    raise ReplayError(f"--episodes: {i} is negative")
                if i not in out:
                    out.append(i)
    return out


def column_order(info: dict[str, Any], key: str, *, arm: str | None = None) -> list[int]:
    """Indices that put the feature's columns in SO-101 joint order; ReplayError if it can't.

    ``arm`` ("left", "right"): that arm's six of a two-arm dataset (LeRobot's ``bi_so_follower``
    columns, ``left_shoulder_pan.pos`` ...)."""
    spec = info.get("features", {}).get(key)
    if spec is None:
        raise ReplayError(f"the dataset has no '{key}' feature")
    names = spec.get("names")
    if isinstance(names, dict):  # LeRobot 2.x style {"motors": [...]}
        names = next(iter(names.values()), None)
    if arm is not None:
        wanted = [f"{arm}_{n}" for n in POSITION_NAMES]
        if not isinstance(names, list) or sorted(map(str, names)) != sorted(position_names(2)):
            raise ReplayError(f"'{key}' names {names!r}, not the two arms' joints {position_names(2)}")
        return [names.index(n) for n in wanted]
    if not isinstance(names, list) or sorted(map(str, names)) != sorted(POSITION_NAMES):
        raise ReplayError(f"'{key}' names {names!r}, not the six SO-101 joints {POSITION_NAMES}")
    return [names.index(n) for n in POSITION_NAMES]


@dataclass(frozen=True, kw_only=True)
class EpisodeJob:
    """One episode's replay check as a task another process (or a Ray node) can run alone."""

    root: Path
    index: int
    length: int
    fps: int
    units: ColumnUnits
    orders: tuple[list[int], list[int]]
    settings: ReplaySettings
    sidecar: Mapping[str, Any] | None


def check_episode_job(job: EpisodeJob) -> EpisodeResult:
    """Replay-check one episode on a twin of its own (the task of a parallel check)."""
    with _default_engine(job.fps, job.sidecar, job.settings) as engine:
        return _check_episode(
            job.root,
            job.index,
            job.length,
            fps=job.fps,
            units=job.units,
            engine=engine,
            limits=engine.limits(),
            orders=job.orders,
            settings=job.settings,
        )


def replay_dataset(
    root: str | Path,
    *,
    settings: ReplaySettings,
    settings_source: str,
    episodes: Sequence[int] | None = None,
    units_flag: str | None = None,
    calibration_flag: Path | None = None,
    engine_factory: EngineFactory | None = None,
    workers: int = 1,
    ray_address: str | None = None,
    arm: str | None = None,
) -> DatasetCheck:
    """Replay-check the chosen episodes (all by default) of the dataset at ``root``; of a
    two-arm dataset, the ``arm`` given ("left" or "right"), on a one-arm twin.

    ``workers`` processes (or the Ray cluster at ``ray_address``) replay the episodes; one
    replays them here, on one twin. A caller's ``engine_factory`` runs in this process only.
    """
    root = Path(root)
    if engine_factory is not None and (workers > 1 or ray_address is not None):
        raise ReplayError("an engine factory replays in this process only: use workers=1 without Ray")
    started = time.perf_counter()
    info = reader.load_info(root)
    fps = int(info["fps"])
    available = {int(e["episode_index"]): int(e["length"]) for e in reader.load_episodes(root)}
    chosen = _chosen(root, available, episodes)
    # One episode gains nothing from a worker process but the cost of starting it.
    parallel = ray_address is not None or min(workers, len(chosen)) > 1
    sidecar = load_dataset_sidecar(root)
    check = DatasetCheck(
        root=root,
        fps=fps,
        robot_type=info.get("robot_type"),
        units=None,
        settings=settings,
        settings_source=settings_source,
    )

    def refuse_all(reason: str) -> DatasetCheck:
        check.results = [
            EpisodeResult.not_replayable(i, reason, frames=available[i], fps=fps) for i in chosen
        ]
        check.seconds = time.perf_counter() - started
        return check

    try:
        action_order = column_order(info, ACTION_KEY, arm=arm)
        state_order = column_order(info, STATE_KEY, arm=arm)
        check.units = resolve_units(
            root, sidecar, units_flag=units_flag, calibration_flag=calibration_flag, arm=arm
        )
        engine = (engine_factory or _default_engine)(fps, sidecar, settings)
    except ReplayError as exc:
        return refuse_all(str(exc))
    except HilrecError as exc:  # a FrameRateError, a CalibrationError...: still the dataset's fault
        return refuse_all(f"{type(exc).__name__}: {exc}")
    check.twin = engine.describe()
    orders = (action_order, state_order)
    if parallel:
        engine.close()  # it was built to refuse what no task could replay, and to describe the twin
        jobs = [
            EpisodeJob(
                root=root.resolve(),  # a Ray worker runs in a directory of its own
                index=i,
                length=available[i],
                fps=fps,
                units=check.units,
                orders=orders,
                settings=settings,
                sidecar=sidecar,
            )
            for i in chosen
        ]
        check.results = _run_jobs(jobs, workers=workers, ray_address=ray_address)
        check.seconds = time.perf_counter() - started
        return check
    with engine:
        limits = engine.limits()
        for index in chosen:
            check.results.append(
                _check_episode(
                    root,
                    index,
                    available[index],
                    fps=fps,
                    units=check.units,
                    engine=engine,
                    limits=limits,
                    orders=orders,
                    settings=settings,
                )
            )
    check.seconds = time.perf_counter() - started
    return check


def _chosen(root: Path, available: Mapping[int, int], episodes: Sequence[int] | None) -> list[int]:
    chosen = list(available) if episodes is None else list(episodes)
    missing = [i for i in chosen if i not in available]
    if missing:
        raise ReplayError(
            f"{root}: episode(s) {missing} not in the dataset "
            f"(it has {len(available)}: {_ranges(sorted(available))})"
        )
    return chosen


def _run_jobs(jobs: list[EpisodeJob], *, workers: int, ray_address: str | None) -> list[EpisodeResult]:
    from hilrec.daemon.fanout import run_tasks

    outcomes = run_tasks(check_episode_job, jobs, workers=workers, ray_address=ray_address)
    results = []
    for job, outcome in zip(jobs, outcomes, strict=True):
        if outcome.result is None:
            # In this process the same failure would have stopped the command: so it does here.
            raise ReplayError(f"{job.root}: the replay of episode {job.index} failed: {outcome.error}")
        results.append(outcome.result)
    return results


def _default_engine(fps: int, sidecar: Mapping[str, Any] | None, settings: ReplaySettings) -> ReplayEngine:
    return ReplayEngine.create(fps, sidecar, settle_iterations=settings.engine.settle_iterations)


def _check_episode(
    root: Path,
    index: int,
    length: int,
    *,
    fps: int,
    units: ColumnUnits,
    engine: ReplayEngine,
    limits: np.ndarray,
    orders: tuple[list[int], list[int]],
    settings: ReplaySettings,
) -> EpisodeResult:
    columns = reader.read_episode(root, index, columns=[ACTION_KEY, STATE_KEY])
    action = np.asarray(columns[ACTION_KEY], dtype=np.float64)[:, orders[0]]
    state = np.asarray(columns[STATE_KEY], dtype=np.float64)[:, orders[1]]
    n = state.shape[0]
    for key, arr in ((ACTION_KEY, action), (STATE_KEY, state)):
        bad = np.argwhere(~np.isfinite(arr))
        if bad.size:
            f, j = bad[0]
            return EpisodeResult.not_replayable(
                index, f"'{key}' has a non-finite value at frame {f}, {POSITION_NAMES[j]}", frames=n, fps=fps
            )
    if n < settings.engine.min_frames:
        return EpisodeResult.not_replayable(
            index, f"only {n} frames (the check needs {settings.engine.min_frames})", frames=n, fps=fps
        )
    action_t, state_t = units.to_twin(action), units.to_twin(state)
    try:
        _, arrays = load_episode_sidecar(root, index)
    except HilrecError as exc:
        log.warning("episode %d: cannot read its sidecar arrays: %s", index, exc)
        arrays = {}
    gaps = _frames_between(arrays.get(SLOTS_ARRAY), n)
    approach = _approach(action_t, state_t, fps, settings)
    try:
        replayed = _replay(engine, state_t, action_t, gaps, approach)
    except ReplayError as exc:
        return EpisodeResult.not_replayable(index, str(exc), frames=n, fps=fps)
    leader = arrays.get(LEADER_ARRAY)  # joint order, the action's units
    if leader is not None and leader.ndim == 2 and leader.shape[1] > action.shape[1]:
        leader = leader[:, orders[0]]  # one arm's of a two-arm recording (its columns' order)
    leader = units.to_twin(leader) if leader is not None and leader.shape == action.shape else None
    traj = Trajectories(recorded=state_t, replayed=replayed, action=action_t, limits=limits, leader=leader)
    result = analyse(index, traj, fps=fps, settings=settings, approach=approach)
    _note_recorder_flags(result, arrays.get(FLAGS_ARRAY), n)
    if gaps is not None:
        result.notes.append(
            f"replayed on the recorded tick slots: {int(gaps.sum()) - (n - 1)} "
            f"missed slot(s) held the last command, as the follower did"
        )
    return result


def _approach(action: np.ndarray, state: np.ndarray, fps: int, settings: ReplaySettings) -> int:
    """Where the take's opening swing of the follower to the leader ends (0: it has none)."""
    cfg = settings.approach
    return approach_end(
        action[:, list(BODY)],
        state[:, list(BODY)],
        min_gap=cfg.min_gap_deg,
        settled_gap=cfg.settled_gap_deg,
        max_frames=round(cfg.max_s * fps),
    )


def _replay(
    engine: ReplayEngine, state: np.ndarray, action: np.ndarray, gaps: np.ndarray | None, approach: int
) -> np.ndarray:
    """The twin's states; after an approach, restarted from the recorded state where it ended.

    The swing itself is the follower's servos on a large move, which the twin does not model: a
    replay carried through it would start the judged frames from where the twin, not the
    follower, had got to.
    """
    if not approach:
        return engine.replay(state[0], action, gaps)
    head = engine.replay(state[0], action[: approach + 1], None if gaps is None else gaps[:approach])
    rest = engine.replay(state[approach], action[approach:], None if gaps is None else gaps[approach:])
    return np.concatenate([head[:approach], rest])


def _frames_between(slots: np.ndarray | None, n: int) -> np.ndarray | None:
    """Frames between consecutive rows from the recorder's tick slots; None when all are one."""
    if slots is None or slots.shape != (n,) or n < 2:
        return None
    gaps = np.diff(slots.astype(np.int64))
    if np.any(gaps < 1):  # not a monotonic slot count: do not trust it
        log.warning("tick_slot is not increasing; replaying one frame per row")
        return None
    return gaps if np.any(gaps > 1) else None


def _note_recorder_flags(result: EpisodeResult, flags: np.ndarray | None, n: int) -> None:
    """Say what the recorder flagged (a failed read, a held follower...), next to the verdict."""
    if flags is None or flags.shape != (n,):
        return
    flags = flags.astype(np.int64)
    for flag in FrameFlag:
        hit = np.flatnonzero(flags & int(flag))
        if flag.name and hit.size:
            result.recorder_flags[flag.name.lower()] = (int(hit.size), int(hit[0]))
    meaning = {
        "follower_failed": "the observation repeats the last good reading",
        "write_failed": "the action was not executed",
        "leader_failed": "the follower held position",
        "leader_stale": "the follower held position",
        "skipped": "whole tick slots were missed, so rows are not 1/fps apart",
        "clamped": "max_relative_target clipped the command; the action is the clipped one",
    }
    for name, why in meaning.items():
        if name in result.recorder_flags:
            count, first = result.recorder_flags[name]
            result.notes.append(f"recorder flagged {name} on {count} frame(s) from frame {first}: {why}")


def _ranges(indices: list[int]) -> str:
    parts, start = [], None
    for i, v in enumerate(indices):
        if start is None:
            start = v
        if i + 1 == len(indices) or indices[i + 1] != v + 1:
            parts.append(f"{start}" if start == v else f"{start}-{v}")
            start = None
    return ", ".join(parts) if parts else "none"
