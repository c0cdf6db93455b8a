"""What the replay check finds about one episode, as data: verdict, lag, joints, gripper, JSON.

:mod:`hilrec.daemon.replay.analysis` fills these in; :mod:`hilrec.daemon.replay.check` gathers
them per dataset, :mod:`hilrec.daemon.replay.report` draws and tabulates them, and
:func:`to_json` is their machine-readable form (``hilrec replay --json`` and ``report.json``).
Units are the twin's: body joints in degrees, the gripper in 0..100, lags in frames of the
dataset's fps.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import numpy as np

from hilrec.daemon.replay.metrics import Excursion, Stall
from hilrec.daemon.replay.settings import ErrorLimits
from hilrec.daemon.so101 import JOINT_NAMES

GRIPPER = JOINT_NAMES.index("gripper")
BODY = tuple(i for i in range(len(JOINT_NAMES)) if i != GRIPPER)


class ReplayVerdict(StrEnum):
    """The hardware replay check's verdict on one episode, best first (the verdict on a take as a
    whole is :class:`hilrec.daemon.dataset.EpisodeVerdict`); :mod:`hilrec.daemon.replay.analysis`
    says what earns each."""

    CONSISTENT = "consistent"
    LAGGING = "lagging"
    DIVERGED = "diverged"
    NOT_REPLAYABLE = "not_replayable"


# The exit status of `hilrec replay` is the code of the worst verdict among the episodes checked.
# 1 is left to Python's own failures and 2 to usage/config errors (argparse, HilrecError).
EXIT_CODES: dict[ReplayVerdict, int] = {
    ReplayVerdict.CONSISTENT: 0,
    ReplayVerdict.LAGGING: 3,
    ReplayVerdict.DIVERGED: 4,
    ReplayVerdict.NOT_REPLAYABLE: 5,
}
SEVERITY: tuple[ReplayVerdict, ...] = (
    ReplayVerdict.CONSISTENT,
    ReplayVerdict.LAGGING,
    ReplayVerdict.DIVERGED,
    ReplayVerdict.NOT_REPLAYABLE,
)


def worst(verdicts: list[ReplayVerdict]) -> ReplayVerdict:
    return max(verdicts, key=SEVERITY.index, default=ReplayVerdict.CONSISTENT)


@dataclass(frozen=True)
class Trajectories:
    """What an episode is judged on, frame for frame, in twin units."""

    recorded: np.ndarray  # (n, 6) observation.state, twin units
    replayed: np.ndarray  # (n, 6) the twin's state, same frames
    action: np.ndarray  # (n, 6) recorded action, twin units
    limits: np.ndarray  # (6, 2) [low, high] of each joint's command range, twin units
    leader: np.ndarray | None = None  # (n, 6) leader reading, when the recorder kept it


@dataclass
class JointResult:
    """One joint's errors (raw, aligned, judged), its own lag, and what else it did."""

    name: str
    motion: float  # peak-to-peak of the replayed position
    rms_error: float  # as recorded, no alignment
    max_error: float
    aligned_rms_error: float  # after shifting the replay by the episode's lag
    aligned_max_error: float
    judged_rms_error: float  # aligned, with the timing slack: what the verdict is based on
    judged_max_error: float
    lag_frames: float | None  # this joint's own best shift (None if it barely moved or diverged)
    limits: ErrorLimits  # what its errors are judged against (degrees, or 0..100 for the gripper)
    divergence: Excursion | None = None
    blips: int = 0
    stalls: list[Stall] = field(default_factory=list)
    at_limit_frames: int = 0
    beyond_range_frames: int = 0
    leader_mismatch_frames: int | None = None


@dataclass
class LagResult:
    """The episode's lag: the alignment fit (:func:`hilrec.daemon.replay.alignment.align`) and the
    action->state responses that second it."""

    frames: float | None  # None: no joint moved enough to show a lag
    best_shift: int | None
    shifts: np.ndarray
    mse: np.ndarray | None
    joints_used: list[str]
    response_recorded: float | None  # action -> recorded state, frames (cross-correlation)
    response_replayed: float | None  # action -> replayed state, frames
    at_search_edge: bool = False
    fitted_frames: int = 0  # the lag was fitted on frames [approach, fitted_frames)


@dataclass
class GripperResult:
    """Gripper behaviour: ranges commanded, reached and replayed, and grasps (not judged as errors)."""

    commanded: tuple[float, float]
    achieved: tuple[float, float]
    replayed: tuple[float, float]
    mean_tracking_gap: float  # mean |action - recorded| outside grasps
    grasp_frames: int
    grasps: list[tuple[int, int]]
    held_opening: float | None  # median recorded opening while grasping
    replayed_grasp_frames: int


