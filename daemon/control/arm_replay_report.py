"""What an on-arm replay (:mod:`hilrec.daemon.control.arm_replay`) measured, and its record.

The comparison is per joint, measured Present_Position against the recorded ``observation.state``
of the same frame, in the dataset's units: RMS and max error over the ticks whose read succeeded,
and the lag by which the arm trails its recording (:func:`hilrec.daemon.replay.alignment.fit_shift`,
the hardware replay check's estimator, on the joints that moved enough to show one). Timing is
the pacer's record (:func:`hilrec.daemon.control.clock.timing_summary`): late ticks, skipped
slots, overruns.

``--record ROOT2`` writes the run as a new episode of another dataset: the measured state as
``observation.state``, the goals sent as ``action`` (the number in the file is the number
executed), the tick times and flags beside it as the daemon writes them, and a sidecar saying
which episode of which dataset it replays.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from hilrec.daemon.control.arm_replay import ArmRun, RecordedEpisode
from hilrec.daemon.control.clock import TIMING_ARRAYS, timing_summary
from hilrec.daemon.dataset import FrameFlag
from hilrec.daemon.replay.alignment import fit_shift
from hilrec.daemon.replay.settings import LagSettings
from hilrec.daemon.so101 import JOINT_NAMES, MOTORS, NormMode

_BODY = [j for j, name in enumerate(JOINT_NAMES) if MOTORS[name][1] != NormMode.RANGE_0_100]


def timing_arrays(run: ArmRun) -> dict[str, np.ndarray]:
    """The playback's per-tick times under the daemon's names (``tick_*``)."""
    fields = [name.removeprefix("tick_") for name in TIMING_ARRAYS]
    out: dict[str, np.ndarray] = {}
    for name, attr in zip(TIMING_ARRAYS, fields, strict=True):
        dtype = np.int64 if attr in ("slot", "skipped") else np.float64
        out[name] = np.array([getattr(t, attr) for t in run.times], dtype=dtype)
    return out


def summarise(episode: RecordedEpisode, run: ArmRun, lag: LagSettings) -> dict[str, Any]:
    """The report as a JSON-ready document."""
    n = run.played
    measured = np.array(run.measured, dtype=np.float64).reshape(n, 6)
    recorded = episode.state[:n].astype(np.float64)
    flags = np.array(run.flags, dtype=np.int64)
    good = (flags & int(FrameFlag.FOLLOWER_FAILED)) == 0 if n else np.zeros(0, dtype=bool)
    error = measured[good] - recorded[good]
    joints = {
        name: {
            "rms": float(np.sqrt(np.mean(error[:, j] ** 2))) if len(error) else None,
            "max": float(np.max(np.abs(error[:, j]))) if len(error) else None,
        }
        for j, name in enumerate(JOINT_NAMES)
    }
    period = 1.0 / episode.fps
    timing = timing_summary(timing_arrays(run), period) if n else {"ticks": 0}
    clamped = [k for k, c in enumerate(run.clamped) if c]
    reached = None if run.reached is None else np.abs(run.reached - run.target)
    return {
        "replay_of": {"root": str(episode.root), "episode_index": episode.index},
        "fps": episode.fps,
        "frames": episode.length,
        "played": n,
        "complete": n == episode.length,
        "interrupted": run.interrupted,
        "fault": run.fault,
        "units": str(episode.body),
        "approach": {
            "start": run.start.tolist(),
            "target": run.target.tolist(),
            "ramp_ticks": len(run.ramp_goal),
            "reached": None if run.reached is None else run.reached.tolist(),
            "error_max": None if reached is None else float(reached.max()),
        },
        "clamped": {"count": len(clamped), "frames": clamped[:20]},
        "failed_reads": int(np.count_nonzero(~good)),
        "joints": joints,
        "lag": _lag(measured, recorded, good, lag, episode.fps),
        "late_ticks": int(np.count_nonzero(flags & int(FrameFlag.LATE))),
        "timing": timing,
    }


def _lag(
    measured: np.ndarray, recorded: np.ndarray, good: np.ndarray, settings: LagSettings, fps: int
) -> dict[str, Any]:
    """How many frames the measurement trails the recording (positive: the arm is late)."""
    n = measured.shape[0]
    if n < settings.max_shift_frames - settings.min_shift_frames + 3:
        return {"frames": None, "why": f"{n} frames are too few to fit a lag"}
    if not good.all():
        return {"frames": None, "why": "some reads failed; the fit needs every frame"}
    motion = np.ptp(recorded, axis=0)
    used = [j for j in _BODY if motion[j] >= settings.min_motion_deg]
    if not used:
        return {"frames": None, "why": f"no body joint moved {settings.min_motion_deg:g} units"}
    fit = fit_shift(
        measured[:, used],
        recorded[:, used],
        min_shift=settings.min_shift_frames,
        max_shift=settings.max_shift_frames,
    )
    return {
        "frames": fit.lag,
        "ms": fit.lag * 1000.0 / fps,
        "joints": [JOINT_NAMES[j] for j in used],
        "at_search_edge": fit.best_shift in (settings.min_shift_frames, settings.max_shift_frames),
    }


def format_text(doc: dict[str, Any]) -> str:
    """The report for a person: what was played, then one line per joint."""
    source = doc["replay_of"]
    lines = [f"replay of {source['root']} episode {source['episode_index']} on the arm at {doc['fps']} fps"]
    approach = doc["approach"]
    if approach["reached"] is not None:
        lines.append(
            f"approach: {approach['ramp_ticks']} ticks; first state reached within "
            f"{approach['error_max']:.2f} ({doc['units']})"
        )
    played = f"played {doc['played']} of {doc['frames']} frames"
    if doc["interrupted"]:
        played += f" (stopped by Ctrl-C during the {doc['interrupted']})"
    if doc["fault"]:
        played += f" (ended by {doc['fault']})"
    lines.append(played)
    if doc["played"]:
        lines.append(f"{'joint':<14} {'rms':>8} {'max':>8}   (measured - recorded observation.state)")
        for name, e in doc["joints"].items():
            if e["rms"] is not None:
                lines.append(f"{name:<14} {e['rms']:8.3f} {e['max']:8.3f}")
        lag = doc["lag"]
        if lag["frames"] is not None:
            lines.append(
                f"lag: {lag['frames']:+.2f} frames ({lag['ms']:+.0f} ms), "
                f"fitted on {', '.join(lag['joints'])}"
            )
        else:
            lines.append(f"lag: not estimated ({lag['why']})")
        timing = doc["timing"]
        lines.append(
            f"clamped commands: {doc['clamped']['count']}; failed reads: {doc['failed_reads']}; "
            f"late ticks: {doc['late_ticks']}, skipped slots: {timing['skipped_slots']}, "
            f"overruns: {timing['overruns']}, late p99 {timing['late_ms_p99']:.2f} ms"
        )
    return "\n".join(lines)


def record_run(
    root: Path, episode: RecordedEpisode, run: ArmRun, doc: dict[str, Any], fields: dict[str, Any]
) -> int:
    """Append the played frames as a new episode of ``root`` (made if new); its index."""
    from hilrec.daemon.dataset import DatasetWriter, update_dataset_sidecar
    from hilrec.daemon.errors import ConfigError, ReplayError
    from hilrec.daemon.so101 import ACTION_KEY, ROBOT_TYPE, STATE_KEY, so101_features
    from hilrec.daemon.wire.root import check_root

    features = so101_features()
    try:
        existing = check_root(root, resume=True, fps=episode.fps, features=features)
    except ConfigError as exc:
        raise ReplayError(f"--record {root}: {exc.problem}") from None
    writer = (
        DatasetWriter.open(root)
        if existing
        else DatasetWriter.create(root, fps=episode.fps, features=features, robot_type=ROBOT_TYPE)
    )
    with writer:
        for state, action in zip(run.measured, run.sent, strict=True):
            writer.add_frame({STATE_KEY: state, ACTION_KEY: action, "task": episode.task})
        arrays = {
            **timing_arrays(run),
            "frame_flags": np.array(run.flags, dtype=np.uint32),
            "ramp_goal": np.array(run.ramp_goal, dtype=np.float32).reshape(-1, 6),
            "ramp_present": np.array(run.ramp_present, dtype=np.float32).reshape(-1, 6),
        }
        index = writer.save_episode(sidecar={"task": episode.task, "arm_replay": doc}, arrays=arrays)
    update_dataset_sidecar(root, fields)
    return index
