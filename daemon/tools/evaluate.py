"""``hilrec eval``: closed-loop evaluation of a policy on the twin, on held-out seeds.

Per episode, the recorder's contract with a policy in the operator's place::

    start = twin.reset(seed)                 # the seed places the cube; the policy never sees it
    policy.reset()
    for frame in range(max_seconds * fps):
        state = twin.observe(); images = twin.render(camera) for each camera
        action = policy.act({observation.state, observation.images.<camera>, task})
        act_and_step(twin, action, pushes of this frame)   # pushes, twin.command (clamps), step
        stop if outcome_of(twin).success     # the scene's success criterion

Pushes are :func:`hilrec.sim.episode.push_schedule` of the episode's push seed (the seed itself
for the first episode of a seed, one drawn from it for repetitions), over ``max_seconds``.

A failure is told apart from the scene's criterion and the cube's track: *not grasped* (the cube
never left the table), *dropped* (lifted, ended outside the bin), *not in the bin* (over or
inside the bin, not resting below its rim). The success rate comes with a 95% Wilson interval.

With a ``record_root`` every episode is written as a LeRobot v3.0 dataset (the SO-101 features,
the executed action) with the sim sidecars the recorder writes (seed, initial_state, pushes,
outcome) plus the evaluation's (policy, failure reason), so ``hilrec check --replay`` replays each
episode bit for bit and a failure can be replayed and watched.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from hilrec.daemon.dataset import FrameSink
from hilrec.daemon.errors import ConfigError
from hilrec.daemon.so101 import ACTION_KEY, IMAGE_PREFIX, STATE_KEY, robot_type, so101_features
from hilrec.daemon.text import DEFAULT_TASK, task_problem
from hilrec.daemon.tools.policies import TASK_KEY, EvalPolicy
from hilrec.sim.episode import (
    ContactTally,
    Push,
    act_and_step,
    outcome_of,
    push_schedule,
    pushes_by_frame,
    start_fields,
)
from hilrec.sim.recorder import MERGE_INTERVAL_S
from hilrec.sim.scene import SceneConfig, Visual, camera_problem
from hilrec.sim.twin import Twin

SOURCE = "hilrec.daemon.tools.evaluate"
Z_95 = 1.959963984540054  # the standard normal's 97.5% quantile
LIFTED_M = 0.01  # the cube's centre this far above where it was placed: it left the table
NOT_GRASPED, DROPPED, NOT_IN_BIN = "not grasped", "dropped", "not in the bin"
FAILURE_REASONS = (NOT_GRASPED, DROPPED, NOT_IN_BIN)


@dataclass(frozen=True, kw_only=True)
class EvalConfig:
    """One evaluation: which seeds, how often each, with what disturbances, fed what."""

    seeds: tuple[int, ...]
    episodes_per_seed: int = 1
    push_rate: float = 0.0  # pushes per second, on the cube or an arm link
    max_seconds: float = 20.0
    fps: int = 25
    cameras: tuple[str, ...] = ("front",)
    image_size: tuple[int, int] = (480, 640)  # (height, width)
    task: str = DEFAULT_TASK
    record_root: Path | None = None
    video_codec: str = "libsvtav1"
    scene: SceneConfig = field(default_factory=SceneConfig)
    render_quality: Visual = "fast"

    def validate(self) -> None:
        if not self.seeds or any(s < 0 for s in self.seeds):
            raise ConfigError("seeds", f"non-negative seeds, at least one, got {list(self.seeds)[:5]}")
        if self.episodes_per_seed < 1:
            raise ConfigError("episodes_per_seed", f"must be at least 1, got {self.episodes_per_seed}")
        if not (self.push_rate >= 0 and math.isfinite(self.push_rate)):
            raise ConfigError("pushes", f"a rate in pushes per second >= 0, got {self.push_rate}")
        if not (self.max_seconds > 0 and math.isfinite(self.max_seconds)):
            raise ConfigError("max_seconds", f"must be positive, got {self.max_seconds}")
        problem = camera_problem(tuple(self.cameras), self.scene.camera_names)
        if problem:
            raise ConfigError("cameras", problem)
        problem = task_problem(self.task)  # the one rule for task strings (daemon.text)
        if problem:
            raise ConfigError("task", problem)

    def __post_init__(self) -> None:
        self.validate()

    @property
    def max_frames(self) -> int:
        return max(1, round(self.max_seconds * self.fps))


def push_seed(seed: int, repetition: int) -> int:
    """The seed of a repetition's pushes: the episode seed first, then ones drawn from it."""
    if repetition == 0:
        return seed
    return int(np.random.SeedSequence([seed, repetition, 0xE7A1]).generate_state(1, np.uint32)[0])


