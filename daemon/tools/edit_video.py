"""Video files of an edited dataset: whole files linked, episode spans cut by packet copy.

An edit keeps or drops whole episodes, and every episode of a LeRobot v3.0 video file starts on a
key frame when the file was made the way both writers make it (each episode encoded on its own,
then the files concatenated by copying packets). So an edited file is made of the kept
episodes' packets, copied (:func:`hilrec.daemon.dataset.video.codec.concat_segments`): no frame is
decoded or re-encoded, and the frames LeRobot reads are bit for bit the source's.

Where a span does not start on a key frame (a file LeRobot's own ``delete_episodes`` re-encoded
in one piece can put an episode start inside a GOP), packets cannot be cut there: only the span's
head, up to its first key frame, is decoded and re-encoded (a GOP of its own, as every episode's
video starts, with the source's recorded encoder settings or LeRobot's), and the rest is copied
(:func:`splice_spans`). The spliced file is decoded whole to count its frames; should that fail,
the run is re-encoded as a whole (:func:`reencode_spans`). Both are reported, with the number
of frames that lost a generation.
"""

from __future__ import annotations

import bisect
import os
from collections.abc import Sequence
from fractions import Fraction
from pathlib import Path

import av

from hilrec.daemon.dataset import (
    Segment,
    StreamEncoder,
    VideoSettings,
    concat_segments,
    decoded_frames,
    open_av,
)
from hilrec.daemon.errors import CorruptDatasetError, VideoEncodingError

# The stream's codec -> the encoder a re-encoded file is written with.
ENCODERS = {"h264": "libx264", "hevc": "libx265", "av1": "libsvtav1"}


def starts_on_keyframes(segments: Sequence[Segment]) -> bool:
    """Whether the first packet of every segment (at or after its start) is a key frame."""
    by_file: dict[Path, list[Segment]] = {}
    for segment in segments:
        by_file.setdefault(segment.path, []).append(segment)
    for path, spans in by_file.items():
        try:
            with open_av(str(path)) as container:
                stream = container.streams.video[0]
                if stream.time_base is None:
                    return False
                tb = Fraction(stream.time_base)
                packets = sorted(
                    (int(p.pts), bool(p.is_keyframe))
                    for p in container.demux(stream)
                    if p.pts is not None and p.size > 0
                )
        except av.FFmpegError as exc:
            raise CorruptDatasetError(str(path), f"unreadable video: {exc}") from exc
        for span in spans:
            start = round(Fraction(span.start_s) / tb)
            first = next((key for pts, key in packets if pts >= start), None)
            if first is not True:
                return False
    return True


def cut_spans(output: Path, segments: Sequence[Segment], *, fps: int) -> list[tuple[float, float, int]]:
    """Copy ``segments`` into ``output`` (packets, no re-encode); (from_s, to_s, frames) each.

    Segments of one file in time order (what an edit's run is) take two demux passes of that
    file, whatever their number: one to count each segment's packets, one to copy them, shifted
    as :func:`~hilrec.daemon.dataset.video.codec.concat_segments` shifts them (which reads its input
    once per segment; it does everything else).
    """
    path = segments[0].path
    starts_s = [s.start_s for s in segments]
    ordered = all(s.path == path for s in segments) and starts_s == sorted(starts_s)
    if not ordered or any(s.end_s is None for s in segments[:-1]):
        return concat_segments(output, segments, fps=fps)
    try:
        with open_av(str(path)) as container:
            stream = container.streams.video[0]
            if stream.time_base is None:
                raise CorruptDatasetError(str(path), "video stream has no time base")
            tb = Fraction(stream.time_base)
            ticks_f = Fraction(1, fps) / tb
            if ticks_f.denominator != 1:
                raise VideoEncodingError(f"time base {tb} cannot hold a 1/{fps} s frame grid")
            ticks = int(ticks_f)
            starts = [round(Fraction(s.start_s) / tb) for s in segments]
            ends = [None if s.end_s is None else round(Fraction(s.end_s) / tb) for s in segments]

            def owner(pts: int) -> int:
                i = bisect.bisect_right(starts, pts) - 1
                if i < 0:
                    return -1
                end = ends[i]
                return i if end is None or pts < end else -1

            counts = [0] * len(segments)
            for packet in container.demux(stream):
                if packet.pts is None or packet.dts is None:
                    continue
                i = owner(int(packet.pts))
                if i >= 0:
                    counts[i] += 1
            offsets = [0] * len(segments)
            for i in range(1, len(segments)):
                offsets[i] = offsets[i - 1] + counts[i - 1] * ticks
            container.seek(0)
            with open_av(str(output), "w", format="mp4", options={"movflags": "faststart"}) as out:
                out_stream = out.add_stream_from_template(template=stream, opaque=True)
                out_stream.time_base = tb
                for packet in container.demux(stream):
                    if packet.pts is None or packet.dts is None:
                        continue
                    i = owner(int(packet.pts))
                    if i < 0:
                        continue
                    packet.pts = offsets[i] + int(packet.pts) - starts[i]
                    packet.dts = offsets[i] + int(packet.dts) - starts[i]
                    packet.duration = ticks
                    packet.stream = out_stream
                    out.mux(packet)
    except av.FFmpegError as exc:
        raise VideoEncodingError(f"{output}: cutting {path} failed: {exc}") from exc
    return [
        (float(offset * tb), float((offset + count * ticks) * tb), count)
        for offset, count in zip(offsets, counts, strict=True)
    ]


