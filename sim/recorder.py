"""Recording sim episodes with the scripted operator into a dataset (any FrameSink).

Per episode: reset the twin from the seed, let the operator plan, draw the pushes, run the frame
loop of :mod:`hilrec.sim.episode` writing one row per frame (``observation.state`` as observed,
``action`` as executed), then save the episode with its sidecar: seed, cube placement, the full
initial state (npz), success and its criterion, disturbances, final cube pose, contacts.
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections import deque
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol

import numpy as np

from hilrec.daemon.dataset import FrameSink, holds_nothing
from hilrec.daemon.errors import ConfigError
from hilrec.daemon.policy.driver import PolicyDriver
from hilrec.daemon.so101 import ACTION_KEY, IMAGE_PREFIX, STATE_KEY, robot_type
from hilrec.daemon.text import DEFAULT_TASK, task_problem
from hilrec.sim.bimanual_operator import make_operator
from hilrec.sim.episode import (
    ContactTally,
    LeaderScript,
    Push,
    act_and_step,
    operator_action,
    outcome_of,
    push_schedule,
    pushes_by_frame,
)
from hilrec.sim.features import sim_features
from hilrec.sim.operator import OperatorConfig, ScriptedOperator
from hilrec.sim.provenance import dataset_provenance
from hilrec.sim.rollout import RolloutConfig, run_policy_episode
from hilrec.sim.scene import SceneConfig, Visual, camera_problem
from hilrec.sim.twin import EpisodeStart, Twin

SOURCE = "hilrec.sim.recorder"
# Saved episodes wait in the writer's journal (durable) up to this long before they are merged
# into LeRobot's files: one merge per interval, not one per episode, when episodes take ~50 ms.
MERGE_INTERVAL_S = 5.0


class ManagedSink(FrameSink, Protocol):
    """A FrameSink used as a context manager, as both writers are: an exception discards the
    open episode and finalizes the saved ones."""

    def __enter__(self) -> ManagedSink: ...

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None: ...


class Progress(Protocol):
    """What the recorder asks of a progress bar (tqdm's, or none)."""

    def update(self, n: int) -> object: ...

    def set_postfix(self, **values: object) -> object: ...

    def close(self) -> object: ...


@dataclass(frozen=True, kw_only=True)
class RecordConfig:
    """One ``hilrec record --sim`` run."""

    root: Path
    episodes: int
    seed: int = 0
    cameras: tuple[str, ...] = ("front",)
    image_size: tuple[int, int] = (480, 640)
    push_rate: float = 0.0  # pushes per second, on the cube or an arm link
    task: str = DEFAULT_TASK
    fps: int = 25
    realtime: bool = False
    video_codec: str = "libsvtav1"
    # Add the episodes to the dataset already at ``root`` (same features, fps, robot type and
    # world); without it a non-empty root is refused.
    resume: bool = False
    render_quality: Visual = "fast"
    scene: SceneConfig = field(default_factory=SceneConfig)
    operator: OperatorConfig = field(default_factory=OperatorConfig)
    # A policy drives, the scripted operator takes over as the expert (hilrec.sim.rollout).
    rollout: RolloutConfig | None = None

    def validate(self) -> None:
        if self.rollout is not None and self.scene.arms != 1:
            raise ConfigError("policy", "a policy rollout in the twin drives one arm; two arms are not yet")
        if self.episodes < 1:
            raise ConfigError("episodes", f"must be at least 1, got {self.episodes}")
        if self.seed < 0:
            raise ConfigError("seed", f"must be non-negative, got {self.seed}")
        if self.push_rate < 0 or not np.isfinite(self.push_rate):
            raise ConfigError("pushes", f"a rate in pushes per second >= 0, got {self.push_rate}")
        problem = camera_problem(tuple(self.cameras), self.scene.camera_names)
        if problem:
            raise ConfigError("cameras", problem)
        problem = task_problem(self.task)  # the one rule for task strings (daemon.text)
        if problem:
            raise ConfigError("task", problem)

    def __post_init__(self) -> None:
        self.validate()


@dataclass(frozen=True, kw_only=True)
class EpisodeSummary:
    episode_index: int
    seed: int
    frames: int
    success: bool


@dataclass(kw_only=True)
class RecordSummary:
    root: Path
    episodes: list[EpisodeSummary] = field(default_factory=list)
    wall_seconds: float = 0.0
    fps: int = 25

    @property
    def successes(self) -> int:
        return sum(e.success for e in self.episodes)

    @property
    def frames(self) -> int:
        return sum(e.frames for e in self.episodes)

    def line(self) -> str:
        sim_seconds = self.frames / self.fps
        speed = sim_seconds / self.wall_seconds if self.wall_seconds > 0 else float("inf")
        return (
            f"{len(self.episodes)} episodes, {self.successes} successes, {self.frames} frames, "
            f"{self.wall_seconds:.1f} s ({speed:.1f}x real time) -> {self.root}"
        )


class Pacer:
    """Holds frame i until ``start + (i + 1) / fps`` on the monotonic clock (``--realtime``)."""

    def __init__(self, fps: int) -> None:
        self._period = 1.0 / fps
        self._start = time.monotonic()
        self._frames = 0

    def restart(self) -> None:
        self._start = time.monotonic()
        self._frames = 0

    def wait(self) -> None:
        self._frames += 1
        delay = self._start + self._frames * self._period - time.monotonic()
        if delay > 0:
            time.sleep(delay)


@dataclass(frozen=True, kw_only=True)
class RecordedEpisode:
    """An episode whose frames are in the sink, with what its save needs."""

    seed: int
    frames: int
    success: bool
    sidecar: dict[str, Any]
    arrays: dict[str, np.ndarray]

    def summary(self, episode_index: int) -> EpisodeSummary:
        return EpisodeSummary(
            episode_index=episode_index, seed=self.seed, frames=self.frames, success=self.success
        )


def run_episode(
    twin: Twin,
    operator: LeaderScript,
    sink: FrameSink,
    *,
    seed: int,
    task: str,
    push_rate: float,
    pacer: Pacer | None = None,
) -> RecordedEpisode:
    """Reset, plan and play one episode into ``sink`` (frames added, not saved; the episode is
    discarded on an exception)."""
    start = twin.reset(seed)
    operator.reset(start)
    num_frames = operator.num_frames
    pushes = push_schedule(seed, num_frames, twin.fps, push_rate, twin.scene.arm_prefixes)
    pushes_at = pushes_by_frame(pushes)
    tally = ContactTally(twin)
    if pacer is not None:
        pacer.restart()
    try:
        for index in range(num_frames):
            observation = twin.observe()
            frame: dict[str, Any] = {STATE_KEY: observation, "task": task}
            for camera in twin.cameras:
                frame[IMAGE_PREFIX + camera] = twin.render(camera)
            action = operator_action(twin, operator, index, observation)
            frame[ACTION_KEY] = act_and_step(twin, action, pushes_at.get(index, ()))
            sink.add_frame(frame)
            tally.add()
            if pacer is not None:
                pacer.wait()
    except BaseException:
        sink.discard_episode()
        raise
    outcome = outcome_of(twin)
    sidecar = episode_sidecar(
        twin,
        start,
        seed=seed,
        pushes=pushes,
        push_rate=push_rate,
        outcome=outcome.to_dict(),
        contacts=tally.summary(),
        phases=operator.phase_starts,
        replans=operator.replans,
        clipped=twin.clipped_commands,
    )
    return RecordedEpisode(
        seed=seed,
        frames=num_frames,
        success=outcome.success,
        sidecar=sidecar,
        arrays={"initial_state": start.state},
    )


def episode_sidecar(
    twin: Twin,
    start: EpisodeStart,
    *,
    seed: int,
    pushes: list[Push],
    push_rate: float,
    outcome: dict[str, Any],
    contacts: dict[str, Any],
    phases: dict[str, int],
    replans: list[int],
    clipped: int,
) -> dict[str, Any]:
    """The per-episode JSON: every oracle fact about the episode (never a dataset column)."""
    return {
        "source": SOURCE,
        "sim": {
            "seed": seed,
            "cube": start.cube.to_dict(),
            "arm_units_start": [float(x) for x in start.arm_units],
            "physics": twin.physics_info(),
            "leader": "scripted",
            "operator_phase_starts": phases,
            "operator_replanned_at_frames": list(replans),
            "initial_state": {
                "array": "initial_state",
                "spec": "mjSTATE_INTEGRATION",
                "size": int(start.state.size),
            },
            "push_rate_hz": push_rate,
            "disturbances": [p.to_dict() for p in pushes],
            "contacts": contacts,
            "commands_clipped_to_joint_limits": clipped,
        },
        **outcome,
    }


def record(
    config: RecordConfig,
    *,
    sink_factory: Callable[..., ManagedSink] | None = None,
    progress: bool = True,
    twin: Twin | None = None,
) -> RecordSummary:
    """Record ``config.episodes`` episodes (seeds ``seed, seed + 1, ...``) and finalize.

    ``twin`` (left open) is one built for ``config`` (:func:`twin_for`) that a worker recording
    seed after seed keeps: every episode starts from a full reset, so it changes no byte.

    An episode is counted (summary, progress bar) once its save is durable. With the native
    writer the save's file writes and fsyncs run on the writer's commit thread while the next
    episode plays (they wait on the disk, not on the GIL), and saved episodes are merged into
    LeRobot's files every few seconds, not after each one. Planning stays in line: on a thread
    it measured slower, the GIL changing hands at every MuJoCo call of the IK.
    """
    from hilrec.daemon.dataset import update_dataset_sidecar

    cameras = dict.fromkeys(config.cameras, config.image_size)
    features = sim_features(cameras, extra=rollout_features(config), arms=config.scene.arms)
    resuming = check_root(config, features)
    if sink_factory is None or resuming:
        from hilrec.daemon.dataset import DatasetWriter

        if resuming and sink_factory is not None:
            raise ConfigError("resume", "resuming writes through the native writer; no other sink")
        sink_factory = (
            functools.partial(_reopen, merge_interval_s=MERGE_INTERVAL_S)
            if resuming
            else functools.partial(DatasetWriter.create, merge_interval_s=MERGE_INTERVAL_S, realtime=False)
        )
    summary = RecordSummary(root=config.root, fps=config.fps)
    began = time.perf_counter()
    held: contextlib.AbstractContextManager[Twin] = (
        contextlib.nullcontext(twin) if twin is not None else twin_for(config)
    )
    # Loaded before the dataset is touched: a policy that cannot load leaves no empty root.
    driver = policy_driver(config)
    with contextlib.ExitStack() as closing, held as live:
        if driver is not None:
            closing.callback(driver.close)
        sink = sink_factory(
            config.root,
            fps=config.fps,
            features=features,
            robot_type=robot_type(config.scene.arms),
            video_codec=config.video_codec,
        )
        with sink:  # an exception discards the open episode and finalizes the saved ones
            update_dataset_sidecar(
                config.root,
                dataset_provenance(
                    scene=config.scene,
                    physics=live.physics_info(),
                    operator_config=config.operator,
                    cameras=cameras,
                    render_quality=config.render_quality,
                    push_rate=config.push_rate,
                ),
            )
            bar = progress_bar(config.episodes, enabled=progress)
            try:
                _record_episodes(config, live, sink, summary, bar, driver)
            finally:
                bar.close()
    summary.wall_seconds = time.perf_counter() - began
    return summary


def twin_for(config: RecordConfig) -> Twin:
    """The twin ``config`` records with."""
    return Twin(
        fps=config.fps,
        cameras=config.cameras,
        image_size=config.image_size,
        scene=config.scene,
        render_quality=config.render_quality,
    )


def resume_mismatch(
    root: Path, *, fps: int, features: Mapping[str, Mapping[str, Any]], robot_type: str | None
) -> list[str]:
    """What keeps a recording of ``features`` at ``fps`` from adding episodes to the dataset at
    ``root``: one sentence per difference (empty when they match)."""
    from hilrec.daemon.dataset import DEFAULT_FEATURES, load_info
    from hilrec.daemon.errors import CorruptDatasetError

    try:
        info = load_info(root)
    except CorruptDatasetError as exc:
        return [f"it holds no LeRobot dataset ({exc})"]
    problems = []
    if info.get("fps") != fps:
        problems.append(f"fps is {info.get('fps')} in the dataset, {fps} in this recording")
    if info.get("robot_type") != robot_type:
        problems.append(f"robot_type is {info.get('robot_type')!r} in the dataset, {robot_type!r} here")
    theirs = {k: v for k, v in info["features"].items() if k not in DEFAULT_FEATURES}
    for key in sorted(set(theirs) | set(features)):
        if key not in features:
            problems.append(f"feature {key!r} is in the dataset but not in this recording")
            continue
        if key not in theirs:
            problems.append(f"feature {key!r} is in this recording but not in the dataset")
            continue
        for field_name in ("dtype", "shape", "names"):
            old, new = theirs[key].get(field_name), features[key].get(field_name)
            if field_name == "shape":
                old, new = list(old or []), list(new or [])
            if old != new:
                problems.append(f"feature {key!r} has {field_name} {old} in the dataset, {new} here")
    return problems


def check_root(config: RecordConfig, features: Mapping[str, Mapping[str, Any]]) -> bool:
    """True to resume the dataset at ``config.root``, False to create it; ConfigError if neither."""
    root = config.root
    if holds_nothing(root):  # missing, empty, or only a leftover lock file
        return False
    if not config.resume:
        raise ConfigError(
            "root",
            f"{root} already exists and is not empty; pass --resume to add episodes to it, "
            "or record into a new directory",
        )
    problems = resume_mismatch(
        root, fps=config.fps, features=features, robot_type=robot_type(config.scene.arms)
    )
    if not problems:
        from hilrec.daemon.dataset import load_dataset_sidecar
        from hilrec.sim.provenance import check_same_world

        problems = [
            f"the world differs: {d}" for d in check_same_world(load_dataset_sidecar(root), config.scene)
        ]
    if problems:
        raise ConfigError("root", f"cannot resume {root}: " + "; ".join(problems))
    return True


def _reopen(root: Path, *, merge_interval_s: float, video_codec: str, **_same: Any) -> ManagedSink:
    from hilrec.daemon.dataset import DatasetWriter

    return DatasetWriter.open(
        root, video_codec=video_codec, merge_interval_s=merge_interval_s, realtime=False
    )


def rollout_features(config: RecordConfig) -> dict[str, dict[str, Any]]:
    """The features a rollout adds: LeRobot 0.6.1's ``intervention`` column."""
    if config.rollout is None:
        return {}
    from hilrec.daemon.policy.record import INTERVENTION_KEY, intervention_feature

    return {INTERVENTION_KEY: intervention_feature()}


def policy_driver(config: RecordConfig) -> PolicyDriver | None:
    """The policy of ``config.rollout``, asked in line (deterministic, faster than real time)."""
    if config.rollout is None:
        return None
    from hilrec.daemon.policy.load import load_policy
    from hilrec.daemon.policy.runner import InlineRunner

    return PolicyDriver(InlineRunner(load_policy(config.rollout.policy)))


def policy_recorded(
    twin: Twin,
    operator: ScriptedOperator,
    sink: FrameSink,
    driver: PolicyDriver,
    config: RecordConfig,
    seed: int,
) -> RecordedEpisode:
    """One rollout episode in the twin, with its sidecar (the rollout's record in it)."""
    assert config.rollout is not None
    played, start = run_policy_episode(
        twin, operator, sink, driver, config.rollout, seed=seed, task=config.task, push_rate=config.push_rate
    )
    sidecar = episode_sidecar(
        twin,
        start,
        seed=seed,
        pushes=played.pushes,
        push_rate=config.push_rate,
        outcome=played.outcome.to_dict(),
        contacts=played.tally.summary(),
        phases=operator.phase_starts,
        replans=operator.replans,
        clipped=twin.clipped_commands,
    )
    sidecar["sim"]["leader"] = f"policy, scripted expert ({config.rollout.takeover})"
    sidecar["rollout"] = {
        **played.log.summary(),
        "takeover": str(config.rollout.takeover),
        "takeover_threshold": config.rollout.threshold,
        "takeover_ticks": config.rollout.ticks,
        "outcome": "success" if played.outcome.success else "failure",
    }
    return RecordedEpisode(
        seed=seed,
        frames=played.frames,
        success=played.outcome.success,
        sidecar=sidecar,
        arrays={"initial_state": start.state, **played.log.arrays()},
    )


def _record_episodes(
    config: RecordConfig,
    twin: Twin,
    sink: FrameSink,
    summary: RecordSummary,
    bar: Progress,
    driver: PolicyDriver | None = None,
) -> None:
    pacer = Pacer(config.fps) if config.realtime else None
    save_nowait = getattr(sink, "save_episode_nowait", None)
    saving: deque[tuple[RecordedEpisode, Future[int]]] = deque()

    def count(episode: RecordedEpisode, index: int) -> None:
        summary.episodes.append(episode.summary(index))
        bar.update(1)
        bar.set_postfix(successes=summary.successes, frames=summary.frames)

    for number in range(config.episodes):
        seed = config.seed + number
        operator = make_operator(
            seed, fps=config.fps, scene=config.scene, config=config.operator, units=twin.units
        )
        if driver is not None:
            assert isinstance(operator, ScriptedOperator)  # one arm: RecordConfig.validate
            episode = policy_recorded(twin, operator, sink, driver, config, seed)
        else:
            episode = run_episode(
                twin, operator, sink, seed=seed, task=config.task, push_rate=config.push_rate, pacer=pacer
            )
        if save_nowait is None:
            count(episode, sink.save_episode(sidecar=episode.sidecar, arrays=episode.arrays))
            continue
        saving.append((episode, save_nowait(sidecar=episode.sidecar, arrays=episode.arrays)))
        while saving and saving[0][1].done():
            count(saving[0][0], saving.popleft()[1].result())
    while saving:
        count(saving[0][0], saving.popleft()[1].result())


def progress_bar(total: int, *, enabled: bool) -> Progress:
    if not enabled:
        return _NoProgress()
    from tqdm import tqdm  # importing it costs 10-40 ms: not paid without a bar

    return tqdm(total=total, unit="episode", desc="recording", dynamic_ncols=True)


class _NoProgress:
    def update(self, n: int) -> None:
        pass

    def set_postfix(self, **values: object) -> None:
        pass

    def close(self) -> None:
        pass
