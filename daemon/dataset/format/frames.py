"""What a recording says about each frame and each episode beside its measurements.

The per-frame marks (:class:`FrameFlag`, a uint32 ``frame_flags`` array in the episode's sidecar
``.npz``, also published by name in the telemetry) and the verdict on a saved episode
(:class:`EpisodeVerdict`, stored in its sidecar ``.json`` and sent in the ``episode_verdict``
event). They belong to the format, not to the wire: the loop sets them, the episode buffer counts
them, and the replay check, ``hilrec view`` and the verdict worker read them back from files.
"""

from __future__ import annotations

import enum
from typing import Final


class FrameFlag(enum.IntFlag):
    """Per-frame marks, stored as a uint32 ``flags`` array beside the dataset and published by name.

    The bit values are in files and on the wire: never renumber, only add.
    """

    FOLLOWER_RETRIED = 1 << 0  # the follower read needed bus retries, then succeeded
    FOLLOWER_FAILED = 1 << 1  # the follower read failed after retries: observation is the last good one
    LEADER_RETRIED = 1 << 2
    LEADER_FAILED = 1 << 3  # the leader read failed after retries: the follower held position
    WRITE_FAILED = 1 << 4  # the follower write failed: the action was not executed
    LEADER_STALE = 1 << 5  # no live leader command (watchdog): the follower held position
    CLAMPED = 1 << 6  # the goal was clamped (joint range, max_relative_target); the action is the clamped one
    CAMERA_REPEATED = 1 << 7  # a camera had no new frame since the last tick (same image again)
    LATE = 1 << 8  # the tick started after its deadline by more than the jitter budget
    SKIPPED = 1 << 9  # one or more whole tick slots were missed before this tick
    OVERRUN = 1 << 10  # the tick's work ran past the next deadline
    STARVED = 1 << 11  # a policy drove and had no goal due this tick: the follower held its last goal
    POLICY_REFUSED = 1 << 12  # a policy's answer arrived refused (NaN, wrong shape, out of range)


def flag_names(flags: int) -> list[str]:
    return [f.name.lower() for f in FrameFlag if f.name and flags & f]


LATE_BUDGET_S: Final[float] = 0.002  # tick start later than this is flagged LATE


class EpisodeVerdict(enum.StrEnum):
    """The verdict on one saved episode (dataset rules, then the sim or hardware replay)."""

    SOUND = "sound"  # keep it
    WARNING = "warning"  # worth a look: keep it or record it again
    BAD = "bad"  # record it again
    NOT_CHECKED = "not_checked"  # it could not be judged (not merged in time, cannot be replayed)
