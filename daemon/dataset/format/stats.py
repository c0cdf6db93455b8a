"""Per-episode and dataset statistics, with LeRobot 0.4.4's keys, shapes and aggregation.

Every numeric feature (the default columns ``timestamp``, ``frame_index``, ``episode_index``,
``index`` and ``task_index`` included) gets ``min, max, mean, std, count, q01, q10, q50, q90, q99``:

- vectors ``(n, d)``: every stat has shape ``(d,)``; scalars ``(n,)`` give shape ``(1,)``;
  ``count`` is ``[n]``;
- images and videos ``(n, H, W, C)`` uint8: per-channel stats of shape ``(C, 1, 1)`` in [0, 1],
  computed on a subsample of frames (LeRobot's ``estimate_num_samples`` rule), each downsampled to
  about 150 px; ``count`` is the number of sampled frames.

Quantiles are LeRobot's histogram estimate (5000 bins between min and max, linear interpolation
inside the bin), so ours and LeRobot's agree on the same data. Two deliberate differences:

- squares are accumulated in float64. LeRobot 0.4.4 squares the uint8 pixels in uint8, which wraps
  around and makes its image ``std`` meaningless (often 0). A checker must therefore not compare an
  image ``std`` of a LeRobot-written dataset against the data.
- min and max keep the column's dtype (so they compare bit-exactly with the data); the other stats
  are float64.

Aggregation over episodes (:func:`aggregate_stats`) is LeRobot 0.4.4's: min of mins, max of maxes,
count-weighted mean, parallel-variance std, summed count, and quantiles as the count-weighted mean of
the episodes' quantiles. (Newer LeRobot releases take a conservative envelope instead: min over
episodes for q <= 50, max above. 0.4.4, the release we target, averages.)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

import numpy as np

from hilrec.daemon.dataset.format.paths import STATS_PREFIX

QUANTILES: Final[tuple[float, ...]] = (0.01, 0.10, 0.50, 0.90, 0.99)
QUANTILE_KEYS: Final[tuple[str, ...]] = tuple(f"q{int(q * 100):02d}" for q in QUANTILES)
STAT_KEYS: Final[tuple[str, ...]] = ("min", "max", "mean", "std", "count", *QUANTILE_KEYS)
HISTOGRAM_BINS: Final[int] = 5000
IMAGE_DTYPES: Final[frozenset[str]] = frozenset({"image", "video"})
NON_NUMERIC_DTYPES: Final[frozenset[str]] = frozenset({"string", "language"})

# LeRobot's frame-sampling rule: all frames up to 100, then len**0.75, at most 10k.
MIN_IMAGE_SAMPLES: Final[int] = 100
MAX_IMAGE_SAMPLES: Final[int] = 10_000
SAMPLE_POWER: Final[float] = 0.75
# Images whose long side is below this are used at full size; larger ones are strided to ~150 px.
DOWNSAMPLE_THRESHOLD: Final[int] = 300
DOWNSAMPLE_TARGET: Final[int] = 150

Stats = dict[str, np.ndarray]
DatasetStats = dict[str, Stats]


# --- sampling ------------------------------------------------------------------------------------


def estimate_num_samples(num_frames: int) -> int:
    """How many frames of an episode of ``num_frames`` the image stats look at."""
    if num_frames < MIN_IMAGE_SAMPLES:
        return num_frames
    return max(MIN_IMAGE_SAMPLES, min(int(num_frames**SAMPLE_POWER), MAX_IMAGE_SAMPLES))


def sample_indices(num_frames: int) -> list[int]:
    """The frame indices LeRobot samples for image stats: evenly spread, first and last included."""
    count = estimate_num_samples(num_frames)
    return np.round(np.linspace(0, num_frames - 1, count)).astype(int).tolist()


def downsample_factor(height: int, width: int) -> int:
    if max(height, width) < DOWNSAMPLE_THRESHOLD:
        return 1
    return int(width / DOWNSAMPLE_TARGET) if width > height else int(height / DOWNSAMPLE_TARGET)


def downsample_image(image: np.ndarray) -> np.ndarray:
    """Stride an ``(H, W, C)`` image down to about 150 px on its long side (a copy)."""
    factor = downsample_factor(image.shape[0], image.shape[1])
    return np.ascontiguousarray(image[::factor, ::factor])


class ImageSampler:
    """Keeps a bounded, evenly strided set of per-frame pixel counts while an episode streams in.

    The episode length is unknown while frames arrive, so LeRobot's exact sample set cannot be
    chosen up front. Instead every ``stride``-th frame is kept (as its downsampled per-channel
    256-value counts, so nothing is left to do at save time); when more than ``capacity`` are held
    the odd ones are dropped and the stride doubles. :meth:`stats` then uses, from what is held,
    the frames nearest to LeRobot's sample indices. Memory stays at ``capacity`` x C x 256 counts.
    """

    def __init__(self, capacity: int = 512) -> None:
        if capacity < 2:
            raise ValueError(f"ImageSampler capacity must be >= 2, got {capacity}")
        self.capacity = capacity
        self.stride = 1
        self.num_frames = 0
        self._indices: list[int] = []
        self._counts: list[np.ndarray] = []

    def add(self, image: np.ndarray) -> None:
        index = self.num_frames
        self.num_frames += 1
        if index % self.stride:
            return
        self._indices.append(index)
        self._counts.append(channel_counts(downsample_image(image)))
        if len(self._counts) > self.capacity:
            self.stride *= 2
            kept = [(i, c) for i, c in zip(self._indices, self._counts, strict=True) if i % self.stride == 0]
            self._indices = [i for i, _ in kept]
            self._counts = [c for _, c in kept]

    def stats(self) -> Stats:
        """Per-channel image stats over the held frames nearest to LeRobot's sample indices."""
        if not self._counts:
            raise ValueError("ImageSampler.stats(): no frame was added")
        held = np.asarray(self._indices)
        wanted = sample_indices(self.num_frames)
        picked = sorted({int(np.abs(held - w).argmin()) for w in wanted})
        return image_stats_from_counts(np.stack([self._counts[p] for p in picked]))


