"""Make a damaged or crashed dataset pass ``hilrec check`` again, keeping every episode that can be read.

The rule is ``mcap recover``'s: every episode whose rows and frames can still be read from some
copy is kept; what was kept, what was lost and why is reported episode by episode; and the result
is never a dataset that ``hilrec check`` rejects: when that cannot be reached, nothing is replaced
and the exit code says so. The copies of an episode are the journal's (its rows and metadata for
good, its frames until they are merged, see :mod:`.journal`) and LeRobot's own files (data,
episodes metadata, videos); either may be the damaged one.

:func:`repair` holds the root's lock (:class:`.rootlock.RootLock`) throughout, and goes as far as
it has to, in order:

1. settle what a crash leaves: an interrupted merge is rolled back or completed (an unreadable
   intent file is set aside and the files are judged by what they hold), temp files are deleted,
   the episode that was open when the writer died is dropped (its frames were never saved), and
   saved episodes not yet in LeRobot's files are merged (:func:`recover`, which
   ``DatasetWriter.open`` also runs). If ``hilrec check`` then passes, damaged journal entries are
   rewritten from the dataset, and that is all.
2. rewrite the metadata derived from the episodes: ``info.json`` (totals; its fixed fields, such as
   ``fps`` and the features, checked against what the rows and videos say, and rebuilt from them
   when the file is unreadable), ``stats.json`` (the aggregate of the episodes' stats) and
   ``tasks.parquet``. If ``hilrec check`` then passes, that is all.
3. rebuild: every episode is re-assembled from its best intact copy into a fresh layout beside
   the dataset: rows from the journal or the data file (when both are readable and differ, the
   one that reproduces the episode's stored stats), frames from the staged mp4 or the episode's
   span of its video file (located by the episodes metadata or, when that is unreadable, by
   aligning the files' frame counts with the episodes' lengths). An episode with no readable rows
   or no readable frames of some camera is dropped (the dataset keeps one feature set, so an
   episode cannot stay without a camera the others have; its rows stay in the damaged copy of the
   journal), and later episodes are renumbered. The fresh layout must pass ``hilrec check``
   (episodes it still rejects are dropped and the layout rebuilt); only then are the damaged files
   moved to ``hilrec/damaged-<time>/`` (never deleted) and the new ones put in their place.

A full disk is not damage: repair stops, puts back what it had started, and says how many bytes
it needs. Exit codes (:attr:`RepairReport.exit_code`): 0 nothing lost, 3 episodes were dropped,
2 the dataset still fails ``hilrec check`` and was left as it was, 4 not enough disk space.
"""

from __future__ import annotations

import copy
import errno
import logging
import os
import shutil
import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any, Final

import av
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from hilrec.daemon.atomic import atomic_write_bytes, fsync_dir, fsync_file, read_json
from hilrec.daemon.dataset import checks_journal, journal
from hilrec.daemon.dataset.checker import CheckReport, check_dataset
from hilrec.daemon.dataset.checks_common import Failure
from hilrec.daemon.dataset.checks_journal import same_rows, stats_reproduced, table_columns
from hilrec.daemon.dataset.consolidate import ConsolidatedState, consolidate, pending_episodes
from hilrec.daemon.dataset.features import DEFAULT_FEATURES, data_keys, is_video, video_keys
from hilrec.daemon.dataset.layout import (
    DEFAULT_CHUNK_SIZE,
    DEFAULT_DATA_FILE_SIZE_IN_MB,
    DEFAULT_VIDEO_FILE_SIZE_IN_MB,
    PARQUET_OPTIONS,
    data_schema,
    empty_info,
    episodes_table,
    meta_json_bytes,
    tasks_table,
    write_info,
)
from hilrec.daemon.dataset.paths import (
    CODEBASE_VERSION,
    DATA_DIR,
    DATA_PATH,
    INFO_PATH,
    META_DIR,
    STATS_PATH,
    TASKS_PATH,
    VIDEO_PATH,
    VIDEOS_DIR,
    FileRef,
    chunk_file_index,
    data_files,
    data_path,
    data_ref,
    episodes_files,
    episodes_path,
    video_path,
    video_ref,
)
from hilrec.daemon.dataset.reader import (
    column_to_numpy,
    decode_video,
    load_info,
    load_stats,
    load_task_list,
    read_episode_rows,
    read_parquet,
    read_parquet_schema,
    tasks_from_table,
)
from hilrec.daemon.dataset.rootlock import RootLock
from hilrec.daemon.dataset.sidecar import (
    episodes_sidecar_dir,
    renumber_episode_sidecar,
    sidecar_dir,
    stored_episode_sidecars,
)
from hilrec.daemon.dataset.spill import (
    ENCODE_PREFIX,
    SPILL_META,
    encode_from_spill,
    pending_spills,
    spill_name,
)
from hilrec.daemon.dataset.stats import (
    STAT_KEYS,
    aggregate_stats,
    compute_episode_stats,
    downsample_image,
    image_stats,
    sample_indices,
    stats_to_json,
    unflatten_episode_stats,
)
from hilrec.daemon.dataset.video import Segment, VideoProbe, concat_segments, probe_video, video_info
from hilrec.daemon.errors import CorruptDatasetError, DatasetError, HilrecError, VideoEncodingError
from hilrec.daemon.so101 import (
    ACTION_KEY,
    NUM_JOINTS,
    ROBOT_TYPE,
    STATE_KEY,
    camera_feature,
    position_feature,
)

log = logging.getLogger(__name__)

EXIT_OK: Final[int] = 0
EXIT_NOT_REPAIRED: Final[int] = 2
EXIT_DROPPED: Final[int] = 3
EXIT_NO_SPACE: Final[int] = 4
# A rebuild whose fresh layout the checker still rejects drops those episodes and tries again.
MAX_REBUILD_PASSES: Final[int] = 3
TIMESTAMP_TOLERANCE_S: Final[float] = 1e-4
# Beyond the files' own bytes: directories, metadata files, the parquet and mp4 containers.
SPACE_SLACK_BYTES: Final[int] = 256 * 1024
SPACE_PER_EPISODE_BYTES: Final[int] = 16 * 1024
WORK_PREFIX: Final[str] = ".rebuild-"
RESTORE_PREFIX: Final[str] = ".restore-"
# What a damaged file can make reading raise (beyond hilrec's own CorruptDatasetError).
DAMAGE: Final[tuple[type[BaseException], ...]] = (
    HilrecError,
    OSError,
    KeyError,
    TypeError,
    ValueError,
    IndexError,
    AttributeError,
    pa.ArrowException,
    av.FFmpegError,
)


# --- the report ----------------------------------------------------------------------------------


@dataclass
class EpisodeOutcome:
    """One row of the report's table: where an episode's rows and frames came from, or why it
    was dropped."""

    episode: int  # its index before the repair
    new_index: int | None  # after it; None: dropped
    length: int | None
    rows: str = "-"
    frames: str = "-"
    reason: str = ""

    @property
    def kept(self) -> bool:
        return self.new_index is not None


