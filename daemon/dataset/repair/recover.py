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
   the episode that was open when the writer died is dropped (its frames were never saved),
   saved episodes whose mp4 was not finished are encoded from their spill (:mod:`.spill`; the
   report lists them apart), and saved episodes not yet in LeRobot's files are merged (:func:`recover`, which
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

The steps live beside this module: :mod:`.repair_settle` (step 1, what a crash leaves),
:mod:`.repair_rewrite` (step 2, and the journal rewritten from a dataset that passes),
:mod:`.repair_evidence` (info.json's fixed fields from what the files say),
:mod:`.repair_sources` (every readable copy of every episode) and :mod:`.repair_rebuild` (step 3);
:mod:`.repair_space` tells damage from a full disk, :mod:`.repair_report` holds the report.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

from hilrec.daemon.dataset.check import journal as checks_journal
from hilrec.daemon.dataset.check.checker import check_dataset
from hilrec.daemon.dataset.format.paths import INFO_PATH, META_DIR
from hilrec.daemon.dataset.repair.rebuild import Regenerate, rebuild
from hilrec.daemon.dataset.repair.report import (
    EXIT_DROPPED,
    EXIT_NO_SPACE,
    EXIT_NOT_REPAIRED,
    EXIT_OK,
    SPILL_ORIGIN,
    EpisodeOutcome,
    Problem,
    RepairReport,
    check_errors,
    check_summary,
)
from hilrec.daemon.dataset.repair.rewrite import rederive_meta, restore_journal
from hilrec.daemon.dataset.repair.settle import (
    drop_open_episodes,
    drop_stale,
    encode_temps,
    merge_pending,
    remove_orphans,
    settle,
    undo_merge,
    verify_files,
    work_dirs,
)
from hilrec.daemon.dataset.repair.space import (
    DAMAGE,
    free_inodes,
    inaccessible,
    no_space_message,
    not_damage,
    out_of_space,
)
from hilrec.daemon.dataset.store import journal
from hilrec.daemon.dataset.store.rootlock import RootLock
from hilrec.daemon.errors import CorruptDatasetError, DatasetError

__all__ = [
    "EXIT_DROPPED",
    "EXIT_NOT_REPAIRED",
    "EXIT_NO_SPACE",
    "EXIT_OK",
    "EpisodeOutcome",
    "RepairReport",
    "recover",
    "repair",
]

log = logging.getLogger(__name__)


def recover(root: Path) -> RepairReport:
    """Finish what a crash interrupted (no lock taken: the caller holds it, e.g. the writer).

    Raises CorruptDatasetError (or another DatasetError) if LeRobot's files are damaged.
    """
    root = Path(root)
    report = RepairReport(root=str(root))
    outcome = journal.recover_intent(root)
    if outcome:
        report.actions.append(f"interrupted merge {outcome}")
    remove_orphans(root, report)
    drop_open_episodes(root, report)
    state = merge_pending(root, report)
    verify_files(root, state)
    drop_stale(root, state, report)
    report.kept = list(range(len(state.episodes)))
    return report


def repair(
    root: Path, *, regenerate: Regenerate | None = None, without_missing_video: bool = False
) -> RepairReport:
    """Settle, re-derive the metadata, rebuild: as far as needed for ``hilrec check`` to pass.

    ``regenerate`` makes an episode's unreadable video again in the rebuild (see
    :data:`.rebuild.Regenerate`), so the episode is kept instead of dropped;
    ``without_missing_video`` keeps an episode whose frames of a camera are lost anyway, by
    removing that camera from the dataset (see :func:`.rebuild.rebuild`).

    Refused (DatasetLockedError, naming the holder's pid) while another process holds the root.
    Raises CorruptDatasetError when ``root`` is no dataset at all.
    """
    root = Path(root)
    if not ((root / META_DIR).is_dir() or journal.journal_dir(root).is_dir()):
        raise CorruptDatasetError(str(root / INFO_PATH), "missing: not a LeRobot dataset root")
    with RootLock(root, "hilrec repair"):
        report = RepairReport(root=str(root))
        try:
            _repair_locked(root, report, regenerate, without_missing_video)
        except DAMAGE as exc:
            if inaccessible(exc):
                raise DatasetError(
                    f"{root}: {exc}: not damage, so nothing was rebuilt; fix the access"
                ) from exc
            if not out_of_space(exc):
                raise
            inodes_left = free_inodes(root) if report.inodes_left == -1 else report.inodes_left
            undo_merge(root)
            for stray in encode_temps(root):
                stray.unlink()
            for stale in work_dirs(root):
                shutil.rmtree(stale, ignore_errors=True)
            report.no_space = no_space_message(root, report, inodes_left)
            log.debug("%s: out of space: %r", root, exc)
        return report


def _repair_locked(
    root: Path, report: RepairReport, regenerate: Regenerate | None, without_missing_video: bool
) -> None:
    settle(root, report)
    problem = _settled_and_checked(root, report)
    if problem is None:
        return
    if rederive_meta(root, report, problem):
        problem = _settled_and_checked(root, report)
        if problem is None:
            return
    rebuild(root, report, problem.reason, regenerate, without_missing_video=without_missing_video)


def _settled_and_checked(root: Path, report: RepairReport) -> Problem | None:
    """Merge what is pending and run the checker; None when the dataset passes (report filled)."""
    try:
        state = merge_pending(root, report)
        verify_files(root, state)
    except DAMAGE as exc:
        if not_damage(exc):
            raise
        return Problem(str(exc))
    checked = check_dataset(root)
    if not checked.passed:
        return Problem(check_summary(checked), {f.file for f in check_errors(checked)})
    drop_stale(root, state, report)
    report.kept = list(range(len(state.episodes)))
    for i, row in enumerate(state.episodes):
        # An episode whose frames repair encoded from its spill was merged from the journal just now.
        origin = ("journal", SPILL_ORIGIN) if report.spilled(i) else ("dataset", "dataset")
        report.episodes.append(EpisodeOutcome(i, i, int(row["length"]), *origin))
    report.episodes.sort(key=lambda e: e.episode)
    if checked.summary.get("notes") or any(f.rule == checks_journal.RULE for f in checked.failures):
        restore_journal(root, state, report)
    return None