def wilson_interval(successes: int, n: int, z: float = Z_95) -> tuple[float, float]:
    """The Wilson score interval of a binomial proportion (95% by default)."""
    if n <= 0:
        return 0.0, 1.0
    p = successes / n
    denominator = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denominator
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denominator
    low = 0.0 if successes == 0 else max(0.0, centre - half)
    high = 1.0 if successes == n else min(1.0, centre + half)  # exact, not 1 - 1e-16
    return low, high


@dataclass(frozen=True, kw_only=True)
class EpisodeResult:
    seed: int
    repetition: int
    push_seed: int
    frames: int
    fps: int
    success: bool
    failure: str | None  # one of FAILURE_REASONS, None for a success
    pushes: int
    max_cube_lift_m: float
    final_cube_position: tuple[float, float, float]
    episode_index: int | None = None  # in the recorded dataset

    @property
    def seconds(self) -> float:
        return self.frames / self.fps

    def to_dict(self) -> dict[str, Any]:
        return {
            "seed": self.seed,
            "repetition": self.repetition,
            "push_seed": self.push_seed,
            "frames": self.frames,
            "seconds": self.seconds,
            "success": self.success,
            "failure": self.failure,
            "pushes": self.pushes,
            "max_cube_lift_m": self.max_cube_lift_m,
            "final_cube_position": list(self.final_cube_position),
            "episode_index": self.episode_index,
        }


@dataclass(kw_only=True)
class EvalReport:
    policy: str
    config: EvalConfig
    episodes: list[EpisodeResult] = field(default_factory=list)

    @property
    def successes(self) -> int:
        return sum(e.success for e in self.episodes)

    @property
    def success_rate(self) -> float:
        return self.successes / len(self.episodes) if self.episodes else 0.0

    @property
    def interval(self) -> tuple[float, float]:
        return wilson_interval(self.successes, len(self.episodes))

    @property
    def mean_seconds(self) -> float:
        return float(np.mean([e.seconds for e in self.episodes])) if self.episodes else 0.0

    @property
    def mean_success_seconds(self) -> float | None:
        done = [e.seconds for e in self.episodes if e.success]
        return float(np.mean(done)) if done else None

    def failures(self) -> dict[str, int]:
        counts = Counter(e.failure for e in self.episodes if e.failure)
        return {reason: counts.get(reason, 0) for reason in FAILURE_REASONS}

    def to_dict(self) -> dict[str, Any]:
        low, high = self.interval
        config = self.config
        return {
            "policy": self.policy,
            "seeds": list(config.seeds),
            "episodes_per_seed": config.episodes_per_seed,
            "push_rate_hz": config.push_rate,
            "max_seconds": config.max_seconds,
            "fps": config.fps,
            "cameras": list(config.cameras),
            "image_size": list(config.image_size),
            "episodes": len(self.episodes),
            "successes": self.successes,
            "success_rate": self.success_rate,
            "success_rate_ci95": [low, high],
            "mean_episode_seconds": self.mean_seconds,
            "mean_success_seconds": self.mean_success_seconds,
            "failures": self.failures(),
            "recorded": None if config.record_root is None else str(config.record_root),
            "per_episode": [e.to_dict() for e in self.episodes],
        }

    def format_text(self) -> str:
        config = self.config
        low, high = self.interval
        seeds = config.seeds
        if len(seeds) == 1:
            span = str(seeds[0])
        elif list(seeds) == list(range(seeds[0], seeds[-1] + 1)):
            span = f"{seeds[0]}..{seeds[-1]}"
        else:
            span = ", ".join(map(str, seeds))
        lines = [
            f"{self.policy} on seeds {span} x {config.episodes_per_seed} "
            f"(pushes {config.push_rate:g}/s, at most {config.max_seconds:g} s an episode):",
            f"  success {self.successes}/{len(self.episodes)} = {self.success_rate:.1%} "
            f"(95% Wilson CI {low:.1%} - {high:.1%})",
        ]
        success_s = self.mean_success_seconds
        lines.append(
            f"  mean episode length {self.mean_seconds:.2f} s"
            + ("" if success_s is None else f" (successes {success_s:.2f} s)")
        )
        failures = self.failures()
        if any(failures.values()):
            lines.append("  failures: " + ", ".join(f"{k} {v}" for k, v in failures.items() if v))
        for e in self.episodes:
            if e.failure:
                where = "" if e.episode_index is None else f", episode {e.episode_index}"
                lines.append(
                    f"    seed {e.seed} #{e.repetition}: {e.failure} ({e.seconds:.1f} s, "
                    f"{e.pushes} push{'' if e.pushes == 1 else 'es'}, "
                    f"cube lifted {e.max_cube_lift_m * 1000:.0f} mm at most{where})"
                )
        if config.record_root is not None:
            lines.append(
                f"  recorded: {config.record_root} (replay: hilrec check {config.record_root} --replay)"
            )
        return "\n".join(lines)