@dataclass
class RepairReport:
    root: str
    kept: list[int] = field(default_factory=list)  # indices (before the repair) of kept episodes
    dropped: list[dict[str, Any]] = field(default_factory=list)
    actions: list[str] = field(default_factory=list)
    renumbered: dict[int, int] = field(default_factory=dict)
    rebuilt: bool = False
    episodes: list[EpisodeOutcome] = field(default_factory=list)
    # What still fails `hilrec check` (the dataset was left as it was for it): exit 2.
    unrepaired: list[str] = field(default_factory=list)
    # Why repair stopped for lack of disk space: exit 4.
    no_space: str | None = None
    # What the operation under way needs, for the message if the disk fills.
    space_for: str = field(default="repair", repr=False)
    space_needed: int = field(default=0, repr=False)
    damaged_dir: Path | None = field(default=None, repr=False)
    # Free inodes when a write failed (before cleaning up freed some); -1: not recorded.
    inodes_left: int | None = field(default=-1, repr=False)

    @property
    def exit_code(self) -> int:
        if self.no_space:
            return EXIT_NO_SPACE
        if self.unrepaired:
            return EXIT_NOT_REPAIRED
        return EXIT_DROPPED if self.dropped else EXIT_OK

    def drop(self, episode: int, reason: str, **extra: Any) -> None:
        self.dropped.append({"episode": episode, "reason": reason, **extra})

    def to_json(self) -> dict[str, Any]:
        return {
            "root": self.root,
            "kept_episodes": self.kept,
            "dropped": self.dropped,
            "renumbered": {str(k): v for k, v in self.renumbered.items()},
            "rebuilt": self.rebuilt,
            "episodes": [asdict(e) for e in self.episodes],
            "actions": self.actions,
            "unrepaired": self.unrepaired,
            "no_space": self.no_space,
            "exit_code": self.exit_code,
        }


# --- level 1: what a crash leaves ----------------------------------------------------------------


def recover(root: Path) -> RepairReport:
    """Finish what a crash interrupted (no lock taken: the caller holds it, e.g. the writer).

    Raises CorruptDatasetError (or another DatasetError) if LeRobot's files are damaged.
    """
    root = Path(root)
    report = RepairReport(root=str(root))
    outcome = journal.recover_intent(root)
    if outcome:
        report.actions.append(f"interrupted merge {outcome}")
    _remove_orphans(root, report)
    _drop_open_episodes(root, report)
    state = _merge_pending(root, report)
    _verify_files(root, state)
    _drop_stale(root, state, report)
    report.kept = list(range(len(state.episodes)))
    return report


def _remove_orphans(root: Path, report: RepairReport) -> None:
    for path in journal.orphan_files(root):
        path.unlink()
        report.actions.append(f"removed temp file {path.relative_to(root)}")


def _drop_open_episodes(root: Path, report: RepairReport) -> None:
    for index in journal.open_episodes(root):
        directory = journal.open_episode_dir(root, index)
        frames = _count_video_frames(directory)
        journal.remove_dir(directory)
        reason = "open (never saved) when the writer stopped"
        report.drop(index, reason, video_frames_on_disk=frames)
        report.episodes.append(EpisodeOutcome(index, None, None, reason=reason))


def _count_video_frames(directory: Path) -> dict[str, int]:
    """The frames an open episode had on disk per camera: in its mp4, or raw in its spill."""
    counts = {}
    for path in directory.glob("*.mp4"):
        try:
            counts[path.stem] = probe_video(path).frames
        except CorruptDatasetError:
            counts[path.stem] = 0
    try:
        cameras = read_json(directory / SPILL_META, what="spill description", if_missing=None) or {}
        shapes = cameras.get("cameras", {}) if isinstance(cameras, dict) else {}
    except CorruptDatasetError:
        shapes = {}
    for key, shape in shapes.items():
        path = directory / spill_name(key)
        if key not in counts and path.exists() and isinstance(shape, list) and len(shape) == 2:
            counts[key] = path.stat().st_size // max(1, int(shape[0]) * int(shape[1]) * 3)
    return counts


def _merge_pending(root: Path, report: RepairReport) -> ConsolidatedState:
    """Merge the saved episodes LeRobot's files do not hold yet; on failure put the files back."""
    state = ConsolidatedState.load(root)
    pending = pending_episodes(root, state)
    if not pending:
        return state
    _need_space(root, report, _merge_bytes(root, state, pending), f"merging saved episodes {pending}")
    try:
        state = consolidate(state, pending)
    except BaseException:
        report.inodes_left = _free_inodes(root)  # before the undo frees some
        _undo_merge(root)
        raise
    report.actions.append(f"merged saved episodes {pending} into LeRobot's files")
    return state


def _undo_merge(root: Path) -> None:
    """After a failed merge: roll its renames back and delete the new versions it wrote."""
    try:
        journal.recover_intent(root)
    except DAMAGE:
        log.exception("%s: rolling back a failed merge", root)
    for path in journal.orphan_files(root):
        if not path.name.endswith(journal.OLD_SUFFIX):
            path.unlink(missing_ok=True)


def _drop_stale(root: Path, state: ConsolidatedState, report: RepairReport) -> None:
    """Sidecars of episodes that were never saved, staged videos of merged ones."""
    saved = len(state.episodes)
    for index, path in stored_episode_sidecars(root):
        if index >= saved:
            path.unlink()
            report.actions.append(f"removed sidecar of unsaved episode {index}: {path.name}")
    keys = video_keys(state.info["features"])
    for index in journal.committed_episodes(root):
        if index < saved:
            for key in keys:
                path = journal.episode_dir(root, index) / journal.video_file_name(key)
                if path.exists():
                    path.unlink()
                    report.actions.append(f"removed merged staged video of episode {index}")


def _verify_files(root: Path, state: ConsolidatedState) -> None:
    """Cheap structural checks: row and frame counts of every file against the episodes."""
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


# --- repair ----------------------------------------------------------------------------------------


@dataclass
class _Problem:
    """Why the dataset does not pass yet."""

    reason: str
    files: set[str] = field(default_factory=set)  # files the checker named (relative)


def repair(root: Path) -> RepairReport:
    """Settle, re-derive the metadata, rebuild: as far as needed for ``hilrec check`` to pass.

    Refused (DatasetLockedError, naming the holder's pid) while another process holds the root.
    Raises CorruptDatasetError when ``root`` is no dataset at all.
    """
    root = Path(root)
    if not ((root / META_DIR).is_dir() or journal.journal_dir(root).is_dir()):
        raise CorruptDatasetError(str(root / INFO_PATH), "missing: not a LeRobot dataset root")
    with RootLock(root, "hilrec repair"):
        report = RepairReport(root=str(root))
        try:
            _repair_locked(root, report)
        except DAMAGE as exc:
            if _inaccessible(exc):
                raise DatasetError(
                    f"{root}: {exc}: not damage, so nothing was rebuilt; fix the access"
                ) from exc
            if not _out_of_space(exc):
                raise
            inodes_left = _free_inodes(root) if report.inodes_left == -1 else report.inodes_left
            _undo_merge(root)
            for stray in _encode_temps(root):
                stray.unlink()
            for stale in _work_dirs(root):
                shutil.rmtree(stale, ignore_errors=True)
            report.no_space = _no_space_message(root, report, inodes_left)
            log.debug("%s: out of space: %r", root, exc)
        return report


def _repair_locked(root: Path, report: RepairReport) -> None:
    _settle(root, report)
    problem = _settled_and_checked(root, report)
    if problem is None:
        return
    if _rederive_meta(root, report, problem):
        problem = _settled_and_checked(root, report)
        if problem is None:
            return
    _rebuild(root, report, problem.reason)


