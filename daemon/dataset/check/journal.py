"""Checker rule on the journal: the copy of every saved episode that ``hilrec repair`` rebuilds from.

The journal (``hilrec/journal/``, see :mod:`.journal`) keeps each saved episode's rows
(``data.parquet``) and metadata (``episode.json``) for good. LeRobot never reads it, so a damaged
journal costs nothing until the dataset's own files are damaged too: then repair has one source
fewer, and an episode whose only intact copy was there is lost. The rule ``journal.entries``
therefore reports:

- an unreadable consolidation intent (``consolidation.json``);
- a committed entry whose episode.json or data.parquet cannot be read, or disagree with each other;
- an episode of the dataset without a journal entry (when the dataset has a journal at all);
- an entry whose rows differ from the dataset's rows of that episode. Which side is damaged is
  decided by the episode's stored stats, recomputed from each side (they were computed from the
  recorded rows, so the intact side reproduces them exactly): when the dataset's rows are the ones
  that do not, that is damage to the dataset, a failure whatever else holds.

Severity: ``journal.entries`` is a warning (the dataset loads and trains as it is; ``hilrec
repair`` rewrites the damaged entries from it). The damage to the dataset found by the comparison
is ``data.journal_copy``, an error. Without severities in the checker (:mod:`.checks_common` has no
``Severity``), a damaged journal is a failure when the dataset fails some other rule (then repair
needs the journal) and a note in the report when the dataset is whole.

Entries not yet merged into LeRobot's files (a live writer's, or a crashed one's) are checked for
readability only; open (``.tmp``) episodes are not the journal's yet and are not looked at.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

import numpy as np
import pyarrow as pa

from hilrec.daemon.dataset.check import common as checks_common
from hilrec.daemon.dataset.check.common import Contents, Failure, Findings
from hilrec.daemon.dataset.format.features import data_keys
from hilrec.daemon.dataset.format.reader import column_to_numpy
from hilrec.daemon.dataset.format.stats import STAT_KEYS, compute_episode_stats
from hilrec.daemon.dataset.store import journal
from hilrec.daemon.errors import CorruptDatasetError

RULE: Final[str] = "journal.entries"
DATA_RULE: Final[str] = "data.journal_copy"
RULES: Final[dict[str, str]] = {
    RULE: "every saved episode has a readable journal copy (hilrec/journal) that agrees with the "
    "dataset: it is what hilrec repair rebuilds from",
    DATA_RULE: "an episode's rows equal its journal copy unless that copy is the damaged one "
    "(the copy that reproduces the episode's stored stats is the intact one)",
}
_SEVERITIES: Final[bool] = hasattr(checks_common, "Severity")
# Stats recomputed from the rows they were computed from agree to the last bits (same code, same
# float64 arithmetic); the margin only absorbs a different summation order on another machine.
STATS_RTOL: Final[float] = 1e-12


def table_columns(
    table: pa.Table, features: Mapping[str, Mapping[str, Any]], path: Path
) -> dict[str, np.ndarray]:
    """The data columns of ``table`` as numpy, in the declared shapes (CorruptDatasetError if not)."""
    out = {}
    for key in data_keys(features):
        if key not in table.column_names:
            raise CorruptDatasetError(str(path), f"has no column '{key}'")
        out[key] = column_to_numpy(table.column(key), features[key]["shape"], name=key, path=path)
    return out


def same_rows(a: Mapping[str, np.ndarray], b: Mapping[str, np.ndarray]) -> bool:
    """Whether two episodes' columns are bit-equal (same keys, shapes, dtypes and values)."""
    return a.keys() == b.keys() and all(
        a[k].dtype == b[k].dtype and a[k].shape == b[k].shape and np.array_equal(a[k], b[k]) for k in a
    )


