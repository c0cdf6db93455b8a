"""Signal maths of the replay check: lag between two trajectories, error runs, stalls, grasps.

Everything here is plain numpy on ``(n, d)`` float arrays (frames x joints) and knows nothing of
datasets or the twin, so each estimator can be tested on signals whose answer is known.

Sign convention: a positive shift ``k`` means the recording *lags* the twin, i.e.
``recorded[t] ~ replayed[t - k]`` (observations written late, or commands reaching the follower
late). Negative shifts (the recording ahead of its cause) are searched too, because finding one
is itself a diagnosis (a mislabelled or reordered column).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class ShiftFit:
    """The best alignment ``recorded[t] ~ replayed[t - lag]`` found in a range of shifts."""

    lag: float  # frames, sub-frame by linear interpolation between the neighbouring shifts
    best_shift: int  # the integer shift with the least error
    shifts: np.ndarray  # (m,) int, the shifts tried
    mse: np.ndarray  # (m,) mean squared error (summed over the joints used) at each shift


def shift_mse(recorded: np.ndarray, replayed: np.ndarray, shifts: np.ndarray) -> np.ndarray:
    """Mean squared error per joint of ``recorded[t] - replayed[t - k]`` for every k in ``shifts``.

    Every shift is scored on the same recorded frames ``t in [max(k), n + min(k))``, so a larger
    shift is not favoured merely by dropping frames at the ends. Returns ``(len(shifts), d)``.
    """
    n = recorded.shape[0]
    lo, hi = int(min(shifts.min(), 0)), int(max(shifts.max(), 0))
    start, stop = hi, n + lo
    if stop - start < 2:
        raise ValueError(f"{n} frames are too few for shifts in [{lo}, {hi}]")
    target = recorded[start:stop]
    out = np.empty((shifts.size, recorded.shape[1]))
    for i, k in enumerate(shifts):
        diff = target - replayed[start - k : stop - k]
        out[i] = np.mean(diff * diff, axis=0)
    return out


def fit_shift(recorded: np.ndarray, replayed: np.ndarray, *, min_shift: int, max_shift: int) -> ShiftFit:
    """The shift in ``[min_shift, max_shift]`` that best aligns the two, refined below a frame.

    The refinement is least squares, not curve fitting: between integer shifts k and k+1 the
    replay is linearly interpolated, ``(1 - f) * replayed[t - k] + f * replayed[t - k - 1]``, and
    the error is a quadratic in f with a closed-form minimum. Both intervals around the best
    integer shift are tried and the better one kept, so the answer is never worse than the integer
    shift it started from.
    """
    shifts = np.arange(min_shift, max_shift + 1)
    mse = shift_mse(recorded, replayed, shifts).sum(axis=1)
    best_i = int(np.argmin(mse))
    best = int(shifts[best_i])
    n = recorded.shape[0]
    start, stop = max_shift, n + min_shift
    target = recorded[start:stop]
    lag, best_err = float(best), float(mse[best_i])
    for k in (best - 1, best):  # intervals [best-1, best] and [best, best+1]
        if k < min_shift or k + 1 > max_shift:
            continue
        near = replayed[start - k : stop - k]
        far = replayed[start - k - 1 : stop - k - 1]
        step = far - near
        denom = float(np.sum(step * step))
        if denom <= 0.0:
            continue
        f = float(np.clip(np.sum((target - near) * step) / denom, 0.0, 1.0))
        resid = target - near - f * step
        err = float(np.mean(np.sum(resid * resid, axis=1)))
        if err < best_err:
            lag, best_err = k + f, err
    return ShiftFit(lag=lag, best_shift=best, shifts=shifts, mse=mse)


def shift_by(series: np.ndarray, lag: float) -> np.ndarray:
    """``series`` delayed by ``lag`` frames (linear interpolation, edges held): ``out[t] = s[t - lag]``."""
    n = series.shape[0]
    t = np.arange(n, dtype=np.float64)
    if series.ndim == 1:
        return np.interp(t - lag, t, series)
    return np.stack([np.interp(t - lag, t, series[:, j]) for j in range(series.shape[1])], axis=1)


def shift_whole(series: np.ndarray, k: int) -> np.ndarray:
    """``series`` delayed by a whole ``k`` frames, edges held: ``out[t] = s[clip(t - k)]``."""
    index = np.clip(np.arange(series.shape[0]) - k, 0, series.shape[0] - 1)
    return series[index]


def slack_error(
    recorded: np.ndarray, replayed: np.ndarray, aligned: np.ndarray, lag: float, slack: int
) -> np.ndarray:
    """Per frame and joint, the smallest ``|recorded - replay|`` over the aligned replay and the
    whole shifts within ``slack`` frames of the lag: an error that a timing slip of up to
    ``slack`` frames explains is not counted."""
    error = np.abs(recorded - aligned)
    centre = int(round(lag))
    for k in range(centre - slack, centre + slack + 1):
        np.minimum(error, np.abs(recorded - shift_whole(replayed, k)), out=error)
    return error


def stale_rows(recorded: np.ndarray, replayed: np.ndarray, *, moved: float) -> np.ndarray:
    """Rows that repeat the previous row exactly (every joint) while the twin moved more than
    ``moved``: a reading taken before the follower updated. Returns their indices."""
    same = np.all(recorded[1:] == recorded[:-1], axis=1)
    moving = np.max(np.abs(replayed[1:] - replayed[:-1]), axis=1) > moved
    return np.flatnonzero(same & moving) + 1


def response_lag(command: np.ndarray, response: np.ndarray, max_lag: int) -> float | None:
    """Frames by which ``response`` follows ``command``, from the cross-correlation of their steps.

    Frame-to-frame differences are correlated rather than positions, so a constant offset or a
    slow drift does not pull the peak. Joints are normalised and averaged, so one large joint does
    not decide alone. Returns None when nothing moved. The peak is refined with a parabola through
    its neighbours (the usual sub-sample estimate for a smooth correlation peak).
    """
    dc = np.diff(command, axis=0)
    dr = np.diff(response, axis=0)
    n = dc.shape[0]
    if n <= max_lag + 2:
        return None
    # Every lag is scored over the same response steps t in [max_lag, n) and normalised by the
    # energy of exactly the two windows it multiplies (a Pearson coefficient per lag), so neither
    # a shorter overlap nor motion that speeds up towards the end favours one lag over another.
    target = dr[max_lag:]
    target_energy = np.sum(target * target, axis=0)
    corr = np.zeros(max_lag + 1)
    for k in range(max_lag + 1):
        window = dc[max_lag - k : n - k]
        scale = np.sqrt(target_energy * np.sum(window * window, axis=0))
        moving = scale > 0.0
        if not np.any(moving):
            return None
        corr[k] = float(np.mean(np.sum(target[:, moving] * window[:, moving], axis=0) / scale[moving]))
    peak = int(np.argmax(corr))
    if corr[peak] <= 0.0:
        return None
    if 0 < peak < max_lag:
        a, b, c = corr[peak - 1], corr[peak], corr[peak + 1]
        curvature = a - 2.0 * b + c
        if curvature < 0.0:
            return peak + 0.5 * (a - c) / curvature
    return float(peak)


def runs(mask: np.ndarray) -> list[tuple[int, int]]:
    """The ``[start, stop)`` intervals where a 1-D boolean mask is True, in order."""
    m = np.concatenate(([False], np.asarray(mask, dtype=bool), [False]))
    edges = np.flatnonzero(m[1:] != m[:-1])
    return [(int(a), int(b)) for a, b in zip(edges[::2], edges[1::2])]


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