def _settle(root: Path, report: RepairReport) -> None:
    for stale in _work_dirs(root):
        shutil.rmtree(stale, ignore_errors=True)
        report.actions.append(f"removed the unfinished work folder of an earlier repair: {stale.name}")
    _settle_intent(root, report)
    _remove_orphans(root, report)
    _drop_open_episodes(root, report)
    _finish_spilled_encodes(root, report)


def _finish_spilled_encodes(root: Path, report: RepairReport) -> None:
    """Encode the frames of saved episodes whose mp4 was not finished (they wait, raw, in the
    episode's spill, see :mod:`.spill`), one camera at a time: a damaged spill costs only its
    episode, which the rebuild then reports."""
    for stray in _encode_temps(root):
        stray.unlink()
        report.actions.append(f"removed interrupted encode {stray.name}")
    spills = pending_spills(root)
    if not spills:
        return
    raw = sum(
        (journal.episode_dir(root, i) / spill_name(key)).stat().st_size
        for i, key in spills
        if (journal.episode_dir(root, i) / spill_name(key)).exists()
    )
    # An mp4 is far smaller than the raw frames it encodes; a tenth of them is a generous bound.
    _need_space(root, report, raw // 10 + SPACE_SLACK_BYTES, "encoding saved frames from their spill")
    for index, key in spills:
        try:
            frames = encode_from_spill(root, index, key)
        except DAMAGE as exc:
            if _out_of_space(exc):
                report.inodes_left = _free_inodes(root)
                raise
            for stray in _encode_temps(root):
                stray.unlink()
            report.actions.append(f"episode {index} '{key}': its spill cannot be encoded ({exc})")
            continue
        report.actions.append(f"encoded episode {index} '{key}' from its spill ({frames} frames)")


def _encode_temps(root: Path) -> list[Path]:
    directory = journal.journal_dir(root)
    return sorted(directory.glob(ENCODE_PREFIX + "*.mp4")) if directory.is_dir() else []


def _work_dirs(root: Path) -> list[Path]:
    """Folders of an unfinished rebuild or journal restore (this repair's or a killed one's)."""
    return [*sidecar_dir(root).glob(WORK_PREFIX + "*"), *journal.journal_dir(root).glob(RESTORE_PREFIX + "*")]


def _settle_intent(root: Path, report: RepairReport) -> None:
    """Roll back or complete an interrupted merge; cope with an intent file that is garbage."""
    try:
        outcome = journal.recover_intent(root)
    except (CorruptDatasetError, KeyError, TypeError, AttributeError) as exc:
        problem = exc.problem if isinstance(exc, CorruptDatasetError) else f"malformed ({exc!r})"
    else:
        if outcome:
            report.actions.append(f"interrupted merge {outcome}")
        return
    path = journal.intent_path(root)
    _set_aside(root, path, report, move=True)
    for orphan in journal.orphan_files(root):
        if orphan.name.endswith(journal.NEW_SUFFIX):  # never published: its target is the old one
            orphan.unlink()
    olds = [p for p in journal.orphan_files(root) if p.name.endswith(journal.OLD_SUFFIX)]
    what = f"{path.relative_to(root)} was unreadable ({problem}); set aside"
    if not olds:
        report.actions.append(f"{what}; no merge was half done")
        return
    if _consistent(root):
        for old in olds:
            old.unlink()
        report.actions.append(f"{what}; the files agree with each other (the merge had completed)")
        return
    for old in olds:
        os.replace(old, old.with_name(old.name[: -len(journal.OLD_SUFFIX)]))
        fsync_dir(old.parent)
    report.actions.append(f"{what}; rolled back the {len(olds)} file(s) the merge had replaced")


def _consistent(root: Path) -> bool:
    try:
        _verify_files(root, ConsolidatedState.load(root))
    except DAMAGE as exc:
        if _not_damage(exc):
            raise
        return False
    return True


def _settled_and_checked(root: Path, report: RepairReport) -> _Problem | None:
    """Merge what is pending and run the checker; None when the dataset passes (report filled)."""
    try:
        state = _merge_pending(root, report)
        _verify_files(root, state)
    except DAMAGE as exc:
        if _not_damage(exc):
            raise
        return _Problem(str(exc))
    verdict = check_dataset(root)
    if not verdict.passed:
        return _Problem(_summary(verdict), {f.file for f in _errors(verdict)})
    _drop_stale(root, state, report)
    report.kept = list(range(len(state.episodes)))
    report.episodes.extend(
        EpisodeOutcome(i, i, int(row["length"]), "dataset", "dataset") for i, row in enumerate(state.episodes)
    )
    report.episodes.sort(key=lambda e: e.episode)
    if verdict.summary.get("notes") or any(f.rule == checks_journal.RULE for f in verdict.failures):
        _restore_journal(root, state, report)
    return None


def _errors(verdict: CheckReport) -> list[Failure]:
    """The findings that make ``hilrec check`` fail (all of them, for a checker without severities)."""
    return list(getattr(verdict, "errors", verdict.failures))


def _summary(verdict: CheckReport, limit: int = 3) -> str:
    errors = _errors(verdict)
    lines = [f.format() for f in errors[:limit]]
    more = len(errors) - limit
    return "; ".join(lines) + (f" (and {more} more)" if more > 0 else "")


# --- the journal, rewritten from a whole dataset -------------------------------------------------


def _restore_journal(root: Path, state: ConsolidatedState, report: RepairReport) -> None:
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
            files[journal.EPISODE_DATA] = _parquet_bytes(table.replace_schema_metadata(schema.metadata))
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


def _parquet_bytes(table: pa.Table) -> bytes:
    stream = pa.BufferOutputStream()
    pq.write_table(table, stream, **PARQUET_OPTIONS)
    return bytes(stream.getvalue().to_pybytes())


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


# --- level 2: metadata derived from the episodes ------------------------------------------------


def _rederive_meta(root: Path, report: RepairReport, problem: _Problem) -> bool:
    """Rewrite info.json, stats.json and tasks.parquet from the episodes; True if any was written.

    Needs every episodes-metadata file to be readable (else only a rebuild can help).
    """
    try:
        info = _fixed_info(root, report)
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
        if _not_damage(exc):
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
        _set_aside(root, root / INFO_PATH, report)
        write_info(root, info)
        written.append(INFO_PATH)
    if _readable_tasks(root) != tasks:
        _set_aside(root, root / TASKS_PATH, report)
        _write_parquet(tasks_table(tasks), root / TASKS_PATH)
        written.append(TASKS_PATH)
    try:
        stats_ok = load_stats(root) is not None or not rows
    except CorruptDatasetError:
        stats_ok = False
    if rows and (not stats_ok or STATS_PATH in problem.files):
        stats = aggregate_stats([unflatten_episode_stats(r) for r in rows])
        _set_aside(root, root / STATS_PATH, report)
        atomic_write_bytes(root / STATS_PATH, meta_json_bytes(stats_to_json(stats)))
        written.append(STATS_PATH)
    if not rows and not episodes_files(root):
        _write_parquet(episodes_table([], info["features"]), episodes_path(root, FileRef()))
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


def _write_parquet(table: pa.Table, path: Path) -> None:
    atomic_write_bytes(path, _parquet_bytes(table))


def _set_aside(root: Path, path: Path, report: RepairReport, *, move: bool = False) -> None:
    """Keep a file about to be replaced in ``hilrec/damaged-<time>/replaced/`` (moved or copied)."""
    if not path.exists():
        return
    target = _damaged_dir(root, report) / "replaced" / path.relative_to(root)
    target.parent.mkdir(parents=True, exist_ok=True)
    if move:
        os.replace(path, target)
        fsync_dir(path.parent)
    else:
        shutil.copy2(path, target)


def _damaged_dir(root: Path, report: RepairReport) -> Path:
    if report.damaged_dir is None:
        report.damaged_dir = sidecar_dir(root) / f"damaged-{time.strftime('%Y%m%d-%H%M%S')}"
        report.damaged_dir.mkdir(parents=True, exist_ok=True)
        report.actions.append(f"kept the damaged files in {report.damaged_dir.relative_to(root)}")
    return report.damaged_dir


# --- info.json's fixed fields, checked against the rows and the videos ---------------------------


@dataclass
class _Evidence:
    """What the files say about the dataset's fixed fields, whatever info.json says."""

    columns: list[tuple[str, str, list[int]]] | None = None  # (key, dtype, shape), file order
    rows_fps: int | None = None
    videos: dict[str, VideoProbe] = field(default_factory=dict)  # key -> the common probe
    video_fps: dict[str, int] = field(default_factory=dict)

    def fps(self) -> tuple[int | None, str]:
        rates = set(self.video_fps.values())
        if self.rows_fps is not None and (not rates or rates == {self.rows_fps}):
            return self.rows_fps, "the rows' timestamps" + (" and the videos" if rates else "")
        if self.rows_fps is None and len(rates) == 1:
            return rates.pop(), "the videos"
        return None, ""


def _fixed_info(root: Path, report: RepairReport) -> dict[str, Any] | None:
    """info.json's fixed fields (totals as on disk), corrected by the evidence; None if unknown."""
    base: dict[str, Any] | None = None
    source = INFO_PATH
    try:
        base = load_info(root)
        unreadable = "" if _usable(base) else "no usable fps or features"
    except CorruptDatasetError as exc:
        unreadable = exc.problem
    if unreadable:
        base = None
        for candidate, name in _info_copies(root):
            base, source = candidate, name
            break
    evidence = _gather_evidence(root, base)
    if base is None:
        info = _info_from_evidence(evidence)
        if info is None:
            report.unrepaired.append(
                f"{INFO_PATH} is unreadable ({unreadable}) and no data file or video says what it held"
            )
            return None
        report.actions.append(
            f"{INFO_PATH} unreadable ({unreadable}): its fixed fields rebuilt from the data: features "
            f"from the data files' columns and the videos, fps {info['fps']} from {evidence.fps()[1]}; "
            "names of action/observation.state and robot_type as hilrec records them (SO-101); "
            "chunks_size and file size limits: the defaults"
        )
        return info
    if source != INFO_PATH:
        report.actions.append(f"{INFO_PATH} unreadable ({unreadable}): its fixed fields taken from {source}")
    return _reconcile(base, evidence, report)


def _usable(info: Mapping[str, Any]) -> bool:
    fps = info.get("fps")
    return (
        isinstance(fps, int)
        and not isinstance(fps, bool)
        and fps > 0
        and isinstance(info.get("features"), dict)
    )


def _info_copies(root: Path) -> Iterable[tuple[dict[str, Any], str]]:
    """Other copies of info.json: the journal's, a merge's old version, earlier damaged ones."""
    copy_ = journal.load_info_copy(root)
    if copy_ is not None and _usable(copy_):
        yield copy_, f"{journal.JOURNAL_DIR}/{journal.INFO_COPY}"
    paths = [journal.old_path(root / INFO_PATH)]
    paths += sorted(sidecar_dir(root).glob("damaged-*/meta/info.json"), reverse=True)
    paths += sorted(sidecar_dir(root).glob("damaged-*/replaced/meta/info.json"), reverse=True)
    for path in paths:
        try:
            info = read_json(path, what="info.json copy", if_missing=None)
        except CorruptDatasetError:
            continue
        if isinstance(info, dict) and _usable(info):
            yield info, path.relative_to(root).as_posix()


def _gather_evidence(root: Path, base: Mapping[str, Any] | None) -> _Evidence:
    evidence = _Evidence()
    parquets = [journal.episode_dir(root, i) / journal.EPISODE_DATA for i in journal.committed_dirs(root)]
    parquets += data_files(root)
    schemas: Counter[tuple[tuple[str, str, tuple[int, ...]], ...]] = Counter()
    for path in parquets:
        try:
            columns = _schema_columns(read_parquet_schema(path))
        except CorruptDatasetError:
            continue
        if columns:
            schemas[columns] += 1
    if schemas:
        best = schemas.most_common(1)[0][0]
        evidence.columns = [(k, d, list(s)) for k, d, s in best]
    for path in parquets:
        rate = _rows_fps(path)
        if rate is not None:
            evidence.rows_fps = rate
            break
    keys: dict[str, None] = dict.fromkeys(video_keys(base["features"]) if base else [])
    if (root / VIDEOS_DIR).is_dir():
        keys.update(dict.fromkeys(sorted(p.name for p in (root / VIDEOS_DIR).iterdir() if p.is_dir())))
    for index in journal.committed_dirs(root):
        keys.update(dict.fromkeys(sorted(p.stem for p in journal.episode_dir(root, index).glob("*.mp4"))))
    for key in keys:
        files = sorted((root / VIDEOS_DIR / key).glob("chunk-*/file-*.mp4"))
        files += [
            journal.episode_dir(root, i) / journal.video_file_name(key) for i in journal.committed_dirs(root)
        ]
        probes: list[VideoProbe] = []
        for path in files:
            if path.exists():
                try:
                    probes.append(probe_video(path))
                except CorruptDatasetError:
                    continue
        if not probes:
            continue
        shapes = Counter((p.height, p.width, int(p.fps) if p.fps else 0) for p in probes)
        height, width, rate = shapes.most_common(1)[0][0]
        evidence.videos[key] = next(p for p in probes if (p.height, p.width) == (height, width))
        if rate:
            evidence.video_fps[key] = rate
    return evidence


def _schema_columns(schema: pa.Schema) -> tuple[tuple[str, str, tuple[int, ...]], ...]:
    out = []
    for f in schema:
        shape: list[int] = []
        leaf = f.type
        while pa.types.is_fixed_size_list(leaf):
            shape.append(leaf.list_size)
            leaf = leaf.value_type
        try:
            dtype = np.dtype(leaf.to_pandas_dtype()).name
        except (NotImplementedError, TypeError):
            return ()
        out.append((f.name, dtype, tuple(shape or [1])))
    return tuple(out)


def _rows_fps(path: Path) -> int | None:
    try:
        table = read_parquet(path, columns=["timestamp", "frame_index"])
        ts = column_to_numpy(table.column("timestamp"))
        frames = column_to_numpy(table.column("frame_index"))
    except (CorruptDatasetError, KeyError, pa.ArrowException):
        return None
    steps = np.flatnonzero(frames == 1)
    if not len(steps) or not ts[steps[0]] > 0:
        return None
    rate = round(1.0 / float(ts[steps[0]]))
    ok = np.abs(ts.astype(np.float64) - frames / rate) <= TIMESTAMP_TOLERANCE_S
    return rate if rate > 0 and bool(ok.all()) else None


def _info_from_evidence(evidence: _Evidence) -> dict[str, Any] | None:
    rate, _ = evidence.fps()
    if evidence.columns is None or rate is None:
        return None
    features: dict[str, dict[str, Any]] = {}
    for key, dtype, shape in evidence.columns:
        if key not in DEFAULT_FEATURES:
            features[key] = _data_spec(key, dtype, shape, None)
    for key, probe in evidence.videos.items():
        features[key] = {**camera_feature(probe.height, probe.width), "info": video_info(probe)}
    features.update(copy.deepcopy(DEFAULT_FEATURES))
    so101 = all(features.get(k, {}).get("names") for k in (ACTION_KEY, STATE_KEY))
    return empty_info(fps=rate, features=features, robot_type=ROBOT_TYPE if so101 else None)


def _data_spec(key: str, dtype: str, shape: list[int], old: Any) -> dict[str, Any]:
    """The spec of a data column; its names from the old spec, else (a feature rebuilt from the
    data alone) the SO-101 joint names hilrec records action and observation.state with."""
    if isinstance(old, Mapping):
        names = old.get("names")
    elif key in (ACTION_KEY, STATE_KEY) and shape == [NUM_JOINTS] and dtype == "float32":
        names = position_feature()["names"]
    else:
        names = None
    if key in DEFAULT_FEATURES:
        return copy.deepcopy(DEFAULT_FEATURES[key])
    spec: dict[str, Any] = {"dtype": dtype, "shape": list(shape), "names": names}
    if isinstance(old, Mapping) and "info" in old:
        spec["info"] = old["info"]
    return spec


def _reconcile(base: Mapping[str, Any], evidence: _Evidence, report: RepairReport) -> dict[str, Any]:
    info = copy.deepcopy(dict(base))
    fixes: list[str] = []
    rate, source = evidence.fps()
    if rate is not None and info.get("fps") != rate:
        fixes.append(f"fps {info.get('fps')!r} -> {rate} (what {source} say)")
        info["fps"] = rate
    old: dict[str, Any] = dict(info["features"])
    features: dict[str, Any] = {}
    if evidence.columns is not None:
        declared_data = [k for k, s in old.items() if not (isinstance(s, dict) and is_video(s))]
        seen = {k for k, _, _ in evidence.columns}
        unmatched_old = [k for k in declared_data if k not in seen]
        unmatched_new = [c for c in evidence.columns if c[0] not in old]
        renames = (
            dict(zip(unmatched_old, unmatched_new, strict=False))
            if len(unmatched_old) == len(unmatched_new)
            else {}
        )
        by_key = {c[0]: c for c in evidence.columns}
        for key, spec in old.items():
            if isinstance(spec, dict) and is_video(spec):
                features[key] = spec
            elif key in by_key:
                _, dtype, shape = by_key[key]
                fixed = _data_spec(key, dtype, shape, spec)
                if (
                    not isinstance(spec, dict)
                    or spec.get("dtype") != dtype
                    or list(spec.get("shape") or []) != shape
                ):
                    fixes.append(
                        f"features.{key}: {_spec_text(spec)} -> {dtype} {shape} (the data files' column)"
                    )
                features[key] = fixed
            elif key in renames:
                new_key, dtype, shape = renames[key]
                fixes.append(f"feature {key!r} -> {new_key!r} (the data files' column)")
                features[new_key] = _data_spec(new_key, dtype, shape, spec)
            else:
                fixes.append(f"features.{key} dropped: no data file has that column")
        for key, dtype, shape in evidence.columns:
            if key not in features:
                fixes.append(f"features.{key} added: {dtype} {shape} (a column of the data files)")
                features[key] = _data_spec(key, dtype, shape, None)
    else:
        features = old
    declared_videos = [k for k, s in features.items() if isinstance(s, dict) and is_video(s)]
    missing = [k for k in declared_videos if k not in evidence.videos]
    extra = [k for k in evidence.videos if k not in features]
    renamed = dict(zip(missing, extra, strict=True)) if len(missing) == len(extra) else {}
    result: dict[str, Any] = {}
    for declared, spec in features.items():
        name: str = renamed.get(declared, declared)
        if name != declared:
            fixes.append(f"video feature {declared!r} -> {name!r} (the folder under videos/)")
        probe = evidence.videos.get(name)
        fixed = spec
        if probe is not None and isinstance(spec, dict) and is_video(spec):
            fixed = _fixed_video_spec(name, spec, probe, fixes)
        result[name] = fixed
    for key in extra:
        if key not in result:
            fixes.append(
                f"features.{key} added: video {evidence.videos[key].height}x{evidence.videos[key].width}"
            )
            result[key] = {**camera_feature(evidence.videos[key].height, evidence.videos[key].width)}
    defaults = {k: result.pop(k) for k in list(result) if k in DEFAULT_FEATURES}
    for key, spec in DEFAULT_FEATURES.items():
        if defaults.get(key) != spec:
            fixes.append(f"features.{key} reset to LeRobot's default")
        result[key] = copy.deepcopy(spec)
    info["features"] = result
    for name, want in (("codebase_version", CODEBASE_VERSION), ("data_path", DATA_PATH)):
        if info.get(name) != want:
            fixes.append(f"{name} {info.get(name)!r} -> {want!r}")
            info[name] = want
    want_video = VIDEO_PATH if video_keys(result) else None
    if info.get("video_path") != want_video:
        fixes.append(f"video_path {info.get('video_path')!r} -> {want_video!r}")
        info["video_path"] = want_video
    for name, default, kind in (
        ("chunks_size", DEFAULT_CHUNK_SIZE, int),
        ("data_files_size_in_mb", DEFAULT_DATA_FILE_SIZE_IN_MB, (int, float)),
        ("video_files_size_in_mb", DEFAULT_VIDEO_FILE_SIZE_IN_MB, (int, float)),
    ):
        value = info.get(name)
        if isinstance(value, bool) or not isinstance(value, kind) or value <= 0:
            fixes.append(f"{name} {value!r} -> {default} (the default)")
            info[name] = default
    if fixes:
        report.actions.append(f"{INFO_PATH}: " + "; ".join(fixes))
    return info


def _spec_text(spec: Any) -> str:
    return f"{spec.get('dtype')} {spec.get('shape')}" if isinstance(spec, dict) else repr(spec)


def _fixed_video_spec(key: str, spec: dict[str, Any], probe: VideoProbe, fixes: list[str]) -> dict[str, Any]:
    spec = copy.deepcopy(spec)
    shape = [probe.height, probe.width, 3]
    if list(spec.get("shape") or []) != shape:
        fixes.append(f"features.{key}.shape {spec.get('shape')} -> {shape} (the videos)")
        spec["shape"] = shape
    stored = spec.get("info")
    want = video_info(probe)
    if stored:
        names = ("video.height", "video.width", "video.fps", "video.codec")
        if not isinstance(stored, dict) or any(stored.get(n) != want[n] for n in names):
            fixes.append(f"features.{key}.info set from the videos")
            spec["info"] = want
    return spec


# --- level 3: rebuild -----------------------------------------------------------------------------


@dataclass
class _Rows:
    """The rows chosen for one episode, or why there are none."""

    table: pa.Table | None
    origin: str
    reason: str = ""
    phantom: bool = False  # only a stray block in a data file speaks of this episode


class _Sources:
    """Every readable copy of every episode at the root, read once."""

    def __init__(self, root: Path, info: dict[str, Any], on_disk_total: int | None) -> None:
        self.root = root
        self.info = info
        self.features: dict[str, Any] = info["features"]
        self.fps = int(info["fps"])
        self.schema = data_schema(self.features)
        self.keys = video_keys(self.features)
        self.chunks_size = int(info.get("chunks_size") or DEFAULT_CHUNK_SIZE)
        self.on_disk_total = on_disk_total
        self.entries = {i: journal.read_entry(root, i) for i in journal.committed_dirs(root)}
        self.rows: dict[int, dict[str, Any]] = {}
        self.problems: list[str] = []
        for path in episodes_files(root):
            try:
                for row in read_parquet(path).to_pylist():
                    if isinstance(row.get("episode_index"), int) and isinstance(row.get("length"), int):
                        self.rows[int(row["episode_index"])] = row
            except CorruptDatasetError as exc:
                self.problems.append(f"{path.relative_to(root)}: {exc.problem}")
        self.data: dict[int, pa.Table | str] = {}
        self.data_problems: dict[str, str] = {}
        for path in data_files(root):
            self._split(path)
        try:
            self.tasks_on_disk: dict[int, str] | None = tasks_from_table(
                read_parquet(root / TASKS_PATH), root / TASKS_PATH
            )
        except CorruptDatasetError:
            self.tasks_on_disk = None
        self._probes: dict[Path, VideoProbe | str] = {}
        self._inferred: dict[str, dict[int, tuple[Path, float, float]]] = {}
        self.lengths: dict[int, int] = {}

    def _split(self, path: Path) -> None:
        rel = path.relative_to(self.root).as_posix()
        try:
            table = read_parquet(path)
            episodes = column_to_numpy(table.column("episode_index"))
        except (CorruptDatasetError, KeyError, pa.ArrowException) as exc:
            self.data_problems[rel] = getattr(exc, "problem", str(exc))
            return
        if not len(episodes):
            return
        change = np.flatnonzero(np.diff(episodes)) + 1
        starts = [0, *change.tolist()]
        ends = [*change.tolist(), len(episodes)]
        for start, end in zip(starts, ends, strict=True):
            episode = int(episodes[start])
            if episode in self.data:
                self.data[episode] = f"its rows are split over several blocks ({rel} row {start})"
            else:
                self.data[episode] = table.slice(start, end - start)

    def candidates(self) -> list[int]:
        return sorted(set(self.entries) | set(self.rows) | set(self.data))

    def probe(self, path: Path) -> VideoProbe | str:
        if path not in self._probes:
            try:
                self._probes[path] = probe_video(path)
            except CorruptDatasetError as exc:
                self._probes[path] = exc.problem
        return self._probes[path]

    def stored_stats(self, episode: int) -> dict[str, Any] | None:
        entry = self.entries.get(episode)
        if entry is not None and entry.meta is not None:
            return dict(entry.meta["stats"])
        row = self.rows.get(episode)
        return dict(unflatten_episode_stats(row)) if row is not None else None

    def tasks_of(self, episode: int) -> list[str] | None:
        entry = self.entries.get(episode)
        if entry is not None and entry.meta is not None:
            return [str(t) for t in entry.meta["tasks"]]
        row = self.rows.get(episode)
        return (
            [str(t) for t in row["tasks"]] if row is not None and isinstance(row.get("tasks"), list) else None
        )

    def rel(self, path: Path) -> str:
        try:
            return path.relative_to(self.root).as_posix()
        except ValueError:
            return str(path)

    # --- rows ---

    def choose_rows(self, episode: int) -> _Rows:
        entry = self.entries.get(episode)
        row = self.rows.get(episode)
        expected = (
            entry.meta["length"] if entry is not None and entry.meta else row["length"] if row else None
        )
        reasons: list[str] = []
        found: list[tuple[str, pa.Table]] = []
        if entry is None:
            reasons.append("no journal entry")
        elif entry.table is None:
            reasons.append(
                "journal: " + "; ".join(m for p, m in entry.problems if p.name == journal.EPISODE_DATA)
            )
        else:
            problem = self._rows_problem(entry.table, episode, expected)
            (reasons.append(f"journal: {problem}") if problem else found.append(("journal", entry.table)))
        data = self.data.get(episode)
        if data is None:
            named = data_path(self.root, data_ref(row)).relative_to(self.root).as_posix() if row else None
            why = self.data_problems.get(named or "") if named else None
            reasons.append(f"data file {named}: {why}" if why else "in no readable data file")
        elif isinstance(data, str):
            reasons.append(f"data file: {data}")
        else:
            problem = self._rows_problem(data, episode, expected)
            (reasons.append(f"data file: {problem}") if problem else found.append(("data file", data)))
        if not found:
            # Rows that name an episode neither the journal nor the episodes metadata know of are
            # a damaged block of another episode's, not an episode.
            phantom = entry is None and row is None and bool(self.entries or self.rows)
            return _Rows(None, "-", "rows unreadable: " + "; ".join(reasons), phantom=phantom)
        origin, table = found[0]
        if len(found) == 2:
            cols = [table_columns(t, self.features, Path(o)) for o, t in found]
            if not same_rows(cols[0], cols[1]):
                stored = self.stored_stats(episode)
                verdict = [stats_reproduced(c, stored, self.features) for c in cols]
                if verdict == [False, True]:
                    origin, table = found[1]
                    origin += " (the journal copy differs and does not reproduce the episode's stats)"
                elif verdict == [True, False]:
                    origin += " (the data file's rows differ and do not reproduce the episode's stats)"
                else:
                    origin += " (the data file's rows differ; neither copy can be told right by the stats)"
        self.lengths[episode] = table.num_rows
        return _Rows(table.select(self.schema.names), origin)

    def _rows_problem(self, table: pa.Table, episode: int, expected: int | None) -> str | None:
        missing = [n for n in self.schema.names if n not in table.column_names]
        if missing:
            return f"columns {missing} missing"
        for f in self.schema:
            if table.schema.field(f.name).type != f.type:
                return f"column '{f.name}' is {table.schema.field(f.name).type}, expected {f.type}"
        n = table.num_rows
        if n == 0:
            return "no rows"
        if expected is not None and n != expected:
            return f"{n} rows, the episode has {expected}"
        try:
            cols = table_columns(table, self.features, Path("rows"))
        except CorruptDatasetError as exc:
            return exc.problem
        if not (cols["episode_index"] == episode).all():
            return "episode_index is not the episode's in every row"
        if not np.array_equal(cols["frame_index"], np.arange(n)):
            return "frame_index is not 0 .. length-1"
        grid = np.arange(n) / self.fps
        if np.abs(cols["timestamp"].astype(np.float64) - grid).max() > TIMESTAMP_TOLERANCE_S:
            return f"timestamp is off the 1/{self.fps} s grid"
        if n > 1 and not (np.diff(cols["index"]) == 1).all():
            return "index is not contiguous"
        for key, values in cols.items():
            if values.dtype.kind == "f" and not np.isfinite(values).all():
                return f"column '{key}' holds NaN or infinity"
        return None

    # --- frames ---

    def place_frames(self, episode: int, key: str, length: int, out: Path) -> tuple[str | None, str]:
        """Write the episode's frames of ``key`` to ``out``; (where they came from, why not)."""
        reasons = []
        staged = journal.episode_dir(self.root, episode) / journal.video_file_name(key)
        if staged.exists():
            probe = self.probe(staged)
            if isinstance(probe, str):
                reasons.append(f"staged {self.rel(staged)}: {probe}")
            elif probe.frames != length:
                reasons.append(f"staged {self.rel(staged)}: {probe.frames} frames for {length} rows")
            else:
                shutil.copyfile(staged, out)
                return "journal (staged mp4)", ""
        spill = journal.episode_dir(self.root, episode) / spill_name(key)
        if spill.exists():
            reasons.append(f"its frames wait in {self.rel(spill)}, which cannot be encoded (see above)")
        row = self.rows.get(episode)
        if row is not None and row.get(f"videos/{key}/chunk_index") is not None:
            prefix = f"videos/{key}/"
            where = (
                video_path(self.root, key, video_ref(row, key)),
                float(row[prefix + "from_timestamp"]),
                float(row[prefix + "to_timestamp"]),
            )
            how = "the episodes metadata"
        else:
            located = self.inferred(key).get(episode)
            if located is None:
                reasons.append(f"no readable video file holds it ({self._video_files_text(key)})")
                return None, "; ".join(reasons)
            where, how = located, "aligned by frame counts"
        path, start, end = where
        problem = self._extract(path, start, end, out, length)
        if problem is None:
            return f"{self.rel(path)} [{start:.3f}, {end:.3f}) s ({how})", ""
        reasons.append(f"{self.rel(path)}: {problem}")
        return None, "; ".join(reasons)

    def _video_files_text(self, key: str) -> str:
        bad = [
            f"{self.rel(p)}: {r}"
            for p, r in self._probes.items()
            if isinstance(r, str) and p.parent.parent.name == key
        ]
        return "; ".join(bad) if bad else f"the files under videos/{key}/ hold other episodes"

    def _extract(self, path: Path, start: float, end: float, out: Path, length: int) -> str | None:
        probe = self.probe(path)
        if isinstance(probe, str):
            return probe
        try:
            placed = concat_segments(out, [Segment(path, start, end)], fps=self.fps)
        except (VideoEncodingError, CorruptDatasetError, av.FFmpegError, OSError) as exc:
            if _out_of_space(exc):
                raise
            out.unlink(missing_ok=True)
            return str(exc)
        if placed[0][2] != length:
            out.unlink(missing_ok=True)
            return f"only {placed[0][2]} of its {length} frames are readable in [{start:.3f}, {end:.3f}) s"
        return None

    def inferred(self, key: str) -> dict[int, tuple[Path, float, float]]:
        """Where each episode's frames sit in LeRobot's video files of ``key``, found without the
        episodes metadata: the files hold the merged episodes in order, each file a run of
        consecutive episodes, so a file whose frame count only one run of episodes adds up to
        holds that run. Files that cannot be read (or are missing from the numbering) hold
        unknown runs; episodes of an ambiguous placement are left out."""
        if key in self._inferred:
            return self._inferred[key]
        placed: dict[int, tuple[Path, float, float]] = {}
        self._inferred[key] = placed
        existing = sorted(
            FileRef(*ref)
            for p in (self.root / VIDEOS_DIR / key).glob("chunk-*/file-*.mp4")
            if (ref := chunk_file_index(p.relative_to(self.root / VIDEOS_DIR / key))) is not None
        )
        if not existing:
            return placed
        refs = [FileRef()]
        while refs[-1] < existing[-1]:
            refs.append(refs[-1].next(self.chunks_size))
        paths = [video_path(self.root, key, ref) for ref in refs]
        counts: list[int | None] = []
        for path in paths:
            probe = self.probe(path) if path.exists() else "missing"
            counts.append(probe.frames if isinstance(probe, VideoProbe) else None)
        staged = {
            e
            for e in self.candidates()
            if (journal.episode_dir(self.root, e) / journal.video_file_name(key)).exists()
        }
        options = []
        if self.on_disk_total is not None:
            options.append(self.on_disk_total)
        options += [len([e for e in self.candidates() if e not in staged]), len(self.candidates())]
        for merged in dict.fromkeys(options):
            lengths = [self.length(e) for e in range(merged)]
            if any(n is None for n in lengths):
                continue
            runs = _align([int(n) for n in lengths if n is not None], counts)
            if not runs:
                continue
            for i, (s, t) in runs.items():
                offset = 0
                for episode in range(s, t):
                    n = int(lengths[episode] or 0)
                    start = float(Fraction(offset, self.fps))
                    placed[episode] = (paths[i], start, float(Fraction(offset + n, self.fps)))
                    offset += n
            break
        return placed

    def length(self, episode: int) -> int | None:
        if episode in self.lengths:
            return self.lengths[episode]
        entry = self.entries.get(episode)
        if entry is not None and entry.meta is not None:
            return int(entry.meta["length"])
        row = self.rows.get(episode)
        if row is not None:
            return int(row["length"])
        data = self.data.get(episode)
        return data.num_rows if isinstance(data, pa.Table) else None

    def image_stats(self, episode: int, key: str, mp4: Path, length: int) -> dict[str, Any]:
        stored = self.stored_stats(episode) or {}
        stats = stored.get(key)
        if isinstance(stats, Mapping) and all(n in stats for n in STAT_KEYS):
            return stats_to_json({key: {n: np.asarray(stats[n]) for n in STAT_KEYS}})[key]
        frames = decode_video(mp4, np.asarray(sample_indices(length), dtype=np.float64) / self.fps)
        return stats_to_json({key: image_stats(np.stack([downsample_image(f) for f in frames]))})[key]


def _align(lengths: Sequence[int], counts: Sequence[int | None]) -> dict[int, tuple[int, int]]:
    """For each file of known frame count whose run of episodes is certain: (first, end) episode.

    Files hold consecutive runs of at least one episode, in order; a file of unknown count
    (unreadable, missing) holds an unknown run; after the last file, episodes may be in files that
    are gone. A run is certain when every split of the episodes consistent with the counts gives
    that file the same run.
    """
    total = len(lengths)
    sums = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64).tolist()
    at = {value: index for index, value in enumerate(sums)}
    m = len(counts)
    forward: list[set[int]] = [set() for _ in range(m + 1)]
    forward[0] = {0}
    for i, count in enumerate(counts):
        if not forward[i]:
            return {}
        if count is None:
            forward[i + 1] = set(range(min(forward[i]) + 1, total + 1))
            continue
        for s in forward[i]:
            t = at.get(sums[s] + count)
            if t is not None and t > s:
                forward[i + 1].add(t)
    backward: list[set[int]] = [set() for _ in range(m + 1)]
    backward[m] = set(range(total + 1))
    for i in reversed(range(m)):
        count = counts[i]
        if not backward[i + 1]:
            return {}
        if count is None:
            backward[i] = set(range(max(backward[i + 1])))
            continue
        for t in backward[i + 1]:
            first = at.get(sums[t] - count)
            if first is not None and first < t:
                backward[i].add(first)
    if 0 not in backward[0]:
        return {}
    runs: dict[int, tuple[int, int]] = {}
    for i, count in enumerate(counts):
        if count is None:
            continue
        options = set()
        for s in forward[i]:
            t = at.get(sums[s] + count)
            if t is not None and t > s and t in backward[i + 1]:
                options.add((s, t))
        if len(options) == 1:
            runs[i] = options.pop()
    return runs


