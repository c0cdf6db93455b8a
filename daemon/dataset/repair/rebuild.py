"""Repair's third step: rebuild every episode from its best intact copy into a fresh layout.

The layout is built beside the dataset (``hilrec/.rebuild-<pid>/``) from :class:`.repair_sources.Sources`;
episodes without readable rows or frames are dropped and later ones renumbered, with their
sidecars. It must pass ``hilrec check`` (episodes it still rejects are dropped and the layout
rebuilt, at most :data:`MAX_REBUILD_PASSES` times); only then are the damaged folders moved to
``hilrec/damaged-<time>/`` and the new ones put in their place (:func:`_swap_in`, undone on any
failure).
"""

from __future__ import annotations

import os
import shutil
from collections import Counter
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Final

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from hilrec.daemon.atomic import fsync_dir, fsync_file
from hilrec.daemon.dataset.check.checker import check_dataset
from hilrec.daemon.dataset.format.features import data_keys
from hilrec.daemon.dataset.format.layout import (
    PARQUET_OPTIONS,
    empty_info,
    episodes_table,
    tasks_table,
    write_info,
)
from hilrec.daemon.dataset.format.paths import (
    DATA_DIR,
    META_DIR,
    TASKS_PATH,
    VIDEOS_DIR,
    FileRef,
    episodes_path,
)
from hilrec.daemon.dataset.format.reader import column_to_numpy, load_info
from hilrec.daemon.dataset.format.sidecar import (
    episodes_sidecar_dir,
    renumber_episode_sidecar,
    sidecar_dir,
    stored_episode_sidecars,
)
from hilrec.daemon.dataset.format.stats import compute_episode_stats, stats_to_json
from hilrec.daemon.dataset.repair.evidence import fixed_info
from hilrec.daemon.dataset.repair.report import SPILL_ORIGIN, EpisodeOutcome, RepairReport, check_errors
from hilrec.daemon.dataset.repair.rewrite import write_parquet
from hilrec.daemon.dataset.repair.settle import WORK_PREFIX, damaged_dir
from hilrec.daemon.dataset.repair.sources import STAGED_ORIGIN, Rows, Sources
from hilrec.daemon.dataset.repair.space import (
    DAMAGE,
    SPACE_PER_EPISODE_BYTES,
    SPACE_SLACK_BYTES,
    free_inodes,
    need_space,
    not_damage,
)
from hilrec.daemon.dataset.store import journal
from hilrec.daemon.dataset.store.consolidate import ConsolidatedState, consolidate
from hilrec.daemon.errors import CorruptDatasetError, HilrecError

# A rebuild whose fresh layout the checker still rejects drops those episodes and tries again.
MAX_REBUILD_PASSES: Final[int] = 3


# A higher layer's way to make an episode's missing video again (``hilrec repair`` passes the
# twin's for a sim dataset): (its index before the rebuild, the camera's key, its rows, where to
# write the mp4) -> where its frames came from, or None when it cannot.
Regenerate = Callable[[int, str, pa.Table, Path], str | None]


class _CameraLost(Exception):
    """An episode's frames of a camera are unreadable and the camera is to go (see rebuild)."""

    def __init__(self, episode: int, key: str, why: str) -> None:
        super().__init__(key)
        self.episode, self.key, self.why = episode, key, why


