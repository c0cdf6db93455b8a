"""Camera frames to mp4: a streaming encoder per episode, probing, and stream-copy concatenation.

Frames go into a PyAV encoder on a background thread as they arrive, so ``add_frame`` only copies
the frame and enqueues it (no PNG staging, no encoding on the caller's thread). Each frame gets
``pts = frame_index`` in a ``1/fps`` time base, so the mp4 has exactly one frame per row on the
``1/fps`` grid.

A frame is never dropped. If the encoder falls so far behind that its queue would exceed its
memory bound, :meth:`EpisodeVideoEncoder.put` raises :class:`VideoEncodingError` instead, and an
encoder failure on the thread is raised at the next ``put`` or ``finish``.

:func:`probe_video` is the one probe of a file's stream (frame count and times, size, codec, rate),
for the writer, the merge, the repair and the checker alike; it reads the rate as LeRobot does.

:func:`concat_segments` builds LeRobot's multi-episode files by copying packets (no re-encode),
shifting each segment's timestamps to follow the previous one.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import queue
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from fractions import Fraction
from pathlib import Path
from typing import Any, Final

import av
import numpy as np

from hilrec.daemon.dataset.video.avlog import open_av
from hilrec.daemon.dataset.video.codec_threads import CodecThreads
from hilrec.daemon.errors import CorruptDatasetError, EncoderBehindError, VideoEncodingError

log = logging.getLogger(__name__)

# hevc is offered only where PyAV's FFmpeg has libx265.
SUPPORTED_CODECS: Final[frozenset[str]] = frozenset({"libsvtav1", "libx264", "libx265"})
# LeRobot's names for the same encoders (its ``vcodec``): accepted and mapped.
CODEC_ALIASES: Final[dict[str, str]] = {"h264": "libx264", "hevc": "libx265", "av1": "libsvtav1"}
DEFAULT_MAX_QUEUE_BYTES: Final[int] = 256 * 1024 * 1024
# SVT-AV1 prints its whole configuration on every encoder open unless told otherwise.
os.environ.setdefault("SVT_LOG", "1")


@dataclass(frozen=True, kw_only=True)
class VideoSettings:
    """Encoder settings. The defaults are LeRobot's, read from its source (0.4.4
    ``datasets/video_utils.py``: ``_get_codec_options`` and ``encode_video_frames``; 0.6.1
    ``configs/video.py``: ``VideoEncoderConfig``): ``vcodec="libsvtav1"``, ``pix_fmt="yuv420p"``,
    ``g=2``, ``crf=30``, ``preset=12`` (``LIBSVTAV1_DEFAULT_PRESET``; libsvtav1 only). 0.6.1 also
    passes ``svtav1-params=fast-decode=0``, SVT-AV1's own default, so the bitstream is the same.
    For h264/hevc LeRobot passes only ``g`` and ``crf`` (x264/x265 default preset); hilrec adds
    ``bf=0`` there (no B-frames: pts == dts, so segments concatenate by a plain timestamp shift)."""

    codec: str = "libsvtav1"
    pix_fmt: str = "yuv420p"
    g: int = 2
    crf: int = 30
    preset: int = 12

    def __post_init__(self) -> None:
        codec = CODEC_ALIASES.get(self.codec, self.codec)
        if codec != self.codec:
            object.__setattr__(self, "codec", codec)
        if self.codec not in SUPPORTED_CODECS:
            raise VideoEncodingError(f"video codec {self.codec!r} is not one of {sorted(SUPPORTED_CODECS)}")
        if self.codec not in av.codecs_available:
            raise VideoEncodingError(f"video codec {self.codec!r} is not in this PyAV/FFmpeg build")

    def options(self) -> dict[str, str]:
        options = {"g": str(self.g), "crf": str(self.crf)}
        if self.codec == "libsvtav1":
            options["preset"] = str(self.preset)
        else:
            # No B-frames: pts == dts, so segments concatenate by a plain timestamp shift.
            options["bf"] = "0"
            if self.codec == "libx265":
                options["x265-params"] = "bframes=0:log-level=error"
        return options

    def provenance(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "codec": self.codec,
            "pix_fmt": self.pix_fmt,
            "g": self.g,
            "crf": self.crf,
            "pyav": av.__version__,
        }
        if self.codec == "libsvtav1":
            out["preset"] = self.preset
        return out

    def to_json(self) -> dict[str, Any]:
        """What a spill records, for the encode to be finished later with the same settings."""
        return {
            "codec": self.codec,
            "pix_fmt": self.pix_fmt,
            "g": self.g,
            "crf": self.crf,
            "preset": self.preset,
        }

    @classmethod
    def from_json(cls, payload: Any) -> VideoSettings:
        if not isinstance(payload, dict):
            raise VideoEncodingError(f"video settings {payload!r} are not a JSON object")
        return cls(**{k: payload[k] for k in ("codec", "pix_fmt", "g", "crf", "preset") if k in payload})


# The first frames, during which a codec starts its threads, are each followed by a look for new
# real-time threads; after them, one frame a second is (a look costs ~0.1 ms).
CODEC_WATCH_FRAMES: Final[int] = 32


# An open episode's mp4: a moov first and a fragment per keyframe (LeRobot's g=2: every other
# frame), each written through at once, so a killed writer leaves a file readable up to its last
# whole fragment (a plain mp4's index is written only at its close). The merge remuxes it into
# LeRobot's plain files (concat_segments).
FRAGMENTED_MP4: Final[dict[str, str]] = {
    "movflags": "frag_keyframe+empty_moov+default_base_moof",
    "flush_packets": "1",
}


class StreamEncoder:
    """One mp4 being encoded: the one encode routine of the thread encoder, the encoder process
    and the finishing of a spilled encode, so all three write the same bytes."""

    def __init__(
        self,
        path: Path,
        *,
        fps: int,
        height: int,
        width: int,
        settings: VideoSettings,
        make_dirs: bool = True,
        file: Any = None,
        fragmented: bool = False,
    ) -> None:
        self.path = path
        self.fps = fps
        self.frames = 0
        # Packets handed to the muxer (behind ``frames`` by the codec's delay), and with
        # ``fragmented`` those in the file: a fragment is written when the next keyframe
        # starts one, so the packets before the last keyframe muxed (see FRAGMENTED_MP4).
        self.muxed = 0
        self.in_file = 0
        if make_dirs:
            path.parent.mkdir(parents=True, exist_ok=True)
        # ``file``: an open binary file to write (FFmpeg opens a path only at the first packet,
        # which may be after the episode's directory was renamed); same muxer, same bytes.
        self._file = file
        self._codec_threads = CodecThreads()  # on the thread that encodes, before the codec opens
        self._container = open_av(
            file if file is not None else str(path),
            "w",
            format="mp4",
            options=dict(FRAGMENTED_MP4) if fragmented else {},
        )
        try:
            stream = self._container.add_stream(settings.codec, rate=fps, options=settings.options())
            if not isinstance(stream, av.VideoStream):
                raise VideoEncodingError(f"{path}: {settings.codec} is not a video codec")
            stream.width = width
            stream.height = height
            stream.pix_fmt = settings.pix_fmt
            stream.time_base = Fraction(1, fps)
        except BaseException:
            self._container.close()
            raise
        self._stream = stream

    def encode(self, image: np.ndarray) -> None:
        frame = av.VideoFrame.from_ndarray(image, format="rgb24")
        frame.pts = self.frames
        frame.time_base = Fraction(1, self.fps)
        for packet in self._stream.encode(frame):
            if packet.is_keyframe:
                self.in_file = self.muxed
            self._container.mux(packet)
            self.muxed += 1
        if self.frames < CODEC_WATCH_FRAMES or self.frames % self.fps == 0:
            # The codec starts its threads from the first frame on, some lazily: keep them out of
            # real-time scheduling (SVT-AV1 asks for FIFO 99 wherever it may; see codec_threads).
            self._codec_threads.settle()
        self.frames += 1

    def close(self) -> int:
        self._codec_threads.settle()
        for packet in self._stream.encode(None):
            self._container.mux(packet)
        self._container.close()
        if self._file is not None:
            self._file.flush()
            os.fsync(self._file.fileno())  # durable before the caller is told it is done
            self._file.close()
        return self.frames

    def abort(self) -> None:
        """Close without finishing the file (the caller deletes it)."""
        with contextlib.suppress(Exception):
            # The end of stream first: SVT-AV1 prints "deinit called without sending EOS!" on
            # fd 2 when its encoder is freed without one. The flushed packets are not muxed.
            for _packet in self._stream.encode(None):
                pass
        with contextlib.suppress(Exception):
            self._container.close()
        if self._file is not None:
            with contextlib.suppress(Exception):
                self._file.close()


class EpisodeVideoEncoder:
    """Encodes one camera's frames of one episode into ``path`` on a background thread."""

    def __init__(
        self,
        path: Path,
        *,
        key: str,
        episode_index: int,
        fps: int,
        height: int,
        width: int,
        settings: VideoSettings,
        max_queue_bytes: int = DEFAULT_MAX_QUEUE_BYTES,
    ) -> None:
        self.path = path
        self.key = key
        self.episode_index = episode_index
        self.fps = fps
        self.height = height
        self.width = width
        self.settings = settings
        frame_bytes = height * width * 3
        self.max_queued = max(2, max_queue_bytes // frame_bytes)
        # None is the end of the episode.
        self._queue: queue.Queue[np.ndarray | None] = queue.Queue(maxsize=self.max_queued + 1)
        self._error: BaseException | None = None
        self._aborted = False
        self.frames_in = 0
        self.frames_encoded = 0
        self._stream: StreamEncoder | None = None
        self._thread = threading.Thread(target=self._run, name=f"encode-{key}-{episode_index}", daemon=True)
        self._thread.start()

    def _where(self) -> str:
        return f"video '{self.key}' episode {self.episode_index} ({self.path})"

    @property
    def frames_in_file(self) -> int:
        """Frames in the (fragmented) file so far: durable once the file is fsynced."""
        stream = self._stream
        return stream.in_file if stream is not None else 0

    @property
    def full(self) -> bool:
        """Whether the queue is at its bound: :meth:`put` would raise."""
        return self._queue.qsize() >= self.max_queued

    @property
    def running(self) -> bool:
        """Whether the encoding thread still takes frames (it has not failed or ended)."""
        return self._thread.is_alive() and self._error is None

    def check_room(self) -> None:
        """Raise :class:`EncoderBehindError` when the queue is at its bound: asked of every camera
        before any takes the frame, so a take that ends there ends whole, on every camera."""
        behind = self._queue.qsize()
        if behind >= self.max_queued:
            raise EncoderBehindError(
                f"{self._where()}: the encoder is {behind} frames behind (its queue's bound, "
                f"{self.max_queued} frames); the take ends at frame {self.frames_in} and is saved "
                '(the encoder processes, video_encoder = "process", spill instead)'
            )

    def put(self, frame: np.ndarray) -> None:
        """Enqueue a copy of ``frame`` (H, W, 3) uint8; raise rather than drop it."""
        self.raise_if_failed()
        if self._queue.qsize() >= self.max_queued:
            raise VideoEncodingError(
                f"{self._where()}: encoder is {self._queue.qsize()} frames behind (bound "
                f"{self.max_queued}); refusing to drop frame {self.frames_in}"
            )
        self._queue.put_nowait(np.array(frame, dtype=np.uint8, copy=True, order="C"))
        self.frames_in += 1

    def finish(self, timeout: float | None = None) -> int:
        """Flush and close the file; return the number of frames encoded."""
        self.raise_if_failed()
        self._queue.put(None)
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise VideoEncodingError(f"{self._where()}: encoder did not finish within {timeout} s")
        self.raise_if_failed()
        if self.frames_encoded != self.frames_in:
            raise VideoEncodingError(
                f"{self._where()}: encoded {self.frames_encoded} frames of {self.frames_in}"
            )
        return self.frames_encoded

    def abort(self) -> None:
        """Stop encoding and delete the partial file (discarding the episode)."""
        self._aborted = True
        while True:
            try:
                self._queue.get_nowait()
            except queue.Empty:
                break
        self._queue.put(None)
        self._thread.join()
        self.path.unlink(missing_ok=True)

    def raise_if_failed(self) -> None:
        if self._error is not None:
            lost = ""
            if isinstance(self._error, OSError) and self._error.errno in (errno.ENOSPC, errno.EDQUOT):
                lost = (
                    "; the disk is full: this episode's frames cannot be kept and are lost, the "
                    "episodes saved before are not affected; free space before the next take"
                )
            raise VideoEncodingError(f"{self._where()}: encoder failed: {self._error}{lost}") from self._error

    def _run(self) -> None:
        encoder: StreamEncoder | None = None
        try:
            encoder = StreamEncoder(
                self.path,
                fps=self.fps,
                height=self.height,
                width=self.width,
                settings=self.settings,
                fragmented=True,
            )
            self._stream = encoder
            while True:
                item = self._queue.get()
                if item is None:
                    break
                if self._aborted:
                    continue
                encoder.encode(item)
                self.frames_encoded += 1
            if not self._aborted:
                encoder.close()
            else:
                encoder.abort()
            encoder = None
        except BaseException as exc:  # noqa: BLE001 - surfaced to the caller at the next put/finish
            self._error = exc
            log.error("%s: encoder failed: %s", self._where(), exc)
        finally:
            if encoder is not None:
                # The first error is the one reported; a failing close after it adds nothing.
                encoder.abort()


# --- probing -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class VideoProbe:
    """What a video file's first video stream says about itself, without decoding a frame.

    ``fps`` is the stream's ``base_rate`` (FFmpeg's ``r_frame_rate``): LeRobot's ``get_video_info``
    stores ``int(base_rate)`` as ``video.fps``, so the writer and the checker read the rate LeRobot
    reads. ``pts`` holds one value per packet that carries a frame, in demux order.
    """

    path: Path
    codec: str
    pix_fmt: str | None
    width: int
    height: int
    fps: Fraction | None
    has_audio: bool
    time_base: Fraction
    pts: tuple[int, ...]

    @property
    def frames(self) -> int:
        return len(self.pts)

    @property
    def num_frames(self) -> int:
        return len(self.pts)

    @property
    def frame_timestamps(self) -> np.ndarray:
        """Presentation times in seconds, float64, sorted."""
        return np.sort(np.asarray(self.pts, dtype=np.float64) * float(self.time_base))

    @property
    def duration_s(self) -> float:
        """Frames times the frame duration (0.0 without a frame rate)."""
        if not self.fps:
            return 0.0
        return float(self.frames * _frame_ticks(self.time_base, int(self.fps)) * self.time_base)


def probe_video(path: str | os.PathLike[str]) -> VideoProbe:
    """Stream parameters and every frame's presentation time (demuxed, not decoded)."""
    path = Path(path)
    if not path.exists():
        raise CorruptDatasetError(str(path), "missing")
    try:
        with open_av(str(path)) as container:
            if not container.streams.video:
                raise CorruptDatasetError(str(path), "has no video stream")
            stream = container.streams.video[0]
            pts = tuple(
                int(packet.pts)
                for packet in container.demux(stream)
                if packet.pts is not None and packet.size > 0
            )
            probe = VideoProbe(
                path=path,
                codec=stream.codec.canonical_name,
                pix_fmt=stream.pix_fmt,
                width=stream.width,
                height=stream.height,
                fps=Fraction(stream.base_rate) if stream.base_rate else None,
                has_audio=bool(container.streams.audio),
                time_base=stream_time_base(stream, path),
                pts=pts,
            )
    except (av.FFmpegError, OSError) as exc:
        raise CorruptDatasetError(str(path), f"unreadable video: {exc}") from exc
    return probe


def stream_time_base(stream: av.VideoStream, path: Path) -> Fraction:
    # Typed optional for a stream being set up; a demuxed one always has it.
    if stream.time_base is None:
        raise CorruptDatasetError(str(path), "video stream has no time base")
    return Fraction(stream.time_base)


class LeRobotInfo(StrEnum):
    """Which LeRobot's spelling a video feature's ``info`` follows. A LeRobot merges datasets only
    when their ``info`` agree (0.4.4's ``aggregate_datasets`` compares all of it, 0.6.1's all but
    the encoder settings), and the two spell the depth flag differently."""

    V0_4 = "0.4"  # "video.is_depth_map", 0.4.4's get_video_info
    V0_6 = "0.6"  # "is_depth_map", 0.6.1's (it still reads the old key when loading)

    @property
    def depth_key(self) -> str:
        return "video.is_depth_map" if self == LeRobotInfo.V0_4 else "is_depth_map"

    @classmethod
    def of(cls, info: object) -> LeRobotInfo | None:
        """The spelling ``info`` uses; None where it has no depth flag."""
        if not isinstance(info, dict):
            return None
        return next((s for s in (cls.V0_6, cls.V0_4) if s.depth_key in info), None)


def video_info(probe: VideoProbe, spelling: LeRobotInfo = LeRobotInfo.V0_4) -> dict[str, Any]:
    """The ``info`` block LeRobot stores for a video feature (its ``get_video_info`` keys, in
    its order), as the LeRobot of ``spelling`` writes it."""
    info: dict[str, Any] = {
        "video.height": probe.height,
        "video.width": probe.width,
        "video.codec": probe.codec,
        "video.pix_fmt": probe.pix_fmt,
    }
    if spelling == LeRobotInfo.V0_4:
        info[spelling.depth_key] = False
    info["video.fps"] = int(probe.fps) if probe.fps else 0
    info["video.channels"] = 3
    info["has_audio"] = probe.has_audio
    if spelling == LeRobotInfo.V0_6:
        info[spelling.depth_key] = False
    return info


def _frame_ticks(time_base: Fraction, fps: int) -> int:
    ticks = Fraction(1, fps) / time_base
    if ticks.denominator != 1:
        raise VideoEncodingError(f"time base {time_base} cannot hold a 1/{fps} s frame grid")
    return int(ticks)


# --- concatenation -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Segment:
    """Frames of ``path`` with ``start_s <= t < end_s`` (``end_s=None``: to the end)."""

    path: Path
    start_s: float = 0.0
    end_s: float | None = None


def concat_segments(
    output: Path,
    segments: Sequence[Segment],
    *,
    fps: int,
) -> list[tuple[float, float, int]]:
    """Write ``segments`` back to back into ``output`` (a temp path is the caller's business).

    Returns ``(from_s, to_s, frames)`` of each segment inside ``output``. Packets are copied, not
    re-encoded; timestamps are shifted so that segment k starts where k-1 ended, on the 1/fps grid.
    """
    if not segments:
        raise VideoEncodingError(f"{output}: nothing to concatenate")
    placed: list[tuple[float, float, int]] = []
    inputs = [open_av(str(s.path)) for s in segments]
    try:
        template = inputs[0].streams.video[0]
        out_tb = stream_time_base(template, segments[0].path)
        ticks = _frame_ticks(out_tb, fps)
        with open_av(str(output), "w", format="mp4", options={"movflags": "faststart"}) as out:
            out_stream = out.add_stream_from_template(template=template, opaque=True)
            out_stream.time_base = out_tb
            offset = 0
            for segment, container in zip(segments, inputs, strict=True):
                stream = container.streams.video[0]
                in_tb = stream_time_base(stream, segment.path)
                start = round(Fraction(segment.start_s) / in_tb)
                end = None if segment.end_s is None else round(Fraction(segment.end_s) / in_tb)
                count = 0
                for packet in container.demux(stream):
                    if packet.pts is None or packet.dts is None:
                        continue
                    if packet.pts < start or (end is not None and packet.pts >= end):
                        continue
                    shift = round((packet.pts - start) * in_tb / out_tb)
                    dts_shift = round((packet.dts - start) * in_tb / out_tb)
                    packet.pts = offset + shift
                    packet.dts = offset + dts_shift
                    packet.duration = ticks
                    packet.stream = out_stream
                    out.mux(packet)
                    count += 1
                placed.append((float(offset * out_tb), float((offset + count * ticks) * out_tb), count))
                offset += count * ticks
    except av.FFmpegError as exc:
        raise VideoEncodingError(f"{output}: concatenation failed: {exc}") from exc
    finally:
        for container in inputs:
            container.close()
    return placed
