"""Merge committed journal episodes into LeRobot's files (data, videos, episodes, tasks, stats, info).

Files grow like LeRobot's: an episode goes into the current data file unless that would pass
``data_files_size_in_mb`` (then the next file; a new chunk after ``chunks_size`` files), and the
same for videos with ``video_files_size_in_mb``. Unlike LeRobot, a file is never appended in place:
its new version is written beside it and renamed over it (see :mod:`journal`), with info.json last.
:class:`BackgroundMerger` runs the merges on a thread of their own, in batches.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from hilrec.daemon.atomic import fsync_dir, fsync_file, temp_path, write_synced
from hilrec.daemon.backoff import Backoff
from hilrec.daemon.dataset.format.features import video_keys
from hilrec.daemon.dataset.format.layout import (
    MB,
    PARQUET_OPTIONS,
    data_schema,
    episodes_table,
    meta_json_bytes,
    tasks_table,
)
from hilrec.daemon.dataset.format.paths import (
    EPISODES_DIR,
    INFO_PATH,
    STATS_PATH,
    STATS_PREFIX,
    TASKS_PATH,
    FileRef,
    data_path,
    data_ref,
    episodes_files,
    episodes_path,
    episodes_ref,
    video_path,
    video_ref,
)
from hilrec.daemon.dataset.format.reader import load_info, load_task_list, read_parquet
from hilrec.daemon.dataset.format.stats import aggregate_stats, stats_to_json, unflatten_episode_stats
from hilrec.daemon.dataset.store import journal
from hilrec.daemon.dataset.store.journal import Hook
from hilrec.daemon.dataset.video.codec import Segment, concat_segments, probe_video, video_info
from hilrec.daemon.errors import CorruptDatasetError, DatasetError

log = logging.getLogger(__name__)

# A failed merge is retried on its own after this long, then twice as long each time.


@dataclass
class ConsolidatedState:
    """What LeRobot's files hold: info.json, the task list and every episode row."""

    root: Path
    info: dict[str, Any]
    tasks: list[str]
    episodes: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def load(cls, root: Path) -> ConsolidatedState:
        info = load_info(root)
        tasks = load_task_list(root)
        rows: list[dict[str, Any]] = []
        for path in episodes_files(root):
            rows.extend(read_parquet(path).to_pylist())
        rows.sort(key=lambda r: r["episode_index"])
        if [r["episode_index"] for r in rows] != list(range(len(rows))):
            raise CorruptDatasetError(str(root / EPISODES_DIR), "episode_index is not 0..n-1")
        if len(rows) != info.get("total_episodes"):
            raise CorruptDatasetError(
                str(root / INFO_PATH),
                f"total_episodes={info.get('total_episodes')} but {EPISODES_DIR} holds {len(rows)} episodes",
            )
        return cls(root=root, info=info, tasks=tasks, episodes=rows)

    @property
    def total_frames(self) -> int:
        return self.episodes[-1]["dataset_to_index"] if self.episodes else 0