def rebuild(
    root: Path,
    report: RepairReport,
    reason: str,
    regenerate: Regenerate | None = None,
    *,
    without_missing_video: bool = False,
) -> None:
    """Re-assemble every episode from its best copy (see :mod:`.recover`, step 3).

    ``without_missing_video``: a camera some episode has no readable (nor regenerated) frames of
    is removed from the dataset, so every episode keeps its rows without it (a dataset has one
    feature set), instead of that episode being dropped."""
    report.rebuilt = True
    report.actions.append(f"rebuild needed: {reason}")
    try:
        on_disk_total = load_info(root).get("total_episodes")
    except CorruptDatasetError:
        on_disk_total = None
    info = fixed_info(root, report)
    if info is None:
        return
    sources = Sources(root, info, on_disk_total if isinstance(on_disk_total, int) else None)
    for problem in sources.problems:
        report.actions.append(f"unreadable: {problem}")
    excluded: dict[int, str] = {}
    passes = 0
    while passes < MAX_REBUILD_PASSES:
        passes += 1
        outcomes = [o for o in report.episodes if o.reason.startswith("open (never saved)")]
        work = sidecar_dir(root) / f"{WORK_PREFIX}{os.getpid()}"
        try:
            try:
                built = _assemble(
                    root, work, sources, excluded, outcomes, report, regenerate, without_missing_video
                )
            except _CameraLost as lost:
                _drop_camera(sources, report, lost)
                passes -= 1  # a camera fewer is a new layout, not a failed pass
                continue
            except DAMAGE as exc:
                if not_damage(exc):
                    raise
                report.episodes = sorted(outcomes, key=lambda o: o.episode)
                report.unrepaired.append(f"the rebuild failed: {exc}")
                return
            checked = check_dataset(work)
            report.episodes = sorted(outcomes, key=lambda o: o.episode)
            if checked.passed:
                _swap_in(root, work, report, built)
                return
            by_new = {o.new_index: o for o in outcomes if o.new_index is not None}
            errors = check_errors(checked)
            bad = {by_new[f.episode].episode: f.format() for f in errors if f.episode in by_new}
            # Dropping episodes helps against damage to some of them; a failure of no episode,
            # or of every one, is the dataset's own (e.g. rows and videos at different rates).
            if not bad or any(f.episode not in by_new for f in errors) or len(bad) == len(by_new):
                break
            for old, failure in bad.items():
                excluded.setdefault(old, f"the rebuilt episode fails check: {failure}")
        except BaseException:
            report.inodes_left = free_inodes(root)  # before the work folder's go
            raise
        finally:
            if work.exists():
                shutil.rmtree(work)
    report.unrepaired = [
        f"the rebuilt dataset would still fail check: {f.format()}" for f in check_errors(checked)
    ]


def _assemble(
    root: Path,
    work: Path,
    sources: Sources,
    excluded: Mapping[int, str],
    outcomes: list[EpisodeOutcome],
    report: RepairReport,
    regenerate: Regenerate | None = None,
    without_missing_video: bool = False,
) -> dict[int, int]:
    """Build the fresh layout in ``work``; returns old -> new index of the episodes in it."""
    info = sources.info
    features = sources.features
    chosen = {e: sources.choose_rows(e) for e in sources.candidates() if e not in excluded}
    tasks = _task_strings(sources, chosen)
    need_space(root, report, _rebuild_bytes(root, sources, chosen), "the rebuild")
    if work.exists():
        shutil.rmtree(work)
    fresh = empty_info(
        fps=sources.fps,
        features=features,
        robot_type=info.get("robot_type"),
        chunks_size=int(info["chunks_size"]),
        data_files_size_in_mb=info["data_files_size_in_mb"],
        video_files_size_in_mb=info["video_files_size_in_mb"],
    )
    (work / journal.JOURNAL_DIR).mkdir(parents=True)
    write_info(work, fresh)
    built: dict[int, int] = {}
    used_tasks: list[str] = []
    frames = 0
    for old in sources.candidates():
        if old in excluded:
            outcomes.append(EpisodeOutcome(old, None, sources.length(old), reason=excluded[old]))
            continue
        rows = chosen[old]
        if rows.table is None:
            if rows.phantom:
                report.actions.append(
                    f"ignored rows that name episode {old} but belong to none ({rows.reason})"
                )
            else:
                outcomes.append(EpisodeOutcome(old, None, sources.length(old), reason=rows.reason))
            continue
        table = rows.table
        n = table.num_rows
        task_ids = column_to_numpy(table.column("task_index")).tolist()
        unknown = sorted({t for t in task_ids if t not in tasks})
        if unknown:
            outcomes.append(
                EpisodeOutcome(old, None, n, rows.origin, reason=f"task_index {unknown} has no task string")
            )
            continue
        new = len(built)
        directory = journal.open_episode_dir(work, new)
        directory.mkdir(parents=True)
        origins, image, lost = _place_frames(
            sources, report, old, table, directory, regenerate=regenerate, drop=without_missing_video
        )
        if lost:
            journal.remove_dir(directory)
            outcomes.append(EpisodeOutcome(old, None, n, rows.origin, reason=lost))
            continue
        names = [tasks[t] for t in task_ids]
        new_tasks = [t for t in dict.fromkeys(names) if t not in used_tasks]
        used_tasks.extend(new_tasks)
        table = _renumber(
            table,
            sources.schema,
            episode_index=new,
            first_frame=frames,
            task_ids=used_tasks,
            task_names=names,
        )
        _stage_rebuilt(
            directory,
            sources,
            table,
            image,
            old=old,
            new=new,
            first_frame=frames,
            names=names,
            new_tasks=new_tasks,
        )
        journal.commit_episode(work, new)
        built[old] = new
        frames += n
        outcomes.append(EpisodeOutcome(old, new, n, rows.origin, "; ".join(origins) or "-"))
    state = ConsolidatedState(root=work, info=fresh, tasks=[], episodes=[])
    if built:
        consolidate(state, list(range(len(built))))
    else:
        _write_empty_meta(work, features)
    return built


