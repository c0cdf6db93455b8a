"""Make a crashed dataset load again, keeping every saved episode, and say what was kept and dropped.

Two levels, tried in order:

1. :func:`recover` (also run by ``DatasetWriter.open``): roll back or complete an interrupted merge
   (journal intent), delete temp files, drop the episode that was open when the writer died (its
   frames were never saved), and merge every committed journal episode that is not yet in
   LeRobot's files. Nothing saved is lost.
2. :func:`rebuild`, when LeRobot's files themselves are damaged (a parquet file without footer,
   an unreadable or short video, info.json counts that disagree with the files): every episode is
   re-assembled from the best source that is intact (the journal's copy of its rows and metadata,
   else the dataset's own files; its frames from the staged mp4, else its slice of the video file)
   into a fresh layout. An episode with no intact source is dropped and the later ones renumbered.
   The damaged files are moved to ``hilrec/damaged-<time>/``, never deleted.

The report's ``exit_code`` follows ``mcap recover``: 0 when nothing was dropped, 3 when something
was.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from hilrec.daemon.atomic import fsync_dir
from hilrec.daemon.dataset import journal
from hilrec.daemon.dataset.consolidate import ConsolidatedState, consolidate, pending_episodes
from hilrec.daemon.dataset.features import video_keys
from hilrec.daemon.dataset.layout import PARQUET_OPTIONS, data_schema, empty_info, write_info
from hilrec.daemon.dataset.paths import (
    DATA_DIR,
    INFO_PATH,
    META_DIR,
    VIDEOS_DIR,
    FileRef,
    data_path,
    data_ref,
    episodes_files,
    video_path,
    video_ref,
)
from hilrec.daemon.dataset.reader import column_to_numpy, load_info, load_task_list, read_parquet
from hilrec.daemon.dataset.sidecar import (
    episodes_sidecar_dir,
    renumber_episode_sidecar,
    sidecar_dir,
    stored_episode_sidecars,
)
from hilrec.daemon.dataset.stats import compute_episode_stats, stats_to_json, unflatten_episode_stats
from hilrec.daemon.dataset.video import Segment, concat_segments, probe_video
from hilrec.daemon.errors import CorruptDatasetError, DatasetError, VideoEncodingError

log = logging.getLogger(__name__)

EXIT_OK = 0
EXIT_DROPPED = 3


@dataclass
class RepairReport:
    root: str
    kept: list[int] = field(default_factory=list)
    dropped: list[dict[str, Any]] = field(default_factory=list)
    actions: list[str] = field(default_factory=list)
    renumbered: dict[int, int] = field(default_factory=dict)
    rebuilt: bool = False

    @property
    def exit_code(self) -> int:
        return EXIT_DROPPED if self.dropped else EXIT_OK

    def to_json(self) -> dict[str, Any]:
        return {
            "root": self.root,
            "kept_episodes": self.kept,
            "dropped": self.dropped,
            "renumbered": {str(k): v for k, v in self.renumbered.items()},
            "rebuilt": self.rebuilt,
            "actions": self.actions,
            "exit_code": self.exit_code,
        }


def recover(root: Path) -> RepairReport:
    """Level 1: finish what a crash interrupted. Raises CorruptDatasetError if files are damaged."""
    root = Path(root)
    report = RepairReport(root=str(root))
    outcome = journal.recover_intent(root)
    if outcome:
        report.actions.append(f"interrupted merge {outcome}")
    for path in journal.orphan_files(root):
        path.unlink()
        report.actions.append(f"removed temp file {path.relative_to(root)}")
    for index in journal.open_episodes(root):
        directory = journal.open_episode_dir(root, index)
        frames = _count_video_frames(directory)
        journal.remove_dir(directory)
        report.dropped.append(
            {
                "episode": index,
                "reason": "open (never saved) when the writer stopped",
                "video_frames_on_disk": frames,
            }
        )
    state = ConsolidatedState.load(root)
    pending = pending_episodes(root, state)
    if pending:
        state = consolidate(state, pending)
        report.actions.append(f"merged saved episodes {pending} into LeRobot's files")
    saved = len(state.episodes)
    _drop_stale_sidecars(root, saved, report)
    _drop_stale_staged_videos(root, state, report)
    _verify_files(root, state)
    report.kept = list(range(saved))
    return report


def _count_video_frames(directory: Path) -> dict[str, int]:
    counts = {}
    for path in directory.glob("*.mp4"):
        try:
            counts[path.stem] = probe_video(path).frames
        except CorruptDatasetError:
            counts[path.stem] = 0
    return counts


def _drop_stale_sidecars(root: Path, saved: int, report: RepairReport) -> None:
    for index, path in stored_episode_sidecars(root):
        if index >= saved:
            path.unlink()
            report.actions.append(f"removed sidecar of unsaved episode {index}: {path.name}")


def _drop_stale_staged_videos(root: Path, state: ConsolidatedState, report: RepairReport) -> None:
    keys = video_keys(state.info["features"])
    for index in journal.committed_episodes(root):
        if index < len(state.episodes):
            for key in keys:
                path = journal.episode_dir(root, index) / journal.video_file_name(key)
                if path.exists():
                    path.unlink()
                    report.actions.append(f"removed merged staged video of episode {index}")


def _verify_files(root: Path, state: ConsolidatedState) -> None:
    """Cheap structural checks that decide whether a rebuild is needed."""
    rows_by_data: dict[FileRef, list[dict[str, Any]]] = {}
    for row in state.episodes:
        rows_by_data.setdefault(data_ref(row), []).append(row)
    for ref, rows in rows_by_data.items():
        path = data_path(root, ref)
        try:
            rows_in_file = pq.ParquetFile(path).metadata.num_rows
        except (OSError, pa.ArrowException) as exc:
            raise CorruptDatasetError(str(path), f"cannot read parquet: {exc}") from exc
        expected = sum(r["length"] for r in rows)
        if rows_in_file != expected:
            raise CorruptDatasetError(str(path), f"{rows_in_file} rows, episodes say {expected}")
    for key in video_keys(state.info["features"]):
        by_file: dict[FileRef, list[dict[str, Any]]] = {}
        for row in state.episodes:
            by_file.setdefault(video_ref(row, key), []).append(row)
        for ref, rows in by_file.items():
            path = video_path(root, key, ref)
            frames = probe_video(path).frames
            expected = sum(r["length"] for r in rows)
            if frames != expected:
                raise CorruptDatasetError(str(path), f"{frames} video frames, episodes say {expected}")
    if state.total_frames != state.info.get("total_frames"):
        raise CorruptDatasetError(
            str(root / INFO_PATH),
            f"total_frames={state.info.get('total_frames')} but episodes hold {state.total_frames}",
        )


def repair(root: Path) -> RepairReport:
    """Level 1, then level 2 if LeRobot's files are damaged."""
    root = Path(root)
    if not (root / INFO_PATH).exists():
        raise CorruptDatasetError(str(root / INFO_PATH), "missing: not a LeRobot dataset root")
    try:
        return recover(root)
    except (CorruptDatasetError, DatasetError, VideoEncodingError) as exc:
        log.warning("%s: %s; rebuilding from intact sources", root, exc)
        report = rebuild(root)
        report.actions.insert(0, f"rebuild needed: {exc}")
        return report


