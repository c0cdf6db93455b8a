"""A :class:`~hilrec.daemon.dataset.format.sink.FrameSink` backed by LeRobot's own ``LeRobotDataset``.

For users who want the official writer: the frames are validated exactly as the native writer
validates them, then handed to ``LeRobotDataset.add_frame`` / ``save_episode`` /
``clear_episode_buffer`` / ``finalize`` (LeRobot 0.4.4). Sidecars go beside the dataset the same
way as with the native writer (:mod:`hilrec.daemon.dataset.format.sidecar`).

LeRobot is a compatibility extra, never a runtime need: it is imported when a sink is created, and
its absence is a :class:`DatasetError` that says how to install it.

What this sink does *not* inherit from the native writer is crash safety: LeRobot keeps its
parquet writers footerless until :meth:`finalize` and rewrites ``info.json``/``stats.json`` in
place, so a killed process leaves a dataset that needs ``hilrec repair`` or is lost.
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final

import numpy as np

from hilrec.daemon.dataset.format.features import FrameValidator, user_keys, validate_features, video_keys
from hilrec.daemon.dataset.format.sidecar import update_dataset_sidecar, write_episode_sidecar
from hilrec.daemon.errors import DatasetError, DatasetStateError, FrameError

if TYPE_CHECKING:  # LeRobot (with torch) is imported only when a sink is created
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

SUPPORTED_LEROBOT: Final[str] = "0.4.4"
# The native writer names encoders as FFmpeg does; LeRobot 0.4.4 calls libx264 "h264".
_LEROBOT_CODEC_NAMES: Final[dict[str, str]] = {"libx264": "h264"}
# LeRobot stages video frames as PNGs here until save_episode encodes them.
_STAGING_TEMPLATE: Final[str] = "images/{key}/episode-{episode_index:06d}"


def _import_lerobot() -> tuple[type[LeRobotDataset], str]:
    try:
        import lerobot
        from lerobot.datasets.lerobot_dataset import LeRobotDataset
    except ImportError as exc:
        raise DatasetError(
            f"the LeRobot-backed writer needs lerobot=={SUPPORTED_LEROBOT} (a compatibility extra, "
            f"not a runtime dependency): pip install -r requirements-compat.txt && "
            f"pip install --no-deps lerobot=={SUPPORTED_LEROBOT} ({exc})"
        ) from exc
    return LeRobotDataset, str(getattr(lerobot, "__version__", "unknown"))


class LeRobotSink:
    """Frames in, LeRobot v3.0 on disk, written by LeRobot itself."""

    def __init__(
        self,
        dataset: LeRobotDataset,
        *,
        root: Path,
        fps: int,
        features: dict[str, dict[str, Any]],
        robot_type: str | None,
    ) -> None:
        self._dataset = dataset
        self.root = root
        self.fps = fps
        self.features = features
        self.robot_type = robot_type
        self._validator = FrameValidator(features)
        self._video_keys = video_keys(features)
        self._frames_open = 0
        self._finalized = False

    @classmethod
    def create(
        cls,
        root: str | Path,
        *,
        fps: int,
        features: Mapping[str, Mapping[str, Any]],
        robot_type: str | None,
        video_codec: str = "libsvtav1",
        repo_id: str | None = None,
        streaming_encoding: bool = False,
    ) -> LeRobotSink:
        """Create a new dataset at ``root`` (which must not exist, as LeRobot requires).

        ``features`` are the user features (no default columns), as for the native writer.
        ``streaming_encoding`` selects LeRobot's streaming encoder, which drops frames when its
        queue stays full (see the reference notes); the default stages PNGs and encodes at save.
        """
        root = Path(root)
        if isinstance(fps, bool) or not isinstance(fps, int) or fps <= 0:
            raise DatasetError(f"{root}: fps must be a positive int, got {fps!r}")
        if root.exists():
            raise DatasetError(f"{root}: already exists; LeRobot creates a dataset in a new directory")
        full = validate_features(features)
        LeRobotDataset, version = _import_lerobot()
        # LeRobot's frame validation compares shapes as tuples; ours are JSON lists.
        lerobot_features = {
            key: {**spec, "shape": tuple(spec["shape"])}
            for key, spec in full.items()
            if key in user_keys(full)
        }
        try:
            dataset = LeRobotDataset.create(
                repo_id=repo_id or f"hilrec/{root.name}",
                fps=fps,
                features=lerobot_features,
                root=root,
                robot_type=robot_type,
                use_videos=bool(video_keys(full)),
                vcodec=_LEROBOT_CODEC_NAMES.get(video_codec, video_codec),
                streaming_encoding=streaming_encoding,
            )
        except (ValueError, OSError) as exc:
            raise DatasetError(f"{root}: LeRobotDataset.create refused: {exc}") from exc
        update_dataset_sidecar(
            root, {"writer": {"name": "lerobot", "version": version, "video_codec": video_codec}}
        )
        return cls(dataset, root=root, fps=fps, features=full, robot_type=robot_type)

    # --- FrameSink ------------------------------------------------------------------------------

    def add_frame(self, frame: Mapping[str, Any]) -> None:
        self._require_open_dataset("add_frame")
        values, task = self._validator.validate(frame)
        lerobot_frame: dict[str, Any] = dict(values)
        lerobot_frame["task"] = task
        try:
            self._dataset.add_frame(lerobot_frame)
        except ValueError as exc:
            raise FrameError("<frame>", f"LeRobot refused the frame: {exc}") from exc
        self._frames_open += 1

    def save_episode(
        self, *, sidecar: Mapping[str, Any] | None = None, arrays: Mapping[str, np.ndarray] | None = None
    ) -> int:
        self._require_open_dataset("save_episode")
        if not self._frames_open:
            raise DatasetStateError(f"{self.root}: save_episode() with no frame added")
        episode_index = int(self._dataset.meta.total_episodes)
        self._dataset.save_episode()
        self._frames_open = 0
        if sidecar is not None or arrays:
            write_episode_sidecar(self.root, episode_index, sidecar, arrays)
        return episode_index

    def discard_episode(self) -> None:
        if self._finalized or not self._frames_open:
            return
        episode_index = int(self._dataset.meta.total_episodes)
        self._dataset.clear_episode_buffer(delete_images=True)
        # LeRobot 0.4.4 deletes the staged PNGs of image features only; staged video frames would
        # otherwise be encoded into the next episode, which reuses this episode index.
        for key in self._video_keys:
            staging = self.root / _STAGING_TEMPLATE.format(key=key, episode_index=episode_index)
            shutil.rmtree(staging, ignore_errors=True)
        self._frames_open = 0

    def finalize(self) -> None:
        if self._finalized:
            return
        if self._frames_open:
            raise DatasetStateError(
                f"{self.root}: finalize() with an episode open "
                f"({self._frames_open} frames); save or discard it first"
            )
        self._dataset.finalize()
        self._finalized = True

    @property
    def episode_open(self) -> bool:
        return self._frames_open > 0

    @property
    def num_episodes(self) -> int:
        return int(self._dataset.meta.total_episodes)

    # --- context manager ------------------------------------------------------------------------

    def __enter__(self) -> LeRobotSink:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc_type is not None:
            self.discard_episode()
        self.finalize()

    def _require_open_dataset(self, what: str) -> None:
        if self._finalized:
            raise DatasetStateError(f"{self.root}: {what}() after finalize()")
