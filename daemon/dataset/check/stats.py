"""Checker rules on statistics: each episode's ``stats/*`` against its rows, and ``stats.json``
against the aggregate of the episodes.

Tolerances, and why they are what they are:

- ``count``, ``min``, ``max``: exact in the column's dtype. Min and max are values of the column;
  stored as double they round back to it exactly (LeRobot takes the timestamp stats from the
  float64 ``frame_index / fps`` before the float32 column rounds it, hence "in the column's dtype").
- ``mean``, ``std``: two references are computed, and a stored value passes if it matches either.
  The float64 reference (what the native writer stores) must match within 1e-9 of the column's
  scale (2 float32 epsilons for a float32 column, whose stats a writer may take from the values
  before they were rounded to float32). The *native* reference repeats LeRobot 0.4.4's arithmetic
  in the column's own dtype (``np.mean`` of float32 values is float32, and its std is
  ``sqrt(E[x^2] - E[x]^2)`` in float32, which loses digits to cancellation); it must match within
  1e-6 of the scale. A mean edited by one part in 10^5 fails both.
- quantiles (q01 .. q99): any sound estimator of the q-quantile returns a value between the order
  statistics around rank q*n. LeRobot estimates from a 5000-bin histogram between min and max, so
  its value lies within one bin width of the order statistic of rank ceil(q*n). The bracket is
  therefore [x_lo - w, x_hi + w] with lo/hi the smaller/larger of those ranks and of numpy's
  (n-1)*q interpolation ranks, and w = (max - min) / 5000 plus float32 rounding.
- dataset stats: the aggregate of the episodes' stats (LeRobot 0.4.4's rules, from
  :mod:`hilrec.daemon.dataset.format.stats`) within 1e-7 of the scale. Quantiles may be either 0.4.4's
  count-weighted mean or the conservative envelope newer LeRobot releases write.

The stats of the five default columns (``timestamp``, ``frame_index``, ``episode_index``,
``index``, ``task_index``) are reported under their own rule, ``stats.default_columns``, a warning:
no policy normalises by them, and LeRobot's own ``delete_episodes`` and ``aggregate_datasets``
renumber those columns but keep their old stats, so stale ones are common and harmless.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Final

import numpy as np

from hilrec.daemon.dataset.check.common import Contents, Findings
from hilrec.daemon.dataset.check.image_stats import image_stats_problem
from hilrec.daemon.dataset.format.features import DEFAULT_FEATURES
from hilrec.daemon.dataset.format.paths import STATS_PATH
from hilrec.daemon.dataset.format.reader import load_stats
from hilrec.daemon.dataset.format.stats import (
    HISTOGRAM_BINS,
    QUANTILE_KEYS,
    QUANTILES,
    STAT_KEYS,
    aggregate_stats,
    downsample_image,
    sample_indices,
)
from hilrec.daemon.errors import CorruptDatasetError

FLOAT64_RTOL: Final[float] = 1e-9
NATIVE_RTOL: Final[float] = 1e-6
DATASET_RTOL: Final[float] = 1e-7
TINY: Final[float] = 1e-12


def stats_rule(key: str, rule: str) -> str:
    """``rule`` for a feature's stats, ``stats.default_columns`` for a default column's."""
    return "stats.default_columns" if key in DEFAULT_FEATURES else rule


def check_episode_stats(contents: Contents, findings: Findings) -> None:
    for episode, rows in sorted(contents.rows.items()):
        meta = contents.episodes.get(episode)
        if meta is None:
            continue
        file = contents.episodes_file(episode)
        stats = meta.get("stats", {})
        for key in contents.numeric_keys:
            if key not in rows.columns:
                continue
            rule = stats_rule(key, "stats.episode")
            stored = stats.get(key)
            if stored is None:
                findings.add(rule, file, f"no stats/{key}/* columns", episode=episode, key=key)
                continue
            missing = [s for s in STAT_KEYS if s not in stored]
            if missing:
                findings.add(rule, file, f"stats {missing} missing", episode=episode, key=key)
                continue
            problem = vector_stats_problem(stored, rows.columns[key])
            if problem:
                findings.add(rule, file, problem, episode=episode, key=key)


def check_image_feature_stats(contents: Contents, findings: Findings) -> None:
    """Stats of ``image`` features (PNG in the parquet, as LeRobot writes without video)."""
    for key in contents.image_keys:
        for episode, rows in sorted(contents.rows.items()):
            meta = contents.episodes.get(episode)
            if meta is None or key not in rows.columns:
                continue
            file = contents.episodes_file(episode)
            stored = meta.get("stats", {}).get(key)
            if stored is None or any(n not in stored for n in STAT_KEYS):
                findings.add(
                    "stats.episode",
                    file,
                    f"stats/{key}/* columns missing or incomplete",
                    episode=episode,
                    key=key,
                )
                continue
            try:
                samples = [
                    downsample_image(_decode_png(rows.columns[key][i])) for i in sample_indices(rows.length)
                ]
            except ValueError as exc:
                findings.add("schema.shape", rows.file, str(exc), episode=episode, key=key)
                continue
            problem = image_stats_problem(stored, rows.length, samples, contents.features[key]["shape"])
            if problem:
                findings.add("stats.episode", file, problem, episode=episode, key=key)


def _decode_png(cell: object) -> np.ndarray:
    import io

    from PIL import Image, UnidentifiedImageError  # only datasets with image features pay for it

    data = cell.get("bytes") if isinstance(cell, dict) else None
    if not data:
        raise ValueError("image cell holds no bytes")
    try:
        with Image.open(io.BytesIO(data)) as image:
            return np.ascontiguousarray(np.asarray(image.convert("RGB"), dtype=np.uint8))
    except (UnidentifiedImageError, OSError) as exc:
        raise ValueError("image cell does not decode") from exc


def vector_stats_problem(stored: Mapping[str, np.ndarray], values: np.ndarray) -> str | None:
    """The first way ``stored`` (one feature's stats) disagrees with ``values`` (n, ...), or None."""
    n = len(values)
    table = values.reshape(n, -1)
    d = table.shape[1]
    for name in STAT_KEYS:
        size = 1 if name == "count" else d
        if np.asarray(stored[name]).size != size:
            return f"stats {name} has shape {list(np.shape(stored[name]))}, expected {size} values"
    flat = {name: np.asarray(stored[name]).reshape(-1) for name in STAT_KEYS}
    if int(flat["count"][0]) != n:
        return f"count is {int(flat['count'][0])}, the episode has {n} rows"
    as64 = table.astype(np.float64)
    for name, actual in (("min", table.min(axis=0)), ("max", table.max(axis=0))):
        # Exact in the column's dtype: LeRobot takes the timestamp stats from the float64
        # frame_index / fps it computed, before the float32 column rounded them.
        got = flat[name].astype(np.float64)
        same = got.astype(table.dtype) == actual
        if not same.all():
            i = int(np.flatnonzero(~same)[0])
            return f"{name}[{i}] is {float(got[i])!r}, the data's {name} is {float(actual[i])!r}"
    scale = np.maximum(np.abs(as64).max(axis=0), TINY)
    # Values computed before the column's rounding differ from the stored ones by its epsilon.
    rtol = (
        FLOAT64_RTOL
        if table.dtype.kind != "f" or table.dtype.itemsize >= 8
        else max(FLOAT64_RTOL, 2 * float(np.finfo(table.dtype).eps))
    )
    mean64 = as64.mean(axis=0)
    var64 = ((as64 - mean64) ** 2).mean(axis=0)
    meansq64 = (as64**2).mean(axis=0)
    native = table.dtype.kind == "f" and table.dtype.itemsize < 8
    if native:
        # LeRobot 0.4.4's arithmetic, in the column's dtype.
        mean_n = table.mean(axis=0)
        meansq_n = (table**2).mean(axis=0)
        var_n = np.maximum(0, meansq_n - mean_n**2).astype(np.float64)
        mean_n, meansq_n = mean_n.astype(np.float64), meansq_n.astype(np.float64)
    got_mean = flat["mean"].astype(np.float64)
    ok = np.abs(got_mean - mean64) <= rtol * scale
    if native:
        ok |= np.abs(got_mean - mean_n) <= NATIVE_RTOL * scale
    if not ok.all():
        i = int(np.flatnonzero(~ok)[0])
        return f"mean[{i}] is {float(got_mean[i])!r}, the data's mean is {float(mean64[i])!r}"
    got_var = flat["std"].astype(np.float64) ** 2
    ok = np.abs(got_var - var64) <= rtol * np.maximum(meansq64, TINY)
    if native:
        ok |= np.abs(got_var - var_n) <= NATIVE_RTOL * np.maximum(meansq_n, TINY)
    if not ok.all():
        i = int(np.flatnonzero(~ok)[0])
        return f"std[{i}] is {float(flat['std'][i])!r}, the data's std is {math.sqrt(var64[i])!r}"
    return _quantile_problem(flat, as64, scale, native)


def _quantile_problem(
    flat: Mapping[str, np.ndarray], as64: np.ndarray, scale: np.ndarray, native: bool
) -> str | None:
    n = len(as64)
    ordered = np.sort(as64, axis=0)
    bin_width = (ordered[-1] - ordered[0]) / HISTOGRAM_BINS
    rounding = (4 * np.finfo(np.float32).eps if native else 1e-12) * scale
    slack = 1.01 * bin_width + rounding + 1e-9
    for q, name in zip(QUANTILES, QUANTILE_KEYS, strict=True):
        histogram_rank = max(math.ceil(q * n) - 1, 0)
        lo = min(histogram_rank, math.floor(q * (n - 1)))
        hi = min(max(histogram_rank, math.ceil(q * (n - 1))), n - 1)
        low, high = ordered[lo] - slack, ordered[hi] + slack
        got = flat[name].astype(np.float64)
        bad = (got < low) | (got > high) | ~np.isfinite(got)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            return (
                f"{name}[{i}] is {float(got[i])!r}, outside [{float(low[i])!r}, "
                f"{float(high[i])!r}] (order "
                f"statistics {lo}..{hi} of {n} values, widened by one histogram bin)"
            )
    return None


# --- dataset level -------------------------------------------------------------------------------


def check_dataset_stats(contents: Contents, findings: Findings) -> None:
    path = contents.root / STATS_PATH
    try:
        stored = load_stats(contents.root)
    except CorruptDatasetError as exc:
        findings.add("file.unreadable", path, exc.problem)
        return
    if stored is None:
        if contents.episodes:
            findings.add("stats.dataset", path, "missing")
        return
    episode_stats = [meta["stats"] for _, meta in sorted(contents.episodes.items())]
    keys = [
        k
        for k in contents.features
        if k in contents.numeric_keys or k in contents.video_keys or k in contents.image_keys
    ]
    for key in keys:
        rule = stats_rule(key, "stats.dataset")
        have = [s[key] for s in episode_stats if key in s and all(n in s[key] for n in STAT_KEYS)]
        if key not in stored:
            findings.add(rule, path, "feature has no stats", key=key)
            continue
        missing = [n for n in STAT_KEYS if n not in stored[key]]
        if missing:
            findings.add(rule, path, f"stats {missing} missing", key=key)
            continue
        if len(have) != len(episode_stats) or not have:
            continue  # stats.episode already names the episodes without stats
        problem = _aggregate_problem(stored[key], have)
        if problem:
            findings.add(rule, path, problem, key=key)
    for key in stored:
        if key not in contents.features:
            findings.add("stats.dataset", path, "stats for a feature info.json does not declare", key=key)


def _aggregate_problem(
    stored: Mapping[str, np.ndarray], episodes: list[Mapping[str, np.ndarray]]
) -> str | None:
    try:
        expected = aggregate_stats([{"k": e} for e in episodes])["k"]
    except (ValueError, KeyError) as exc:
        return f"episode stats cannot be aggregated: {exc}"
    envelope = {
        name: (np.min if q <= 0.5 else np.max)(
            np.stack([np.asarray(e[name], dtype=np.float64) for e in episodes]), axis=0
        )
        for q, name in zip(QUANTILES, QUANTILE_KEYS, strict=True)
    }
    for name in STAT_KEYS:
        got = np.asarray(stored[name], dtype=np.float64)
        want = np.asarray(expected[name], dtype=np.float64)
        if got.shape != want.shape and got.size != want.size:
            return f"{name} has shape {list(got.shape)}, the episodes' have {list(want.shape)}"
        got, want = got.reshape(-1), want.reshape(-1)
        scale = (
            np.maximum.reduce(
                [
                    np.abs(np.asarray(expected[s], dtype=np.float64)).reshape(-1)
                    for s in ("min", "max", "mean")
                ]
            )
            + TINY
        )
        if name in ("count", "min", "max"):
            ok = got == want
        else:
            ok = np.abs(got - want) <= DATASET_RTOL * scale
            if name in envelope:
                ok |= np.abs(got - envelope[name].reshape(-1)) <= DATASET_RTOL * scale
        if not ok.all():
            i = int(np.flatnonzero(~ok)[0])
            return (
                f"{name}[{i}] is {float(got[i])!r}, the aggregate of the {len(episodes)} "
                f"episodes' stats is {float(want[i])!r}"
            )
    return None