# --- level 2 -------------------------------------------------------------------------------------


def rebuild(root: Path) -> RepairReport:
    root = Path(root)
    report = RepairReport(root=str(root), rebuilt=True)
    journal.recover_intent(root)
    for path in journal.orphan_files(root):
        path.unlink()
    for index in journal.open_episodes(root):
        journal.remove_dir(journal.open_episode_dir(root, index))
        report.dropped.append({"episode": index, "reason": "open (never saved) when the writer stopped"})
    info = load_info(root)
    features = info["features"]
    keys = video_keys(features)
    rows = _readable_episode_rows(root)
    committed = set(journal.committed_episodes(root))
    candidates = sorted(committed | set(rows))
    try:
        tasks = load_task_list(root)
    except CorruptDatasetError:
        tasks = []
    tasks = _tasks_from_journal(root, candidates, tasks)

    work = sidecar_dir(root) / f".rebuild-{os.getpid()}"
    if work.exists():
        shutil.rmtree(work)
    fresh = empty_info(
        fps=int(info["fps"]),
        features=features,
        robot_type=info.get("robot_type"),
        chunks_size=int(info["chunks_size"]),
        data_files_size_in_mb=info["data_files_size_in_mb"],
        video_files_size_in_mb=info["video_files_size_in_mb"],
    )
    (work / journal.JOURNAL_DIR).mkdir(parents=True)
    write_info(work, fresh)
    schema = data_schema(features)
    used_tasks: list[str] = []
    new_index = 0
    frames = 0
    for old in candidates:
        try:
            table, meta_tasks, video_stats = _episode_rows(root, old, rows.get(old), schema, features)
            source_dir = journal.open_episode_dir(work, new_index)
            source_dir.mkdir(parents=True)
            for key in keys:
                _extract_video(
                    root,
                    old,
                    key,
                    row=rows.get(old),
                    out=source_dir / journal.video_file_name(key),
                    fps=int(info["fps"]),
                    length=table.num_rows,
                )
        except (CorruptDatasetError, DatasetError, VideoEncodingError, KeyError) as exc:
            journal.remove_dir(journal.open_episode_dir(work, new_index))
            report.dropped.append({"episode": old, "reason": str(exc)})
            continue
        task_names = [tasks[i] for i in table.column("task_index").to_pylist()]
        new_tasks = [t for t in dict.fromkeys(task_names) if t not in used_tasks]
        used_tasks.extend(new_tasks)
        table = _renumber(
            table,
            schema,
            episode_index=new_index,
            first_frame=frames,
            task_ids={t: used_tasks.index(t) for t in used_tasks},
            task_names=task_names,
        )
        pq.write_table(table, source_dir / journal.EPISODE_DATA, **PARQUET_OPTIONS)
        columns = {name: column_to_numpy(table.column(name)) for name in table.column_names}
        stats = compute_episode_stats(columns, features)
        stats.update(video_stats)
        ordered = {k: stats[k] for k in features if k in stats}
        journal.write_episode_meta(
            source_dir,
            {
                "episode_index": new_index,
                "length": table.num_rows,
                "tasks": meta_tasks,
                "new_tasks": new_tasks,
                "dataset_from_index": frames,
                "data_bytes": (source_dir / journal.EPISODE_DATA).stat().st_size,
                "videos": {},
                "stats": stats_to_json(ordered),
                "rebuilt_from_episode": old,
            },
        )
        journal.commit_episode(work, new_index)
        report.renumbered[old] = new_index
        new_index += 1
        frames += table.num_rows
    state = ConsolidatedState(root=work, info=fresh, tasks=[], episodes=[])
    if new_index:
        state = consolidate(state, list(range(new_index)))
    _swap_in(root, work, report)
    report.kept = sorted(report.renumbered)
    report.renumbered = {o: n for o, n in report.renumbered.items() if o != n}
    return report


