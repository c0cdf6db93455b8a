"""Checker rules on videos: files, frame rate and size, each episode's span, frame count and frame
timestamps, and the per-episode image stats against decoded frames.

An episode's frames are those LeRobot will query: frame ``i`` at ``from_timestamp + i / fps`` of
its file, matched to the nearest presented frame within ``tolerance_s = 1e-4`` s. The checker
demuxes every packet (cheap) for counts and timestamps. For the image stats it decodes, episode by
episode, exactly that episode's span of its file (seeking to the key frame before its
``from_timestamp``), and looks at the frames the stats sampled. The episodes are independent, so
they are decoded in a process pool (``workers``); the findings are made afterwards, in a fixed
order (key, file, episode), and are the same whatever the number of workers.

Image stats of a video are the one place where the data itself is lossy: the writer computed them
from the frames it was given, the checker can only see them after compression. They are judged
only by what a lossy codec keeps:

- the stored stats themselves: shapes, values in [0, 1], min <= q01 <= ... <= q99 <= max, mean in
  [min, max], std <= 0.5;
- the per-channel **mean**. Not as the mean of the decoded RGB pixels: the decoder's
  YCbCr -> RGB conversion clips every pixel to [0, 255], and 4:2:0 chroma mixes the colours of
  neighbouring pixels, so a saturated one-pixel pattern (blue and white columns) moves the RGB
  mean by 0.22 through a perfect codec. The conversion is affine, though, and averaging commutes
  with it: the stored channel means map (BT.601, or BT.709 when the stream says so) to the Y, Cb
  and Cr means the decoded planes must have, before any clipping (within 0.002 for every pair of
  the RGB cube's corners through 4:2:0 alone), and those means a transform codec keeps (each
  block's average). Y, Cb and Cr must each be within 0.02 (5 levels of 255); a channel mean off
  by 0.3 moves Y by 0.034 at least (blue's weight is 0.114), and Cb or Cr by more;
- the **bounds**: the stored per-channel min and max bound each pixel's Y, Cb and Cr (interval
  arithmetic through the same matrix; a 4:2:0 chroma sample averages pixels inside that convex
  box, so it stays inside too). 98 % of the decoded plane values must lie within those bounds
  widened by 0.1 (ringing at edges); the 1 % tails, and the extremes, are not judged.

Not judged: the quantiles q01 .. q99, and std. Quantiles of images are not stable under a lossy
codec: a one-pixel line covers less than 1 % of the pixels, so q99 is the background, until the
codec smears it over 2 % (0.0 stored, 0.30 decoded); a two-level picture (a checkerboard) has its
median on one level, and any blur moves it half-way (0.50). LeRobot 0.4.4 also squares uint8
pixels in uint8, so the std it stores for images is meaningless and must still be accepted.

Frames wider or taller than 300 px are strided for the stats (every second pixel or more). Y is
full resolution, so the checker reads it at exactly the pixels the stats saw; but a codec that
blurs detail at the pixel scale (a one-pixel checkerboard that inverts every frame) moves exactly
those pixels while the whole frame's mean stays, so a strided mean passes when it matches either
the decoded values at the stats' pixels or the whole decoded frame. A 4:2:0 chroma sample also
averages neighbours the stride skipped: the chroma tolerances widen by 10 x the mean difference
between the sampled pixels' Y and the mean Y of their chroma block (0 on smooth pictures, about
0.5 on a one-pixel checkerboard of saturated colours). What stays out of reach is a picture with
a pixel-scale pattern that differs between the sampled pixels and the rest, and that the codec
blurs away entirely: its stride-sampled stats cannot be told from wrong ones after compression.

Image stats of ``image`` features (PNG in the parquet) are lossless and keep the stricter
comparison of :func:`hilrec.daemon.dataset.check.image_stats.image_stats_problem`, quantiles
included.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any, Final

import av
import numpy as np

from hilrec.daemon.dataset.check.common import Contents, Findings, run_in_pool
from hilrec.daemon.dataset.check.image_stats import flat_stats, pixels_per_frame, stored_stats_problem
from hilrec.daemon.dataset.format.features import TIMESTAMP_TOLERANCE_S
from hilrec.daemon.dataset.format.paths import INFO_PATH, video_file_path
from hilrec.daemon.dataset.format.stats import (
    STAT_KEYS,
    downsample_factor,
    sample_indices,
)
from hilrec.daemon.dataset.video.avlog import open_av
from hilrec.daemon.dataset.video.codec import VideoProbe, probe_video, stream_time_base
from hilrec.daemon.errors import CorruptDatasetError

# Videos: what a lossy codec keeps (see the module docstring).
LUMA_TOLERANCE: Final[float] = 0.02
CHROMA_TOLERANCE: Final[float] = 0.02
BOUND_SLACK: Final[float] = 0.1
BOUND_TAIL: Final[float] = 0.01
ALIAS_GAIN: Final[float] = 10.0
# 8-bit planar YCbCr formats read as they are; anything else is converted to yuv420p first.
_PLANAR_YUV8: Final[frozenset[str]] = frozenset(
    {"yuv420p", "yuvj420p", "yuv422p", "yuvj422p", "yuv444p", "yuvj444p", "yuv440p", "yuvj440p"}
)
_PLANES: Final[tuple[str, ...]] = ("Y", "Cb", "Cr")
# (Kr, Kb) of the two matrices FFmpeg's swscale uses; BT.601 unless a stream says BT.709.
_BT601: Final[tuple[float, float]] = (0.299, 0.114)
_BT709: Final[tuple[float, float]] = (0.2126, 0.0722)
_AVCOL_SPC_BT709: Final[int] = 1
_AVCOL_RANGE_JPEG: Final[int] = 2


@dataclass
class _Span:
    episode: int
    length: int
    start: float
    end: float
    sample_ts: np.ndarray = field(default_factory=lambda: np.array([]))


@dataclass(frozen=True)
class DecodeJob:
    """One episode's span of one video file, and the timestamps of the frames its stats sampled."""

    path: str
    start: float
    end: float
    sample_ts: tuple[float, ...]
    factor: int  # the stats' stride (stats.downsample_factor)


