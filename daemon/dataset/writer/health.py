"""A writer's health: saves waiting for a retry, merge failures, and room for one more take.

:class:`WriterHealth` is the part of :class:`~.writer.DatasetWriter` that answers "is every
acknowledged episode where it belongs, and can the next take be kept?": :meth:`~WriterHealth.problems`
(one sentence per thing that is wrong), :attr:`~WriterHealth.failed_saves` and
:meth:`~WriterHealth.retry_failed` (see :mod:`.commit`), and :meth:`~WriterHealth.space_problem`,
sized by :class:`~.space.TakeSizes` from the episodes encoded lately.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hilrec.daemon.dataset.store.consolidate import BackgroundMerger
from hilrec.daemon.dataset.writer.commit import Committer
from hilrec.daemon.dataset.writer.episode import OpenEpisode
from hilrec.daemon.dataset.writer.space import TakeSizes, dir_bytes, space_problem
from hilrec.daemon.errors import DatasetStateError


class WriterHealth:
    """Mixed into the writer, which sets these attributes."""

    root: Path
    _committer: Committer
    _merger: BackgroundMerger
    _sizes: TakeSizes
    _episode: OpenEpisode | None
    _finalized: bool

    @property
    def num_episodes(self) -> int:
        return self._committer.num_episodes

    @property
    def failed_saves(self) -> list[int]:
        """Episodes whose save failed with an OS error and that wait for a retry, in order."""
        return [index for index, _frames, _why in self._committer.held]

    def retry_failed(self, timeout: float | None = None) -> list[int]:
        """Save the episodes whose save failed (:attr:`failed_saves`) now, in order, and retry a
        failed merge. Returns the episode indices saved by this call; raises
        :class:`DatasetError` if one still cannot be saved (it stays kept for a later retry).

        They are also retried on their own every few seconds once the file system has room, at
        the next save and at :meth:`finalize`: calling this is only needed to know at once.
        """
        if self._finalized:
            raise DatasetStateError(f"{self.root}: the writer is finalized")
        try:
            return self._committer.retry().result(timeout)
        finally:
            self._merger.retry()

    def problems(self) -> list[str]:
        """What keeps saved or acknowledged episodes from being where they belong, one sentence
        each (empty when all is well): saves waiting for a retry, a failing merge (with the
        episode indices), a failure that stopped the writer, episodes lost at finalize. Safe to
        call from any thread; the daemon reports it in its status."""
        found = [
            f"{self.root}: episode {index} ({frames} frames) is not saved yet, kept for a retry: {why}"
            for index, frames, why in self._committer.held
        ]
        merge = self._merger.problem
        if merge is not None:
            found.append(merge)
        if self._committer.error is not None:
            found.append(f"{self.root}: saving stopped: {self._committer.error}")
        if self._committer.lost:
            found.append(lost_message(self.root, self._committer.lost, self.num_episodes))
        return found

    def space_problem(self, need_bytes: int | None = None) -> str | None:
        """Why the file system of the root may not hold one more take, or None when it has room.

        Free is what an unprivileged writer may use (``statvfs``: ``f_bavail * f_frsize``).
        ``need_bytes`` defaults to :meth:`space_needed`. The sentence names both, in bytes. The
        daemon calls this before a take starts (to refuse or warn) and every few seconds while
        one runs (to stop it before its video cannot be written any more); it is cheap (one
        ``statvfs`` and a few ``stat`` calls) and safe from any thread.
        """
        if need_bytes is None:
            need, how = self._space_estimate()
        else:
            need, how = int(need_bytes), "as asked"
        return space_problem(self.root, need, how)

    def space_needed(self) -> int:
        """Bytes one more take needs on the root's file system (see :meth:`space_problem`).

        Frames: the longest of the recent episodes (and of the one being recorded; a minute
        before any). Bytes per frame: measured on the recent episodes (their rows and staged
        videos) and on the files the next merge appends to; before any, a parquet row plus
        :data:`VIDEO_BITS_PER_PIXEL` per camera pixel. A take is on disk twice while it is merged
        (staged, and in the new LeRobot files), and the merge rewrites the files it appends to
        beside the old ones; saves waiting for a retry add their bytes. At least
        :data:`MIN_FREE_BYTES`.
        """
        return self._space_estimate()[0]

    def _remember_size(self, episode: OpenEpisode, encoded: Any) -> None:
        staged = dir_bytes(episode.directory)
        written = sum(map(len, encoded.files.values())) + sum(map(len, encoded.beside.values()))
        self._sizes.remember(episode.length, staged + written)

    def _space_estimate(self) -> tuple[int, str]:
        episode = self._episode
        return self._sizes.estimate(
            open_length=episode.length if episode is not None else 0,
            open_directory=episode.directory if episode is not None else None,
            merged=self._merger.state,
            held=self._committer.held_bytes,
        )


def lost_message(root: Path, lost: list[tuple[int, int, str]], saved: int) -> str:
    names = ", ".join(f"{index} ({frames} frames)" for index, frames, _ in lost)
    return (
        f"{root}: episode(s) {names} could not be saved before the writer closed "
        f"({lost[0][2]}); their frames are lost. The {saved} episodes saved before are kept"
    )