def _task_strings(sources: _Sources, chosen: Mapping[int, _Rows]) -> dict[int, str]:
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


def _rebuild(root: Path, report: RepairReport, reason: str) -> None:
    report.rebuilt = True
    report.actions.append(f"rebuild needed: {reason}")
    try:
        on_disk_total = load_info(root).get("total_episodes")
    except CorruptDatasetError:
        on_disk_total = None
    info = _fixed_info(root, report)
    if info is None:
        return
    sources = _Sources(root, info, on_disk_total if isinstance(on_disk_total, int) else None)
    for problem in sources.problems:
        report.actions.append(f"unreadable: {problem}")
    excluded: dict[int, str] = {}
    for _ in range(MAX_REBUILD_PASSES):
        outcomes = [o for o in report.episodes if o.reason.startswith("open (never saved)")]
        work = sidecar_dir(root) / f"{WORK_PREFIX}{os.getpid()}"
        try:
            try:
                built = _assemble(root, work, sources, excluded, outcomes, report)
            except DAMAGE as exc:
                if _not_damage(exc):
                    raise
                report.episodes = sorted(outcomes, key=lambda o: o.episode)
                report.unrepaired.append(f"the rebuild failed: {exc}")
                return
            verdict = check_dataset(work)
            report.episodes = sorted(outcomes, key=lambda o: o.episode)
            if verdict.passed:
                _swap_in(root, work, report, built)
                return
            by_new = {o.new_index: o for o in outcomes if o.new_index is not None}
            errors = _errors(verdict)
            bad = {by_new[f.episode].episode: f.format() for f in errors if f.episode in by_new}
            # Dropping episodes helps against damage to some of them; a failure of no episode,
            # or of every one, is the dataset's own (e.g. rows and videos at different rates).
            if not bad or any(f.episode not in by_new for f in errors) or len(bad) == len(by_new):
                break
            for old, failure in bad.items():
                excluded.setdefault(old, f"the rebuilt episode fails check: {failure}")
        except BaseException:
            report.inodes_left = _free_inodes(root)  # before the work folder's go
            raise
        finally:
            if work.exists():
                shutil.rmtree(work)
    report.unrepaired = [
        f"the rebuilt dataset would still fail check: {f.format()}" for f in _errors(verdict)
    ]