@dataclass(frozen=True)
class DecodedPlanes:
    """What the sampled frames of one episode hold, in the codec's own colour space."""

    # (k, 3, 256): how often each code value of Y, Cb and Cr occurs at the stats' pixels, per frame
    counts: np.ndarray
    # (k, 3): the mean code of each whole plane, per frame (None when the stats saw every pixel)
    whole: np.ndarray | None = None
    # mean |Y of a sampled pixel - mean Y of its chroma block| / Y range (0 unless strided)
    alias: float = 0.0
    bt709: bool = False
    full_range: bool = False
    error: str | None = None


def check_videos(contents: Contents, findings: Findings, *, decode: bool, workers: int = 1) -> None:
    """Every video rule; with ``decode`` also the image stats, decoded on ``workers`` processes."""
    jobs: list[tuple[str, Path, _Span, DecodeJob]] = []
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
            if decode:
                jobs.extend(_decode_jobs(contents, key, path, spans, findings))
    results = run_in_pool(decode_job, [job for *_, job in jobs], workers)
    for (key, path, span, _job), planes in zip(jobs, results, strict=True):
        if planes.error is not None:
            findings.add("video.file", path, planes.error, episode=span.episode, key=key)
            continue
        stored = contents.episodes[span.episode]["stats"][key]
        problem = video_stats_problem(stored, span.length, planes, contents.features[key]["shape"])
        if problem:
            findings.add(
                "stats.episode", contents.episodes_file(span.episode), problem, episode=span.episode, key=key
            )


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
    if start < -TIMESTAMP_TOLERANCE_S or abs((end - start) - duration) > TIMESTAMP_TOLERANCE_S:
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
        if span.start < previous.end - TIMESTAMP_TOLERANCE_S:
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
        inside = int(
            (
                (stamps >= span.start - TIMESTAMP_TOLERANCE_S) & (stamps < span.end - TIMESTAMP_TOLERANCE_S)
            ).sum()
        )
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
        if (error > TIMESTAMP_TOLERANCE_S).any():
            i = int(np.flatnonzero(error > TIMESTAMP_TOLERANCE_S)[0])
            findings.add(
                "video.timestamps",
                path,
                f"frame {i} is queried at {wanted[i]:.6f} s; the nearest frame is "
                f"{error[i]:.6f} s away (tolerance {TIMESTAMP_TOLERANCE_S} s; "
                f"{int((error > TIMESTAMP_TOLERANCE_S).sum())} of {span.length} frames off)",
                episode=span.episode,
                key=key,
            )
        elif decode:
            span.sample_ts = span.start + np.asarray(_sampled_frames(contents, key, span)) / contents.fps


