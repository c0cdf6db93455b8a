"""Judge one replayed episode: per-joint errors, lag, gripper, saturation, and the verdict.

Input is three ``(n, 6)`` trajectories in the twin's units (body joints in degrees, gripper in
0..100): the recorded ``observation.state``, the state the twin reached when driven by the
recorded ``action`` from the first recorded state, and the action itself.

Verdicts, worst first: ``not_replayable`` (the check could not run; never a pass), ``diverged``
(after the best lag alignment a joint still leaves its error limit for long enough, or its RMS
error is over the limit), ``lagging`` (aligned, it tracks; but the recording trails the twin by
more than the tolerance), ``consistent``.

The error judged is the aligned one with a timing slack: each row may match the replay up to
``timing_slack_frames`` whole frames either side of the lag. Hardware reads a servo at a time of
its own, so single rows a frame early or late are timing (their share is what a fractional lag
measures), while a joint that does something else stays far from the replay at every shift.

A gripper closed on an object reads more open than commanded while the twin, which has no object
in its hand, closes fully. Those frames (on either side) are grasps, reported as gripper
behaviour and left out of the gripper's error judgement.

A take that opens with the follower swinging from where it rested to the leader (its
``approach``, found by :func:`hilrec.daemon.replay.metrics.approach_end`) is judged from the frame
the follower caught up: the replay restarts there from the recorded state
(:mod:`hilrec.daemon.replay.check`), and the frames before it, and the few after it whose aligned
replay would reach back into them, are reported and not judged.
"""

from __future__ import annotations

import math

import numpy as np

from hilrec.daemon.replay.alignment import Alignment, align, fit_shift, response_lag, slack_error
from hilrec.daemon.replay.metrics import (
    Excursion,
    Stall,
    count_blips,
    find_stalls,
    grasp_mask,
    limit_hits,
    runs,
    stale_rows,
    sustained_excursion,
)
from hilrec.daemon.replay.results import (
    BODY,
    GRIPPER,
    EpisodeResult,
    GripperResult,
    JointResult,
    LagResult,
    ReplayVerdict,
    Trajectories,
)
from hilrec.daemon.replay.settings import (
    ErrorLimits,
    GripperSettings,
    LagSettings,
    ReplaySettings,
    StallSettings,
)
from hilrec.daemon.so101 import JOINT_NAMES


