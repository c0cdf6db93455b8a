"""The writer's commit thread: encoded episodes become durable one at a time, in order.

``save_episode`` and ``save_episode_nowait`` hand a :class:`PendingSave` (an encoded episode) to
:class:`Committer`, whose thread writes its files into the journal, fsyncs them and commits the
episode (:func:`.journal.commit_episode`); the save's future then resolves to the episode_index.
At most ``max_in_flight`` saves wait for the thread: one more blocks :meth:`Committer.submit`, so
encoded episodes cannot pile up in memory behind a slow disk.

A failed commit stops the line: every save queued after it is dropped unwritten (its future
raises the same error), so the journal never has a gap an episode would have to be renumbered
over. What a failed save leaves depends on who waits for it:

- ``save_episode`` (``keep_on_failure``): an ``OSError`` (a full disk) keeps the episode's open
  directory with its staged videos, so the caller can retry once the cause is fixed;
- ``save_episode_nowait``: the caller has moved on to the next episode, so the failed one is
  deleted and the error says its frames are lost.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from hilrec.daemon.dataset import journal
from hilrec.daemon.dataset.encode import EncodedEpisode
from hilrec.daemon.dataset.episode import OpenEpisode
from hilrec.daemon.dataset.journal import Hook
from hilrec.daemon.errors import DatasetError

# Episodes encoded but not yet durable before save_episode_nowait() waits for the commit thread.
MAX_SAVES_IN_FLIGHT: Final[int] = 4


@dataclass(eq=False)
class PendingSave:
    """An encoded episode on its way to the commit thread."""

    episode: OpenEpisode
    encoded: EncodedEpisode
    # save_episode() keeps a failed episode open for a retry; save_episode_nowait() cannot.
    keep_on_failure: bool
    kept: bool = False  # failed, and the episode is kept open for a retry
    skipped: bool = False  # not attempted: an earlier save had failed
    future: Future[int] = field(default_factory=Future)


class Committer:
    """Commits :class:`PendingSave` s on a thread of its own and counts what is durable."""

    def __init__(
        self,
        root: Path,
        *,
        episodes: int,
        frames: int,
        hook: Hook,
        on_committed: Callable[[int], None],
        max_in_flight: int = MAX_SAVES_IN_FLIGHT,
    ) -> None:
        self.root = root
        self.num_episodes = episodes  # durable, merged or not
        self.num_frames = frames
        # The first commit that failed; cleared when a save_episode() caller took it back.
        self.error: BaseException | None = None
        self._hook = hook
        self._on_committed = on_committed
        self._saves: queue.Queue[PendingSave | None] = queue.Queue()  # None stops the thread
        self._in_flight = threading.BoundedSemaphore(max_in_flight)
        self._thread = threading.Thread(target=self._loop, name="episode-commit", daemon=True)
        self._thread.start()

    def submit(self, save: PendingSave) -> None:
        """Queue ``save``; blocks while ``max_in_flight`` saves are waiting."""
        self._in_flight.acquire()
        self._saves.put(save)

    def wait(self) -> None:
        """Block until every save submitted so far is committed (or has failed)."""
        self._saves.join()

    def stop(self) -> None:
        """Commit what is queued, then end the thread."""
        if self._thread.is_alive():
            self._saves.put(None)
            self._thread.join()

    def _loop(self) -> None:
        while True:
            save = self._saves.get()
            try:
                if save is None:
                    return
                self._commit(save)
            finally:
                if save is not None:
                    self._in_flight.release()
                self._saves.task_done()

    def _commit(self, save: PendingSave) -> None:
        episode = save.episode
        if self.error is not None:  # never commit past a failed episode: no gaps
            journal.remove_dir(episode.directory)
            save.skipped = True
            save.future.set_exception(self.error)
            return
        files = save.encoded.files
        try:
            journal.commit_episode(
                self.root, episode.index, files=files, beside=save.encoded.beside, hook=self._hook
            )
        except BaseException as exc:  # noqa: BLE001 - handed to the caller through the future
            for name in files:
                (episode.directory / name).unlink(missing_ok=True)
            error = self._failure(save, exc)
            self.error = error
            save.future.set_exception(error)
            return
        if self._hook is not None:
            self._hook("committed")
        self.num_episodes += 1
        self.num_frames += episode.length
        self._on_committed(episode.index)
        save.future.set_result(episode.index)

    def _failure(self, save: PendingSave, exc: BaseException) -> BaseException:
        """What the caller is told, after keeping or deleting the episode's open directory."""
        episode = save.episode
        if save.keep_on_failure and isinstance(exc, OSError):
            save.kept = True
            error = DatasetError(
                f"{self.root}: saving episode {episode.index} failed ({exc}); it is still "
                f"open with its {episode.length} frames: call save_episode() again once the "
                "cause is fixed, or discard_episode()"
            )
            error.__cause__ = exc
            return error
        journal.remove_dir(episode.directory)
        if save.keep_on_failure:
            return exc
        error = DatasetError(
            f"{self.root}: saving episode {episode.index} failed "
            f"({exc}); its frames are lost, the episodes saved "
            "before it are kept"
        )
        error.__cause__ = exc
        return error
