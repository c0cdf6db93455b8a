"""The writer's commit thread: encoded episodes become durable one at a time, in order.

``save_episode`` and ``save_episode_nowait`` hand a :class:`PendingSave` (an encoded episode) to
:class:`Committer`, whose thread writes its files into the journal, fsyncs them and commits the
episode (:func:`.journal.commit_episode`); the save's future then resolves to the episode_index.
At most ``max_in_flight`` saves wait for the thread: one more blocks :meth:`Committer.submit`, so
encoded episodes cannot pile up in memory behind a slow disk.

Commits never overtake each other, so the journal never has a gap an episode would have to be
renumbered over. What a failed commit leaves depends on why it failed:

- an ``OSError`` (a full disk, a quota): the episode is *held*. Its open directory keeps its
  staged videos, its encoded rows and sidecar stay in memory (a few kB per second of recording),
  and its future raises a :class:`DatasetError` that says so. A held episode is committed again,
  with the numbers it was given, before anything after it: at the next save, every few seconds
  on its own once the file system has room again (:class:`hilrec.daemon.backoff.Backoff`: 2 s,
  doubling to a minute), by :meth:`Committer.retry` (``DatasetWriter.retry_failed``), and a last
  time at :meth:`Committer.stop` (``finalize``). A save queued while an episode is held waits
  behind it, held too (its future says which episode it waits for). Only ``stop`` gives up: the
  episodes still held then are *lost*, deleted with what they published, and :attr:`lost`
  says so. Recording goes on meanwhile: a held episode never costs the next take.
- anything else (a bug, a broken file): the episode is deleted. Its ``save_episode`` caller takes
  its numbers back and goes on; after a ``save_episode_nowait`` the line stops (:attr:`error`):
  every later save is dropped unwritten with the same error.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from hilrec.daemon.atomic import fsync_dir, temp_path
from hilrec.daemon.backoff import Backoff
from hilrec.daemon.dataset.store import journal
from hilrec.daemon.dataset.store.journal import Hook
from hilrec.daemon.dataset.writer.checkpoint import ROWS_PREFIX
from hilrec.daemon.dataset.writer.encode import EncodedEpisode
from hilrec.daemon.dataset.writer.episode import OpenEpisode
from hilrec.daemon.errors import DatasetError

log = logging.getLogger(__name__)

# Episodes encoded but not yet durable before save_episode_nowait() waits for the commit thread.
MAX_SAVES_IN_FLIGHT: Final[int] = 4
# Held episodes are retried on their own after this long, then twice as long each time.
# A retry on its own is only tried when the file system has the episode's bytes plus this free.
RETRY_SLACK_BYTES: Final[int] = 1024 * 1024


@dataclass(eq=False)
class PendingSave:
    """An encoded episode on its way to the commit thread."""

    episode: OpenEpisode
    encoded: EncodedEpisode
    # save_episode() waits for its save and takes a failure's numbers back; _nowait() cannot.
    waited: bool
    held: bool = False  # failed with an OSError (or waits behind one): kept for a retry
    skipped: bool = False  # not attempted: the line had stopped
    future: Future[int] = field(default_factory=Future)
    reason: str = ""  # why it is held

    @property
    def index(self) -> int:
        return self.episode.index

    @property
    def size(self) -> int:
        """Bytes the commit still has to write (the staged videos are on disk already)."""
        return sum(map(len, self.encoded.files.values())) + sum(map(len, self.encoded.beside.values()))


@dataclass(eq=False)
class _Retry:
    """A request to commit the held episodes now; resolves to the indices made durable."""

    future: Future[list[int]] = field(default_factory=Future)


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
        # A failure that stopped the line (not an OSError, after save_episode_nowait); cleared
        # when a save_episode() caller took it back.
        self.error: BaseException | None = None
        # Episodes given up at stop() (still held then): (index, frames, reason).
        self.lost: list[tuple[int, int, str]] = []
        self._held: list[PendingSave] = []  # in order; changed on the commit thread only
        self._held_lock = threading.Lock()
        self._backoff = Backoff()  # its failures: the first hold, then each retry that failed
        self._hook = hook
        self._on_committed = on_committed
        self._saves: queue.Queue[PendingSave | _Retry | None] = queue.Queue()  # None stops it
        self._in_flight = threading.BoundedSemaphore(max_in_flight)
        self._thread = threading.Thread(target=self._loop, name="episode-commit", daemon=True)
        self._thread.start()

    # --- the caller's side ---------------------------------------------------------------------

    def submit(self, save: PendingSave) -> None:
        """Queue ``save``; blocks while ``max_in_flight`` saves are waiting."""
        self._in_flight.acquire()
        self._saves.put(save)

    def retry(self) -> Future[list[int]]:
        """Commit the held episodes now (after what is queued); the future resolves to the
        episode indices made durable, or raises if one still fails (it stays held)."""
        request = _Retry()
        if not self._thread.is_alive():
            request.future.set_result([])
            return request.future
        self._saves.put(request)
        return request.future

    def wait(self) -> None:
        """Block until every save submitted so far is committed, held or failed."""
        self._saves.join()

    def stop(self) -> None:
        """Commit what is queued, retry the held episodes a last time (those still failing are
        lost, see :attr:`lost`), then end the thread."""
        if self._thread.is_alive():
            self._saves.put(None)
            self._thread.join()

    @property
    def held(self) -> list[tuple[int, int, str]]:
        """The held episodes, in order: (index, frames, why)."""
        with self._held_lock:
            return [(s.index, s.episode.length, s.reason) for s in self._held]

    @property
    def held_bytes(self) -> int:
        with self._held_lock:
            return sum(s.size for s in self._held)

    # --- the commit thread ---------------------------------------------------------------------

    def _loop(self) -> None:
        while True:
            try:
                item = self._saves.get(timeout=self._backoff.delay_s if self._held else None)
            except queue.Empty:
                self._retry_on_its_own()
                continue
            try:
                if item is None:
                    self._give_up()
                    return
                if isinstance(item, _Retry):
                    self._answer_retry(item)
                else:
                    self._commit(item)
            except BaseException as exc:  # the caller waits on the future: never leave it unresolved
                log.exception("%s: the commit thread failed", self.root)
                if item is not None and not item.future.done():
                    item.future.set_exception(exc)
            finally:
                if isinstance(item, PendingSave):
                    self._in_flight.release()
                self._saves.task_done()

    def _commit(self, save: PendingSave) -> None:
        if self.error is not None:  # never commit past a failed episode: no gaps
            journal.remove_dir(save.episode.directory)
            save.skipped = True
            save.future.set_exception(self.error)
            return
        if self._held and not self._retry_held():
            first = self._held[0]
            self._hold(
                save,
                f"it waits behind episode {first.index}, whose save failed ({first.reason})",
            )
            save.future.set_exception(
                DatasetError(
                    f"{self.root}: episode {save.index} is not saved yet: it waits behind episode "
                    f"{first.index}, whose save failed ({first.reason}); both are kept with their "
                    f"frames and saved in order once there is room: {_RETRIED}"
                )
            )
            return
        try:
            self._write(save)
        except OSError as exc:
            self._hold(save, _why(exc))
            held = DatasetError(
                f"{self.root}: saving episode {save.index} failed ({_why(exc)}); it is kept with "
                f"its {save.episode.length} frames and saved once there is room: {_RETRIED}"
            )
            held.__cause__ = exc
            save.future.set_exception(held)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller through the future
            journal.remove_dir(save.episode.directory)
            error = self._failure(save, exc)
            self.error = error
            save.future.set_exception(error)
        else:
            save.future.set_result(save.index)

    def _write(self, save: PendingSave) -> None:
        """Commit ``save`` and count it; on failure remove what it wrote and raise."""
        episode = save.episode
        files = save.encoded.files
        try:
            journal.commit_episode(
                self.root, episode.index, files=files, beside=save.encoded.beside, hook=self._hook
            )
        except BaseException:
            # What the attempt wrote frees its space; the staged videos stay for the retry.
            for name in files:
                (episode.directory / name).unlink(missing_ok=True)
            for path in save.encoded.beside:
                temp_path(path).unlink(missing_ok=True)
            raise
        _drop_checkpoints(journal.episode_dir(self.root, episode.index))
        if self._hook is not None:
            self._hook("committed")
        self.num_episodes += 1
        self.num_frames += episode.length
        self._on_committed(episode.index)

    def _hold(self, save: PendingSave, reason: str) -> None:
        save.held = True
        save.reason = reason
        if not self._held:  # the failure that starts the holding; the retries count on from it
            self._backoff.failed()
        with self._held_lock:
            self._held.append(save)
        log.error("%s: episode %d is held for a retry: %s", self.root, save.index, reason)

    def _retry_held(self, saved: list[int] | None = None) -> bool:
        """Commit the held episodes in order (their indices appended to ``saved``); True when
        none is left held."""
        while self._held:
            save = self._held[0]
            try:
                self._write(save)
            except BaseException as exc:  # noqa: BLE001 - it stays held; the reason is reported
                save.reason = _why(exc)
                self._backoff.failed()
                return False
            with self._held_lock:
                self._held.pop(0)
            save.held = False
            if saved is not None:
                saved.append(save.index)
            log.warning("%s: held episode %d is saved now", self.root, save.index)
        self._backoff.succeeded()
        return True

    def _retry_on_its_own(self) -> None:
        # Only when the episode fits, so a full disk is not written to every few seconds.
        save = self._held[0]
        try:
            stat = os.statvfs(self.root)
        except OSError:
            return
        if stat.f_bavail * stat.f_frsize >= save.size + RETRY_SLACK_BYTES:
            self._retry_held()

    def _answer_retry(self, request: _Retry) -> None:
        saved: list[int] = []
        if self._retry_held(saved):
            request.future.set_result(saved)
            return
        save = self._held[0]
        request.future.set_exception(
            DatasetError(
                f"{self.root}: episode {save.index} still cannot be saved ({save.reason}); "
                f"saved now: {saved or 'none'}; still held: episodes {[s.index for s in self._held]}"
            )
        )

    def _give_up(self) -> None:
        if not self._held or self._retry_held():
            return
        with self._held_lock:
            given_up, self._held = self._held, []
        for save in given_up:
            try:
                journal.remove_dir(save.episode.directory)
                for path in save.encoded.beside:
                    path.unlink(missing_ok=True)
            except OSError as exc:  # left for the next open's recovery to drop
                log.error("%s: removing what lost episode %d left: %s", self.root, save.index, exc)
            self.lost.append((save.index, save.episode.length, save.reason))
            log.error(
                "%s: episode %d (%d frames) could not be saved before the writer closed (%s); it is lost",
                self.root,
                save.index,
                save.episode.length,
                save.reason,
            )

    def _failure(self, save: PendingSave, exc: BaseException) -> BaseException:
        """What the caller is told of a failure that is not retried (the episode is deleted)."""
        if save.waited:
            return exc
        error = DatasetError(
            f"{self.root}: saving episode {save.index} failed "
            f"({exc}); its frames are lost, the episodes saved "
            "before it are kept"
        )
        error.__cause__ = exc
        return error


_RETRIED = (
    "fix the cause (a full disk: free space); it is retried on its own, at the next save, "
    "by retry_failed() and a last time at finalize(); recording can go on"
)


def _why(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        where = f": {exc.filename}" if exc.filename else ""
        return f"[Errno {exc.errno}] {exc.strerror}{where}"
    return f"{type(exc).__name__}: {exc}"


def _drop_checkpoints(directory: Path) -> None:
    """A committed episode's rows are its parquet: the checkpoints that kept the open take's rows
    durable (:mod:`.checkpoint`) are removed after the commit, never before it, so a crash in
    between costs nothing but a stray file in a whole entry."""
    stale = sorted(directory.glob(f"{ROWS_PREFIX}*.npz"))
    for path in stale:
        path.unlink(missing_ok=True)
    if stale:
        fsync_dir(directory)
