"""A FrameSink that hands every call to one writer thread, so simulation and disk overlap.

A sim recording is CPU-bound (physics, planning, rendering) while a save is mostly waiting on
fsync. Run in line, a save's durability costs about as much wall time as simulating the next
episode; on a thread it costs almost none. Calls reach the wrapped sink in the order they were
made, on one thread, and nothing is dropped: the queue is bounded and a full queue makes the
caller wait. The first error the writer thread meets is raised by every later call made here
and by :meth:`finalize`, which still closes the sink so the episodes saved before are merged.

``save_episode`` returns the index the episode will get (episodes are numbered in order); if
saving it fails, the failure is raised from the next call.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from hilrec.daemon.dataset.sink import FrameSink
from hilrec.daemon.errors import DatasetStateError

log = logging.getLogger(__name__)
_STOP = object()


class PipelinedSink:
    """Wraps ``sink`` (already created); lifecycle is the sink's, plus the thread it owns."""

    def __init__(self, sink: FrameSink, *, max_queued: int = 256,
                 copy_frames: bool = True) -> None:
        """``copy_frames=False`` when the caller never touches a frame's arrays again (the twin
        returns fresh arrays), which saves a copy of every image."""
        self._sink = sink
        self._copy_frames = copy_frames
        self.root: Path = sink.root
        self.fps: int = sink.fps
        self.features: dict = sink.features
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=max_queued)
        self._error: BaseException | None = None
        self._episode_open = False
        self._next_index = sink.num_episodes
        self._finalized = False
        self._thread = threading.Thread(target=self._run, name="sim-writer", daemon=True)
        self._thread.start()

    # --- FrameSink --------------------------------------------------------------------------

    @property
    def episode_open(self) -> bool:
        return self._episode_open

    @property
    def num_episodes(self) -> int:
        return self._next_index

    def add_frame(self, frame: Mapping[str, Any]) -> None:
        # The caller may reuse its arrays once this returns: the sink copies only when it runs.
        snapshot = {k: (np.array(v, copy=True) if isinstance(v, np.ndarray) else v)
                    for k, v in frame.items()} if self._copy_frames else dict(frame)
        self._submit(self._sink.add_frame, snapshot)
        self._episode_open = True

    def save_episode(self, *, sidecar: Mapping[str, Any] | None = None,
                     arrays: Mapping[str, np.ndarray] | None = None) -> int:
        if not self._episode_open:
            raise DatasetStateError(f"{self.root}: save_episode() with no frames added")
        self._submit(lambda: self._sink.save_episode(sidecar=sidecar, arrays=arrays))
        self._episode_open = False
        index = self._next_index
        self._next_index += 1
        return index

    def discard_episode(self) -> None:
        if self._error is None and not self._finalized:
            self._submit(self._sink.discard_episode)
        self._episode_open = False

    def finalize(self) -> None:
        """Drain the queue, stop the thread, then finalize the sink on this thread."""
        if self._finalized:
            return
        self._finalized = True
        self._queue.put(_STOP)
        self._thread.join()
        if self._error is None:
            self._sink.finalize()
            return
        # Saved episodes must still be merged: close the sink, then report what went wrong.
        try:
            self._sink.discard_episode()
            self._sink.finalize()
        except Exception:
            log.exception("%s: finalize after a writer error failed", self.root)
        raise self._error

    def call(self, function: Callable[[], Any]) -> None:
        """Run ``function`` on the writer thread, after every call made before it."""
        self._submit(function)

    def __enter__(self) -> PipelinedSink:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        if exc_type is not None:
            self.discard_episode()
            try:
                self.finalize()
            except Exception:  # the original exception is the one to report
                pass
            return
        self.finalize()

    # --- the writer thread --------------------------------------------------------------------

    def _submit(self, function: Callable[..., Any], *args: Any) -> None:
        if self._finalized:
            raise DatasetStateError(f"{self.root}: the sink is finalized")
        if self._error is not None:
            raise self._error
        self._queue.put((function, args))

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is _STOP:
                return
            if self._error is not None:
                continue  # drain: after a failure only the error matters
            function, args = item
            try:
                function(*args)
            except BaseException as exc:  # handed to the caller's thread
                self._error = exc