def failure_reason(*, inside: bool, lifted: bool) -> str:
    """Why an episode that did not succeed failed (see the module docstring)."""
    if inside:
        return NOT_IN_BIN  # over or inside the bin, not resting below the rim
    return DROPPED if lifted else NOT_GRASPED


def evaluate(config: EvalConfig, policy: EvalPolicy, *, progress: bool = False) -> EvalReport:
    """Run ``policy`` closed loop on every seed ``episodes_per_seed`` times; the report."""
    report = EvalReport(policy=policy.name, config=config)
    with Twin(
        fps=config.fps,
        cameras=config.cameras,
        image_size=config.image_size,
        scene=config.scene,
        render_quality=config.render_quality,
    ) as twin:
        sink = _open_sink(config, twin, policy) if config.record_root is not None else None
        bar = _progress(len(config.seeds) * config.episodes_per_seed, enabled=progress)
        try:
            for seed in config.seeds:
                for repetition in range(config.episodes_per_seed):
                    report.episodes.append(run_episode(twin, policy, config, seed, repetition, sink))
                    bar.update(1)
                    bar.set_postfix(successes=report.successes)
        finally:
            bar.close()
            if sink is not None:
                sink.finalize()
    return report


def run_episode(
    twin: Twin,
    policy: EvalPolicy,
    config: EvalConfig,
    seed: int,
    repetition: int,
    sink: FrameSink | None = None,
) -> EpisodeResult:
    """One closed-loop episode (recorded into ``sink`` when given)."""
    start = twin.reset(seed)
    policy.reset()
    pseed = push_seed(seed, repetition)
    schedule = push_schedule(pseed, config.max_frames, config.fps, config.push_rate, twin.scene.arm_prefixes)
    pushes_at = pushes_by_frame(schedule)
    tally = ContactTally(twin)
    placed_z = float(start.cube.z)
    max_lift = 0.0
    frames = 0
    try:
        for frame in range(config.max_frames):
            state = twin.observe()
            observation: dict[str, Any] = {STATE_KEY: state}
            for camera in twin.cameras:
                observation[IMAGE_PREFIX + camera] = twin.render(camera)
            observation[TASK_KEY] = config.task
            for value in observation.values():
                if isinstance(value, np.ndarray):
                    value.flags.writeable = False  # what is recorded is what the policy saw
            action = _checked_action(policy.act(observation), policy.name, seed, frame, len(twin.joint_names))
            executed = act_and_step(twin, action, pushes_at.get(frame, ()))
            frames = frame + 1
            if sink is not None:
                sink.add_frame({**observation, ACTION_KEY: executed})
            tally.add()
            max_lift = max(max_lift, float(twin.cube_state().position[2]) - placed_z)
            if outcome_of(twin).success:
                break
    except BaseException:
        if sink is not None and sink.episode_open:
            sink.discard_episode()
        raise
    outcome = outcome_of(twin)
    check = outcome.check
    failure = None if outcome.success else failure_reason(inside=check.inside, lifted=max_lift > LIFTED_M)
    applied = [p for p in schedule if p.frame < frames]
    episode_index = None
    if sink is not None:
        sidecar = _episode_sidecar(
            twin, start, policy, config, seed=seed, repetition=repetition, push_seed=pseed,
            pushes=applied, outcome=outcome.to_dict(), contacts=tally.summary(), failure=failure,
            frames=frames, max_lift=max_lift,
        )  # fmt: skip
        episode_index = sink.save_episode(sidecar=sidecar, arrays={"initial_state": start.state})
    position = outcome.cube.position
    return EpisodeResult(
        seed=seed,
        repetition=repetition,
        push_seed=pseed,
        frames=frames,
        fps=config.fps,
        success=outcome.success,
        failure=failure,
        pushes=len(applied),
        max_cube_lift_m=max_lift,
        final_cube_position=(float(position[0]), float(position[1]), float(position[2])),
        episode_index=episode_index,
    )


