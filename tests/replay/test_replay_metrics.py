"""The estimators of the replay check, on signals whose answer is known."""

from __future__ import annotations

import numpy as np
import pytest

from hilrec.daemon.replay.alignment import fit_shift, response_lag, shift_by, shift_mse
from hilrec.daemon.replay.metrics import (
    count_blips,
    find_stalls,
    grasp_mask,
    limit_hits,
    runs,
    sustained_excursion,
)


def smooth_motion(n: int = 300, joints: int = 3, seed: int = 0) -> np.ndarray:
    """Sums of slow sines, different per joint: smooth like an arm, never periodic in the window."""
    rng = np.random.default_rng(seed)
    t = np.arange(n) / 25.0
    cols = []
    for _ in range(joints):
        freqs = rng.uniform(0.1, 0.6, size=3)
        phases = rng.uniform(0, 2 * np.pi, size=3)
        amps = rng.uniform(5.0, 30.0, size=3)
        cols.append(
            sum(a * np.sin(2 * np.pi * f * t + p) for a, f, p in zip(amps, freqs, phases, strict=True))
        )
    return np.stack(cols, axis=1)


@pytest.mark.parametrize("true_lag", [0.0, 1.0, 3.0, -2.0, 0.4, 1.5, 2.75])
def test_fit_shift_recovers_integer_and_fractional_delays(true_lag: float) -> None:
    replayed = smooth_motion()
    recorded = shift_by(replayed, true_lag)
    fit = fit_shift(recorded, replayed, min_shift=-5, max_shift=10)
    assert fit.best_shift == round(true_lag) or abs(fit.best_shift - true_lag) == 0.5
    assert fit.lag == pytest.approx(true_lag, abs=0.02)


def test_fit_shift_prefers_the_true_shift_under_noise() -> None:
    replayed = smooth_motion(seed=3)
    recorded = shift_by(replayed, 2.0) + np.random.default_rng(1).normal(0, 0.3, replayed.shape)
    fit = fit_shift(recorded, replayed, min_shift=-5, max_shift=10)
    assert fit.best_shift == 2
    assert abs(fit.lag - 2.0) < 0.1


def test_shift_mse_scores_every_shift_on_the_same_frames() -> None:
    replayed = smooth_motion(n=100, joints=1)
    recorded = replayed.copy()
    recorded[:10] += 100.0  # only the first 10 recorded frames are off
    shifts = np.arange(-2, 11)
    mse = shift_mse(recorded, replayed, shifts)
    # The window starts at frame max(shift) = 10, so the bad frames are never scored, for any shift.
    assert mse[shifts.tolist().index(0), 0] == 0.0
    with pytest.raises(ValueError):
        shift_mse(recorded[:12], replayed[:12], shifts)


def test_shift_by_delays_and_holds_edges() -> None:
    s = np.arange(10, dtype=float)
    assert np.allclose(shift_by(s, 2.0)[2:], s[:-2])
    assert shift_by(s, 2.0)[0] == 0.0
    assert shift_by(s, 0.5)[5] == pytest.approx(4.5)


def test_response_lag_finds_the_delay_of_a_delayed_copy() -> None:
    command = smooth_motion(seed=5)
    assert response_lag(command, shift_by(command, 3.0), 10) == pytest.approx(3.0, abs=0.15)
    assert response_lag(command, shift_by(command, 1.4), 10) == pytest.approx(1.4, abs=0.3)
    still = np.zeros_like(command)
    assert response_lag(still, still, 10) is None


def test_runs_lists_true_intervals() -> None:
    assert runs(np.array([0, 1, 1, 0, 1, 0, 0, 1], dtype=bool)) == [(1, 3), (4, 5), (7, 8)]
    assert runs(np.zeros(4, dtype=bool)) == []


def test_sustained_excursion_dates_the_rise_not_the_crossing() -> None:
    error = np.zeros(100)
    error[40:] = np.linspace(0.0, 30.0, 60)  # a ramp starting at frame 40
    error[10] = 50.0  # a one-frame blip earlier
    exc = sustained_excursion(error, limit=6.0, min_frames=5, floor=1.5)
    assert exc is not None
    assert exc.first_over > 50  # it crosses 6 deg well after it starts to grow
    assert 40 <= exc.onset <= 44  # ...and is dated from where it left the floor
    assert exc.blips == 1
    assert count_blips(error, limit=6.0, min_frames=5) == 1
    assert exc.floor == 1.5


def test_sustained_excursion_sees_through_a_zero_crossing() -> None:
    # A joint frozen while the twin swings past it: the error rises, crosses zero, then grows.
    error = np.zeros(120)
    t = np.arange(60)
    error[60:] = 0.4 * t * np.sin(t / 6.0)  # goes through zero at frame 60 + 19
    exc = sustained_excursion(error, limit=6.0, min_frames=5, floor=0.25)
    assert exc is not None and exc.first_over > 80
    assert exc.onset == 62  # first frame above the 0.25 floor, not the zero crossing at 79


def test_sustained_excursion_ignores_masked_frames() -> None:
    error = np.zeros(100)
    error[40:] = np.linspace(0.0, 30.0, 60)
    valid = np.ones(100, dtype=bool)
    valid[40:] = False
    assert sustained_excursion(error, limit=6.0, min_frames=5, floor=1.5, valid=valid) is None


def test_find_stalls_needs_a_frozen_reading_and_a_moving_twin() -> None:
    replayed = np.linspace(0.0, 60.0, 100)
    recorded = replayed.copy()
    recorded[50:] = recorded[50]
    stalls = find_stalls(recorded, replayed, still=0.1, min_frames=10, min_motion=5.0)
    assert len(stalls) == 1
    assert stalls[0].start == 50 and stalls[0].stop == 100
    assert stalls[0].held_value == pytest.approx(recorded[50])
    # Both standing still is not a stall.
    flat = np.full(100, 3.0)
    assert find_stalls(flat, flat, still=0.1, min_frames=10, min_motion=5.0) == []


def test_grasp_mask_marks_a_jaw_held_open() -> None:
    command = np.array([50, 40, 10, 0, 0, 0, 60], dtype=float)
    reading = np.array([50, 45, 30, 25, 25, 25, 40], dtype=float)
    mask = grasp_mask(command, reading, gap=8.0, still=0.5)
    assert mask.tolist() == [False, False, False, False, True, True, False]


def test_limit_hits_counts_at_and_beyond() -> None:
    cmd = np.array([[0.0, 99.8], [-110.0, 50.0], [-120.0, 101.0]])
    lo, hi = np.array([-110.0, 0.0]), np.array([110.0, 100.0])
    at, beyond = limit_hits(cmd, lo, hi, np.array([0.5, 0.5]))
    assert at.tolist() == [[False, True], [True, False], [True, True]]
    assert beyond.tolist() == [[False, False], [False, False], [True, True]]