def channel_counts(image: np.ndarray) -> np.ndarray:
    """``(C, 256)`` counts of each pixel value per channel of an ``(h, w, C)`` uint8 image."""
    channels = image.shape[-1]
    flat = image.reshape(-1, channels).astype(np.intp) + 256 * np.arange(channels)
    return np.bincount(flat.ravel(), minlength=256 * channels).reshape(channels, 256)


# --- per-episode stats ---------------------------------------------------------------------------


def compute_episode_stats(
    columns: Mapping[str, Any],
    features: Mapping[str, Mapping[str, Any]],
) -> DatasetStats:
    """Stats of one episode for every numeric feature present in ``columns``.

    ``columns[key]`` is an array with the frame axis first: ``(n,)`` or ``(n, d)`` for numeric
    features, ``(n, H, W, C)`` uint8 (or a sequence of ``(H, W, C)`` frames) for image and video
    features. Image frames are subsampled and downsampled here as LeRobot does.
    """
    stats: DatasetStats = {}
    for key, data in columns.items():
        dtype = features[key]["dtype"]
        if dtype in NON_NUMERIC_DTYPES:
            continue
        if dtype in IMAGE_DTYPES:
            picked = [downsample_image(np.asarray(data[i])) for i in sample_indices(len(data))]
            stats[key] = image_stats(np.stack(picked))
        else:
            stats[key] = vector_stats(np.asarray(data))
    return stats


def vector_stats(values: np.ndarray) -> Stats:
    """Stats over the frame axis of ``(n,)`` or ``(n, d)`` values (``(n, ...)`` is flattened)."""
    if values.ndim == 0 or len(values) == 0:
        raise ValueError("vector_stats needs at least one frame")
    table = values.reshape(len(values), -1)
    stats = _column_stats(table)
    stats["count"] = np.array([len(values)], dtype=np.int64)
    return {name: stats[name] for name in STAT_KEYS}


def image_stats(samples: np.ndarray) -> Stats:
    """Per-channel stats ``(C, 1, 1)`` in [0, 1] of already sampled ``(k, h, w, C)`` uint8 frames."""
    if samples.ndim != 4 or samples.dtype != np.uint8:
        raise ValueError(
            f"image_stats expects (k, h, w, C) uint8 frames, got {samples.dtype} {samples.shape}"
        )
    return image_stats_from_counts(np.stack([channel_counts(frame) for frame in samples]))


def image_stats_from_counts(counts: np.ndarray) -> Stats:
    """Image stats from ``(k, C, 256)`` per-frame pixel counts (see :func:`channel_counts`)."""
    frames, channels, _ = counts.shape
    raw = _stats_from_value_counts(counts.sum(axis=0).astype(np.float64))
    stats: Stats = {
        name: (np.asarray(v, dtype=np.float64) / 255.0).reshape(channels, 1, 1) for name, v in raw.items()
    }
    stats["count"] = np.array([frames], dtype=np.int64)
    return {name: stats[name] for name in STAT_KEYS}


