"""The episode being recorded: its numeric rows in memory, its camera frames in the encoders.

An :class:`OpenEpisode` lives in the journal's open directory (``.episode-NNNNNN.tmp/``, see
:mod:`.journal`) from its first frame until it is committed or discarded:

- numeric values are copied into one list per key, because the caller may reuse its arrays for
  the next frame;
- each camera's frames stream into an :class:`~.video.EpisodeVideoEncoder` that writes the
  episode's mp4 into the open directory on a thread of its own, and into an
  :class:`~.stats.ImageSampler` that keeps what the image stats need, so nothing is decoded at
  save time.

:meth:`OpenEpisode.finish_videos` closes the encoders and checks that every file holds exactly one
frame per row. From then on no frame can be added. Once encoded, :meth:`OpenEpisode.release_frames`
drops what the encoded bytes now carry; a save that fails after that keeps the finished videos in
the open directory, and the retry commits them with the same bytes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TypedDict

import numpy as np

from hilrec.daemon.dataset import journal
from hilrec.daemon.dataset.features import video_keys
from hilrec.daemon.dataset.stats import ImageSampler, Stats
from hilrec.daemon.dataset.video import EpisodeVideoEncoder, VideoSettings, probe_video
from hilrec.daemon.errors import VideoEncodingError


class VideoSummary(TypedDict):
    """What ``episode.json`` records of one camera's staged mp4."""

    frames: int
    duration_s: float


class OpenEpisode:
    """Frames of the episode being recorded (see the module docstring)."""

    def __init__(self, index: int, directory: Path, numeric_keys: Sequence[str]) -> None:
        self.index = index
        self.directory = directory
        self.values: dict[str, list[np.ndarray]] = {key: [] for key in numeric_keys}
        self.tasks: list[str] = []
        self.encoders: dict[str, EpisodeVideoEncoder] = {}
        self.samplers: dict[str, ImageSampler] = {}
        # Set once the encoders are closed (by a save attempt): no frame may be added after that.
        self.videos: dict[str, VideoSummary] | None = None

    @classmethod
    def start(
        cls,
        root: Path,
        index: int,
        *,
        features: Mapping[str, Mapping[str, Any]],
        numeric_keys: Sequence[str],
        fps: int,
        settings: VideoSettings,
        max_queue_bytes: int,
    ) -> OpenEpisode:
        """A fresh open directory for episode ``index`` with one running encoder per camera.

        A directory of that name left by an earlier attempt is removed first.
        """
        directory = journal.open_episode_dir(root, index)
        if directory.exists():
            journal.remove_dir(directory)
        directory.mkdir(parents=True)
        episode = cls(index, directory, numeric_keys)
        try:
            for key in video_keys(features):
                height, width, _ = features[key]["shape"]
                episode.encoders[key] = EpisodeVideoEncoder(
                    directory / journal.video_file_name(key),
                    key=key,
                    episode_index=index,
                    fps=fps,
                    height=height,
                    width=width,
                    settings=settings,
                    max_queue_bytes=max_queue_bytes,
                )
                episode.samplers[key] = ImageSampler()
        except BaseException:
            episode.discard()
            raise
        return episode

    @property
    def length(self) -> int:
        return len(self.tasks)

    @property
    def finished(self) -> bool:
        """Whether the videos are closed (a save was attempted): frames can no longer be added."""
        return self.videos is not None

    def add(self, values: Mapping[str, np.ndarray], task: str) -> None:
        """Append one validated frame (see :class:`~.features.FrameValidator`)."""
        for encoder in self.encoders.values():
            encoder.raise_if_failed()
        for key, column in self.values.items():
            column.append(np.array(values[key], copy=True))
        for key, encoder in self.encoders.items():
            encoder.put(values[key])
            self.samplers[key].add(values[key])
        self.tasks.append(task)

    def finish_videos(self) -> dict[str, VideoSummary]:
        """Close the encoders (once) and check each mp4 holds one frame per row."""
        if self.videos is not None:
            return self.videos
        n = self.length
        videos: dict[str, VideoSummary] = {}
        for key, encoder in self.encoders.items():
            encoded = encoder.finish()
            probe = probe_video(encoder.path)
            if encoded != n or probe.frames != n:
                raise VideoEncodingError(
                    f"video '{key}' episode {self.index}: "
                    f"{probe.frames} frames in {encoder.path} for {n} rows"
                )
            videos[key] = {"frames": probe.frames, "duration_s": probe.duration_s}
        self.videos = videos
        return videos

    def columns(self) -> dict[str, np.ndarray]:
        """The numeric values by key, frame axis first: ``(n, d)``."""
        return {key: np.stack(column) for key, column in self.values.items()}

    def image_stats(self) -> dict[str, Stats]:
        """Each camera's image stats, from the frames its sampler kept."""
        return {key: sampler.stats() for key, sampler in self.samplers.items()}

    def release_frames(self) -> None:
        """Drop the rows and image samples once the episode is encoded (its bytes carry them):
        an episode held for a retry (see :mod:`.commit`) keeps only its length and its videos."""
        for column in self.values.values():
            column.clear()
        self.samplers.clear()

    def discard(self) -> None:
        """Stop the encoders and delete the open directory with everything in it."""
        for encoder in self.encoders.values():
            encoder.abort()
        journal.remove_dir(self.directory)
