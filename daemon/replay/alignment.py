"""How far a hardware recording trails its replay, and the alignment its errors are judged at.

Plain numpy on ``(n, d)`` float arrays (frames x joints): nothing here knows datasets or the twin,
so each estimator can be tested on signals whose answer is known.

Sign convention: a positive shift ``k`` means the recording *lags* the twin, i.e.
``recorded[t] ~ replayed[t - k]`` (observations written late, or commands reaching the follower
late). Negative shifts (the recording ahead of its cause) are searched too, because finding one
is itself a diagnosis (a mislabelled or reordered column).

Two estimators, for two questions:

- :func:`fit_shift`: how far the recorded state trails the replayed state. Least squares over
  whole shifts, refined below a frame; this is the lag the verdict judges.
- :func:`response_lag`: how long a state takes to follow the action, from the cross-correlation
  of their steps. Run on the recording and on the replay, the difference is a second opinion on
  the first, made without comparing positions (the analysis notes when the two disagree).

Choosing the lag without letting a fault choose it (:func:`align`). A plain fit over the whole
episode is pulled by whatever went wrong in it: when a servo freezes half-way, the best shift of
the frozen half is nonsense, and so is a lag fitted on it, and so is the divergence dated at that
lag (a polluted lag even postpones the onset by a frame or two). Candidates are fitted on the
moving joints over the whole episode, over the frames before a divergence, and without the joints
that diverged, each new divergence suggesting the next candidate. The winner is, in order: a
*clean* fit (no fitted joint diverges inside the fitted frames), then the one that keeps the
recording consistent the longest (the latest first divergence; none is best), then the fewest
diverged joints, then the most data fitted.

Why :func:`hilrec.sim.replay.best_shift` is a separate estimator: it answers a yes/no question
about a deterministic sim replay (is the recording the replay moved by whole frames, bit for
bit?), so it tries whole shifts only, scores each on its own full overlap so that "exact" covers
every comparable row, reports mean absolute errors and prefers the smallest shift on a tie. A
hardware recording is a physical arm with noise, quantisation and faults: its lag is fractional,
every shift is scored on the same frames so none gains by dropping the noisy ends, and the fit
steers around faults. Neither could answer the other's question without changing its reports,
and the sim layer cannot import this package anyway.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from hilrec.daemon.replay.metrics import Excursion


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
    centre = round(lag)
    for k in range(centre - slack, centre + slack + 1):
        np.minimum(error, np.abs(recorded - shift_whole(replayed, k)), out=error)
    return error


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


# (aligned replay, lag) -> joint -> its sustained excursion
ExcursionFinder = Callable[[np.ndarray, float], dict[int, Excursion]]
# Each candidate costs a fit and an excursion search over the whole episode; a handful covers the
# episode, the frames before each divergence and the joints that did not diverge.
MAX_CANDIDATES = 8


@dataclass(frozen=True)
class Alignment:
    """One candidate lag: what it was fitted on, the replay shifted by it, and what diverges then."""

    fit: ShiftFit | None  # None: no joint moved enough to fit a lag
    joints: tuple[int, ...]  # joints the lag was fitted on
    window: int  # frames [start, window) it was fitted on (start: the first judged frame)
    aligned: np.ndarray  # the replay shifted by the lag, (n, d)
    excursions: dict[int, Excursion]

    @property
    def lag(self) -> float:
        return self.fit.lag if self.fit is not None else 0.0

    def earliest_onset(self) -> float:
        return min((e.onset for e in self.excursions.values()), default=float("inf"))

    @property
    def clean(self) -> bool:
        """No fitted joint diverges inside the fitted window: the fit saw only tracking."""
        return all(self.excursions[j].onset >= self.window for j in self.joints if j in self.excursions)


def align(
    recorded: np.ndarray,
    replayed: np.ndarray,
    moving: Sequence[int],
    *,
    min_shift: int,
    max_shift: int,
    find_excursions: ExcursionFinder,
    start: int = 0,
) -> Alignment:
    """The alignment of ``recorded`` to ``replayed`` that stays consistent longest (see module).

    Frames before ``start`` (a take's approach) are not fitted on."""
    n = recorded.shape[0]
    min_window = start + max(2 * (max_shift - min_shift), 25)

    def evaluate(joints: tuple[int, ...], window: int) -> Alignment:
        fit = fit_shift(
            recorded[start:window, list(joints)],
            replayed[start:window, list(joints)],
            min_shift=min_shift,
            max_shift=max_shift,
        )
        aligned = shift_by(replayed, fit.lag)
        return Alignment(fit, joints, window, aligned, find_excursions(aligned, fit.lag))

    if not moving:
        return Alignment(None, (), n, replayed.copy(), find_excursions(replayed, 0.0))
    unaligned = find_excursions(replayed, 0.0)
    pending: list[tuple[tuple[int, ...], int]] = [(tuple(moving), n)]
    first_onset = min((e.onset for e in unaligned.values()), default=n)
    if min_window <= first_onset < n:
        pending.append((tuple(moving), first_onset))
    seen: set[tuple[tuple[int, ...], int]] = set()
    best: Alignment | None = None
    while pending and len(seen) < MAX_CANDIDATES:
        key = pending.pop(0)
        if key in seen:
            continue
        seen.add(key)
        candidate = evaluate(*key)
        if best is None or _better(candidate, best):
            best = candidate
        if not candidate.excursions:
            break  # nothing diverges: no later candidate can do better
        joints, _ = key
        onset = int(candidate.earliest_onset())
        if min_window <= onset < n:
            pending.append((joints, onset))
        healthy = tuple(j for j in joints if j not in candidate.excursions)
        if healthy and healthy != joints:
            pending.append((healthy, n))
            if min_window <= onset < n:
                pending.append((healthy, onset))
    assert best is not None
    return best


def _better(a: Alignment, b: Alignment) -> bool:
    def rank(c: Alignment) -> tuple[bool, float, int, int]:
        return (c.clean, c.earliest_onset(), -len(c.excursions), c.window * len(c.joints))

    return rank(a) > rank(b)
