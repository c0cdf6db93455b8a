"""Replay verification of sim episodes: the recording must be exactly what the twin does.

For every episode with a recorded start state, the twin (built at the recorded timestep, never a
default: :func:`hilrec.sim.provenance.scene_from_sidecar`) is restored to it and fed the episode's
``action`` column, with the recorded disturbances at their frames, through the same frame loop
the recorder used (:mod:`hilrec.sim.episode`). Then:

- every ``observation.state`` row must equal the replayed observation exactly (maximum error 0),
  reported per joint;
- the outcome must be identical: the cube's final pose (bit for bit) and success.

When rows disagree, the frame shift ``k`` in [-3, 3] that best aligns them is reported (``k = 1``:
the recorded observation equals the replayed one of the frame before, i.e. it was written one
frame late). With disturbances recorded, the episode is replayed a second time without them and
the drift is reported as the size of their effect. An episode without a start state cannot be
replayed; it is reported as such, with the reason, and never counts as passed.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypedDict

import numpy as np

from hilrec.daemon.dataset import (
    load_dataset_sidecar,
    load_episode_sidecar,
    load_episodes,
    load_info,
    read_episode,
)
from hilrec.daemon.errors import HilrecError, ReplayError
from hilrec.daemon.so101 import ACTION_KEY, ARM_SIDES, STATE_KEY
from hilrec.sim.episode import Outcome, Push, act_and_step, outcome_of, pushes_by_frame
from hilrec.sim.provenance import check_same_world, scene_from_sidecar
from hilrec.sim.twin import Twin

MAX_SHIFT = 3  # a column written a few frames late or early; further is not a timing slip
PASSED, FAILED, NOT_REPLAYABLE = "passed", "failed", "not_replayable"


class Shift(TypedDict):
    """:func:`best_shift`'s answer: which whole-frame shift explains a mismatch, and how well."""

    best_lag: int
    best_mean_error: float
    mean_error_by_lag: dict[str, float]  # keyed by the shift as text, as it is in the JSON report
    exact_at_best_lag: bool


class OutcomeCheck(TypedDict, total=False):
    """The recorded outcome against the replayed one; empty for an episode that was not replayed."""

    identical: bool
    difference: str
    recorded: dict[str, Any]
    replayed: dict[str, Any]


class DisturbanceEffect(TypedDict):
    """How far the episode ends up without its recorded pushes: the size of their effect."""

    max_state_drift: float
    max_state_drift_per_joint: dict[str, float]
    cube_final_distance_m: float
    success_without: bool


@dataclass(kw_only=True)
class EpisodeReplay:
    """The verdict on one episode."""

    episode_index: int
    status: str
    reason: str = ""
    frames: int = 0
    max_error: float | None = None
    max_error_per_joint: dict[str, float] = field(default_factory=dict)
    mismatched_rows: int = 0
    first_mismatch_frame: int | None = None
    outcome: OutcomeCheck = field(default_factory=OutcomeCheck)
    shift: Shift | None = None  # only when the rows differ
    disturbances: int = 0
    disturbance_effect: DisturbanceEffect | None = None

    @property
    def passed(self) -> bool:
        return self.status == PASSED

    @property
    def max_error_per_arm(self) -> dict[str, float]:
        """Two arms: the largest state error of each (``left``, ``right``); one arm: empty."""
        arms: dict[str, float] = {}
        for joint, error in self.max_error_per_joint.items():
            side = next((s for s in ARM_SIDES if joint.startswith(f"{s}_")), None)
            if side is not None:
                arms[side] = max(arms.get(side, 0.0), error)
        return arms

    def to_dict(self) -> dict[str, Any]:
        extra: dict[str, Any] = {"passed": self.passed}
        if self.max_error_per_arm:
            extra["max_error_per_arm"] = self.max_error_per_arm
        return dict(self.__dict__) | extra

    def format_text(self) -> str:
        head = f"episode {self.episode_index}: {self.status.upper().replace('_', ' ')}"
        if self.status == NOT_REPLAYABLE:
            return f"{head}: {self.reason}"
        lines = [
            f"{head} ({self.frames} frames, max |state error| {self.max_error:.6g}, "
            f"outcome {'identical' if self.outcome.get('identical') else 'DIFFERENT'})"
        ]
        if self.reason:
            lines.append(f"  {self.reason}")
        if self.max_error:
            per_joint = ", ".join(f"{j} {e:.4g}" for j, e in self.max_error_per_joint.items())
            lines.append(f"  per joint: {per_joint}")
            if self.max_error_per_arm:
                arms = ", ".join(
                    f"{side} arm {'differs' if e else 'exact'} (max {e:.4g})"
                    for side, e in self.max_error_per_arm.items()
                )
                lines.append(f"  per arm: {arms}")
            lines.append(f"  {self.mismatched_rows} rows differ, first at frame {self.first_mismatch_frame}")
        if self.shift is not None:
            lines.append(
                f"  best alignment: lag {self.shift['best_lag']:+d} frames "
                f"(mean |error| {self.shift['best_mean_error']:.4g}; "
                f"at lag 0 {self.shift['mean_error_by_lag']['0']:.4g})"
            )
        if self.disturbance_effect is not None:
            effect = self.disturbance_effect
            lines.append(
                f"  without its {self.disturbances} disturbances: max state drift "
                f"{effect['max_state_drift']:.4g}, cube ends "
                f"{effect['cube_final_distance_m'] * 1000:.1f} mm away, success "
                f"{effect['success_without']}"
            )
        return "\n".join(lines)