def _sampled_frames(contents: Contents, key: str, span: _Span) -> list[int]:
    """The frames an episode's image stats were taken from: LeRobot's sample, or every frame when
    the count says so (LeRobot 0.4.4's streaming encoder counts every frame's pixels)."""
    stored = contents.episodes[span.episode].get("stats", {}).get(key, {})
    count = np.asarray(stored.get("count", [0])).reshape(-1)
    if (
        count.size
        and span.length > 1
        and int(count[0]) == span.length * pixels_per_frame(contents.features[key]["shape"])
    ):
        return list(range(span.length))
    return sample_indices(span.length)


def _decode_jobs(
    contents: Contents, key: str, path: Path, spans: list[_Span], findings: Findings
) -> list[tuple[str, Path, _Span, DecodeJob]]:
    jobs = []
    shape = contents.features[key]["shape"]
    for span in sorted(spans, key=lambda s: s.episode):
        if not len(span.sample_ts):
            continue
        stored = contents.episodes[span.episode].get("stats", {}).get(key)
        if stored is None or any(n not in stored for n in STAT_KEYS):
            findings.add(
                "stats.episode",
                contents.episodes_file(span.episode),
                f"stats/{key}/* columns missing or incomplete",
                episode=span.episode,
                key=key,
            )
            continue
        job = DecodeJob(
            path=str(path),
            start=span.start,
            end=span.end,
            sample_ts=tuple(float(t) for t in span.sample_ts),
            factor=downsample_factor(shape[0], shape[1]),
        )
        jobs.append((key, path, span, job))
    return jobs


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


# --- decoding (runs in the pool's processes) -------------------------------------------------------


def decode_job(job: DecodeJob) -> DecodedPlanes:
    """Decode one episode's span and keep the sampled frames' plane values at the stats' pixels.

    Seeks to the key frame before the first sampled frame; if the demuxer lands after it (an
    index that lies), the file is decoded from its start instead. Only frames presented inside
    ``[from_timestamp, to_timestamp)`` of this episode are taken.
    """
    try:
        found = _decode_span(job, seek=True)
        if found is None:  # without a seek nothing is skipped: never None
            found = _decode_span(job, seek=False) or []
    except av.FFmpegError as exc:
        return DecodedPlanes(counts=np.zeros((0, 3, 256), np.int64), error=f"decoding failed: {exc}")
    if not found:
        return DecodedPlanes(counts=np.zeros((0, 3, 256), np.int64))
    wholes = [w for _, w, _, _ in found]
    return DecodedPlanes(
        counts=np.stack([c for c, _, _, _ in found]),
        whole=None if any(w is None for w in wholes) else np.stack([w for w in wholes if w is not None]),
        alias=float(np.mean([a for _, _, a, _ in found])),
        bt709=found[0][3][0],
        full_range=found[0][3][1],
    )


# per sampled frame: counts at the stats' pixels, whole planes' mean codes, alias, (bt709, range)
_Sampled = tuple[np.ndarray, np.ndarray | None, float, tuple[bool, bool]]