def stats_reproduced(
    columns: Mapping[str, np.ndarray],
    stored: Mapping[str, Mapping[str, Any]] | None,
    features: Mapping[str, Mapping[str, Any]],
) -> bool | None:
    """Whether ``columns`` reproduce the stored per-episode stats of their numeric features
    (None: nothing to compare with)."""
    if not stored:
        return None
    keys = [k for k in columns if k in stored and isinstance(stored[k], Mapping)]
    if not keys or any(len(columns[k]) == 0 for k in keys):
        return None
    computed = compute_episode_stats({k: columns[k] for k in keys}, features)
    for key in keys:
        for name in STAT_KEYS:
            if name not in stored[key]:
                return None
            try:
                want = np.asarray(stored[key][name], dtype=np.float64).reshape(-1)
            except (TypeError, ValueError):
                return False
            got = np.asarray(computed[key][name], dtype=np.float64).reshape(-1)
            if got.shape != want.shape:
                return False
            if name == "count" and not np.array_equal(got, want):
                return False
            if not np.allclose(got, want, rtol=STATS_RTOL, atol=0.0, equal_nan=False):
                return False
    return True


def journal_problems(root: Path, contents: Contents | None, findings: Findings) -> list[Failure]:
    """Every problem of the journal at ``root``, as failures of :data:`RULE` (not yet reported).

    Damage to the dataset found on the way (its rows differ from an intact journal copy that
    reproduces the stored stats) is added to ``findings`` at once.
    """
    directory = journal.journal_dir(root)
    if not directory.is_dir():
        return []
    problems: list[Failure] = []

    def problem(path: Path, message: str, episode: int | None = None) -> None:
        problems.append(Failure(rule=RULE, file=findings.rel(path), message=message, episode=episode))

    if journal.intent_path(root).exists():
        try:
            intent = journal.read_intent(root)
            if intent is not None and not isinstance(intent.get("targets"), list):
                problem(journal.intent_path(root), "consolidation intent without a list of targets")
        except CorruptDatasetError as exc:
            problem(journal.intent_path(root), exc.problem)
    indices = journal.committed_dirs(root)
    in_dataset = sorted(contents.episodes) if contents is not None else []
    for episode in sorted(set(in_dataset) - set(indices)):
        problem(journal.episode_dir(root, episode), "the dataset's episode has no journal entry", episode)
    for episode in indices:
        entry = journal.read_entry(root, episode)
        for path, message in entry.problems:
            problem(path, message, episode)
        if entry.table is None or contents is None or episode not in contents.rows:
            continue
        data_path = entry.directory / journal.EPISODE_DATA
        try:
            copy = table_columns(entry.table, contents.features, data_path)
        except CorruptDatasetError as exc:
            problem(data_path, exc.problem, episode)
            continue
        rows = contents.rows[episode]
        if same_rows(copy, rows.columns):
            continue
        stored = (entry.meta or {}).get("stats") or contents.episodes.get(episode, {}).get("stats")
        if stats_reproduced(copy, stored, contents.features) and not stats_reproduced(
            rows.columns, stored, contents.features
        ):
            findings.add(
                DATA_RULE,
                rows.file,
                "rows differ from the journal copy, and only the journal copy reproduces the "
                "episode's stats: the data file is damaged (hilrec repair restores it)",
                episode=episode,
            )
        else:
            problem(data_path, f"rows differ from the dataset's ({findings.rel(rows.file)})", episode)
    return problems


def check_journal(root: Path, contents: Contents | None, findings: Findings) -> list[str]:
    """Report the journal's problems as findings of :data:`RULE` (a warning); without severities
    in the checker, as notes (returned) when the dataset is whole."""
    whole = not findings.failures
    problems = journal_problems(root, contents, findings)
    if not problems:
        return []
    if not _SEVERITIES and whole and not findings.failures:
        return [f"{p.format()} (the dataset is whole; hilrec repair rewrites the entry)" for p in problems]
    for p in problems:
        findings.add(p.rule, p.file, p.message, episode=p.episode)
    return []
