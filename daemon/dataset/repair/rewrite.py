"""Repair's second step: rewrite in place what is derived from an intact copy.

``info.json`` (its totals; its fixed fields from :mod:`.repair_evidence`), ``stats.json`` and
``tasks.parquet`` are rewritten from the episodes metadata when every episodes file is readable;
damaged or missing journal entries of a dataset that passes ``hilrec check`` are rewritten from
the dataset. What is replaced is set aside first (:func:`.repair_settle.set_aside`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from hilrec.daemon.atomic import atomic_write_bytes, fsync_dir
from hilrec.daemon.dataset.check.journal import same_rows, table_columns
from hilrec.daemon.dataset.format.features import video_keys
from hilrec.daemon.dataset.format.layout import (
    PARQUET_OPTIONS,
    data_schema,
    episodes_table,
    meta_json_bytes,
    tasks_table,
    write_info,
)
from hilrec.daemon.dataset.format.paths import (
    INFO_PATH,
    STATS_PATH,
    TASKS_PATH,
    FileRef,
    data_path,
    data_ref,
    episodes_files,
    episodes_path,
)
from hilrec.daemon.dataset.format.reader import (
    column_to_numpy,
    load_info,
    load_stats,
    load_task_list,
    read_episode_rows,
    read_parquet,
)
from hilrec.daemon.dataset.format.stats import aggregate_stats, stats_to_json, unflatten_episode_stats
from hilrec.daemon.dataset.repair.evidence import fixed_info
from hilrec.daemon.dataset.repair.report import Problem, RepairReport
from hilrec.daemon.dataset.repair.settle import RESTORE_PREFIX, set_aside
from hilrec.daemon.dataset.repair.space import DAMAGE, not_damage
from hilrec.daemon.dataset.store import journal
from hilrec.daemon.dataset.store.consolidate import ConsolidatedState
from hilrec.daemon.errors import CorruptDatasetError


def rederive_meta(root: Path, report: RepairReport, problem: Problem) -> bool:
    """Rewrite info.json, stats.json and tasks.parquet from the episodes; True if any was written.

    Needs every episodes-metadata file to be readable (else only a rebuild can help).
    """
    try:
        info = fixed_info(root, report)
        if info is None:
            return False
        rows: list[dict[str, Any]] = []
        for path in episodes_files(root):
            rows.extend(read_parquet(path).to_pylist())
        rows.sort(key=lambda r: r["episode_index"])
        if [r["episode_index"] for r in rows] != list(range(len(rows))):
            return False
        tasks = _readable_tasks(root)
    except DAMAGE as exc:
        if not_damage(exc):
            raise
        return False
    if tasks is None:
        tasks = _tasks_from_rows(rows, root)
        if tasks is None:
            return False
    written: list[str] = []
    report.space_for = "rewriting the metadata"
    info.update(
        total_episodes=len(rows),
        total_frames=int(rows[-1]["dataset_to_index"]) if rows else 0,
        total_tasks=len(tasks),
        splits={"train": f"0:{len(rows)}"} if rows else {},
    )
    try:
        on_disk = load_info(root)
    except CorruptDatasetError:
        on_disk = None
    if on_disk != info:
        set_aside(root, root / INFO_PATH, report)
        write_info(root, info)
        written.append(INFO_PATH)
    if _readable_tasks(root) != tasks:
        set_aside(root, root / TASKS_PATH, report)
        write_parquet(tasks_table(tasks), root / TASKS_PATH)
        written.append(TASKS_PATH)
    try:
        stats_ok = load_stats(root) is not None or not rows
    except CorruptDatasetError:
        stats_ok = False
    if rows and (not stats_ok or STATS_PATH in problem.files):
        stats = aggregate_stats([unflatten_episode_stats(r) for r in rows])
        set_aside(root, root / STATS_PATH, report)
        atomic_write_bytes(root / STATS_PATH, meta_json_bytes(stats_to_json(stats)))
        written.append(STATS_PATH)
    if not rows and not episodes_files(root):
        write_parquet(episodes_table([], info["features"]), episodes_path(root, FileRef()))
        written.append(episodes_path(root, FileRef()).relative_to(root).as_posix())
    if written:
        report.actions.append(
            f"rewrote {', '.join(written)} from the episodes (check said: {problem.reason})"
        )
    return bool(written)


def _readable_tasks(root: Path) -> list[str] | None:
    try:
        if not (root / TASKS_PATH).exists():
            return None
        return load_task_list(root)
    except CorruptDatasetError:
        return None


def _tasks_from_rows(rows: Sequence[Mapping[str, Any]], root: Path) -> list[str] | None:
    """The task list from the journal (each episode's new tasks, in order), when it is whole."""
    tasks: list[str] = []
    for index in range(len(rows)):
        entry = journal.read_entry(root, index)
        if entry.meta is None:
            return None
        tasks.extend(str(t) for t in entry.meta["new_tasks"])
    return tasks if len(set(tasks)) == len(tasks) else None


def restore_journal(root: Path, state: ConsolidatedState, report: RepairReport) -> None:
    """Rewrite every damaged or missing journal entry of a dataset that passes check from it."""
    features = state.info["features"]
    schema = data_schema(features)
    fps = int(state.info["fps"])
    first_use: dict[int, int] = {}
    tables: dict[int, pa.Table] = {}
    for index, row in enumerate(state.episodes):
        table = read_episode_rows(data_path(root, data_ref(row)), index, schema.names).select(schema.names)
        tables[index] = table
        for task in column_to_numpy(table.column("task_index")).tolist():
            first_use.setdefault(int(task), index)
    for index, row in enumerate(state.episodes):
        entry = journal.read_entry(root, index)
        table = tables[index]
        rows_ok = entry.table is not None and _same_table(entry.table, table, features)
        meta_ok = entry.meta is not None and entry.meta["length"] == row["length"]
        if rows_ok and meta_ok:
            continue
        files: dict[str, bytes] = {}
        if not rows_ok:
            files[journal.EPISODE_DATA] = parquet_bytes(table.replace_schema_metadata(schema.metadata))
        if not meta_ok:
            stats = unflatten_episode_stats(row)
            files[journal.EPISODE_META] = journal.episode_meta_bytes(
                {
                    "episode_index": index,
                    "length": int(row["length"]),
                    "tasks": list(row["tasks"]),
                    "new_tasks": [state.tasks[t] for t in sorted(first_use) if first_use[t] == index],
                    "dataset_from_index": int(row["dataset_from_index"]),
                    "data_bytes": len(files.get(journal.EPISODE_DATA, b""))
                    or (entry.directory / journal.EPISODE_DATA).stat().st_size,
                    "videos": {
                        k: {"frames": int(row["length"]), "duration_s": int(row["length"]) / fps}
                        for k in video_keys(features)
                    },
                    "stats": stats_to_json({k: stats[k] for k in features if k in stats}),
                    "restored_from_dataset_unix_s": time.time(),
                }
            )
        report.space_for = f"rewriting the journal entry of episode {index}"
        _write_entry(root, index, files)
        why = "; ".join(f"{p.name}: {m}" for p, m in entry.problems) or "its rows differed from the dataset's"
        report.actions.append(
            f"rewrote {', '.join(files)} of the journal entry of episode {index} from the dataset ({why})"
        )


def _same_table(a: pa.Table, b: pa.Table, features: Mapping[str, Any]) -> bool:
    try:
        return same_rows(table_columns(a, features, Path("a")), table_columns(b, features, Path("b")))
    except CorruptDatasetError:
        return False


def _write_entry(root: Path, index: int, files: Mapping[str, bytes]) -> None:
    directory = journal.episode_dir(root, index)
    if directory.is_dir():
        for name, content in files.items():  # rows first: episode.json says the entry is there
            atomic_write_bytes(directory / name, content)
        return
    work = journal.journal_dir(root) / f"{RESTORE_PREFIX}{index:06d}-{os.getpid()}"
    work.mkdir(parents=True)
    for name, content in files.items():
        atomic_write_bytes(work / name, content)
    os.replace(work, directory)
    fsync_dir(directory.parent)


def parquet_bytes(table: pa.Table) -> bytes:
    stream = pa.BufferOutputStream()
    pq.write_table(table, stream, **PARQUET_OPTIONS)
    return bytes(stream.getvalue().to_pybytes())


def write_parquet(table: pa.Table, path: Path) -> None:
    atomic_write_bytes(path, parquet_bytes(table))
