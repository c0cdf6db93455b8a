"""Checker rules on videos: files, frame rate and size, each episode's span, frame count and frame
timestamps, and the per-episode image stats against decoded frames.

An episode's frames are those LeRobot will query: frame ``i`` at ``from_timestamp + i / fps`` of
its file, matched to the nearest presented frame within ``tolerance_s = 1e-4`` s. The checker
demuxes every packet (cheap) for counts and timestamps, and decodes only the frames the image stats
sample.

Image stats are the one place where the data itself is lossy: the writer computed them from the
frames it was given, the checker can only see them after compression. So they are checked for
shape, range [0, 1] and order (min <= q01 <= ... <= q99 <= max), and against the decoded sample
with tolerances a lossy codec stays inside: mean 0.03 (about 8 levels of 255), q10/q50/q90 0.06,
q01/q99 0.15 (tails sit on edges the codec smears: 0.11 was seen on a 48x64 sawtooth pattern).
Min and max are not compared (compression moves extremes), and neither is std:
LeRobot 0.4.4 squares uint8 pixels in uint8, so the std it stores for images is meaningless and
must still be accepted.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import av
import numpy as np

from hilrec.daemon.dataset.checks_common import Contents, Findings
from hilrec.daemon.dataset.paths import INFO_PATH, video_file_path
from hilrec.daemon.dataset.reader import decoded_frames
from hilrec.daemon.dataset.stats import (
    QUANTILE_KEYS,
    STAT_KEYS,
    downsample_factor,
    downsample_image,
    image_stats,
    sample_indices,
)
from hilrec.daemon.dataset.video import VideoProbe, probe_video
from hilrec.daemon.errors import CorruptDatasetError

TOLERANCE_S: Final[float] = 1e-4
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


@dataclass
class _Span:
    episode: int
    length: int
    start: float
    end: float
    sample_ts: np.ndarray = field(default_factory=lambda: np.array([]))
    samples: list[np.ndarray] = field(default_factory=list)


def check_videos(contents: Contents, findings: Findings, *, decode: bool) -> None:
    for key in contents.video_keys:
        _check_declared_video_info(contents, key, findings)
        by_file: dict[Path, list[_Span]] = {}
        for episode, meta in sorted(contents.episodes.items()):
            span = _episode_span(contents, key, episode, meta, findings)
            if span is not None:
                path = video_file_path(contents.root, contents.info, meta, key)
                by_file.setdefault(path, []).append(span)
        for path, spans in by_file.items():
            _check_file(contents, key, path, spans, findings, decode=decode)


def _check_declared_video_info(contents: Contents, key: str, findings: Findings) -> None:
    info = contents.features[key].get("info") or {}
    path = contents.root / INFO_PATH
    if "video.fps" in info and info["video.fps"] != contents.fps:
        findings.add(
            "video.fps",
            path,
            f"features.{key}.info video.fps is {info['video.fps']}, fps is {contents.fps}",
            key=key,
        )
    height, width = contents.features[key]["shape"][:2]
    for name, want in (("video.height", height), ("video.width", width)):
        if name in info and info[name] != want:
            findings.add(
                "video.size",
                path,
                f"features.{key}.info {name} is {info[name]}, the feature's shape says {want}",
                key=key,
            )


def _episode_span(
    contents: Contents, key: str, episode: int, meta: dict[str, Any], findings: Findings
) -> _Span | None:
    file = contents.episodes_file(episode)
    names = [f"videos/{key}/{n}" for n in ("chunk_index", "file_index", "from_timestamp", "to_timestamp")]
    missing = [n for n in names if meta.get(n) is None]
    if missing:
        findings.add("video.range", file, f"columns {missing} missing or null", episode=episode, key=key)
        return None
    start, end = float(meta[names[2]]), float(meta[names[3]])
    length = int(meta["length"])
    duration = length / contents.fps
    if start < -TOLERANCE_S or abs((end - start) - duration) > TOLERANCE_S:
        findings.add(
            "video.range",
            file,
            f"from_timestamp {start!r} .. to_timestamp {end!r} spans {end - start:.6f} s; "
            f"{length} frames at {contents.fps} fps need {duration:.6f} s",
            episode=episode,
            key=key,
        )
    return _Span(episode=episode, length=length, start=start, end=end)


def _check_file(
    contents: Contents, key: str, path: Path, spans: list[_Span], findings: Findings, *, decode: bool
) -> None:
    try:
        probe = probe_video(path)
    except CorruptDatasetError as exc:
        for span in spans:
            findings.add("video.file", path, exc.problem, episode=span.episode, key=key)
        return
    _check_stream(contents, key, probe, findings)
    spans.sort(key=lambda s: s.start)
    for previous, span in itertools.pairwise(spans):
        if span.start < previous.end - TOLERANCE_S:
            findings.add(
                "video.range",
                contents.episodes_file(span.episode),
                f"starts at {span.start!r} s of {findings.rel(path)}, before episode "
                f"{previous.episode} ends ({previous.end!r} s)",
                episode=span.episode,
                key=key,
            )
    stamps = probe.frame_timestamps
    for span in spans:
        inside = int(((stamps >= span.start - TOLERANCE_S) & (stamps < span.end - TOLERANCE_S)).sum())
        if inside != span.length:
            findings.add(
                "video.frame_count",
                path,
                f"{inside} frames in [{span.start:.6f}, {span.end:.6f}) s, the episode has "
                f"{span.length} rows",
                episode=span.episode,
                key=key,
            )
        wanted = span.start + np.arange(span.length) / contents.fps
        error = _nearest_distance(stamps, wanted)
        if (error > TOLERANCE_S).any():
            i = int(np.flatnonzero(error > TOLERANCE_S)[0])
            findings.add(
                "video.timestamps",
                path,
                f"frame {i} is queried at {wanted[i]:.6f} s; the nearest frame is "
                f"{error[i]:.6f} s away (tolerance {TOLERANCE_S} s; "
                f"{int((error > TOLERANCE_S).sum())} of {span.length} frames off)",
                episode=span.episode,
                key=key,
            )
        elif decode:
            span.sample_ts = span.start + np.asarray(sample_indices(span.length)) / contents.fps
    if decode:
        _check_image_stats(contents, key, path, [s for s in spans if len(s.sample_ts)], findings)


def _check_stream(contents: Contents, key: str, probe: VideoProbe, findings: Findings) -> None:
    if probe.fps is None or abs(float(probe.fps) - contents.fps) > 1e-6:
        findings.add(
            "video.fps", probe.path, f"stream frame rate is {probe.fps}, info fps is {contents.fps}", key=key
        )
    height, width = contents.features[key]["shape"][:2]
    if (probe.height, probe.width) != (height, width):
        findings.add(
            "video.size",
            probe.path,
            f"frames are {probe.height}x{probe.width} (HxW), the feature declares {height}x{width}",
            key=key,
        )


def _nearest_distance(stamps: np.ndarray, wanted: np.ndarray) -> np.ndarray:
    if not len(stamps):
        return np.full(len(wanted), np.inf)
    right = np.clip(np.searchsorted(stamps, wanted), 0, len(stamps) - 1)
    left = np.clip(right - 1, 0, len(stamps) - 1)
    return np.minimum(np.abs(stamps[right] - wanted), np.abs(stamps[left] - wanted))


def _check_image_stats(
    contents: Contents, key: str, path: Path, spans: list[_Span], findings: Findings
) -> None:
    """Decode the file once, keeping the sampled frames (downsampled) episode by episode."""
    if not spans:
        return
    pending = list(spans)
    try:
        for ts, frame in decoded_frames(path):
            while pending and ts > pending[0].end + TOLERANCE_S:
                _compare_image_stats(contents, key, pending.pop(0), findings)
            if not pending:
                break
            span = pending[0]
            if np.abs(span.sample_ts - ts).min() <= TOLERANCE_S:
                span.samples.append(downsample_image(frame.to_ndarray(format="rgb24")))
    except av.FFmpegError as exc:
        findings.add(
            "video.file",
            path,
            f"decoding failed: {exc}",
            episode=pending[0].episode if pending else None,
            key=key,
        )
        return
    for span in pending:
        _compare_image_stats(contents, key, span, findings)


def _compare_image_stats(contents: Contents, key: str, span: _Span, findings: Findings) -> None:
    file = contents.episodes_file(span.episode)
    stored = contents.episodes[span.episode].get("stats", {}).get(key)
    if stored is None or any(n not in stored for n in STAT_KEYS):
        findings.add(
            "stats.episode",
            file,
            f"stats/{key}/* columns missing or incomplete",
            episode=span.episode,
            key=key,
        )
        return
    problem = image_stats_problem(stored, span.length, span.samples, contents.features[key]["shape"])
    if problem:
        findings.add("stats.episode", file, problem, episode=span.episode, key=key)


def image_stats_problem(
    stored: dict[str, np.ndarray], length: int, samples: list[np.ndarray], shape: list[int]
) -> str | None:
    """The first way one image feature's stats disagree with the sampled (downsampled) frames.

    ``count`` is the number of sampled frames, except that LeRobot 0.4.4's streaming encoder
    counts the pixels of every (downsampled) frame; both are accepted.
    """
    factor = downsample_factor(shape[0], shape[1])
    pixels_per_frame = -(-shape[0] // factor) * -(-shape[1] // factor)
    values = {n: np.asarray(stored[n], dtype=np.float64).reshape(-1) for n in STAT_KEYS}
    channels = values["mean"].size
    for name in STAT_KEYS:
        if name != "count" and values[name].size != channels:
            return f"{name} has {values[name].size} values, mean has {channels}"
    count = int(values["count"][0])
    if not (1 <= count <= length or count == length * pixels_per_frame):
        return (
            f"count is {count}: neither a number of sampled frames (1 .. {length}) nor the "
            f"pixels of every frame ({length} x {pixels_per_frame})"
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
    if not samples:
        return None
    decoded = image_stats(np.stack(samples))
    if decoded["mean"].size != channels:
        return f"stats have {channels} channels, the video has {decoded['mean'].size}"
    for name, tolerance in IMAGE_TOLERANCES.items():
        want = decoded[name].reshape(-1)
        off = np.abs(values[name] - want)
        if (off > tolerance).any():
            c = int(np.argmax(off))
            return (
                f"{name}[channel {c}] is {values[name][c]:.4f}, the decoded video's sampled "
                f"frames give {want[c]:.4f} (tolerance {tolerance} for a lossy codec)"
            )
    return None
