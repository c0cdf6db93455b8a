"""The one frame interface every dataset writer implements.

The recording loop talks to a :class:`FrameSink` only, so the native writer
(:class:`hilrec.daemon.dataset.writer.dataset_writer.DatasetWriter`) and the LeRobot-backed one
(:class:`hilrec.daemon.dataset.writer.lerobot_sink.LeRobotSink`) are interchangeable.

Lifecycle: ``create`` (a classmethod of each implementation) -> ``add_frame`` ... ->
``save_episode`` or ``discard_episode`` -> ... -> ``finalize``. A sink is also a context manager:
a normal exit finalizes; an exception discards the open episode and then finalizes, so saved
episodes are never lost either way.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np


@runtime_checkable
class FrameSink(Protocol):
    root: Path
    fps: int
    features: dict

    def add_frame(self, frame: Mapping[str, Any]) -> None:
        """Accept one frame: every declared feature key (no defaults) plus ``"task"``."""
        ...

    def save_episode(
        self, *, sidecar: Mapping[str, Any] | None = None, arrays: Mapping[str, np.ndarray] | None = None
    ) -> int:
        """Make the open episode durable and return its episode_index."""
        ...

    def discard_episode(self) -> None:
        """Drop the open episode's frames (no-op when none is open)."""
        ...

    def finalize(self) -> None:
        """Close the dataset; refuses while an episode is open; a second call is harmless."""
        ...

    @property
    def episode_open(self) -> bool: ...

    @property
    def num_episodes(self) -> int: ...
