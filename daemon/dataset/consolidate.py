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

from hilrec.daemon.atomic import fsync_dir, fsync_file, write_synced
from hilrec.daemon.dataset import journal
from hilrec.daemon.dataset.features import video_keys
from hilrec.daemon.dataset.journal import Hook
from hilrec.daemon.dataset.layout import (
    MB,
    PARQUET_OPTIONS,
    data_schema,
    episodes_table,
    meta_json_bytes,
    tasks_table,
)
from hilrec.daemon.dataset.paths import (
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
from hilrec.daemon.dataset.reader import load_info, load_task_list, read_parquet
from hilrec.daemon.dataset.stats import aggregate_stats, stats_to_json, unflatten_episode_stats
from hilrec.daemon.dataset.video import Segment, concat_segments, probe_video, video_info
from hilrec.daemon.errors import CorruptDatasetError, DatasetError

log = logging.getLogger(__name__)


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
    fps = int(info["fps"])
    chunks = int(info["chunks_size"])
    metas = [journal.load_episode_meta(root, index) for index in batch]
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
    rows = [_base_row(meta) for meta in metas]
    targets: list[str] = []
    last = state.episodes[-1] if state.episodes else None

    # data/
    last_ref = data_ref(last) if last else None
    last_size = data_path(root, last_ref).stat().st_size if last_ref else 0
    placements = _assign(
        last_ref,
        last_size,
        [m["data_bytes"] for m in metas],
        int(float(info["data_files_size_in_mb"]) * MB),
        chunks,
    )
    schema = data_schema(features)
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

    # videos/
    for key in video_keys(features):
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
                        f"{staged[i]}: {frames} video frames for "
                        f"{metas[i]['length']} rows (episode {batch[i]})"
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
    drop_staged_videos(root, batch, video_keys(features))
    return ConsolidatedState(root=root, info=info, tasks=tasks, episodes=all_rows)


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
    are safe in the journal. After a failed merge nothing is retried until :meth:`add` or
    :meth:`wait` asks again.
    """

    def __init__(self, state: ConsolidatedState, *, hook: Hook = None, interval_s: float = 0.0) -> None:
        self.state = state
        self._hook = hook
        self._interval = interval_s
        self._pending: list[int] = []
        self._cond = threading.Condition()
        self._merging = False
        self._error: BaseException | None = None
        self._flush = False
        self._stop = False
        self._last_start = time.monotonic()
        self._thread = threading.Thread(target=self._loop, name="consolidate", daemon=True)
        self._thread.start()

    def add(self, episode_index: int) -> None:
        with self._cond:
            self._pending.append(episode_index)
            self._error = None  # a new episode is also a retry of a failed merge
            self._cond.notify_all()

    def wait(self, timeout: float | None = None) -> None:
        """Merge what is pending now and block until done; DatasetError if the merge failed."""
        deadline = None if timeout is None else time.monotonic() + timeout
        root = self.state.root
        with self._cond:
            self._flush = True
            self._cond.notify_all()
            while (self._pending or self._merging) and self._error is None:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise DatasetError(f"{root}: merge not done within {timeout} s")
                self._cond.wait(remaining)
            self._flush = False
            if self._error is not None:
                raise DatasetError(
                    f"{root}: merging saved episodes into LeRobot's files failed ({self._error}); "
                    f"they are safe in {journal.JOURNAL_DIR}, run 'hilrec repair'"
                ) from self._error

    def retry(self) -> None:
        with self._cond:
            self._error = None
            self._cond.notify_all()

    def close(self) -> None:
        """Stop the thread (after :meth:`wait`; what is still pending stays in the journal)."""
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        self._thread.join()

    def _next_batch(self) -> list[int] | None:
        with self._cond:
            while True:
                ready = bool(self._pending) and self._error is None
                if self._stop and not (ready and self._flush):
                    return None
                due = self._last_start + self._interval - time.monotonic()
                if ready and (self._flush or due <= 0):
                    self._merging = True
                    self._last_start = time.monotonic()
                    return list(self._pending)
                self._cond.wait(due if ready else None)

    def _loop(self) -> None:
        while (batch := self._next_batch()) is not None:
            try:
                self.state = consolidate(self.state, batch, hook=self._hook)
            except BaseException as exc:
                log.exception(
                    "%s: merging episodes %s failed; they stay in the journal", self.state.root, batch
                )
                _undo_failed_merge(self.state.root)
                with self._cond:
                    self._error = exc
                    self._merging = False
                    self._cond.notify_all()
                continue
            with self._cond:
                del self._pending[: len(batch)]
                self._merging = False
                self._cond.notify_all()


def _undo_failed_merge(root: Path) -> None:
    """Put LeRobot's files back as they were before the failed batch (best effort)."""
    try:
        journal.recover_intent(root)
        for path in journal.orphan_files(root):
            if path.name.endswith(journal.NEW_SUFFIX):
                path.unlink()
    except OSError:
        log.exception("%s: cleaning up after a failed merge", root)