def _column_stats(table: np.ndarray) -> Stats:
    """min/max/mean/std/quantiles per column of an ``(n, d)`` table."""
    if len(table) < 2:
        # LeRobot has no histogram for a single sample: every quantile is the mean.
        as_float = table.astype(np.float64)
        mean = as_float.mean(axis=0)
        stats = {
            "min": table.min(axis=0),
            "max": table.max(axis=0),
            "mean": mean,
            "std": as_float.std(axis=0),
        }
        stats.update({q: mean.copy() for q in QUANTILE_KEYS})
        return stats
    if table.dtype == np.uint8:
        return _uint8_column_stats(table)
    as_float = table.astype(np.float64, copy=False)
    minimum = table.min(axis=0)
    maximum = table.max(axis=0)
    mean = as_float.mean(axis=0)
    mean_sq = np.square(as_float).mean(axis=0)
    std = np.sqrt(np.maximum(0.0, mean_sq - mean * mean))
    ordered = np.sort(as_float, axis=0)
    quantiles = np.empty((len(QUANTILES), table.shape[1]), dtype=np.float64)
    for column in range(table.shape[1]):
        edges = _edges(float(minimum[column]), float(maximum[column]))
        quantiles[:, column] = _quantiles_of_sorted(ordered[:, column], edges)
    stats = {"min": minimum, "max": maximum, "mean": mean, "std": std}
    stats.update({key: quantiles[i] for i, key in enumerate(QUANTILE_KEYS)})
    return stats


_QUANTILE_ARRAY = np.array(QUANTILES)