def _write_new_parquet(table: pa.Table, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = journal.new_path(target)
    pq.write_table(table, tmp, **PARQUET_OPTIONS)
    fsync_file(tmp)


def _write_new_json(obj: Any, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    write_synced(journal.new_path(target), meta_json_bytes(obj))


def _rel(root: Path, path: Path) -> str:
    return str(path.relative_to(root))


@dataclass
class _Placement:
    ref: FileRef
    rows_before: bool  # the file already held earlier episodes


def _assign(
    last_ref: FileRef | None, last_size: int, sizes: Sequence[int], limit_bytes: int, chunks_size: int
) -> list[_Placement]:
    """LeRobot's roll-over rule: a new file when current + next episode would reach the limit."""
    placements = []
    ref = last_ref or FileRef()
    size = last_size if last_ref is not None else 0
    has_rows = last_ref is not None
    for episode_size in sizes:
        if has_rows and size + episode_size >= limit_bytes:
            ref, size, has_rows = ref.next(chunks_size), 0, False
        placements.append(_Placement(ref, has_rows))
        size += episode_size
        has_rows = True
    return placements


def consolidate(
    state: ConsolidatedState,
    batch: Sequence[int],
    *,
    hook: Hook = None,
) -> ConsolidatedState:
    """Merge the committed journal episodes ``batch`` (the next indices, in order)."""
    root = state.root
    info = dict(state.info)
    features = info["features"]
    chunks = int(info["chunks_size"])
    metas = [journal.load_episode_meta(root, index) for index in batch]
    tasks = _next_tasks(state, metas)
    rows = [_base_row(meta) for meta in metas]
    targets: list[str] = []
    last = state.episodes[-1] if state.episodes else None

    # data/, then videos/
    _merge_data(root, info, last, batch, metas, rows, targets)
    for key in video_keys(features):
        features = _merge_video(root, info, features, key, last, batch, metas, rows, targets)

    # meta/episodes/
    e_last = episodes_ref(last) if last else None
    e_size = episodes_path(root, e_last).stat().st_size if e_last else 0
    per_row = e_size // max(1, sum(1 for r in state.episodes if episodes_ref(r) == e_last)) if e_last else 0
    e_places = _assign(
        e_last, e_size, [per_row] * len(rows), int(float(info["data_files_size_in_mb"]) * MB), chunks
    )
    for row, placement in zip(rows, e_places, strict=True):
        row["meta/episodes/chunk_index"], row["meta/episodes/file_index"] = (
            placement.ref.chunk,
            placement.ref.file,
        )
    all_rows = state.episodes + rows
    for ref in dict.fromkeys(p.ref for p in e_places):
        in_file = [r for r in all_rows if episodes_ref(r) == ref]
        _write_new_parquet(episodes_table(in_file, features), episodes_path(root, ref))
        targets.append(_rel(root, episodes_path(root, ref)))

    # tasks, stats, info (last)
    if tasks != state.tasks:
        _write_new_parquet(tasks_table(tasks), root / TASKS_PATH)
        targets.append(TASKS_PATH)
    stats = aggregate_stats([unflatten_episode_stats(r) for r in all_rows])
    _write_new_json(stats_to_json(stats), root / STATS_PATH)
    targets.append(STATS_PATH)
    info.update(
        features=features,
        total_episodes=len(all_rows),
        total_frames=all_rows[-1]["dataset_to_index"],
        total_tasks=len(tasks),
        splits={"train": f"0:{len(all_rows)}"},
    )
    _write_new_json(info, root / INFO_PATH)
    targets.append(INFO_PATH)

    journal.publish_batch(root, batch, targets, hook)
    try:
        drop_staged_videos(root, batch, video_keys(features))
    except OSError as exc:  # the batch is merged; recovery drops what is left on the next open
        log.warning("%s: staged videos of merged episodes %s not deleted: %s", root, list(batch), exc)
    return ConsolidatedState(root=root, info=info, tasks=tasks, episodes=all_rows)


def _next_tasks(state: ConsolidatedState, metas: Sequence[Mapping[str, Any]]) -> list[str]:
    """The task list once the journal episodes ``metas`` are merged; DatasetError unless they
    follow the consolidated dataset (the next indices and rows) and add tasks it does not have."""
    first = len(state.episodes)
    frames_so_far = state.total_frames
    tasks = list(state.tasks)
    for offset, meta in enumerate(metas):
        if meta["episode_index"] != first + offset or meta["dataset_from_index"] != frames_so_far:
            raise DatasetError(
                f"journal episode {meta['episode_index']} does not follow the "
                f"consolidated dataset ({first + offset} episodes, "
                f"{frames_so_far} frames)"
            )
        frames_so_far += meta["length"]
        for task in meta["new_tasks"]:
            if task in tasks:
                raise DatasetError(f"journal episode {meta['episode_index']}: task {task!r} already exists")
            tasks.append(task)
    return tasks


def _merge_data(
    root: Path,
    info: Mapping[str, Any],
    last: Mapping[str, Any] | None,
    batch: Sequence[int],
    metas: Sequence[Mapping[str, Any]],
    rows: list[dict[str, Any]],
    targets: list[str],
) -> None:
    """The batch's rows appended to the last data file, or to new ones past its size limit
    (written beside the targets, added to ``targets``; ``rows`` get their files)."""
    chunks = int(info["chunks_size"])
    last_ref = data_ref(last) if last else None
    last_size = data_path(root, last_ref).stat().st_size if last_ref else 0
    placements = _assign(
        last_ref,
        last_size,
        [m["data_bytes"] for m in metas],
        int(float(info["data_files_size_in_mb"]) * MB),
        chunks,
    )
    schema = data_schema(info["features"])
    for ref in dict.fromkeys(p.ref for p in placements):
        members = [i for i, p in enumerate(placements) if p.ref == ref]
        tables = []
        if placements[members[0]].rows_before:
            tables.append(read_parquet(data_path(root, ref)))
        tables += [read_parquet(journal.episode_dir(root, batch[i]) / journal.EPISODE_DATA) for i in members]
        merged = pa.concat_tables([t.replace_schema_metadata(schema.metadata) for t in tables])
        _write_new_parquet(merged, data_path(root, ref))
        targets.append(_rel(root, data_path(root, ref)))
    for row, placement in zip(rows, placements, strict=True):
        row["data/chunk_index"], row["data/file_index"] = placement.ref.chunk, placement.ref.file


def _merge_video(
    root: Path,
    info: Mapping[str, Any],
    features: dict[str, Any],
    key: str,
    last: Mapping[str, Any] | None,
    batch: Sequence[int],
    metas: Sequence[Mapping[str, Any]],
    rows: list[dict[str, Any]],
    targets: list[str],
) -> dict[str, Any]:
    """The batch's staged videos of ``key`` joined to the last video file, or in new ones past
    its size limit; the features, with the video's info once the first file of it exists."""
    fps, chunks = int(info["fps"]), int(info["chunks_size"])
    prefix = f"videos/{key}/"
    v_last = video_ref(last, key) if last else None
    v_size = video_path(root, key, v_last).stat().st_size if v_last else 0
    staged = [journal.episode_dir(root, index) / journal.video_file_name(key) for index in batch]
    v_places = _assign(
        v_last,
        v_size,
        [p.stat().st_size for p in staged],
        int(float(info["video_files_size_in_mb"]) * MB),
        chunks,
    )
    for ref in dict.fromkeys(p.ref for p in v_places):
        members = [i for i, p in enumerate(v_places) if p.ref == ref]
        target = video_path(root, key, ref)
        segments = []
        if last is not None and v_places[members[0]].rows_before:
            segments.append(Segment(target, 0.0, last[prefix + "to_timestamp"]))
        segments += [Segment(staged[i]) for i in members]
        target.parent.mkdir(parents=True, exist_ok=True)
        placed = concat_segments(journal.new_path(target), segments, fps=fps)
        fsync_file(journal.new_path(target))
        placed = placed[len(segments) - len(members) :]
        for i, (start, end, frames) in zip(members, placed, strict=True):
            if frames != metas[i]["length"]:
                raise DatasetError(
                    f"{staged[i]}: {frames} video frames for {metas[i]['length']} rows (episode {batch[i]})"
                )
            rows[i].update(
                {
                    prefix + "chunk_index": ref.chunk,
                    prefix + "file_index": ref.file,
                    prefix + "from_timestamp": start,
                    prefix + "to_timestamp": end,
                }
            )
        targets.append(_rel(root, target))
        if not features[key].get("info"):
            features = {
                **features,
                key: {**features[key], "info": video_info(probe_video(journal.new_path(target)))},
            }
    return features


def _base_row(meta: Mapping[str, Any]) -> dict[str, Any]:
    row: dict[str, Any] = {
        "episode_index": meta["episode_index"],
        "tasks": list(meta["tasks"]),
        "length": meta["length"],
        "dataset_from_index": meta["dataset_from_index"],
        "dataset_to_index": meta["dataset_from_index"] + meta["length"],
    }
    for key, ft in meta["stats"].items():
        for name, value in ft.items():
            row[f"{STATS_PREFIX}{key}/{name}"] = value
    return row


def drop_staged_videos(root: Path, episodes: Sequence[int], keys: Sequence[str]) -> None:
    """Delete the staged mp4s of consolidated episodes (their frames are in LeRobot's files now)."""
    for index in episodes:
        directory = journal.episode_dir(root, index)
        removed = False
        for key in keys:
            path = directory / journal.video_file_name(key)
            if path.exists():
                path.unlink()
                removed = True
        if removed:
            fsync_dir(directory)


def pending_episodes(root: Path, state: ConsolidatedState) -> list[int]:
    """Committed journal episodes not yet in LeRobot's files, in order (stops at a gap)."""
    pending = []
    expected = len(state.episodes)
    for index in journal.committed_episodes(root):
        if index < expected:
            continue
        if index != expected:
            log.warning("journal: episode %d follows a gap at %d; it is not consolidated", index, expected)
            break
        pending.append(index)
        expected += 1
    return pending


class BackgroundMerger:
    """Merges committed journal episodes into LeRobot's files on one background thread.

    A merge takes every episode pending when it starts. With ``interval_s`` > 0 a merge starts at
    most once per interval (and at once on :meth:`wait`), so a producer that saves many episodes
    a second pays one merge per interval instead of one per episode; the episodes waiting meanwhile
    are safe in the journal.

    A failed merge never costs a saved episode: what it wrote is rolled back, so LeRobot's files
    stay as they were before it (every episode merged earlier stays visible), the journal keeps
    the batch, and the state is read back from disk. It is retried on its own after a backoff
    (:class:`hilrec.daemon.backoff.Backoff`: 2 s, doubling to a minute), and at once when an
    episode is added, on :meth:`retry` and on :meth:`wait`. Until one succeeds, :attr:`problem`
    says which episodes wait and why (the writer's ``problems()``), and :meth:`wait` raises it.
    """

    def __init__(self, state: ConsolidatedState, *, hook: Hook = None, interval_s: float = 0.0) -> None:
        self.state = state
        self._hook = hook
        self._interval = interval_s
        self._pending: list[int] = []
        self._cond = threading.Condition()
        self._merging = False
        self._error: BaseException | None = None
        self._failed_batch: list[int] = []
        self._backoff = Backoff()  # its failures: merges failed in a row
        self._attempts = 0  # merges started
        self._failed_attempt = 0  # the attempt that set _error
        self._retry_at = 0.0
        # _attempts when a retry was last asked for: one asked during or after the failed
        # attempt starts the next one at once (the backoff is for retries on the merger's own).
        self._retry_asked = -1
        self._flush = 0  # callers in wait()
        self._stop = False
        self._last_start = time.monotonic()
        self._thread = threading.Thread(target=self._loop, name="consolidate", daemon=True)
        self._thread.start()

    def add(self, episode_index: int) -> None:
        with self._cond:
            self._pending.append(episode_index)
            self._retry_asked = self._attempts  # a new episode is also a retry of a failed merge
            self._cond.notify_all()

    @property
    def problem(self) -> str | None:
        """Why saved episodes are not in LeRobot's files yet (None while merges succeed)."""
        with self._cond:
            if self._error is None:
                return None
            return self._describe()

    def wait(self, timeout: float | None = None, *, retry: bool = True) -> None:
        """Merge what is pending now and block until done; DatasetError if the merge failed.

        After a failed merge, ``retry`` starts another attempt at once (its failure is raised);
        ``retry=False`` waits for the next one on the merger's own schedule instead.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        root = self.state.root
        with self._cond:
            self._flush += 1
            if retry:
                self._retry_asked = self._attempts
            started = self._attempts
            self._cond.notify_all()
            try:
                while self._pending or self._merging:
                    if self._error is not None and self._failed_attempt > started:
                        raise DatasetError(self._describe()) from self._error
                    remaining = None if deadline is None else deadline - time.monotonic()
                    if remaining is not None and remaining <= 0:
                        late = f" ({self._describe()})" if self._error is not None else ""
                        raise DatasetError(f"{root}: merge not done within {timeout} s{late}")
                    self._cond.wait(remaining)
            finally:
                self._flush -= 1

    def retry(self) -> None:
        with self._cond:
            self._retry_asked = self._attempts
            self._cond.notify_all()

    def close(self) -> None:
        """Stop the thread (after :meth:`wait`; what is still pending stays in the journal)."""
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        self._thread.join()

    def _describe(self) -> str:
        """The failed merge, for an error and for the writer's status (under the lock)."""
        root = self.state.root
        merged = len(self.state.episodes)
        shown = f"episodes 0..{merged - 1}" if merged else "no episode"
        next_try = max(0.0, self._retry_at - time.monotonic())
        return (
            f"{root}: merging saved episodes {self._failed_batch} into LeRobot's files failed "
            f"({_reason(self._error)}; {self._backoff.failures} attempt(s) in a row); they are safe in "
            f"{journal.JOURNAL_DIR} and the merge is retried (next in {next_try:.0f} s, at the "
            f"next save and at finalize; 'hilrec repair' merges them too); LeRobot's files hold "
            f"{shown}, unchanged"
        )

    def _next_batch(self) -> list[int] | None:
        with self._cond:
            while True:
                now = time.monotonic()
                wait_s: float | None = None  # until a merge is due; None: until notified
                if self._pending:
                    if self._error is None:
                        wait_s = 0.0 if self._flush else self._last_start + self._interval - now
                    elif self._retry_asked >= self._failed_attempt:
                        wait_s = 0.0
                    else:
                        wait_s = self._retry_at - now
                due = wait_s is not None and wait_s <= 0
                if self._stop and not (due and self._flush):
                    return None
                if due:
                    self._merging = True
                    self._attempts += 1
                    self._last_start = now
                    return list(self._pending)
                self._cond.wait(wait_s)

    def _loop(self) -> None:
        while (batch := self._next_batch()) is not None:
            try:
                state = consolidate(self.state, batch, hook=self._hook)
            except BaseException as exc:  # noqa: BLE001 - kept, reported by problem/wait, retried
                self._failed(batch, exc)
                continue
            with self._cond:
                self.state = state
                del self._pending[: len(batch)]
                self._error = None
                self._backoff.succeeded()
                self._merging = False
                self._cond.notify_all()

    def _failed(self, batch: list[int], exc: BaseException) -> None:
        root = self.state.root
        with self._cond:
            first = self._backoff.failures == 0 or _reason(exc) != _reason(self._error)
        if first:
            log.exception("%s: merging episodes %s failed; they stay in the journal", root, batch)
        else:
            log.error("%s: merging episodes %s failed again: %s", root, batch, _reason(exc))
        _undo_failed_merge(root)
        try:
            # What is on disk is the truth: the batch rolled back (or, if it failed after its
            # last rename, merged).
            state = ConsolidatedState.load(root)
        except (DatasetError, OSError) as load_error:
            log.error("%s: reading LeRobot's files back after the failed merge: %s", root, load_error)
            state = self.state
        merged = len(state.episodes)
        if merged > len(self.state.episodes):  # merged after all: its staged videos are copies
            try:
                drop_staged_videos(root, [i for i in batch if i < merged], video_keys(state.info["features"]))
            except OSError as drop_error:
                log.warning("%s: staged videos of merged episodes not deleted: %s", root, drop_error)
        with self._cond:
            self.state = state
            self._pending = [i for i in self._pending if i >= merged]
            self._merging = False
            self._cond.notify_all()
            if not self._pending:  # it failed past its last rename: merged, nothing waits
                self._error = None
                self._backoff.succeeded()
                return
            self._error = exc
            self._failed_batch = list(batch)
            self._failed_attempt = self._attempts
            self._retry_at = time.monotonic() + self._backoff.failed()


def _reason(exc: BaseException | None) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return f"[Errno {exc.errno}] {exc.strerror}" + (f": {exc.filename}" if exc.filename else "")
    return f"{type(exc).__name__}: {exc}"


def _undo_failed_merge(root: Path) -> None:
    """Put LeRobot's files back as they were before the failed batch (best effort)."""
    try:
        journal.recover_intent(root)
        for path in journal.orphan_files(root):
            if path.name.endswith(journal.NEW_SUFFIX):
                path.unlink()
        # The intent's own temp file, if writing it was what failed (a full disk).
        temp_path(journal.intent_path(root)).unlink(missing_ok=True)
    except OSError:
        log.exception("%s: cleaning up after a failed merge", root)