def analyse(
    episode_index: int, traj: Trajectories, *, fps: int, settings: ReplaySettings, approach: int = 0
) -> EpisodeResult:
    """Errors, lag, gripper and saturation of one replayed episode, and its verdict.

    ``approach``: frames [0, approach) are the follower's swing to the leader, not judged."""
    rec, rep, act = traj.recorded, traj.replayed, traj.action
    n = rec.shape[0]
    lag_cfg, cons = settings.lag, settings.consistency
    too_short = _too_short(n - approach, approach, fps=fps, settings=settings)
    if too_short:
        return EpisodeResult.not_replayable(episode_index, too_short, frames=n, fps=fps)
    min_frames = max(1, math.ceil(cons.min_duration_s * fps))

    grasp_rec, grasp_rep, valid = _grasps(traj, settings.gripper)
    valid[:approach] = False

    def valid_at(lag: float) -> np.ndarray:
        return _valid_after(valid, approach, lag, cons.timing_slack_frames)

    motion = np.ptp(rep[approach:], axis=0)
    moving = [j for j in BODY if motion[j] >= lag_cfg.min_motion_deg]

    def judged(aligned: np.ndarray, lag: float) -> np.ndarray:
        return slack_error(rec, rep, aligned, lag, cons.timing_slack_frames)

    def excursions(aligned: np.ndarray, lag: float) -> dict[int, Excursion]:
        return _excursions(judged(aligned, lag), valid_at(lag), settings, min_frames)

    alignment = align(
        rec,
        rep,
        moving,
        min_shift=lag_cfg.min_shift_frames,
        max_shift=lag_cfg.max_shift_frames,
        find_excursions=excursions,
        start=approach,
    )
    aligned, exc, lag = alignment.aligned, alignment.excursions, alignment.lag

    lag_result = _lag_result(alignment, traj, lag_cfg, start=approach)

    raw_err = rec - rep
    al_err = rec - aligned
    judged_err = judged(aligned, lag)
    sat, stall_cfg = settings.saturation, settings.stall
    margin = np.where(np.arange(rec.shape[1]) == GRIPPER, sat.gripper_margin, sat.limit_margin_deg)
    at_limit, beyond = limit_hits(act, traj.limits[:, 0], traj.limits[:, 1], margin)

    judged_valid = valid_at(lag)
    joints: list[JointResult] = []
    for j, name in enumerate(JOINT_NAMES):
        ok = judged_valid[:, j]
        raw_j, al_j, judged_j = (e[ok, j] if ok.any() else np.zeros(1) for e in (raw_err, al_err, judged_err))
        own_lag = _own_lag(traj, j, lag_cfg, start=approach) if j in moving and j not in exc else None
        lim = _limits(settings, j)
        joints.append(
            JointResult(
                name=name,
                motion=float(motion[j]),
                rms_error=_rms(raw_j),
                max_error=float(np.max(np.abs(raw_j))),
                aligned_rms_error=_rms(al_j),
                aligned_max_error=float(np.max(np.abs(al_j))),
                judged_rms_error=_rms(judged_j),
                judged_max_error=float(np.max(judged_j)),
                lag_frames=own_lag,
                limits=lim,
                divergence=exc.get(j),
                blips=count_blips(judged_err[:, j], limit=lim.max, min_frames=min_frames, valid=ok),
                stalls=[] if j == GRIPPER else _stalls(traj, j, stall_cfg, fps, start=approach),
                at_limit_frames=int(at_limit[:, j].sum()),
                beyond_range_frames=int(beyond[:, j].sum()),
                leader_mismatch_frames=_leader_mismatch(traj, j, sat.leader_tolerance),
            )
        )

    result = EpisodeResult(
        episode_index=episode_index,
        verdict=ReplayVerdict.CONSISTENT,
        reason="",
        frames=n,
        fps=fps,
        lag=lag_result,
        joints=joints,
        gripper=_gripper(act, rec, rep, grasp_rec, grasp_rep),
        trajectories=traj,
        aligned_replay=aligned,
        judged_error=judged_err,
        stale_rows=[r for r in stale_rows(rec, rep, moved=stall_cfg.still_deg).tolist() if r >= approach],
        approach_frames=approach,
    )
    _judge(result, settings)
    return result


def _limits(settings: ReplaySettings, j: int) -> ErrorLimits:
    cons = settings.consistency
    return cons.gripper if j == GRIPPER else cons.body


def _excursions(
    error: np.ndarray, valid: np.ndarray, settings: ReplaySettings, min_frames: int
) -> dict[int, Excursion]:
    """Each joint's first sustained excursion of ``error`` past its limit, on ``valid`` frames."""
    found = {}
    for j in range(error.shape[1]):
        lim = _limits(settings, j)
        exc = sustained_excursion(
            error[:, j], limit=lim.max, min_frames=min_frames, floor=lim.floor, valid=valid[:, j]
        )
        if exc is not None:
            found[j] = exc
    return found


def _too_short(judged_frames: int, approach: int, *, fps: int, settings: ReplaySettings) -> str:
    """Why an episode with ``judged_frames`` after its approach is too short to judge, or ""."""
    lag_cfg = settings.lag
    needed = max(settings.engine.min_frames, lag_cfg.max_shift_frames - lag_cfg.min_shift_frames + 3)
    if judged_frames >= needed:
        return ""
    after = f" after the approach (first {approach / fps:.2f} s)" if approach else ""
    return f"only {judged_frames} frames{after}; the check needs at least {needed}"


def _valid_after(valid: np.ndarray, approach: int, lag: float, slack: int) -> np.ndarray:
    """``valid`` less the frames whose aligned replay reaches back into the approach."""
    if not approach:
        return valid
    out = valid.copy()
    out[: approach + max(0, math.ceil(lag)) + slack] = False
    return out