def _quantiles_of_sorted(ordered: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """:func:`_quantiles_from_histogram` of the 5000-bin histogram of ``ordered`` (sorted
    float64, all within the edges), without building the histogram: bit for bit the same.

    ``cumulative[i]``, the count up to bin i, is ``#(v < edges[i + 1])`` (the last bin also takes
    v == edges[-1], so the last count is n). The bin holding the target ``q n`` is the first whose
    count reaches ``k = ceil(q n)``, i.e. whose right edge is above the k-th smallest value.
    """
    n = len(ordered)
    targets = _QUANTILE_ARRAY * n
    kth = ordered[np.ceil(targets).astype(np.intp) - 1]
    bins = np.minimum(np.searchsorted(edges, kth, side="right"), HISTOGRAM_BINS) - 1
    left = ordered.searchsorted(edges[bins], side="left")
    right = np.where(
        bins < HISTOGRAM_BINS - 1,
        ordered.searchsorted(edges[np.minimum(bins + 1, HISTOGRAM_BINS - 1)], side="left"),
        n,
    )
    result = edges[bins] + (targets - left) / (right - left) * (edges[bins + 1] - edges[bins])
    result[bins == 0] = edges[0]
    return result


def _uint8_column_stats(table: np.ndarray) -> Stats:
    counts = np.stack([np.bincount(table[:, c], minlength=256) for c in range(table.shape[1])])
    return _stats_from_value_counts(counts.astype(np.float64))


def _stats_from_value_counts(counts: np.ndarray) -> Stats:
    """Stats of uint8 columns given as ``(d, 256)`` value counts, without touching the pixels."""
    values = np.arange(256, dtype=np.float64)
    columns = counts.shape[0]
    minimum = np.empty(columns, dtype=np.uint8)
    maximum = np.empty(columns, dtype=np.uint8)
    mean = np.empty(columns)
    std = np.empty(columns)
    quantiles = np.empty((len(QUANTILES), columns))
    for column in range(columns):
        column_counts = counts[column]
        total = column_counts.sum()
        present = np.nonzero(column_counts)[0]
        minimum[column], maximum[column] = present[0], present[-1]
        mean[column] = column_counts @ values / total
        mean_sq = column_counts @ (values * values) / total
        std[column] = np.sqrt(max(0.0, mean_sq - mean[column] ** 2))
        edges = _edges(float(present[0]), float(present[-1]))
        bins = np.clip(
            np.searchsorted(edges, present.astype(np.float64), side="right") - 1, 0, HISTOGRAM_BINS - 1
        )
        hist = np.zeros(HISTOGRAM_BINS)
        np.add.at(hist, bins, column_counts[present])
        quantiles[:, column] = _quantiles_from_histogram(hist, edges, total)
    stats: Stats = {"min": minimum, "max": maximum, "mean": mean, "std": std}
    stats.update({key: quantiles[i] for i, key in enumerate(QUANTILE_KEYS)})
    return stats


def _edges(low: float, high: float) -> np.ndarray:
    return np.linspace(low - 1e-10, high + 1e-10, HISTOGRAM_BINS + 1)


def _quantiles_from_histogram(hist: np.ndarray, edges: np.ndarray, total: int) -> np.ndarray:
    """LeRobot's estimate: find the bin holding q*n samples and interpolate linearly inside it."""
    cumulative = np.cumsum(hist)
    result = np.empty(len(QUANTILES))
    for i, q in enumerate(QUANTILES):
        target = q * total
        idx = int(np.searchsorted(cumulative, target))
        if idx == 0:
            result[i] = edges[0]
        elif idx >= len(cumulative):
            result[i] = edges[-1]
        else:
            before = cumulative[idx - 1]
            in_bin = cumulative[idx] - before
            if in_bin == 0:
                result[i] = edges[idx]
            else:
                result[i] = edges[idx] + (target - before) / in_bin * (edges[idx + 1] - edges[idx])
    return result


# --- aggregation ---------------------------------------------------------------------------------


def aggregate_stats(stats_list: Sequence[Mapping[str, Mapping[str, Any]]]) -> DatasetStats:
    """Dataset stats from per-episode stats (the union of their keys), LeRobot 0.4.4's way."""
    keys: list[str] = []
    for stats in stats_list:
        keys.extend(k for k in stats if k not in keys)
    return {key: aggregate_feature_stats([s[key] for s in stats_list if key in s]) for key in keys}


def aggregate_feature_stats(stats_list: Sequence[Mapping[str, Any]]) -> Stats:
    if not stats_list:
        raise ValueError("aggregate_feature_stats needs at least one episode's stats")
    means = np.stack([np.asarray(s["mean"], dtype=np.float64) for s in stats_list])
    variances = np.stack([np.asarray(s["std"], dtype=np.float64) ** 2 for s in stats_list])
    counts = np.stack([np.asarray(s["count"]) for s in stats_list])
    total_count = counts.sum(axis=0)
    weights = counts.astype(np.float64)
    while weights.ndim < means.ndim:
        weights = weights[..., np.newaxis]
    total_mean = (means * weights).sum(axis=0) / total_count
    total_variance = ((variances + (means - total_mean) ** 2) * weights).sum(axis=0) / total_count
    aggregated: Stats = {
        "min": np.min(np.stack([np.asarray(s["min"]) for s in stats_list]), axis=0),
        "max": np.max(np.stack([np.asarray(s["max"]) for s in stats_list]), axis=0),
        "mean": total_mean,
        "std": np.sqrt(total_variance),
        "count": total_count,
    }
    for q_key in QUANTILE_KEYS:
        if all(q_key in s for s in stats_list):
            values = np.stack([np.asarray(s[q_key], dtype=np.float64) for s in stats_list])
            aggregated[q_key] = (values * weights).sum(axis=0) / total_count
    return aggregated


# --- (de)serialisation ---------------------------------------------------------------------------


def stats_to_json(stats: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Nested lists, as LeRobot writes ``meta/stats.json``."""
    return {
        key: {name: np.asarray(value).tolist() for name, value in ft.items()} for key, ft in stats.items()
    }


def stats_from_json(data: Mapping[str, Mapping[str, Any]]) -> DatasetStats:
    return {key: {name: np.asarray(value) for name, value in ft.items()} for key, ft in data.items()}


def flatten_episode_stats(stats: Mapping[str, Mapping[str, Any]]) -> dict[str, np.ndarray]:
    """``{"stats/<feature>/<stat>": array}``, the episodes-parquet column form."""
    return {
        f"{STATS_PREFIX}{key}/{name}": np.asarray(value)
        for key, ft in stats.items()
        for name, value in ft.items()
    }


def unflatten_episode_stats(row: Mapping[str, Any]) -> DatasetStats:
    """Inverse of :func:`flatten_episode_stats` for one episodes-parquet row (other keys ignored)."""
    stats: DatasetStats = {}
    for column, value in row.items():
        if not column.startswith(STATS_PREFIX):
            continue
        key, _, name = column[len(STATS_PREFIX) :].rpartition("/")
        stats.setdefault(key, {})[name] = np.asarray(value)
    return stats