def _readable_episode_rows(root: Path) -> dict[int, dict[str, Any]]:
    rows: dict[int, dict[str, Any]] = {}
    for path in episodes_files(root):
        try:
            for row in read_parquet(path).to_pylist():
                rows[int(row["episode_index"])] = row
        except CorruptDatasetError:
            log.warning("%s: unreadable; its episodes need the journal", path)
    return rows


def _tasks_from_journal(root: Path, candidates: list[int], tasks: list[str]) -> list[str]:
    out = list(tasks)
    for index in candidates:
        try:
            meta = journal.load_episode_meta(root, index)
        except CorruptDatasetError:
            continue
        out.extend(t for t in meta.get("new_tasks", []) if t not in out)
    return out


def _episode_rows(
    root: Path, index: int, row: dict[str, Any] | None, schema: pa.Schema, features: dict[str, Any]
) -> tuple[pa.Table, list[str], dict[str, Any]]:
    """The episode's rows (journal copy first), its task list, and its video stats."""
    keys = video_keys(features)
    meta = None
    table = None
    source = journal.episode_dir(root, index)
    if (source / journal.EPISODE_META).exists():
        try:
            meta = journal.load_episode_meta(root, index)
            table = read_parquet(source / journal.EPISODE_DATA)
        except CorruptDatasetError:
            meta, table = None, None
    if table is None:
        if row is None:
            raise CorruptDatasetError(str(source), f"episode {index}: no journal copy and no episode row")
        path = data_path(root, data_ref(row))
        whole = read_parquet(path)
        table = whole.filter(pc.equal(whole.column("episode_index"), index))
        if table.num_rows != row["length"]:
            raise CorruptDatasetError(
                str(path), f"episode {index}: {table.num_rows} rows, expected {row['length']}"
            )
    if meta is not None:
        stats = {k: v for k, v in meta["stats"].items() if k in keys}
        return table.select(schema.names), list(meta["tasks"]), stats
    assert row is not None
    stats = {k: v for k, v in unflatten_episode_stats(row).items() if k in keys}
    return table.select(schema.names), list(row["tasks"]), stats