def _place_frames(
    sources: Sources,
    report: RepairReport,
    old: int,
    table: pa.Table,
    directory: Path,
    *,
    regenerate: Regenerate | None,
    drop: bool,
) -> tuple[list[str], dict[str, Any], str]:
    """Each camera's frames of episode ``old`` put in ``directory`` (made again by
    ``regenerate`` where they are lost and it can), and their image stats: (where each came from,
    the stats, why the episode is lost: empty when it is not). With ``drop``, a camera whose
    frames are lost raises _CameraLost instead, so that the camera leaves the dataset."""
    n = table.num_rows
    origins: list[str] = []
    for key in sources.keys:
        out = directory / journal.video_file_name(key)
        origin, why = sources.place_frames(old, key, n, out)
        if origin is None and regenerate is not None:
            try:
                origin = regenerate(old, key, table, out)
            except HilrecError as exc:
                why += f"; not made again: {exc}"
            if origin is None:
                out.unlink(missing_ok=True)
        if origin is None:
            if drop:
                raise _CameraLost(old, key, why)
            return origins, {}, f"frames of '{key}' unreadable: {why}"
        if origin == STAGED_ORIGIN and report.spilled(old, key):
            origin = SPILL_ORIGIN
        origins.append(origin if len(sources.keys) == 1 else f"{key}: {origin}")
    image: dict[str, Any] = {}
    try:
        for key in sources.keys:
            image[key] = sources.image_stats(old, key, directory / journal.video_file_name(key), n)
    except DAMAGE as exc:
        if not_damage(exc):
            raise
        return origins, {}, f"frames undecodable: {exc}"
    return origins, image, ""


def _stage_rebuilt(
    directory: Path,
    sources: Sources,
    table: pa.Table,
    image: dict[str, Any],
    *,
    old: int,
    new: int,
    first_frame: int,
    names: list[str],
    new_tasks: list[str],
) -> None:
    """The rebuilt episode's rows, stats and journal entry in its open directory, synced
    (``names``: each row's task string)."""
    features, n = sources.features, table.num_rows
    pq.write_table(table, directory / journal.EPISODE_DATA, **PARQUET_OPTIONS)
    columns = {k: column_to_numpy(table.column(k)) for k in data_keys(features)}
    stats: dict[str, Any] = stats_to_json(compute_episode_stats(columns, features))
    stats.update(image)
    journal.write_episode_meta(
        directory,
        {
            "episode_index": new,
            "length": n,
            "tasks": list(dict.fromkeys(names)),
            "new_tasks": new_tasks,
            "dataset_from_index": first_frame,
            "data_bytes": (directory / journal.EPISODE_DATA).stat().st_size,
            "videos": {k: {"frames": n, "duration_s": n / sources.fps} for k in sources.keys},
            "stats": {k: stats[k] for k in features if k in stats},
            "rebuilt_from_episode": old,
        },
    )
    for child in directory.iterdir():
        fsync_file(child)


def _drop_camera(sources: Sources, report: RepairReport, lost: _CameraLost) -> None:
    sources.features.pop(lost.key, None)
    sources.keys = [key for key in sources.keys if key != lost.key]
    report.actions.append(
        f"--without-missing-video: camera '{lost.key}' removed from the dataset: episode "
        f"{lost.episode} has no readable frames of it ({lost.why}); every episode keeps its rows "
        f"and its other cameras, none keeps '{lost.key}' (its files are kept in the damaged copy)"
    )


