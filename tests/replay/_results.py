"""The parts of a judged episode's result that every judged episode has, for the tests to read.

:class:`~hilrec.daemon.replay.results.EpisodeResult` leaves them optional because a
``not_replayable`` episode has none; each accessor asserts the episode was judged.
"""

from __future__ import annotations

from hilrec.daemon.replay.results import EpisodeResult, GripperResult, LagResult, Trajectories


def lag_of(result: EpisodeResult) -> LagResult:
    assert result.lag is not None, f"episode {result.episode_index} was not judged: {result.reason}"
    return result.lag


def gripper_of(result: EpisodeResult) -> GripperResult:
    assert result.gripper is not None, f"episode {result.episode_index} was not judged: {result.reason}"
    return result.gripper


def trajectories_of(result: EpisodeResult) -> Trajectories:
    assert result.trajectories is not None, f"episode {result.episode_index} was not replayed"
    return result.trajectories


def onset_of(result: EpisodeResult) -> int:
    """The frame the episode's first divergence began at."""
    assert result.divergence_onset is not None, f"episode {result.episode_index} did not diverge"
    return result.divergence_onset


def lag_frames(result: EpisodeResult) -> float:
    """The episode's lag in frames, which it has when a joint moved enough to show one."""
    frames = lag_of(result).frames
    assert frames is not None, f"episode {result.episode_index}: no lag estimated ({result.reason})"
    return frames