def _assemble(
    root: Path,
    work: Path,
    sources: _Sources,
    excluded: Mapping[int, str],
    outcomes: list[EpisodeOutcome],
    report: RepairReport,
) -> dict[int, int]:
    """Build the fresh layout in ``work``; returns old -> new index of the episodes in it."""
    info = sources.info
    features = sources.features
    chosen = {e: sources.choose_rows(e) for e in sources.candidates() if e not in excluded}
    tasks = _task_strings(sources, chosen)
    _need_space(root, report, _rebuild_bytes(root, sources, chosen), "the rebuild")
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
        origins: list[str] = []
        lost = ""
        for key in sources.keys:
            origin, why = sources.place_frames(old, key, n, directory / journal.video_file_name(key))
            if origin is None:
                lost = f"frames of '{key}' unreadable: {why}"
                break
            origins.append(origin if len(sources.keys) == 1 else f"{key}: {origin}")
        if lost:
            journal.remove_dir(directory)
            outcomes.append(EpisodeOutcome(old, None, n, rows.origin, reason=lost))
            continue
        image: dict[str, Any] = {}
        try:
            for key in sources.keys:
                image[key] = sources.image_stats(old, key, directory / journal.video_file_name(key), n)
        except DAMAGE as exc:
            if _not_damage(exc):
                raise
            journal.remove_dir(directory)
            outcomes.append(EpisodeOutcome(old, None, n, rows.origin, reason=f"frames undecodable: {exc}"))
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
                "dataset_from_index": frames,
                "data_bytes": (directory / journal.EPISODE_DATA).stat().st_size,
                "videos": {k: {"frames": n, "duration_s": n / sources.fps} for k in sources.keys},
                "stats": {k: stats[k] for k in features if k in stats},
                "rebuilt_from_episode": old,
            },
        )
        for child in directory.iterdir():
            fsync_file(child)
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


