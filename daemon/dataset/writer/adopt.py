"""Episodes recorded elsewhere, appended to a dataset as its next journal entries.

``record --sim --workers N`` (and ``--ray``) records each episode in a worker, into a one-episode
dataset of its own made by the ordinary writer (rows, stats, video encoded there). The worker
hands it back as an :class:`EpisodeBundle` (bytes only, so it travels through a pipe or Ray's
object store from another machine), and :class:`Adopter` appends bundles to the destination in
the order given: each becomes the next committed journal entry, as the writer's own save would
make it, and the journal is merged into LeRobot's files as the writer merges it
(:class:`~.consolidate.BackgroundMerger`).

Only what depends on the episode's place changes: ``episode_index``, the dataset-wide ``index``
and ``task_index`` columns with their stats, and the sidecar's file names. Everything else
(rows, stats, mp4 packets, sidecar content) is the worker's bytes, so the result does not depend
on how many workers recorded it or in what order they finished.

One adopt is whole or absent: Ctrl-C waits until its episode is committed and counted
(:func:`sigint_deferred`), and a failed write (a full disk) removes what it staged and fails that
episode alone, as a DatasetError.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import signal
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from hilrec.daemon.atomic import fsync_dir, temp_path
from hilrec.daemon.dataset.format.features import video_keys
from hilrec.daemon.dataset.format.layout import PARQUET_OPTIONS, data_schema, episode_data_table
from hilrec.daemon.dataset.format.paths import video_path, video_ref
from hilrec.daemon.dataset.format.reader import column_to_numpy
from hilrec.daemon.dataset.format.sidecar import episode_sidecar_files, load_episode_sidecar
from hilrec.daemon.dataset.format.stats import compute_episode_stats, stats_to_json
from hilrec.daemon.dataset.store import journal
from hilrec.daemon.dataset.store.consolidate import BackgroundMerger, ConsolidatedState
from hilrec.daemon.dataset.store.rootlock import RootLock
from hilrec.daemon.dataset.writer.encode import Numbering
from hilrec.daemon.errors import DatasetError, DatasetStateError

log = logging.getLogger(__name__)

# The columns whose values depend on where the episode lands in the dataset.
PLACED_COLUMNS: Final[tuple[str, ...]] = ("episode_index", "index", "task_index")
# Keys episode_sidecar_files() sets itself (at the end of the JSON): dropped before it re-adds them.
_SIDECAR_OWN: Final[tuple[str, ...]] = ("episode_index", "has_arrays")


@dataclass(frozen=True, kw_only=True)
class EpisodeBundle:
    """One saved episode of a one-episode dataset, as bytes and plain values."""

    data: bytes  # the journal's data.parquet
    meta: dict[str, Any]  # the journal's episode.json
    tasks: list[str]  # the source dataset's task list: task_index -> task
    fps: int
    features: dict[str, Any]
    videos: dict[str, bytes] = field(default_factory=dict)  # video key -> mp4 of this episode alone
    sidecar: dict[str, Any] | None = None
    arrays: dict[str, np.ndarray] = field(default_factory=dict)


def bundle_episode(root: Path) -> EpisodeBundle:
    """The only episode of the finalized dataset at ``root``, as an :class:`EpisodeBundle`."""
    state = ConsolidatedState.load(root)
    if len(state.episodes) != 1:
        raise DatasetError(f"{root}: holds {len(state.episodes)} episodes, a bundle is of exactly one")
    row = state.episodes[0]
    entry = journal.read_entry(root, 0)
    if not entry.intact or entry.meta is None:
        problems = "; ".join(f"{path}: {why}" for path, why in entry.problems)
        raise DatasetError(f"{root}: journal entry of episode 0 is damaged: {problems}")
    features = state.info["features"]
    videos = {}
    for key in video_keys(features):
        if row[f"videos/{key}/from_timestamp"] != 0.0:
            raise DatasetError(f"{root}: episode 0 of '{key}' does not start its video file")
        videos[key] = video_path(root, key, video_ref(row, key)).read_bytes()
    sidecar, arrays = load_episode_sidecar(root, 0)
    return EpisodeBundle(
        data=(entry.directory / journal.EPISODE_DATA).read_bytes(),
        meta=entry.meta,
        tasks=list(state.tasks),
        fps=int(state.info["fps"]),
        features=features,
        videos=videos,
        sidecar=sidecar,
        arrays=arrays,
    )


@contextlib.contextmanager
def sigint_noted() -> Iterator[list[int]]:
    """SIGINT only noted (in the yielded list) while the block runs, on the main thread; the
    handler it had is put back after.

    A handler, not a signal mask: a Ctrl-C is sent to the process, and with the main thread
    masking it the kernel hands it to another thread, whose C handler still makes the main thread
    raise KeyboardInterrupt at once (seen under load: a committed episode left out of the count).
    """
    noted: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield noted
        return
    before = signal.signal(signal.SIGINT, lambda signum, _frame: noted.append(signum))
    try:
        yield noted
    finally:
        # None: a handler set outside Python, which cannot be put back; Python's own then, so
        # a Ctrl-C still ends in KeyboardInterrupt (and the caller keeps what is saved).
        signal.signal(signal.SIGINT, signal.default_int_handler if before is None else before)


@contextlib.contextmanager
def sigint_deferred() -> Iterator[None]:
    """SIGINT held back while the block runs (:func:`sigint_noted`; off the main thread it never
    lands), and delivered to the handler it had once the block is done: what the block writes
    and counts stays in step."""
    held: list[int] = []
    try:
        with sigint_noted() as held:
            yield
    finally:  # also when the block raises: the Ctrl-C is not lost behind its error
        if held:
            signal.raise_signal(signal.SIGINT)


class Adopter:
    """Appends :class:`EpisodeBundle` s to the dataset at ``root``, holding its lock throughout.

    The dataset must exist (made by :class:`~.writer.DatasetWriter`, which also recovers a crashed
    one on ``open``); a bundle of other features or fps is refused.
    """

    def __init__(self, root: Path, *, lock_command: str | None = None, merge_interval_s: float = 0.0) -> None:
        self.root = Path(root)
        self._lock = RootLock(self.root, lock_command).acquire()
        try:
            state = ConsolidatedState.load(self.root)
            leftovers = journal.committed_episodes(self.root)[len(state.episodes) :]
            if leftovers or journal.open_episodes(self.root):
                raise DatasetStateError(
                    f"{self.root}: journal entries {leftovers} wait to be merged; open it with the "
                    "writer (or run hilrec repair) first"
                )
        except BaseException:
            self._lock.release()
            raise
        self._info = state.info
        self._numbering = Numbering(
            episodes=len(state.episodes), frames=state.total_frames, tasks=state.tasks
        )
        self._merger = BackgroundMerger(state, interval_s=merge_interval_s)
        self._closed = False

    @property
    def num_episodes(self) -> int:
        """Episodes in the dataset, merged or only committed so far."""
        return self._numbering.next_index

    def adopt(self, bundle: EpisodeBundle, *, origin: str | None = None) -> int:
        """Commit ``bundle`` as the next episode (durable on return) and return its episode_index.

        ``origin`` names the episode in errors (``seed 3``). A write that fails (OSError: a full
        disk) leaves nothing of the episode and raises DatasetError; the next adopt takes its index.
        """
        if self._closed:
            raise DatasetStateError(f"{self.root}: adopt() after finalize()")
        self._check_fits(bundle)
        index = self._numbering.next_index
        first = self._numbering.next_frame
        table = pq.read_table(pa.BufferReader(bundle.data))
        length = table.num_rows
        columns = {
            name: column_to_numpy(table.column(name), name=name, path=self.root)
            for name in table.column_names
        }
        task_index, new_tasks = self._numbering.task_indices(
            [bundle.tasks[int(t)] for t in columns["task_index"]]
        )
        placed = {
            "episode_index": np.full(length, index, dtype=np.int64),
            "index": np.arange(first, first + length, dtype=np.int64),
            "task_index": np.asarray(task_index, dtype=np.int64),
        }
        columns.update(placed)
        # Built as the writer builds it (episode_data_table), so the bytes are the writer's.
        data = _parquet_bytes(episode_data_table(columns, data_schema(bundle.features)))
        stats = dict(bundle.meta["stats"])
        stats.update(stats_to_json(compute_episode_stats(placed, bundle.features)))
        meta = {
            **bundle.meta,
            "episode_index": index,
            "new_tasks": new_tasks,
            "dataset_from_index": first,
            "data_bytes": len(data),
            "stats": {key: stats[key] for key in bundle.meta["stats"]},
        }
        meta.pop("format", None)  # episode_meta_bytes() puts it back, last
        sidecar = {k: v for k, v in (bundle.sidecar or {}).items() if k not in _SIDECAR_OWN}
        beside = (
            episode_sidecar_files(self.root, index, sidecar, bundle.arrays)
            if bundle.sidecar is not None or bundle.arrays
            else {}
        )
        files = {journal.EPISODE_DATA: data, journal.EPISODE_META: journal.episode_meta_bytes(meta)}
        # An interrupt between the commit's rename and the numbering below would give this
        # episode's index (and its sidecar's names) to the next one.
        with sigint_deferred():
            try:
                self._commit(index, bundle.videos, files, beside)
            except OSError as exc:
                self._remove_episode(index, beside)
                what = f"episode {index}" + (f" ({origin})" if origin else "")
                raise DatasetError(
                    f"{self.root}: {what} could not be written ({exc}); nothing of it is kept"
                ) from exc
            self._numbering.next_index = index + 1
            self._numbering.next_frame = first + length
            self._numbering.tasks.extend(new_tasks)
            self._merger.add(index)
        return index

    def _commit(
        self, index: int, videos: Mapping[str, bytes], files: dict[str, bytes], beside: Mapping[Path, bytes]
    ) -> None:
        staging = journal.open_episode_dir(self.root, index)
        staging.mkdir(parents=True, exist_ok=True)
        fsync_dir(staging.parent)
        for key, mp4 in videos.items():
            (staging / journal.video_file_name(key)).write_bytes(mp4)
        journal.commit_episode(self.root, index, files=files, beside=beside)

    def _remove_episode(self, index: int, beside: Mapping[Path, bytes]) -> None:
        """Undo a failed commit: not yet counted nor merged, the episode is not in the dataset."""
        for directory in (journal.open_episode_dir(self.root, index), journal.episode_dir(self.root, index)):
            shutil.rmtree(directory, ignore_errors=True)
        for path in beside:
            for leftover in (path, temp_path(path)):
                with contextlib.suppress(OSError):
                    leftover.unlink(missing_ok=True)

    def finalize(self) -> None:
        """Merge every adopted episode into LeRobot's files and release the root."""
        if self._closed:
            return
        self._closed = True
        try:
            self._merger.wait()
        finally:
            self._merger.close()
            self._lock.release()

    def __enter__(self) -> Adopter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.finalize()

    def _check_fits(self, bundle: EpisodeBundle) -> None:
        if bundle.fps != int(self._info["fps"]):
            raise DatasetError(
                f"{self.root}: episode at {bundle.fps} fps, the dataset is {self._info['fps']}"
            )
        ours, theirs = _shapes(self._info["features"]), _shapes(bundle.features)
        if ours != theirs:
            differ = sorted(k for k in set(ours) | set(theirs) if ours.get(k) != theirs.get(k))
            raise DatasetError(f"{self.root}: the episode's features differ from the dataset's: {differ}")
        missing = [key for key in video_keys(bundle.features) if key not in bundle.videos]
        if missing:
            raise DatasetError(f"{self.root}: the episode has no video for {missing}")


def _shapes(features: Mapping[str, Mapping[str, Any]]) -> dict[str, tuple[Any, ...]]:
    return {k: (v.get("dtype"), tuple(v.get("shape") or ()), v.get("names")) for k, v in features.items()}


def _parquet_bytes(table: pa.Table) -> bytes:
    stream = pa.BufferOutputStream()
    pq.write_table(table, stream, **PARQUET_OPTIONS)
    return stream.getvalue().to_pybytes()