@dataclass
class EpisodeResult:
    """Everything the check found about one episode; a ``not_replayable`` one has only the reason."""

    episode_index: int
    verdict: ReplayVerdict
    reason: str
    frames: int
    fps: int
    lag: LagResult | None = None
    joints: list[JointResult] = field(default_factory=list)
    gripper: GripperResult | None = None
    divergence_joint: str | None = None
    divergence_onset: int | None = None
    trajectories: Trajectories | None = None
    aligned_replay: np.ndarray | None = None
    judged_error: np.ndarray | None = None  # (n, 6) |error| with the timing slack
    stale_rows: list[int] = field(default_factory=list)  # rows repeating the last while the twin moved
    # Frames [0, approach) are the follower's swing to the leader at the start: reported, not judged
    approach_frames: int = 0
    notes: list[str] = field(default_factory=list)
    # What the recorder itself flagged per frame (hilrec's frame_flags): name -> (frames, first)
    recorder_flags: dict[str, tuple[int, int]] = field(default_factory=dict)

    @classmethod
    def not_replayable(
        cls, episode_index: int, reason: str, *, frames: int = 0, fps: int = 0
    ) -> EpisodeResult:
        return cls(
            episode_index=episode_index,
            verdict=ReplayVerdict.NOT_REPLAYABLE,
            reason=reason,
            frames=frames,
            fps=fps,
        )

    def ms(self, frames: float | None) -> float | None:
        return None if frames is None or not self.fps else frames * 1000.0 / self.fps

    def worst_joint(self) -> JointResult | None:
        """The joint closest to (or furthest past) its limits, body and gripper alike."""
        return max(
            self.joints,
            default=None,
            key=lambda j: max(j.judged_rms_error / j.limits.rms, j.judged_max_error / j.limits.max),
        )


def to_json(result: EpisodeResult) -> dict[str, Any]:
    """The machine-readable form of one episode's result (no arrays but the lag curve)."""
    fps = result.fps

    def num(x: float | None) -> float | None:
        return None if x is None or not math.isfinite(x) else round(float(x), 6)

    out: dict[str, Any] = {
        "episode_index": result.episode_index,
        "verdict": result.verdict.value,
        "reason": result.reason,
        "frames": result.frames,
        "fps": fps,
        "notes": list(result.notes),
        "stale_rows": list(result.stale_rows),
        "approach": None
        if not result.approach_frames
        else {"frames": result.approach_frames, "s": round(result.approach_frames / fps, 6) if fps else None},
        "recorder_flags": {
            name: {"frames": n, "first_frame": first} for name, (n, first) in result.recorder_flags.items()
        },
    }
    if result.verdict is ReplayVerdict.NOT_REPLAYABLE:
        return out
    lag = result.lag
    assert lag is not None
    out["lag"] = {
        "frames": num(lag.frames),
        "ms": num(result.ms(lag.frames)),
        "best_shift": lag.best_shift,
        "joints_used": lag.joints_used,
        "fitted_frames": lag.fitted_frames,
        "at_search_edge": lag.at_search_edge,
        "response_recorded_frames": num(lag.response_recorded),
        "response_replayed_frames": num(lag.response_replayed),
        "curve": None
        if lag.mse is None
        else {"shifts": [int(k) for k in lag.shifts], "mse": [num(v) for v in lag.mse]},
    }
    out["divergence"] = (
        None
        if result.divergence_onset is None
        else {
            "joint": result.divergence_joint,
            "onset_frame": result.divergence_onset,
            "onset_s": num(result.divergence_onset / fps),
        }
    )
    out["joints"] = {
        j.name: {
            "motion": num(j.motion),
            "rms_error": num(j.rms_error),
            "max_error": num(j.max_error),
            "aligned_rms_error": num(j.aligned_rms_error),
            "aligned_max_error": num(j.aligned_max_error),
            "judged_rms_error": num(j.judged_rms_error),
            "judged_max_error": num(j.judged_max_error),
            "lag_frames": num(j.lag_frames),
            "lag_ms": num(result.ms(j.lag_frames)),
            "divergence": None
            if j.divergence is None
            else {
                "onset_frame": j.divergence.onset,
                "first_over_frame": j.divergence.first_over,
                "peak_error": num(j.divergence.peak),
            },
            "limits": {"rms": j.limits.rms, "max": j.limits.max, "floor": j.limits.floor},
            "blips": j.blips,
            "stalls": [
                {
                    "start_frame": s.start,
                    "stop_frame": s.stop,
                    "held": num(s.held_value),
                    "twin_motion": num(s.command_motion),
                }
                for s in j.stalls
            ],
            "commands_at_limit": j.at_limit_frames,
            "commands_beyond_range": j.beyond_range_frames,
            "leader_mismatch_frames": j.leader_mismatch_frames,
        }
        for j in result.joints
    }
    g = result.gripper
    if g is not None:
        out["gripper"] = {
            "commanded_range": [num(v) for v in g.commanded],
            "achieved_range": [num(v) for v in g.achieved],
            "replayed_range": [num(v) for v in g.replayed],
            "mean_tracking_gap": num(g.mean_tracking_gap),
            "grasp_frames": g.grasp_frames,
            "grasps": [list(iv) for iv in g.grasps],
            "held_opening": num(g.held_opening),
            "replayed_grasp_frames": g.replayed_grasp_frames,
        }
    return out


def verdict_table(results: list[EpisodeResult]) -> str:
    """One line per episode: frames, verdict, lag, worst joint and the reason (as people read it)."""
    rows = [("episode", "frames", "verdict", "lag", "worst joint", "reason")]
    for r in results:
        if r.verdict is ReplayVerdict.NOT_REPLAYABLE or r.lag is None:
            rows.append((str(r.episode_index), str(r.frames), r.verdict.value, "", "", r.reason))
            continue
        lag = "n/a" if r.lag.frames is None else f"{r.lag.frames:+.2f} fr {r.ms(r.lag.frames):+.0f} ms"
        wj = r.worst_joint()
        assert wj is not None
        rows.append(
            (
                str(r.episode_index),
                str(r.frames),
                r.verdict.value,
                lag,
                f"{wj.name} rms {wj.judged_rms_error:.2f} max {wj.judged_max_error:.2f}",
                r.reason,
            )
        )
    # The reason, last, is not padded: it is long, and nothing follows it.
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(row[:-1], widths, strict=True)) + "  " + row[-1]
        for row in rows
    )