def _extract_video(
    root: Path, index: int, key: str, *, row: dict[str, Any] | None, out: Path, fps: int, length: int
) -> None:
    staged = journal.episode_dir(root, index) / journal.video_file_name(key)
    if staged.exists() and probe_video(staged).frames == length:
        shutil.copyfile(staged, out)
        return
    if row is None or row.get(f"videos/{key}/chunk_index") is None:
        raise CorruptDatasetError(str(staged), f"episode {index}: no video for '{key}'")
    prefix = f"videos/{key}/"
    source = video_path(root, key, video_ref(row, key))
    placed = concat_segments(
        out, [Segment(source, row[prefix + "from_timestamp"], row[prefix + "to_timestamp"])], fps=fps
    )
    if placed[0][2] != length:
        raise CorruptDatasetError(
            str(source), f"episode {index}: {placed[0][2]} frames of '{key}' for {length} rows"
        )


def _renumber(
    table: pa.Table,
    schema: pa.Schema,
    *,
    episode_index: int,
    first_frame: int,
    task_ids: dict[str, int],
    task_names: list[str],
) -> pa.Table:
    n = table.num_rows
    replace = {
        "episode_index": np.full(n, episode_index, dtype=np.int64),
        "index": np.arange(first_frame, first_frame + n, dtype=np.int64),
        "task_index": np.array([task_ids[t] for t in task_names], dtype=np.int64),
    }
    arrays = [pa.array(replace[name]) if name in replace else table.column(name) for name in schema.names]
    return pa.Table.from_arrays(arrays, schema=schema)


def _swap_in(root: Path, work: Path, report: RepairReport) -> None:
    damaged = sidecar_dir(root) / f"damaged-{time.strftime('%Y%m%d-%H%M%S')}"
    damaged.mkdir(parents=True, exist_ok=True)
    for name in (META_DIR, DATA_DIR, VIDEOS_DIR):
        if (root / name).exists():
            os.replace(root / name, damaged / name)
    if journal.journal_dir(root).exists():
        os.replace(journal.journal_dir(root), damaged / "journal")
    fsync_dir(root)
    for name in (DATA_DIR, VIDEOS_DIR, META_DIR):
        if (work / name).exists():
            os.replace(work / name, root / name)
    os.replace(journal.journal_dir(work), journal.journal_dir(root))
    shutil.rmtree(work)
    fsync_dir(root)
    fsync_dir(sidecar_dir(root))
    _renumber_sidecars(root, report.renumbered)
    report.actions.append(f"moved the damaged files to {damaged.relative_to(root)}")


def _renumber_sidecars(root: Path, mapping: dict[int, int]) -> None:
    directory = episodes_sidecar_dir(root)
    if not directory.is_dir():
        return
    for index, path in stored_episode_sidecars(root):
        if index not in mapping:
            path.rename(path.with_name("dropped-" + path.name))
    for old, new in sorted(mapping.items()):
        if old != new:
            renumber_episode_sidecar(root, old, new)
    fsync_dir(directory)