@dataclass(kw_only=True)
class ReplayReport:
    """The verdicts on a dataset's episodes, or why none could be replayed (``error``)."""

    root: str
    episodes: list[EpisodeReplay] = field(default_factory=list)
    world_differences: list[str] = field(default_factory=list)
    error: str | None = None

    @property
    def passed(self) -> bool:
        """Every episode replayed bit for bit (an unreplayable episode is not a pass)."""
        return self.error is None and bool(self.episodes) and all(e.passed for e in self.episodes)

    def counts(self) -> dict[str, int]:
        return {
            status: sum(e.status == status for e in self.episodes)
            for status in (PASSED, FAILED, NOT_REPLAYABLE)
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "passed": self.passed,
            "root": self.root,
            "counts": self.counts(),
            "world_differences": list(self.world_differences),
            "error": self.error,
            "episodes": [e.to_dict() for e in self.episodes],
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def format_text(self) -> str:
        counts = self.counts()
        lines = [
            f"replay {'PASSED' if self.passed else 'FAILED'}: {counts[PASSED]} passed, "
            f"{counts[FAILED]} failed, {counts[NOT_REPLAYABLE]} not replayable ({self.root})"
        ]
        if self.error:
            lines.append(f"  {self.error}")
        lines.extend(f"  world: {d}" for d in self.world_differences)
        lines.extend(e.format_text() for e in self.episodes)
        return "\n".join(lines)


def replay_check(
    root: str | Path, *, episodes: Iterable[int] | None = None, undisturbed: bool = True
) -> ReplayReport:
    """Replay the sim episodes of the dataset at ``root`` on the twin and judge them."""
    root = Path(root)
    report = ReplayReport(root=str(root))
    info = load_info(root)
    indices = [int(row["episode_index"]) for row in load_episodes(root)]
    if episodes is not None:
        wanted = sorted(set(episodes))
        unknown = sorted(set(wanted) - set(indices))
        if unknown:
            raise ReplayError(
                f"{root}: no episode {', '.join(map(str, unknown))} (the dataset has {len(indices)})"
            )
        indices = wanted
    for key in (ACTION_KEY, STATE_KEY):
        if key not in info.get("features", {}):
            report.error = f"the dataset has no '{key}' feature to replay"
            return report
    dataset_sidecar = load_dataset_sidecar(root)
    try:
        scene = scene_from_sidecar(dataset_sidecar, root)
        twin = Twin(fps=int(info["fps"]), cameras=(), scene=scene)
    except HilrecError as exc:
        report.error = f"cannot build the twin this dataset was recorded in: {exc}"
        report.episodes = [
            EpisodeReplay(episode_index=i, status=NOT_REPLAYABLE, reason=report.error) for i in indices
        ]
        return report
    report.world_differences = check_same_world(dataset_sidecar, scene) + _physics_differences(
        dataset_sidecar, twin
    )
    with twin:
        for index in indices:
            report.episodes.append(_replay_episode(root, twin, index, undisturbed=undisturbed))
    return report


def _physics_differences(dataset_sidecar: Mapping[str, Any] | None, twin: Twin) -> list[str]:
    """The recorded frame (timestep, substeps, fps) against the replaying twin's."""
    recorded = ((dataset_sidecar or {}).get("sim") or {}).get("physics") or {}
    here = twin.physics_info()
    differ = [k for k in ("timestep", "substeps", "fps") if k in recorded and recorded[k] != here[k]]
    if not differ:
        return []
    return [
        "recorded physics "
        + ", ".join(f"{k} {recorded[k]}" for k in differ)
        + "; replaying with "
        + ", ".join(f"{k} {here[k]}" for k in differ)
    ]


def _replay_episode(root: Path, twin: Twin, index: int, *, undisturbed: bool) -> EpisodeReplay:
    meta, arrays = load_episode_sidecar(root, index)
    reason = _why_not_replayable(meta, arrays, twin, index)
    if reason:
        return EpisodeReplay(episode_index=index, status=NOT_REPLAYABLE, reason=reason)
    assert meta is not None
    columns = read_episode(root, index, [ACTION_KEY, STATE_KEY])
    actions, recorded = columns[ACTION_KEY], columns[STATE_KEY]
    where = f"{root} episode {index}"
    sim = meta.get("sim") or {}
    pushes = [Push.from_dict(p, where) for p in sim.get("disturbances") or []]
    replayed, outcome = run_actions(twin, arrays["initial_state"], actions, pushes)

    result = EpisodeReplay(episode_index=index, status=PASSED, frames=len(actions), disturbances=len(pushes))
    _compare_states(result, recorded, replayed, twin.joint_names)
    result.outcome = _compare_outcome(meta, outcome)
    problems = []
    if result.max_error:
        problems.append(
            f"observation.state differs from the replay in {result.mismatched_rows} of {result.frames} rows"
        )
        result.shift = best_shift(recorded, replayed)
    if not result.outcome["identical"]:
        problems.append("the outcome differs: " + result.outcome["difference"])
    if problems:
        result.status, result.reason = FAILED, "; ".join(problems)
    if pushes and undisturbed:
        free_states, free_outcome = run_actions(twin, arrays["initial_state"], actions, [])
        result.disturbance_effect = _effect(recorded, free_states, meta, free_outcome, twin.joint_names)
    return result


def _why_not_replayable(
    meta: Mapping[str, Any] | None, arrays: Mapping[str, np.ndarray], twin: Twin, index: int
) -> str:
    if meta is None:
        return (
            f"no sidecar hilrec/episodes/episode-{index:06d}.json, so no recorded start "
            "state (written by another recorder?)"
        )
    state = arrays.get("initial_state")
    if state is None:
        return (
            f"hilrec/episodes/episode-{index:06d} has no initial_state array: no recorded "
            "start state (a hardware episode? 'hilrec replay' checks those)"
        )
    if np.asarray(state).shape != (twin.state_size,):
        return (
            f"its start state has shape {np.asarray(state).shape}, this twin's is "
            f"({twin.state_size},): recorded with a different model"
        )
    return ""


def run_actions(
    twin: Twin,
    initial_state: np.ndarray,
    actions: np.ndarray,
    pushes: list[Push],
    on_observe: Callable[[int, np.ndarray], None] | None = None,
) -> tuple[np.ndarray, Outcome]:
    """Restore ``initial_state``, play ``actions`` (with ``pushes``); observations and outcome.

    ``on_observe(frame, observation)`` runs after each observation, before the frame acts (where
    the recorder renders its cameras).
    """
    twin.set_state(initial_state)
    at = pushes_by_frame(pushes)
    observations = np.empty((len(actions), len(twin.joint_names)), dtype=np.float32)
    for frame, action in enumerate(actions):
        observations[frame] = twin.observe()
        if on_observe is not None:
            on_observe(frame, observations[frame])
        act_and_step(twin, action, at.get(frame, ()))
    return observations, outcome_of(twin)


def _compare_states(
    result: EpisodeReplay, recorded: np.ndarray, replayed: np.ndarray, joints: tuple[str, ...]
) -> None:
    if recorded.shape != replayed.shape:
        raise ReplayError(
            f"episode {result.episode_index}: observation.state has shape "
            f"{recorded.shape}, expected {replayed.shape}"
        )
    error = np.abs(recorded.astype(np.float64) - replayed.astype(np.float64))
    error[~np.isfinite(error)] = np.inf
    per_joint = error.max(axis=0) if len(error) else np.zeros(len(joints))
    result.max_error_per_joint = {j: float(e) for j, e in zip(joints, per_joint, strict=True)}
    result.max_error = float(per_joint.max()) if len(per_joint) else 0.0
    bad_rows = np.nonzero(error.max(axis=1) > 0)[0] if len(error) else np.array([], int)
    result.mismatched_rows = len(bad_rows)
    result.first_mismatch_frame = int(bad_rows[0]) if len(bad_rows) else None


def best_shift(recorded: np.ndarray, replayed: np.ndarray, max_shift: int = MAX_SHIFT) -> Shift:
    """The lag k in [-max_shift, max_shift] minimising mean |recorded[t] - replayed[t - k]|.

    k > 0: the recording is late by k frames (its row t is the twin's row t - k).

    A sim replay is deterministic, so the question is yes or no: is the recording the replay
    moved by whole frames, bit for bit? Hence whole shifts only; each scored on its own full
    overlap, so that ``exact_at_best_lag`` covers every row that can be compared; mean absolute
    errors, in the joints' own units, for the report; and a tie goes to the smallest shift. The
    hardware replay check estimates a different thing, the fractional lag of a noisy physical
    recording, with estimators of its own (:mod:`hilrec.daemon.replay.alignment`, a higher layer
    this one cannot import); neither could take the other's place without changing its answers.
    """
    n = len(recorded)
    errors: dict[int, float] = {}
    for lag in range(-max_shift, max_shift + 1):
        if n - abs(lag) < 1:
            continue
        rec = recorded[max(lag, 0) : n + min(lag, 0)].astype(np.float64)
        rep = replayed[max(-lag, 0) : n - max(lag, 0)].astype(np.float64)
        errors[lag] = float(np.mean(np.abs(rec - rep)))
    best = min(errors, key=lambda lag: (errors[lag], abs(lag)))
    return {
        "best_lag": best,
        "best_mean_error": errors[best],
        "mean_error_by_lag": {str(k): v for k, v in errors.items()},
        "exact_at_best_lag": errors[best] == 0.0,
    }


def _compare_outcome(meta: Mapping[str, Any], outcome: Outcome) -> OutcomeCheck:
    replayed = {"success": outcome.success, "final_cube": outcome.cube.to_dict()}
    recorded_cube = meta.get("final_cube") or {}
    recorded = {"success": meta.get("success"), "final_cube": recorded_cube}
    differences = []
    if meta.get("success") is None or not recorded_cube:
        differences.append("the sidecar records no outcome (success, final_cube)")
    else:
        if bool(meta["success"]) != outcome.success:
            differences.append(f"success recorded {meta['success']}, replayed {outcome.success}")
        for key in ("position", "quaternion"):
            want = np.asarray(recorded_cube.get(key, []), dtype=np.float64)
            got = getattr(outcome.cube, key)
            if want.shape != got.shape or not np.array_equal(want, got):
                distance = float(np.max(np.abs(want - got))) if want.shape == got.shape else float("inf")
                differences.append(f"cube final {key} differs by up to {distance:.3g}")
    return {
        "identical": not differences,
        "difference": "; ".join(differences),
        "recorded": recorded,
        "replayed": replayed,
    }


def _effect(
    recorded: np.ndarray,
    free: np.ndarray,
    meta: Mapping[str, Any],
    free_outcome: Outcome,
    joints: tuple[str, ...],
) -> DisturbanceEffect:
    drift = np.abs(recorded.astype(np.float64) - free.astype(np.float64))
    per_joint = drift.max(axis=0)
    cube = np.asarray((meta.get("final_cube") or {}).get("position", [np.nan] * 3), np.float64)
    return {
        "max_state_drift": float(per_joint.max()),
        "max_state_drift_per_joint": {j: float(e) for j, e in zip(joints, per_joint, strict=True)},
        "cube_final_distance_m": float(np.linalg.norm(cube - free_outcome.cube.position)),
        "success_without": free_outcome.success,
    }