def _rms(x: np.ndarray) -> float:
    return float(np.sqrt(np.mean(x * x)))


def _gripper(
    act: np.ndarray, rec: np.ndarray, rep: np.ndarray, grasp_rec: np.ndarray, grasp_rep: np.ndarray
) -> GripperResult:
    a, r, p = act[:, GRIPPER], rec[:, GRIPPER], rep[:, GRIPPER]
    free = ~grasp_rec
    return GripperResult(
        commanded=(float(a.min()), float(a.max())),
        achieved=(float(r.min()), float(r.max())),
        replayed=(float(p.min()), float(p.max())),
        mean_tracking_gap=float(np.mean(np.abs(a[free] - r[free]))) if free.any() else 0.0,
        grasp_frames=int(grasp_rec.sum()),
        grasps=runs(grasp_rec),
        held_opening=float(np.median(r[grasp_rec])) if grasp_rec.any() else None,
        replayed_grasp_frames=int(grasp_rep.sum()),
    )


def _judge(result: EpisodeResult, settings: ReplaySettings) -> None:
    """Set the verdict and a one-line reason a person can act on."""
    fps = result.fps
    lag = result.lag
    assert lag is not None
    diverged = [(j.divergence.onset, j) for j in result.joints if j.divergence is not None]
    if diverged:
        onset, joint = min(diverged, key=lambda item: item[0])
        exc = joint.divergence
        assert exc is not None
        limit = joint.limits.max
        unit = "" if joint.name == "gripper" else " deg"
        reason = (
            f"{joint.name} diverged from frame {onset} ({onset / fps:.2f} s): the error "
            f"reaches {exc.peak:.1f}{unit}, limit {limit:g}{unit}"
        )
        stall = next((s for s in joint.stalls if s.start <= exc.first_over < s.stop + 1), None)
        if stall is not None:
            reason += (
                f"; its reading holds {stall.held_value:.1f}{unit} from frame {stall.start} "
                f"while the twin moves {stall.command_motion:.1f}{unit} (servo stalled or "
                "not responding)"
            )
        others = sorted({j.name for _, j in diverged} - {joint.name})
        if others:
            reason += f"; also diverged: {', '.join(others)}"
        result.verdict, result.reason = ReplayVerdict.DIVERGED, reason
        result.divergence_joint, result.divergence_onset = joint.name, onset
    else:
        over = []
        for j in result.joints:
            if j.judged_rms_error > j.limits.rms:
                over.append(f"{j.name} RMS error {j.judged_rms_error:.2f} > {j.limits.rms:g}")
        if over:
            result.verdict = ReplayVerdict.DIVERGED
            result.reason = "no single departure, but " + "; ".join(over)
        elif lag.frames is not None and abs(lag.frames) > settings.lag.tolerance_frames:
            direction = "lags" if lag.frames > 0 else "leads"
            result.verdict = ReplayVerdict.LAGGING
            result.reason = (
                f"the recorded state {direction} the replay by {abs(lag.frames):.2f} "
                f"frames ({abs(lag.frames) * 1000.0 / fps:.0f} ms)"
            )
        else:
            result.verdict = ReplayVerdict.CONSISTENT
            result.reason = "tracks the twin within the limits"
            if lag.frames is None:
                result.reason += f" (lag not estimable: no joint moved {settings.lag.min_motion_deg:g} deg)"
    if result.approach_frames:
        approach = (
            f"approach: first {result.approach_frames / fps:.2f} s ({result.approach_frames} frames), "
            "follower moving to the leader; judged from there on"
        )
        result.reason += f"; {approach}"
        result.notes.insert(0, approach)
    if lag.at_search_edge:
        result.notes.append(
            f"the best shift {lag.best_shift} is at the edge of the search range "
            f"[{settings.lag.min_shift_frames}, {settings.lag.max_shift_frames}]"
        )
    if lag.frames is not None and lag.response_recorded is not None and lag.response_replayed is not None:
        extra = lag.response_recorded - lag.response_replayed
        if abs(extra - lag.frames) > 1.0:
            result.notes.append(
                f"cross-correlation puts the extra action->state delay at {extra:.2f} frames, "
                f"the alignment at {lag.frames:.2f}"
            )
    if result.stale_rows:
        result.notes.append(
            f"{len(result.stale_rows)} row(s) repeat the previous reading exactly while the twin "
            f"moved, from frame {result.stale_rows[0]}: a stale or held observation"
        )
    for j in result.joints:
        if j.beyond_range_frames:
            result.notes.append(
                f"{j.name}: {j.beyond_range_frames} commands beyond the joint range (clamped)"
            )
        if j.leader_mismatch_frames:
            result.notes.append(
                f"{j.name}: recorded action differs from the leader on {j.leader_mismatch_frames} frames"
            )


