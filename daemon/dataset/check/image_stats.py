"""One image feature's stored stats judged on their own, and against lossless decoded images.

Both kinds of image feature share the first part: a video's (:mod:`.video`, which then judges
what a lossy codec keeps) and an ``image`` feature's, PNG in the parquet (:mod:`.stats`), whose
decoded pixels are the written ones, so its stats are compared with the sampled frames' own,
quantiles included.
"""

from __future__ import annotations

import itertools
from typing import Final

import numpy as np

from hilrec.daemon.dataset.format.stats import QUANTILE_KEYS, STAT_KEYS, downsample_factor, image_stats

# Lossless images (PNG): the decoded pixels are the written ones.
IMAGE_TOLERANCES: Final[dict[str, float]] = {
    "mean": 0.03,
    "q10": 0.06,
    "q50": 0.06,
    "q90": 0.06,
    "q01": 0.15,
    "q99": 0.15,
}
ORDER: Final[tuple[str, ...]] = ("min", *QUANTILE_KEYS, "max")
ORDER_SLACK: Final[float] = 1e-6


def pixels_per_frame(shape: list[int]) -> int:
    factor = downsample_factor(shape[0], shape[1])
    return -(-shape[0] // factor) * -(-shape[1] // factor)


def stored_stats_problem(values: dict[str, np.ndarray], length: int, shape: list[int]) -> str | None:
    """What is wrong with one image feature's stored stats on their own, or None.

    ``count`` is the number of sampled frames, except that LeRobot 0.4.4's streaming encoder
    counts the pixels of every (downsampled) frame; both are accepted.
    """
    channels = values["mean"].size
    for name in STAT_KEYS:
        if name != "count" and values[name].size != channels:
            return f"{name} has {values[name].size} values, mean has {channels}"
    count = int(values["count"][0])
    pixels = pixels_per_frame(shape)
    if not (1 <= count <= length or count == length * pixels):
        return (
            f"count is {count}: neither a number of sampled frames (1 .. {length}) nor the "
            f"pixels of every frame ({length} x {pixels})"
        )
    for name in STAT_KEYS:
        if (
            name != "count"
            and (
                (values[name] < -ORDER_SLACK) | (values[name] > 1 + ORDER_SLACK) | ~np.isfinite(values[name])
            ).any()
        ):
            return f"{name} is {values[name].tolist()}, outside [0, 1]"
    for lower, upper in itertools.pairwise(ORDER):
        if (values[lower] > values[upper] + ORDER_SLACK).any():
            return f"{lower} {values[lower].tolist()} exceeds {upper} {values[upper].tolist()}"
    if (
        (values["mean"] < values["min"] - ORDER_SLACK) | (values["mean"] > values["max"] + ORDER_SLACK)
    ).any():
        return f"mean {values['mean'].tolist()} is outside [min, max]"
    if (values["std"] > 0.5 + ORDER_SLACK).any():
        return f"std {values['std'].tolist()} exceeds 0.5, impossible for values in [0, 1]"
    return None


def flat_stats(stored: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {n: np.asarray(stored[n], dtype=np.float64).reshape(-1) for n in STAT_KEYS}


def image_stats_problem(
    stored: dict[str, np.ndarray], length: int, samples: list[np.ndarray], shape: list[int]
) -> str | None:
    """The first way one lossless image feature's stats disagree with its sampled (downsampled)
    decoded frames, or None."""
    values = flat_stats(stored)
    problem = stored_stats_problem(values, length, shape)
    if problem or not samples:
        return problem
    channels = values["mean"].size
    decoded = image_stats(np.stack(samples))
    if decoded["mean"].size != channels:
        return f"stats have {channels} channels, the images have {decoded['mean'].size}"
    for name, tolerance in IMAGE_TOLERANCES.items():
        want = decoded[name].reshape(-1)
        off = np.abs(values[name] - want)
        if (off > tolerance).any():
            c = int(np.argmax(off))
            return (
                f"{name}[channel {c}] is {values[name][c]:.4f}, the decoded images' sampled "
                f"frames give {want[c]:.4f} (tolerance {tolerance})"
            )
    return None