def _decode_span(job: DecodeJob, *, seek: bool) -> list[_Sampled] | None:
    wanted = np.asarray(job.sample_ts, dtype=np.float64)
    first, last = float(wanted.min()), float(wanted.max())
    found: list[_Sampled] = []
    with open_av(job.path) as container:
        stream = container.streams.video[0]
        stream.thread_type = "AUTO"
        time_base = stream_time_base(stream, Path(job.path))
        seeked = seek and first > TIMESTAMP_TOLERANCE_S
        if seeked:
            target = (Fraction(first) - Fraction(TIMESTAMP_TOLERANCE_S)) / time_base
            container.seek(math.floor(target), stream=stream, backward=True, any_frame=False)
        decoded_any = False
        for frame in container.decode(stream):
            if frame.pts is None:
                continue
            ts = float(frame.pts * time_base)
            if not decoded_any:
                decoded_any = True
                if seeked and ts > first + TIMESTAMP_TOLERANCE_S:
                    return None
            if ts > last + TIMESTAMP_TOLERANCE_S:
                break
            if ts < job.start - TIMESTAMP_TOLERANCE_S or ts >= job.end - TIMESTAMP_TOLERANCE_S:
                continue
            if np.abs(wanted - ts).min() <= TIMESTAMP_TOLERANCE_S:
                found.append(_frame_planes(frame, job.factor))
    return found


