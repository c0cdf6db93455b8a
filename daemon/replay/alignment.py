"""Choose the lag that aligns a recording with its replay, without letting a fault choose it.

A plain least-squares fit over the whole episode is pulled by whatever went wrong in it: when a
servo freezes half-way, the best shift of the frozen half is nonsense, and so is a lag fitted on
it, and so is the divergence dated at that lag (a polluted lag even postpones the onset by a
frame or two). Candidates are fitted on the moving joints over the whole episode, over the frames
before a divergence, and without the joints that diverged, each new divergence suggesting the next
candidate. The winner is, in order: a *clean* fit (no fitted joint diverges inside the fitted
frames), then the one that keeps the recording consistent the longest (the latest first
divergence; none is best), then the fewest diverged joints, then the most data fitted.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from hilrec.daemon.replay.metrics import Excursion, ShiftFit, fit_shift, shift_by

# (aligned replay, lag) -> joint -> its sustained excursion
ExcursionFinder = Callable[[np.ndarray, float], dict[int, Excursion]]
MAX_CANDIDATES = 8


@dataclass(frozen=True)
class Alignment:
    fit: ShiftFit | None  # None: no joint moved enough to fit a lag
    joints: tuple[int, ...]  # joints the lag was fitted on
    window: int  # frames [0, window) it was fitted on
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
) -> Alignment:
    """The alignment of ``recorded`` to ``replayed`` that stays consistent longest (see module)."""
    n = recorded.shape[0]
    min_window = max(2 * (max_shift - min_shift), 25)

    def evaluate(joints: tuple[int, ...], window: int) -> Alignment:
        fit = fit_shift(
            recorded[:window, list(joints)],
            replayed[:window, list(joints)],
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
