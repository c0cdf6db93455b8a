"""What a take's verdict says about a rollout: how often and where the human took over, and
whether the policy kept the loop's rate.

Read from the episode sidecar's ``rollout`` summary (:class:`hilrec.daemon.policy.record.RolloutLog`):
the switches (their frames, so their times), the human's share of the frames, the starved ticks
(a tick with no action due from the policy in time: the arm held its goal) and the inference
latency. A policy that starved more than :data:`STARVED_WARN_SHARE` of the take's ticks did not
keep the rate: that is a recorder note, which makes an otherwise sound take a warning.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

STARVED_WARN_SHARE: Final[float] = 0.05
_LISTED_SWITCHES: Final[int] = 5


@dataclass(frozen=True)
class RolloutFindings:
    sentence: str  # appended to the verdict's summary
    details: dict[str, Any]
    note: str | None  # a recorder note (the policy missed the rate), or None


def rollout_findings(meta: Mapping[str, Any], fps: int) -> RolloutFindings | None:
    """None for a take no policy drove."""
    rollout = meta.get("rollout")
    if not isinstance(rollout, Mapping):
        return None
    frames = int(rollout.get("frames") or meta.get("frames") or 0)
    takeovers = [s for s in rollout.get("switches") or [] if s.get("to") == "human"]
    times = [round(int(s["frame"]) / fps, 2) if fps else None for s in takeovers]
    starved = int(rollout.get("starved_ticks") or 0)
    share = starved / frames if frames else 0.0
    kept = share <= STARVED_WARN_SHARE
    latency = rollout.get("inference_latency_s") or {}
    human = float(rollout.get("human_share") or 0.0)
    if rollout.get("record") == "corrections":
        took = f"a correction window: the human drove {human:.0%} of its {frames} frames"
    elif takeovers:
        where = ", ".join(f"{t:g} s" for t in times[:_LISTED_SWITCHES] if t is not None)
        more = f" and {len(times) - _LISTED_SWITCHES} more" if len(times) > _LISTED_SWITCHES else ""
        took = f"the human took over {len(takeovers)} time(s) (at {where}{more}), {human:.0%} of frames"
    else:
        took = "the policy drove it all (no takeover)"
    p99 = latency.get("p99")
    timing = f", inference p99 {p99 * 1000:.0f} ms" if isinstance(p99, (int, float)) else ""
    rate = (
        f"the policy kept the rate ({starved} of {frames} ticks starved{timing})"
        if kept
        else f"the policy missed the rate on {share:.0%} of ticks ({starved} of {frames} starved{timing})"
    )
    details = {
        "takeovers": len(takeovers),
        "takeover_s": times,
        "human_share": human,
        "starved_ticks": starved,
        "starved_share": share,
        "kept_rate": kept,
        "inference_latency_s": dict(latency),
        "outcome": _outcome(meta),
    }
    note = None if kept else f"the policy starved {starved} of {frames} ticks (held the arm)"
    return RolloutFindings(sentence=f"{took}; {rate}", details=details, note=note)


def _outcome(meta: Mapping[str, Any]) -> str | None:
    from hilrec.daemon.policy.record import episode_outcome

    outcome = episode_outcome(meta)
    return None if outcome is None else str(outcome)