def _frame_planes(frame: av.VideoFrame, factor: int) -> _Sampled:
    """(3, 256) code counts of Y, Cb, Cr at the pixels the stats saw, the alias term, the tags."""
    name = frame.format.name
    rgb_source = name.startswith(("gbr", "rgb", "bgr", "argb", "abgr"))
    bt709 = not rgb_source and int(frame.colorspace) == _AVCOL_SPC_BT709
    full_range = not rgb_source and (int(frame.color_range) == _AVCOL_RANGE_JPEG or name.startswith("yuvj"))
    if name not in _PLANAR_YUV8:
        frame = frame.reformat(format="yuv420p")
    luma, cb, cr = (
        np.frombuffer(memoryview(p), dtype=np.uint8).reshape(-1, p.line_size)[: p.height, : p.width]
        for p in frame.planes[:3]
    )
    height, width = luma.shape
    step_y, step_x = -(-height // cb.shape[0]), -(-width // cb.shape[1])
    sampled_luma = luma[::factor, ::factor]
    shape = sampled_luma.shape
    rows, cols = np.arange(0, height, factor), np.arange(0, width, factor)
    aligned = factor % step_y == 0 and factor % step_x == 0  # each sampled pixel starts its block

    def at_blocks(plane: np.ndarray) -> np.ndarray:
        if aligned:
            return plane[:: factor // step_y, :: factor // step_x][: shape[0], : shape[1]]
        return plane[np.ix_(rows // step_y, cols // step_x)]

    def counted(planes: tuple[np.ndarray, ...]) -> np.ndarray:
        return np.stack([np.bincount(p.ravel(), minlength=256) for p in planes]).astype(np.int64)

    counts = counted((sampled_luma, at_blocks(cb), at_blocks(cr)))
    whole = np.array([p.mean(dtype=np.float64) for p in (luma, cb, cr)]) if factor > 1 else None
    alias = 0.0
    if factor > 1 and (step_y > 1 or step_x > 1):
        # Each sampled pixel's Y against the mean Y of its chroma block (the block's pixels
        # inside the frame).
        total = np.zeros(shape, dtype=np.int32)
        for dy, dx in itertools.product(range(step_y), range(step_x)):
            part = luma[dy::factor, dx::factor] if aligned else luma[:0]
            if part.shape != shape:
                block_rows = np.minimum((rows // step_y) * step_y + dy, height - 1)
                block_cols = np.minimum((cols // step_x) * step_x + dx, width - 1)
                part = luma[np.ix_(block_rows, block_cols)]
            total += part
        cells = step_y * step_x
        spread = np.abs(cells * sampled_luma.astype(np.int32) - total).mean() / cells
        alias = float(spread) / (255.0 if full_range else 219.0)
    return counts, whole, alias, (bt709, full_range)


# --- judging ---------------------------------------------------------------------------------------


def _ycbcr_matrix(bt709: bool) -> np.ndarray:
    """Rows Y, Cb, Cr of RGB in [0, 1] -> Y in [0, 1], Cb and Cr in [-0.5, 0.5]."""
    kr, kb = _BT709 if bt709 else _BT601
    kg = 1.0 - kr - kb
    luma = np.array([kr, kg, kb])
    return np.stack(
        [
            luma,
            (np.array([0.0, 0.0, 1.0]) - luma) / (2 * (1 - kb)),
            (np.array([1.0, 0.0, 0.0]) - luma) / (2 * (1 - kr)),
        ]
    )


def _normalised_codes(full_range: bool) -> np.ndarray:
    """(3, 256): the value each code of Y, Cb, Cr stands for (Y in [0, 1], chroma around 0)."""
    codes = np.arange(256, dtype=np.float64)
    if full_range:
        return np.stack([codes / 255.0, (codes - 128) / 255.0, (codes - 128) / 255.0])
    return np.stack([(codes - 16) / 219.0, (codes - 128) / 224.0, (codes - 128) / 224.0])


def video_stats_problem(
    stored: dict[str, np.ndarray], length: int, planes: DecodedPlanes, shape: list[int]
) -> str | None:
    """The first way one video feature's stats disagree with its decoded sample, judged by what a
    lossy codec keeps (module docstring), or None."""
    values = flat_stats(stored)
    problem = stored_stats_problem(values, length, shape)
    if problem or not len(planes.counts):
        return problem
    channels = values["mean"].size
    totals = planes.counts.sum(axis=0).astype(np.float64)  # (3, 256)
    levels = _normalised_codes(planes.full_range)
    plane_mean = (totals * levels).sum(axis=1) / totals.sum(axis=1)
    if planes.whole is not None:  # strided stats: the whole frame's means are the other candidate
        codes = planes.whole.mean(axis=0)  # levels are affine in the code: mean of codes suffices
        whole_mean = np.array([np.interp(codes[p], np.arange(256), levels[p]) for p in range(3)])
    else:
        whole_mean = plane_mean
    widen = ALIAS_GAIN * planes.alias
    if channels == 3:
        matrix = _ycbcr_matrix(planes.bt709)
        expected = matrix @ values["mean"]
        low = np.where(matrix > 0, matrix * values["min"], matrix * values["max"]).sum(axis=1)
        high = np.where(matrix > 0, matrix * values["max"], matrix * values["min"]).sum(axis=1)
        judged = 3
    else:  # one channel (a depth map or grey): its value is Y
        matrix = np.ones((1, 1))
        expected = values["mean"][:1]
        low, high = values["min"][:1], values["max"][:1]
        judged = 1
    tolerance = np.array([LUMA_TOLERANCE, CHROMA_TOLERANCE + widen, CHROMA_TOLERANCE + widen])[:judged]
    off = np.minimum(np.abs(expected - plane_mean[:judged]), np.abs(expected - whole_mean[:judged]))
    if (off > tolerance).any():
        p = int(np.argmax(off / tolerance))
        decoded_mean = np.linalg.solve(matrix, plane_mean[:judged])  # unclipped, per channel
        c = int(np.argmax(np.abs(values["mean"][:judged] - decoded_mean)))
        return (
            f"mean[channel {c}] is {values['mean'][c]:.4f}, the decoded video's sampled frames give "
            f"{decoded_mean[c]:.4f} (unclipped): their {_PLANES[p]} mean is {plane_mean[p]:.4f}, "
            f"the stored means give {expected[p]:.4f} (tolerance {tolerance[p]:.3f} for a lossy codec)"
        )
    for p in range(judged):
        slack = BOUND_SLACK + (widen if p else 0.0)
        below, above = _tails(totals[p], levels[p])
        if below < low[p] - slack or above > high[p] + slack:
            return (
                f"{_PLANES[p]}: 98 % of the decoded values lie in [{below:.4f}, {above:.4f}], but the "
                f"stored min {values['min'].round(4).tolist()} and max "
                f"{values['max'].round(4).tolist()} allow only [{low[p]:.4f}, {high[p]:.4f}] "
                f"(slack {slack:.3f} for a lossy codec)"
            )
    return None


def _tails(counts: np.ndarray, levels: np.ndarray) -> tuple[float, float]:
    """The values at ranks BOUND_TAIL and 1 - BOUND_TAIL of a plane given as code counts."""
    cumulative = np.cumsum(counts)
    total = cumulative[-1]
    lo = int(np.searchsorted(cumulative, BOUND_TAIL * total, side="right"))
    hi = int(np.searchsorted(cumulative, (1 - BOUND_TAIL) * total, side="left"))
    return float(levels[min(lo, 255)]), float(levels[min(hi, 255)])
