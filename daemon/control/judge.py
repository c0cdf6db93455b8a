"""The verdict on one saved episode: the dataset rules that concern it, then its replay.

Run in the verdict worker process (:mod:`hilrec.daemon.control.verdict`), which keeps MuJoCo
and the checkers imported between takes. :func:`judge_episode` waits (bounded) until the episode
is merged into LeRobot's files (``meta/info.json`` counts it: the checks read those files), then
judges that episode alone:

- the dataset rules that concern one episode (:mod:`hilrec.daemon.dataset`'s checker, its
  failures for that episode only: rows, timestamps, stats, video frames);
- sim episodes: the bit-exact replay (:func:`hilrec.sim.replay.replay_check`);
- hardware and emulated episodes: the hardware replay check (:mod:`hilrec.daemon.replay.check`:
  consistent, lagging or diverged, with the lag and the worst joint); a two-arm episode's arms
  each on a one-arm twin, the verdict the worse of the two, its summary naming the arm.

The answer is a dict: the :class:`hilrec.daemon.dataset.EpisodeVerdict`, a one-sentence summary
a person can act on, and the details.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from hilrec.daemon.dataset import INFO_PATH, EpisodeVerdict

if TYPE_CHECKING:  # the replay check imports MuJoCo: only in the worker, only when it judges
    from hilrec.daemon.replay.metrics import Stall
    from hilrec.daemon.replay.results import EpisodeResult

log = logging.getLogger(__name__)

MERGE_TIMEOUT_S: Final[float] = 60.0
MERGE_POLL_S: Final[float] = 0.01

WARN_FLAGGED_FRACTION: Final[float] = 0.01
WARN_FLAGGED_MIN: Final[int] = 2
# Recorder flags that make a take worth a second look (the follower did not do what was asked).
_WARN_FLAGS: Final[dict[str, str]] = {
    "follower_failed": "the follower could not be read",
    "write_failed": "the follower could not be written",
    "leader_failed": "the leader could not be read",
    "leader_stale": "the leader sent nothing",
}


def judge_episode(
    root: Path, episode_index: int, *, mode: str, merge_timeout_s: float = MERGE_TIMEOUT_S
) -> dict[str, Any]:
    """The verdict on one saved episode: ``{episode_index, verdict, summary, details}``."""
    from hilrec.daemon.errors import HilrecError

    started = time.perf_counter()
    waited = wait_merged(root, episode_index, merge_timeout_s)
    if waited is None:
        return not_checked(
            episode_index, f"it was not merged into LeRobot's files within {merge_timeout_s:.0f} s"
        )
    checking = time.perf_counter()
    try:
        verdict, summary, details = _judge(root, episode_index, mode)
    except (HilrecError, OSError, ValueError, KeyError) as exc:
        log.exception("verdict of episode %d", episode_index)
        return not_checked(episode_index, f"{type(exc).__name__}: {exc}")
    details["merge_wait_s"] = round(waited, 3)
    details["check_s"] = round(time.perf_counter() - checking, 3)
    details["worker_s"] = round(time.perf_counter() - started, 3)
    return {"episode_index": episode_index, "verdict": verdict, "summary": summary, "details": details}


def wait_merged(root: Path, episode_index: int, timeout_s: float) -> float | None:
    """Seconds until ``meta/info.json`` counts the episode (merged); None at the timeout.

    The episode is durable in the journal before the daemon asks; the merge into LeRobot's files
    follows at once on the writer's merge thread, and info.json is the last file it replaces."""
    from hilrec.daemon.atomic import read_json

    info_path = root / INFO_PATH
    started = time.monotonic()
    while True:
        info = read_json(info_path, if_missing=None)
        if isinstance(info, dict) and int(info.get("total_episodes", 0)) > episode_index:
            return time.monotonic() - started
        if time.monotonic() - started > timeout_s:
            return None
        time.sleep(MERGE_POLL_S)  # a bounded poll on a file another process replaces


