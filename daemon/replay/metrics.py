"""Error events of the replay check: runs over a limit, divergences, stalls, grasps, stale rows.

Plain numpy on 1-D or ``(n, d)`` float arrays (frames x joints): nothing here knows datasets or the
twin, so each detector can be tested on signals whose answer is known. The lag between the two
trajectories, and the alignment these errors are measured at, are :mod:`hilrec.daemon.replay.alignment`'s.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def stale_rows(recorded: np.ndarray, replayed: np.ndarray, *, moved: float) -> np.ndarray:
    """Rows that repeat the previous row exactly (every joint) while the twin moved more than
    ``moved``: a reading taken before the follower updated. Returns their indices."""
    same = np.all(recorded[1:] == recorded[:-1], axis=1)
    moving = np.max(np.abs(replayed[1:] - replayed[:-1]), axis=1) > moved
    return np.flatnonzero(same & moving) + 1


def runs(mask: np.ndarray) -> list[tuple[int, int]]:
    """The ``[start, stop)`` intervals where a 1-D boolean mask is True, in order."""
    m = np.concatenate(([False], np.asarray(mask, dtype=bool), [False]))
    edges = np.flatnonzero(m[1:] != m[:-1])
    return [(int(a), int(b)) for a, b in zip(edges[::2], edges[1::2], strict=True)]


@dataclass(frozen=True)
class Excursion:
    """Where an error first exceeded its limit for long enough, and where that departure began."""

    onset: int  # first frame after the last quiet stretch before the sustained run
    first_over: int  # first frame above the limit in the sustained run
    peak: float
    blips: int  # runs above the limit too short to count, before the sustained one
    floor: float  # the "quiet" level used to date the onset


def sustained_excursion(
    error: np.ndarray, *, limit: float, min_frames: int, floor: float, valid: np.ndarray | None = None
) -> Excursion | None:
    """The first run of ``|error| > limit`` lasting ``min_frames`` or more, with its onset.

    The onset is dated from the error's departure, not from the (larger) limit crossing: walking
    back from the run, it is the frame after the last stretch of ``min_frames`` frames that were
    all quiet (at or below the floor). An error that swings through zero on its way out is
    therefore not mistaken for one that returned. The floor is ``floor`` or, if the episode's own
    tracking error before the run is noisier, three times its median. Frames where ``valid`` is
    False (e.g. a gripper held on an object) never count.
    """
    mag = np.abs(error)
    if valid is not None:
        mag = np.where(valid, mag, 0.0)
    quiet_needed = max(min_frames, 1)
    blips = 0
    for start, stop in runs(mag > limit):
        if stop - start < quiet_needed:
            blips += 1
            continue
        level = max(floor, 3.0 * float(np.median(mag[:start]))) if start else floor
        onset, quiet = start, 0
        for t in range(start - 1, -1, -1):
            if mag[t] <= level:
                quiet += 1
                if quiet == quiet_needed:
                    break
            else:
                quiet = 0
                onset = t
        return Excursion(
            onset=onset, first_over=start, peak=float(mag[start:].max()), blips=blips, floor=level
        )
    return None


def count_blips(error: np.ndarray, *, limit: float, min_frames: int, valid: np.ndarray | None = None) -> int:
    mag = np.abs(error) if valid is None else np.where(valid, np.abs(error), 0.0)
    return sum(1 for a, b in runs(mag > limit) if b - a < max(min_frames, 1))


@dataclass(frozen=True)
class Stall:
    """A reading that stopped changing while the twin, driven by the same commands, kept moving."""

    start: int
    stop: int
    held_value: float
    command_motion: float  # peak-to-peak of the replayed position over the interval


def find_stalls(
    recorded: np.ndarray, replayed: np.ndarray, *, still: float, min_frames: int, min_motion: float
) -> list[Stall]:
    """Intervals of at least ``min_frames`` where ``recorded`` (1-D) moved less than ``still`` per
    frame while ``replayed`` moved at least ``min_motion`` peak to peak."""
    if recorded.shape[0] < 2:
        return []
    still_steps = np.abs(np.diff(recorded)) < still
    found = []
    for a, b in runs(still_steps):
        start, stop = a, b + 1  # b steps of stillness span b + 1 frames
        if stop - start < min_frames:
            continue
        window = replayed[start:stop]
        motion = float(window.max() - window.min())
        if motion >= min_motion:
            found.append(
                Stall(start=start, stop=stop, held_value=float(recorded[start]), command_motion=motion)
            )
    return found


def approach_end(
    action: np.ndarray, recorded: np.ndarray, *, min_gap: float, settled_gap: float, max_frames: int
) -> int:
    """The frame at which a take's opening approach ends (0: none): the follower started at least
    ``min_gap`` from the leader (``action``) on some joint of the ``(n, d)`` arrays, the gap kept
    closing (never more than ``settled_gap`` above its smallest so far) and fell to ``settled_gap``
    on every joint within ``max_frames``."""
    gap = np.max(np.abs(action - recorded), axis=1)
    if gap.size == 0 or gap[0] < min_gap:
        return 0
    settled = np.flatnonzero(gap[: max_frames + 1] <= settled_gap)
    if not settled.size:
        return 0
    end = int(settled[0])
    closing = gap[:end]
    if np.any(closing > np.minimum.accumulate(closing) + settled_gap):
        return 0  # it moved away from the leader on the way: not an approach
    return end


def grasp_mask(command: np.ndarray, reading: np.ndarray, *, gap: float, still: float) -> np.ndarray:
    """Frames where a gripper is held open by something: commanded more closed than it reads by
    more than ``gap`` and not moving (1-D arrays in 0..100, 0 = closed)."""
    blocked = command < reading - gap
    speed = np.abs(np.diff(reading, prepend=reading[:1]))
    return blocked & (speed < still)


def limit_hits(
    command: np.ndarray, lo: np.ndarray, hi: np.ndarray, margin: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Per joint, frames at a range end (within ``margin``) and frames beyond the range.

    ``command`` is ``(n, d)``; returns two ``(n, d)`` boolean masks ``(at_or_beyond, beyond)``.
    """
    beyond = (command < lo) | (command > hi)
    at_limit = (command <= lo + margin) | (command >= hi - margin)
    return at_limit, beyond