def _checked_action(action: Any, name: str, seed: int, frame: int, joints: int) -> np.ndarray:
    try:
        values = np.asarray(action, dtype=np.float64).reshape(-1)
    except (TypeError, ValueError):
        values = np.empty(0)
    if values.shape != (joints,) or not np.isfinite(values).all():
        raise ConfigError(
            "policy",
            f"{name} answered {action!r} at seed {seed} frame {frame}; an action is {joints} "
            "finite numbers in LeRobot units (degrees, gripper 0-100)",
        )
    return values


def _open_sink(config: EvalConfig, twin: Twin, policy: EvalPolicy) -> Any:
    from hilrec.daemon.dataset import DatasetWriter, update_dataset_sidecar
    from hilrec.sim.provenance import dataset_provenance

    assert config.record_root is not None
    cameras = dict.fromkeys(config.cameras, config.image_size)
    sink = DatasetWriter.create(
        config.record_root,
        fps=config.fps,
        features=so101_features(cameras, arms=twin.arms),
        robot_type=robot_type(twin.arms),
        video_codec=config.video_codec,
        merge_interval_s=MERGE_INTERVAL_S,
        lock_command="hilrec eval",
        realtime=False,
    )
    provenance = dataset_provenance(
        scene=twin.scene,
        physics=twin.physics_info(),
        operator_config=None,
        cameras=cameras,
        render_quality=config.render_quality,
        push_rate=config.push_rate,
    )
    provenance["eval"] = {
        "source": SOURCE,
        "policy": policy.name,
        "seeds": list(config.seeds),
        "episodes_per_seed": config.episodes_per_seed,
        "max_seconds": config.max_seconds,
        "task": config.task,
    }
    update_dataset_sidecar(config.record_root, provenance)
    return sink


def _episode_sidecar(
    twin: Twin,
    start: Any,
    policy: EvalPolicy,
    config: EvalConfig,
    *,
    seed: int,
    repetition: int,
    push_seed: int,
    pushes: Sequence[Push],
    outcome: dict[str, Any],
    contacts: dict[str, Any],
    failure: str | None,
    frames: int,
    max_lift: float,
) -> dict[str, Any]:
    sim = start_fields(
        twin,
        start,
        seed=seed,
        leader=f"policy {policy.name}",
        phases={},
        push_rate=config.push_rate,
        pushes=pushes,
    )
    sim["contacts"] = contacts
    sim["commands_clipped_to_joint_limits"] = twin.clipped_commands
    return {
        "source": SOURCE,
        "sim": sim,
        **outcome,
        "eval": {
            "policy": policy.name,
            "seed": seed,
            "repetition": repetition,
            "push_seed": push_seed,
            "frames": frames,
            "ended_by": "success" if outcome["success"] else "max_seconds",
            "failure": failure,
            "max_cube_lift_m": max_lift,
        },
    }


class _NoProgress:
    def update(self, n: int) -> None:
        pass

    def set_postfix(self, **values: object) -> None:
        pass

    def close(self) -> None:
        pass


def _progress(total: int, *, enabled: bool) -> Any:
    if not enabled:
        return _NoProgress()
    from tqdm import tqdm

    return tqdm(total=total, unit="episode", desc="evaluating", dynamic_ncols=True)