def episode_data_problems(root: Path, episode_index: int) -> tuple[list[str], list[str]]:
    """The checker's errors and warnings that concern this episode (rows, timestamps, stats,
    video), each as the checker words it."""
    import dataclasses

    from hilrec.daemon.dataset import (
        Findings,
        Severity,
        checks_data,
        checks_rows,
        checks_stats,
        checks_video,
        classified,
    )

    findings = Findings(root)
    contents = checks_data.load_contents(root, findings)
    if contents is None:
        return [f.format() for f in findings.failures] or ["the dataset cannot be read"], []
    # Row checks are cheap for the whole dataset; only this episode's failures count (another
    # episode merged while this was read shows as a mismatch of *its* rows, or of the totals).
    checks_rows.check_rows(contents, findings)
    if episode_index not in contents.episodes:
        return [f"episode {episode_index} has no metadata row in meta/episodes"], []
    if episode_index in contents.rows:
        one = dataclasses.replace(
            contents,
            episodes={episode_index: contents.episodes[episode_index]},
            rows={episode_index: contents.rows[episode_index]},
        )
        checks_stats.check_episode_stats(one, findings)
        checks_video.check_videos(one, findings, decode=True)
    mine = [classified(f) for f in findings.failures if f.episode == episode_index]
    errors = [f.format() for f in mine if f.severity is Severity.ERROR]
    return errors, [f.format() for f in mine if f.severity is not Severity.ERROR]


def _judge(root: Path, index: int, mode: str) -> tuple[EpisodeVerdict, str, dict[str, Any]]:
    """The verdict, with what it says of a rollout (:mod:`hilrec.daemon.control.judge_rollout`)."""
    from hilrec.daemon.control.judge_rollout import rollout_findings
    from hilrec.daemon.dataset import load_episode_sidecar

    meta, _ = load_episode_sidecar(root, index)
    rollout = rollout_findings(meta or {}, _fps(root))
    notes = _recorder_notes(meta or {})
    if rollout is not None and rollout.note is not None:
        notes.append(rollout.note)
    verdict, summary, details = _judge_take(root, index, mode, meta, notes)
    if rollout is not None:
        details["rollout"] = rollout.details
        summary = f"{summary} ({rollout.sentence})"
    return verdict, summary, details


def _judge_take(
    root: Path, index: int, mode: str, meta: dict[str, Any] | None, notes: list[str]
) -> tuple[EpisodeVerdict, str, dict[str, Any]]:
    problems, harmless = episode_data_problems(root, index)
    replay = _sim_replay(root, index) if mode == "sim" else _hardware_replay(root, index)
    details: dict[str, Any] = {
        "data_problems": problems,
        "data_warnings": harmless,  # true but harmless (the checker's WARNING rules): shown, not judged
        "recorder_notes": notes,
        "replay": replay,
    }
    frames = replay.get("frames") or (meta or {}).get("frames")
    if problems:
        return (
            EpisodeVerdict.BAD,
            f"episode {index} breaks a dataset rule ({problems[0]}): press ← to record it again",
            details,
        )
    why = f" ({notes[0]})" if notes else ""  # beside a replay's finding: a fault is not to be missed
    if replay["verdict"] == EpisodeVerdict.BAD:
        return EpisodeVerdict.BAD, f"{replay['summary']}{why}: press ← to record it again", details
    if replay["verdict"] == EpisodeVerdict.WARNING:
        return (
            EpisodeVerdict.WARNING,
            f"{replay['summary']}{why}: keep it, or press ← to record it again",
            details,
        )
    if notes:
        return (
            EpisodeVerdict.WARNING,
            f"{notes[0]}: look at it, keep it or press ← to record it again",
            details,
        )
    if replay["verdict"] == EpisodeVerdict.NOT_CHECKED:
        return (
            EpisodeVerdict.NOT_CHECKED,
            f"episode {index} passes the dataset checks, but {replay['summary']}",
            details,
        )
    return (
        EpisodeVerdict.SOUND,
        f"episode {index} is sound: {frames} frames, {replay['summary']}; keep it",
        details,
    )


def _recorder_notes(meta: dict[str, Any]) -> list[str]:
    notes = []
    ended_by = str(meta.get("ended_by") or "")
    if ended_by.startswith("fault:"):
        _, kind, device = [*ended_by.split(":", 2), "", ""][:3]
        notes.append(f"the take was ended by a fault ({kind} on {device})")
    counts = (meta.get("frame_flags") or {}).get("counts") or {}
    frames = int(meta.get("frames") or 0)
    for flag, what in _WARN_FLAGS.items():
        # A read that failed after its retries repeats the last good value for that frame: a few
        # are harmless; more than WARN_FLAGGED_FRACTION of the take are worth a look.
        if counts.get(flag, 0) > max(WARN_FLAGGED_MIN, WARN_FLAGGED_FRACTION * frames):
            notes.append(f"{what} on {counts[flag]} of {frames} frames")
    return notes