def _write_empty_meta(root: Path, features: Mapping[str, Any]) -> None:
    """What ``hilrec check`` needs of a dataset without episodes: an empty task table and an
    empty episodes file (LeRobot 0.4.4 still cannot load a dataset without episodes)."""
    _write_parquet(tasks_table([]), root / TASKS_PATH)
    _write_parquet(episodes_table([], features), episodes_path(root, FileRef()))


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
    damaged = _damaged_dir(root, report)
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


# --- disk space -----------------------------------------------------------------------------------


def _not_damage(exc: BaseException) -> bool:
    """A full disk or a refused access: the files may be fine, so no copy of them is dropped."""
    return _out_of_space(exc) or _inaccessible(exc)


def _inaccessible(exc: BaseException | None) -> bool:
    seen = 0
    while exc is not None and seen < 10:
        if isinstance(exc, OSError) and exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
            return True
        exc = exc.__cause__ or exc.__context__
        seen += 1
    return False


def _out_of_space(exc: BaseException | None) -> bool:
    """Whether ``exc`` (or what caused it) is a full disk or an exhausted quota."""
    seen = 0
    while exc is not None and seen < 10:
        if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if "No space left on device" in str(exc):
            return True
        exc = exc.__cause__ or exc.__context__
        seen += 1
    return False