def _task_strings(sources: Sources, chosen: Mapping[int, Rows]) -> dict[int, str]:
    """task_index -> task, by majority of tasks.parquet, the journal's chain of new tasks and
    each episode's task list matched with the task_index values of its rows."""
    votes: dict[int, Counter[str]] = {}

    def vote(index: int, task: str, weight: int = 1) -> None:
        votes.setdefault(index, Counter())[task] += weight

    if sources.tasks_on_disk is not None:
        for index, task in sources.tasks_on_disk.items():
            vote(index, task)
    chain: list[str] = []
    for episode in range(len(sources.entries) + 1):
        entry = sources.entries.get(episode)
        if entry is None or entry.meta is None:
            break
        chain.extend(str(t) for t in entry.meta["new_tasks"])
    for index, task in enumerate(chain):
        vote(index, task)
    for episode, rows in chosen.items():
        names = sources.tasks_of(episode)
        if rows.table is None or names is None:
            continue
        used = list(dict.fromkeys(column_to_numpy(rows.table.column("task_index")).tolist()))
        if len(used) == len(names):
            for index, task in zip(used, names, strict=True):
                vote(int(index), task)
    return {index: counter.most_common(1)[0][0] for index, counter in votes.items()}


def _write_empty_meta(root: Path, features: Mapping[str, Any]) -> None:
    """What ``hilrec check`` needs of a dataset without episodes: an empty task table and an
    empty episodes file (LeRobot 0.4.4 still cannot load a dataset without episodes)."""
    write_parquet(tasks_table([]), root / TASKS_PATH)
    write_parquet(episodes_table([], features), episodes_path(root, FileRef()))


def _renumber(
    table: pa.Table,
    schema: pa.Schema,
    *,
    episode_index: int,
    first_frame: int,
    task_ids: list[str],
    task_names: list[str],
) -> pa.Table:
    n = table.num_rows
    ids = {task: i for i, task in enumerate(task_ids)}
    replace = {
        "episode_index": np.full(n, episode_index, dtype=np.int64),
        "index": np.arange(first_frame, first_frame + n, dtype=np.int64),
        "task_index": np.array([ids[t] for t in task_names], dtype=np.int64),
    }
    arrays = [pa.array(replace[name]) if name in replace else table.column(name) for name in schema.names]
    return pa.Table.from_arrays(arrays, schema=schema)


def _swap_in(root: Path, work: Path, report: RepairReport, built: Mapping[int, int]) -> None:
    """Move the damaged files aside and the rebuilt ones in; on any failure, put everything back."""
    damaged = damaged_dir(root, report)
    # (folder under the root, its name in the damaged copy)
    names = [
        (META_DIR, META_DIR),
        (DATA_DIR, DATA_DIR),
        (VIDEOS_DIR, VIDEOS_DIR),
        (journal.JOURNAL_DIR, "journal"),
    ]
    moved_out: list[tuple[str, str]] = []
    moved_in: list[str] = []
    try:
        for name, aside in names:
            if (root / name).exists():
                os.replace(root / name, damaged / aside)
                moved_out.append((name, aside))
        fsync_dir(root)
        for name, _ in names:
            if (work / name).exists():
                os.replace(work / name, root / name)
                moved_in.append(name)
    except BaseException:
        for name in reversed(moved_in):
            os.replace(root / name, work / name)
        for name, aside in reversed(moved_out):
            os.replace(damaged / aside, root / name)
        raise
    shutil.rmtree(work)
    fsync_dir(root)
    fsync_dir(sidecar_dir(root))
    _renumber_sidecars(root, built)
    report.kept = sorted(built)
    report.renumbered = {o: n for o, n in built.items() if o != n}
    for outcome in report.episodes:
        if not outcome.kept and not outcome.reason.startswith("open (never saved)"):
            report.drop(outcome.episode, outcome.reason)


def _renumber_sidecars(root: Path, mapping: Mapping[int, int]) -> None:
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


def _rebuild_bytes(root: Path, sources: Sources, chosen: Mapping[int, Rows]) -> int:
    """What a rebuild writes at most: every episode's rows and frames twice (the staged copy and
    the merged files, both on disk until the merge is done), plus the metadata."""
    rows = sum(r.table.nbytes for r in chosen.values() if r.table is not None)
    videos = (
        sum(p.stat().st_size for p in (root / VIDEOS_DIR).rglob("*.mp4"))
        if (root / VIDEOS_DIR).is_dir()
        else 0
    )
    videos += sum(p.stat().st_size for p in journal.journal_dir(root).glob("episode-*/*.mp4"))
    return 2 * (rows + videos) + SPACE_SLACK_BYTES + SPACE_PER_EPISODE_BYTES * len(chosen)
