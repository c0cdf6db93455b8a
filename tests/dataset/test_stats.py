"""Stats: LeRobot 0.4.4's keys, shapes, estimates and aggregation (compared with LeRobot itself)."""

from __future__ import annotations

import numpy as np
import pytest

from hilrec.daemon.dataset.format.stats import (
    STAT_KEYS,
    ImageSampler,
    aggregate_stats,
    compute_episode_stats,
    image_stats,
    sample_indices,
    stats_from_json,
    stats_to_json,
)

FEATURES = {
    "action": {"dtype": "float32"},
    "timestamp": {"dtype": "float32"},
    "index": {"dtype": "int64"},
    "cam": {"dtype": "video"},
    "label": {"dtype": "string"},
}


def episode(seed: int, n: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "action": rng.normal(seed, 1 + seed, size=(n, 6)).astype(np.float32),
        "timestamp": (np.arange(n) / 25).astype(np.float32),
        "index": np.arange(n, dtype=np.int64) + 100 * seed,
        "cam": rng.integers(0, 256, (n, 40, 30, 3), dtype=np.uint8),
    }


def test_keys_and_shapes() -> None:
    stats = compute_episode_stats(episode(0, 50), FEATURES)
    assert set(stats) == {"action", "timestamp", "index", "cam"}
    for key, shape in (("action", (6,)), ("timestamp", (1,)), ("index", (1,)), ("cam", (3, 1, 1))):
        assert list(stats[key]) == list(STAT_KEYS)
        for name in STAT_KEYS:
            assert stats[key][name].shape == ((1,) if name == "count" else shape)
    assert stats["cam"]["max"].max() <= 1.0 and stats["cam"]["min"].min() >= 0.0
    assert stats["index"]["min"].dtype == np.int64 and stats["action"]["min"].dtype == np.float32


def test_matches_lerobot_on_the_same_data() -> None:
    from lerobot.datasets import compute_stats as lerobot_stats

    data = episode(1, 300)
    ours = compute_episode_stats(data, FEATURES)
    for key in ("action", "timestamp", "index"):
        theirs = lerobot_stats.get_feature_stats(data[key], axis=0, keepdims=data[key].ndim == 1)
        for name in STAT_KEYS:
            np.testing.assert_allclose(
                ours[key][name], theirs[name], rtol=1e-5, atol=1e-5, err_msg=f"{key}/{name}"
            )
    frames = data["cam"][sample_indices(300)].transpose(0, 3, 1, 2)
    theirs = lerobot_stats.get_feature_stats(frames, axis=(0, 2, 3), keepdims=True)
    for name in STAT_KEYS:
        if name in ("std", "count"):
            continue  # LeRobot squares uint8 pixels in uint8 (wraps); we do not.
        np.testing.assert_allclose(
            ours["cam"][name], np.squeeze(theirs[name] / 255.0, axis=0), atol=1e-9, err_msg=f"cam/{name}"
        )
    pixels = frames.transpose(0, 2, 3, 1).reshape(-1, 3).astype(np.float64) / 255
    np.testing.assert_allclose(ours["cam"]["std"].ravel(), pixels.std(axis=0), rtol=1e-9)
    assert ours["cam"]["count"].tolist() == [len(sample_indices(300))]


def test_aggregation_matches_lerobot_and_the_pooled_data() -> None:
    from lerobot.datasets import compute_stats as lerobot_stats

    parts = [episode(seed, n) for seed, n in ((0, 40), (1, 90), (2, 15))]
    per_episode = [compute_episode_stats({k: v for k, v in p.items() if k != "cam"}, FEATURES) for p in parts]
    ours = aggregate_stats(per_episode)
    theirs = lerobot_stats.aggregate_stats(per_episode)
    for key in ours:
        for name in STAT_KEYS:
            np.testing.assert_allclose(ours[key][name], theirs[key][name], rtol=1e-9, err_msg=name)
    pooled = np.concatenate([p["action"] for p in parts]).astype(np.float64)
    np.testing.assert_allclose(ours["action"]["mean"], pooled.mean(axis=0), rtol=1e-6)
    np.testing.assert_allclose(ours["action"]["std"], pooled.std(axis=0), rtol=1e-5)
    assert ours["action"]["count"].tolist() == [145]
    assert ours["index"]["max"].tolist() == [200 + 14]


def test_sampler_bounds_memory_and_stays_close_to_full_sampling() -> None:
    rng = np.random.default_rng(3)
    frames = rng.integers(0, 256, (1500, 24, 32, 3), dtype=np.uint8)
    frames[:, :, :, 0] //= 2
    sampler = ImageSampler(capacity=64)
    for frame in frames:
        sampler.add(frame)
    assert len(sampler._counts) <= 64 and sampler.stride > 1
    sampled = sampler.stats()
    exact = image_stats(frames[sample_indices(1500)])
    for name in ("mean", "std", "q50"):
        np.testing.assert_allclose(sampled[name], exact[name], atol=0.01)
    assert sampled["max"][0, 0, 0] <= 0.5 + 1e-9


def test_json_round_trip() -> None:
    stats = compute_episode_stats(episode(0, 20), FEATURES)
    back = stats_from_json(stats_to_json(stats))
    for key in stats:
        for name in STAT_KEYS:
            np.testing.assert_array_equal(back[key][name], stats[key][name])


def test_a_single_frame_has_quantiles_equal_to_the_mean() -> None:
    stats = compute_episode_stats({"action": np.ones((1, 6), np.float32)}, FEATURES)
    for name in ("q01", "q50", "q99"):
        assert stats["action"][name] == pytest.approx(stats["action"]["mean"])


def _histogram_quantiles(column: np.ndarray) -> np.ndarray:
    """LeRobot's estimate done the long way: the 5000-bin histogram, then interpolation."""
    low, high = float(column.min()), float(column.max())
    edges = np.linspace(low - 1e-10, high + 1e-10, 5001)
    cumulative = np.cumsum(np.histogram(column.astype(np.float64), bins=edges)[0])
    out = []
    for q in (0.01, 0.10, 0.50, 0.90, 0.99):
        target = q * len(column)
        idx = int(np.searchsorted(cumulative, target))
        if idx == 0:
            out.append(edges[0])
            continue
        before = float(cumulative[idx - 1])
        in_bin = float(cumulative[idx]) - before
        out.append(edges[idx] + (target - before) / in_bin * (edges[idx + 1] - edges[idx]))
    return np.array(out)


def test_quantiles_equal_the_histogram_estimate_bit_for_bit() -> None:
    rng = np.random.default_rng(7)
    columns: list[np.ndarray] = [
        rng.normal(size=(123, 6)).astype(np.float32),
        (rng.normal(size=(40, 3)) * 1e4).astype(np.float32),
        np.full((17, 2), 3.25, dtype=np.float32),  # constant: all in one bin
        rng.integers(0, 4, (300, 2)).astype(np.int64),  # many ties
        (np.arange(2) + 10**9).reshape(2, 1).astype(np.int64),
        rng.choice([-1.5, 0.0, 2.25, 1e6], size=(64, 1)),  # far apart, few values
        (np.arange(250) / 25).astype(np.float32).reshape(-1, 1),
    ]
    for table in columns:
        stats = compute_episode_stats({"x": table}, {"x": {"dtype": str(table.dtype)}})["x"]
        for column in range(table.shape[1]):
            got = np.array([stats[key][column] for key in ("q01", "q10", "q50", "q90", "q99")])
            assert np.array_equal(got, _histogram_quantiles(table[:, column])), table.dtype