def _need_space(root: Path, report: RepairReport, needed: int, what: str) -> None:
    """Refuse (as the disk would, with ENOSPC) before starting to write what does not fit."""
    report.space_for, report.space_needed = what, needed
    free = shutil.disk_usage(sidecar_dir(root) if sidecar_dir(root).is_dir() else root).free
    if free < needed:
        raise OSError(errno.ENOSPC, f"{what} needs about {needed} bytes, {free} are free", str(root))


def _free_inodes(root: Path) -> int | None:
    stat = os.statvfs(sidecar_dir(root) if sidecar_dir(root).is_dir() else root)
    return int(stat.f_favail) if stat.f_files else None  # None: the file system has no inode limit


def _no_space_message(root: Path, report: RepairReport, inodes_left: int | None) -> str:
    where = sidecar_dir(root) if sidecar_dir(root).is_dir() else root
    free = shutil.disk_usage(where).free
    need = report.space_needed
    text = f"not enough disk space on the file system of {root}: {report.space_for}"
    if inodes_left == 0:
        text += f" needs new files and no inode was left ({free} bytes are free): delete some files"
    elif need > free:
        text += f" needs about {need} bytes, {free} are free: free at least {need - free} bytes"
    else:
        text += f" ran out of space ({free} bytes free now; it needs about {need}): free more"
    return (
        text + " and run 'hilrec repair' again. Nothing was lost: the dataset's files were left as they were."
    )


def _merge_bytes(root: Path, state: ConsolidatedState, pending: Sequence[int]) -> int:
    """What a merge of ``pending`` writes at most: new versions of the last files, plus the episodes."""
    total = SPACE_SLACK_BYTES + SPACE_PER_EPISODE_BYTES * (len(state.episodes) + len(pending))
    last = state.episodes[-1] if state.episodes else None
    files = [data_path(root, data_ref(last))] if last else []
    keys = video_keys(state.info["features"])
    files += [video_path(root, key, video_ref(last, key)) for key in keys] if last else []
    for index in pending:
        directory = journal.episode_dir(root, index)
        files += [directory / journal.EPISODE_DATA, *(directory / journal.video_file_name(k) for k in keys)]
    return total + sum(p.stat().st_size for p in files if p.exists())


def _rebuild_bytes(root: Path, sources: _Sources, chosen: Mapping[int, _Rows]) -> int:
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