def _sim_replay(root: Path, index: int) -> dict[str, Any]:
    from hilrec.sim.replay import FAILED, NOT_REPLAYABLE, replay_check

    report = replay_check(root, episodes=[index], undisturbed=False)
    if not report.episodes:
        return {
            "kind": "sim",
            "verdict": EpisodeVerdict.NOT_CHECKED,
            "summary": f"it cannot be replayed: {report.error}",
        }
    episode = report.episodes[0]
    out: dict[str, Any] = {"kind": "sim", "status": episode.status, "frames": episode.frames}
    if episode.status == NOT_REPLAYABLE:
        return {
            **out,
            "verdict": EpisodeVerdict.NOT_CHECKED,
            "summary": f"it cannot be replayed: {episode.reason}",
        }
    if episode.status == FAILED:
        out["max_error_per_joint"] = episode.max_error_per_joint
        out["first_mismatch_frame"] = episode.first_mismatch_frame
        out["outcome"] = dict(episode.outcome)
        if episode.max_error_per_joint and episode.max_error:
            joint = max(episode.max_error_per_joint, key=lambda j: episode.max_error_per_joint[j])
            at = _seconds(episode.first_mismatch_frame, _fps(root))
            summary = (
                f"{joint} differs from the bit-exact replay from {at:.1f} s "
                f"(max error {episode.max_error_per_joint[joint]:.3g})"
            )
        else:
            summary = f"the replay's outcome differs ({episode.outcome.get('difference')})"
        return {**out, "verdict": EpisodeVerdict.BAD, "summary": summary}
    return {**out, "verdict": EpisodeVerdict.SOUND, "summary": "it replays bit for bit"}