def first_keyframe(segment: Segment) -> float | None:
    """The time of the first key frame inside ``segment`` (None: there is none)."""
    with open_av(str(segment.path)) as container:
        stream = container.streams.video[0]
        if stream.time_base is None:
            return None
        tb = Fraction(stream.time_base)
        start = round(Fraction(segment.start_s) / tb)
        end = None if segment.end_s is None else round(Fraction(segment.end_s) / tb)
        keys = sorted(
            int(p.pts)
            for p in container.demux(stream)
            if p.pts is not None
            and p.size > 0
            and p.is_keyframe
            and p.pts >= start
            and (end is None or p.pts < end)
        )
    return float(keys[0] * tb) if keys else None


def splice_spans(
    output: Path,
    segments: Sequence[Segment],
    *,
    fps: int,
    lengths: Sequence[int],
    settings: VideoSettings | None = None,
) -> tuple[list[tuple[float, float, int]], int]:
    """Like :func:`cut_spans`, but a segment that does not start on a key frame has only its
    head, up to its first key frame, re-encoded (a GOP of its own, as every episode's video
    starts), and the rest copied. Returns the placement and the frames re-encoded.

    The spliced file is decoded whole and its frames counted; if that fails the caller falls
    back to :func:`reencode_spans`.
    """
    pieces: list[Segment] = []
    owner: list[int] = []
    heads: list[Path] = []
    reencoded = 0
    try:
        for i, (segment, length) in enumerate(zip(segments, lengths, strict=True)):
            if starts_on_keyframes([segment]):
                pieces.append(segment)
                owner.append(i)
                continue
            key = first_keyframe(segment)
            cut = segment.end_s if key is None else key
            frames = length if key is None else round((key - segment.start_s) * fps)
            head = output.with_name(f".{output.stem}.head-{i}.mp4")
            heads.append(head)
            reencode_spans(
                head,
                [Segment(segment.path, segment.start_s, cut)],
                fps=fps,
                lengths=[frames],
                settings=settings,
            )
            reencoded += frames
            pieces.append(Segment(head))
            owner.append(i)
            if key is not None:
                pieces.append(Segment(segment.path, key, segment.end_s))
                owner.append(i)
        placed_pieces = concat_segments(output, pieces, fps=fps)
    finally:
        for head in heads:
            head.unlink(missing_ok=True)
    placed: list[tuple[float, float, int]] = []
    for i in range(len(segments)):
        mine = [p for p, o in zip(placed_pieces, owner, strict=True) if o == i]
        placed.append((mine[0][0], mine[-1][1], sum(p[2] for p in mine)))
    decoded = sum(1 for _ in decoded_frames(output))
    if decoded != sum(lengths):
        raise VideoEncodingError(f"{output}: the splice decodes to {decoded} frames of {sum(lengths)}")
    return placed, reencoded


def reencode_spans(
    output: Path,
    segments: Sequence[Segment],
    *,
    fps: int,
    lengths: Sequence[int],
    settings: VideoSettings | None = None,
) -> list[tuple[float, float, int]]:
    """Decode the frames of ``segments`` and encode them into ``output`` back to back.

    ``lengths`` is each segment's frame count (its episode's length), checked against what was
    decoded. ``settings`` defaults to LeRobot's for the source stream's codec.
    """
    first = segments[0].path
    with open_av(str(first)) as container:
        stream = container.streams.video[0]
        codec = stream.codec.canonical_name
        width, height = stream.width, stream.height
    if settings is None:
        encoder_name = ENCODERS.get(codec)
        if encoder_name is None:
            raise VideoEncodingError(f"{first}: cannot re-encode codec {codec!r}")
        settings = VideoSettings(codec=encoder_name)
    encoder = StreamEncoder(output, fps=fps, height=height, width=width, settings=settings)
    placed: list[tuple[float, float, int]] = []
    try:
        frames_total = 0
        for segment, length in zip(segments, lengths, strict=True):
            count = 0
            for ts, frame in decoded_frames(segment.path):
                if ts < segment.start_s - 1e-6:
                    continue
                if segment.end_s is not None and ts >= segment.end_s - 1e-6:
                    break
                encoder.encode(frame.to_ndarray(format="rgb24"))
                count += 1
            if count != length:
                raise VideoEncodingError(
                    f"{segment.path}: {count} frames in [{segment.start_s}, {segment.end_s}), "
                    f"the episode has {length}"
                )
            placed.append((frames_total / fps, (frames_total + count) / fps, count))
            frames_total += count
        encoder.close()
    except BaseException:
        encoder.abort()
        output.unlink(missing_ok=True)
        raise
    return placed


def link_or_copy(src: Path, dst: Path) -> None:
    """``dst`` becomes ``src``'s bytes: a hard link (neither side is ever written in place: every
    writer of a dataset publishes new files by rename), or a copy across file systems."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(src, dst)
    except OSError:
        import shutil

        shutil.copyfile(src, dst)