def _grasps(traj: Trajectories, gcfg: GripperSettings) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The gripper's grasps, as recorded and as replayed, and the frames each joint is judged on
    (all but a grasp's, for the gripper: squeezing an object is not an error)."""
    act, rec, rep = traj.action[:, GRIPPER], traj.recorded[:, GRIPPER], traj.replayed[:, GRIPPER]
    grasp_rec = grasp_mask(act, rec, gap=gcfg.grasp_gap, still=gcfg.still)
    grasp_rep = grasp_mask(act, rep, gap=gcfg.grasp_gap, still=gcfg.still)
    valid = np.ones_like(traj.recorded, dtype=bool)
    valid[:, GRIPPER] = ~(grasp_rec | grasp_rep)
    return grasp_rec, grasp_rep, valid


def _own_lag(traj: Trajectories, j: int, lag_cfg: LagSettings, *, start: int) -> float | None:
    rec, rep = traj.recorded[start:, [j]], traj.replayed[start:, [j]]
    return fit_shift(rec, rep, min_shift=lag_cfg.min_shift_frames, max_shift=lag_cfg.max_shift_frames).lag


def _stalls(traj: Trajectories, j: int, stall_cfg: StallSettings, fps: int, *, start: int) -> list[Stall]:
    """Joint ``j``'s stalls that end after the approach (``start`` frames)."""
    found = find_stalls(
        traj.recorded[:, j],
        traj.replayed[:, j],
        still=stall_cfg.still_deg,
        min_frames=max(1, math.ceil(stall_cfg.min_duration_s * fps)),
        min_motion=stall_cfg.min_command_motion_deg,
    )
    return [s for s in found if s.stop > start]


def _lag_result(alignment: Alignment, traj: Trajectories, lag_cfg: LagSettings, *, start: int) -> LagResult:
    """The episode's lag: the alignment's fit over the moving joints, and the response lags
    (after the approach's ``start`` frames)."""
    fit, used = alignment.fit, list(alignment.joints)
    act, rec, rep = traj.action[start:], traj.recorded[start:], traj.replayed[start:]
    window = lag_cfg.max_correlation_frames
    return LagResult(
        frames=alignment.lag if fit is not None else None,
        best_shift=fit.best_shift if fit is not None else None,
        shifts=fit.shifts
        if fit is not None
        else np.arange(lag_cfg.min_shift_frames, lag_cfg.max_shift_frames + 1),
        mse=fit.mse if fit is not None else None,
        joints_used=[JOINT_NAMES[j] for j in used] if fit is not None else [],
        fitted_frames=alignment.window if fit is not None else 0,
        response_recorded=response_lag(act[:, used], rec[:, used], window) if used else None,
        response_replayed=response_lag(act[:, used], rep[:, used], window) if used else None,
        at_search_edge=fit is not None
        and fit.best_shift in (lag_cfg.min_shift_frames, lag_cfg.max_shift_frames),
    )


def _leader_mismatch(traj: Trajectories, j: int, tolerance: float) -> int | None:
    """Frames where the action of joint ``j`` is not the leader's reading (a clamp); None
    without the leader's recording."""
    if traj.leader is None:
        return None
    leader = traj.leader[:, j]
    return int(np.sum(np.isfinite(leader) & (np.abs(traj.action[:, j] - np.nan_to_num(leader)) > tolerance)))
