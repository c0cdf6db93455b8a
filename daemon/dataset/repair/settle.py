"""Repair's first step: settle what a crash leaves, before anything is judged.

A killed writer can leave an interrupted merge (rolled back or completed by its intent file; an
unreadable intent is set aside and the files are judged by what they hold), temp files, the
episode that was open (dropped: its frames were never saved), saved episodes whose mp4 was not
finished (encoded from their spill, see :mod:`.spill`) and saved episodes not yet merged into
LeRobot's files (merged; a failed merge is undone). Files about to be replaced are kept in
``hilrec/damaged-<time>/`` (:func:`set_aside`), never deleted.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from pathlib import Path
from typing import Any, Final

import pyarrow as pa
import pyarrow.parquet as pq

from hilrec.daemon.atomic import fsync_dir, read_json
from hilrec.daemon.dataset.format.features import video_keys
from hilrec.daemon.dataset.format.paths import INFO_PATH, FileRef, data_path, data_ref, video_path, video_ref
from hilrec.daemon.dataset.format.sidecar import sidecar_dir, stored_episode_sidecars
from hilrec.daemon.dataset.repair.report import EpisodeOutcome, RepairReport
from hilrec.daemon.dataset.repair.space import (
    DAMAGE,
    SPACE_SLACK_BYTES,
    free_inodes,
    merge_bytes,
    need_space,
    not_damage,
    out_of_space,
)
from hilrec.daemon.dataset.store import journal
from hilrec.daemon.dataset.store.consolidate import ConsolidatedState, consolidate, pending_episodes
from hilrec.daemon.dataset.store.spilled import encode_from_spill, pending_spills
from hilrec.daemon.dataset.video.codec import probe_video
from hilrec.daemon.dataset.video.spill import ENCODE_PREFIX, SPILL_META, spill_name
from hilrec.daemon.errors import CorruptDatasetError

log = logging.getLogger(__name__)

WORK_PREFIX: Final[str] = ".rebuild-"
RESTORE_PREFIX: Final[str] = ".restore-"


def settle(root: Path, report: RepairReport) -> None:
    """Everything of step 1 but the merge, which comes with the first check."""
    for stale in work_dirs(root):
        shutil.rmtree(stale, ignore_errors=True)
        report.actions.append(f"removed the unfinished work folder of an earlier repair: {stale.name}")
    _settle_intent(root, report)
    remove_orphans(root, report)
    drop_open_episodes(root, report)
    _finish_spilled_encodes(root, report)


def work_dirs(root: Path) -> list[Path]:
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
    set_aside(root, path, report, move=True)
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
        verify_files(root, ConsolidatedState.load(root))
    except DAMAGE as exc:
        if not_damage(exc):
            raise
        return False
    return True


def remove_orphans(root: Path, report: RepairReport) -> None:
    for path in journal.orphan_files(root):
        path.unlink()
        report.actions.append(f"removed temp file {path.relative_to(root)}")


def drop_open_episodes(root: Path, report: RepairReport) -> None:
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


def _finish_spilled_encodes(root: Path, report: RepairReport) -> None:
    """Encode the frames of saved episodes whose mp4 was not finished (they wait, raw, in the
    episode's spill, see :mod:`.spill`), one camera at a time: a damaged spill costs only its
    episode, which the rebuild then reports."""
    for stray in encode_temps(root):
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
    need_space(root, report, raw // 10 + SPACE_SLACK_BYTES, "encoding saved frames from their spill")
    for index, key in spills:
        try:
            frames = encode_from_spill(root, index, key)
        except DAMAGE as exc:
            if out_of_space(exc):
                report.inodes_left = free_inodes(root)
                raise
            for stray in encode_temps(root):
                stray.unlink()
            report.actions.append(f"episode {index} '{key}': its spill cannot be encoded ({exc})")
            continue
        report.actions.append(f"encoded episode {index} '{key}' from its spill ({frames} frames)")
        report.encoded_from_spill.append({"episode": index, "camera": key, "frames": frames})


def encode_temps(root: Path) -> list[Path]:
    directory = journal.journal_dir(root)
    return sorted(directory.glob(ENCODE_PREFIX + "*.mp4")) if directory.is_dir() else []


def merge_pending(root: Path, report: RepairReport) -> ConsolidatedState:
    """Merge the saved episodes LeRobot's files do not hold yet; on failure put the files back."""
    state = ConsolidatedState.load(root)
    pending = pending_episodes(root, state)
    if not pending:
        return state
    need_space(root, report, merge_bytes(root, state, pending), f"merging saved episodes {pending}")
    try:
        state = consolidate(state, pending)
    except BaseException:
        report.inodes_left = free_inodes(root)  # before the undo frees some
        undo_merge(root)
        raise
    report.actions.append(f"merged saved episodes {pending} into LeRobot's files")
    return state


def undo_merge(root: Path) -> None:
    """After a failed merge: roll its renames back and delete the new versions it wrote."""
    try:
        journal.recover_intent(root)
    except DAMAGE:
        log.exception("%s: rolling back a failed merge", root)
    for path in journal.orphan_files(root):
        if not path.name.endswith(journal.OLD_SUFFIX):
            path.unlink(missing_ok=True)


def drop_stale(root: Path, state: ConsolidatedState, report: RepairReport) -> None:
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


def verify_files(root: Path, state: ConsolidatedState) -> None:
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


def set_aside(root: Path, path: Path, report: RepairReport, *, move: bool = False) -> None:
    """Keep a file about to be replaced in ``hilrec/damaged-<time>/replaced/`` (moved or copied)."""
    if not path.exists():
        return
    target = damaged_dir(root, report) / "replaced" / path.relative_to(root)
    target.parent.mkdir(parents=True, exist_ok=True)
    if move:
        os.replace(path, target)
        fsync_dir(path.parent)
    else:
        shutil.copy2(path, target)


def damaged_dir(root: Path, report: RepairReport) -> Path:
    if report.damaged_dir is None:
        report.damaged_dir = sidecar_dir(root) / f"damaged-{time.strftime('%Y%m%d-%H%M%S')}"
        report.damaged_dir.mkdir(parents=True, exist_ok=True)
        report.actions.append(f"kept the damaged files in {report.damaged_dir.relative_to(root)}")
    return report.damaged_dir