def _plot(result: EpisodeResult, root: Path, index: int, arm: str | None = None) -> str | None:
    """The replay's figure, written with the verdict so the ui links it at once (as ``hilrec
    replay --report`` would); its path relative to the root, None if it could not be written.
    One arm of two: ``episode-NNNNNN-<arm>.png``."""
    from hilrec.daemon.replay.report import episode_plot_path, plot_episode

    path = episode_plot_path(root, index)
    if arm is not None:
        path = path.with_name(f"{path.stem}-{arm}{path.suffix}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        plot_episode(result, path)
    except (OSError, ValueError) as exc:  # a full disk costs the figure, never the verdict
        log.warning("episode %d: the replay figure was not written: %s", index, exc)
        return None
    return str(path.relative_to(root))


# The worse verdict first: which arm's verdict a two-arm episode's is.
_SEVERITY: Final[tuple[EpisodeVerdict, ...]] = (
    EpisodeVerdict.BAD,
    EpisodeVerdict.WARNING,
    EpisodeVerdict.NOT_CHECKED,
    EpisodeVerdict.SOUND,
)


def _hardware_replay(root: Path, index: int) -> dict[str, Any]:
    """The replay check's verdict; of a two-arm episode, each arm's and the worse of them."""
    from hilrec.daemon.atomic import read_json
    from hilrec.daemon.so101 import ARM_SIDES, STATE_KEY, arms_of

    info = read_json(root / INFO_PATH, if_missing=None) or {}
    names = ((info.get("features") or {}).get(STATE_KEY) or {}).get("names") or []
    if arms_of(names) != len(ARM_SIDES):
        return _arm_replay(root, index)
    arms = {side: _arm_replay(root, index, side) for side in ARM_SIDES}
    side = min(ARM_SIDES, key=lambda s: _SEVERITY.index(arms[s]["verdict"]))
    verdict = arms[side]["verdict"]
    if verdict == EpisodeVerdict.SOUND:
        summary = "; ".join(f"{s} arm {arms[s]['summary']}" for s in ARM_SIDES)
    else:
        summary = f"{side} arm: {arms[side]['summary']}"
    return {
        "kind": "hardware",
        "verdict": verdict,
        "summary": summary,
        "frames": arms[side].get("frames"),
        "arm": side,
        "arms": arms,
    }


def _arm_replay(root: Path, index: int, arm: str | None = None) -> dict[str, Any]:
    from hilrec.daemon.replay.check import replay_dataset
    from hilrec.daemon.replay.results import ReplayVerdict
    from hilrec.daemon.replay.settings import DEFAULT_CONFIG_PATH, load_replay_settings

    check = replay_dataset(
        root,
        settings=load_replay_settings(None),
        settings_source=str(DEFAULT_CONFIG_PATH),
        episodes=[index],
        arm=arm,
    )
    result = check.results[0]
    out: dict[str, Any] = {
        "kind": "hardware",
        "status": result.verdict.value,
        "frames": result.frames,
        "reason": result.reason,
        "notes": list(result.notes),
    }
    if result.verdict is not ReplayVerdict.NOT_REPLAYABLE:
        out["plot"] = _plot(result, root, index, arm)
    if result.verdict is ReplayVerdict.NOT_REPLAYABLE:
        return {
            **out,
            "verdict": EpisodeVerdict.NOT_CHECKED,
            "summary": f"the twin cannot replay it: {result.reason}",
        }
    lag = result.lag.frames if result.lag is not None else None
    worst = result.worst_joint()
    out["lag_frames"] = None if lag is None else round(float(lag), 3)
    out["lag_ms"] = None if lag is None else round(float(result.ms(lag) or 0.0), 1)
    if worst is not None:
        out["worst_joint"] = {
            "name": worst.name,
            "rms": round(worst.judged_rms_error, 3),
            "max": round(worst.judged_max_error, 3),
        }
    if result.divergence_joint is not None:
        out["divergence"] = {
            "joint": result.divergence_joint,
            "onset_frame": result.divergence_onset,
            "onset_s": _seconds(result.divergence_onset, result.fps),
        }
    if result.verdict is ReplayVerdict.DIVERGED:
        stalled = any(j.stalls for j in result.joints)
        if result.divergence_joint is None and not stalled:
            # Errors over the RMS limits with no departure and no stall: the follower tracked the
            # twin loosely (e.g. a short take that started mid-motion, from the twin at rest).
            return {
                **out,
                "verdict": EpisodeVerdict.WARNING,
                "summary": f"the follower tracks the twin loosely ({result.reason})",
            }
        return {**out, "verdict": EpisodeVerdict.BAD, "summary": _divergence_summary(result)}
    if result.verdict is ReplayVerdict.LAGGING:
        ms = out["lag_ms"]
        return {
            **out,
            "verdict": EpisodeVerdict.WARNING,
            "summary": f"the follower is {abs(ms or 0):.0f} ms {'behind' if (lag or 0) > 0 else 'ahead of'} "
            f"the twin ({lag or 0:+.2f} frames)",
        }
    worst_text = f"; worst joint {worst.name}, rms {worst.judged_rms_error:.2f}" if worst is not None else ""
    return {
        **out,
        "verdict": EpisodeVerdict.SOUND,
        "summary": f"consistent with the twin (lag {lag or 0:+.2f} frames{worst_text})",
    }


def _divergence_summary(result: EpisodeResult) -> str:
    joint = result.divergence_joint
    if joint is None:
        worst = result.worst_joint()
        name = worst.name if worst is not None else "a joint"
        return f"{name} is off the twin ({result.reason})"
    stalls: list[Stall] = next((j.stalls for j in result.joints if j.name == joint), [])
    if stalls:
        return f"{joint} stalled from {_seconds(stalls[0].start, result.fps):.1f} s"
    return f"{joint} diverged from the twin from {_seconds(result.divergence_onset, result.fps):.1f} s"


def _seconds(frame: int | None, fps: int) -> float:
    return 0.0 if frame is None or not fps else frame / fps


def _fps(root: Path) -> int:
    from hilrec.daemon.atomic import read_json

    return int((read_json(root / INFO_PATH, if_missing=None) or {}).get("fps") or 0)


def not_checked(episode_index: int, why: str) -> dict[str, Any]:
    return {
        "episode_index": episode_index,
        "verdict": EpisodeVerdict.NOT_CHECKED,
        "summary": f"episode {episode_index} was not checked: {why}",
        "details": {"error": why},
    }
