"""``hilrec check``: is this directory a LeRobot v3.0 dataset that says exactly what it holds?

The checker reads (never writes) a dataset and reports every rule it breaks. The rules are data,
in :data:`RULES`; each failure names the rule, the file (relative to the root), the episode and the
key it is about, so a person can go straight to the broken row.

Every rule has a severity and a fix (:class:`~.checks_common.Rule`). An ERROR breaks loading or
training: LeRobot refuses the dataset, returns wrong frames, or a policy normalises by wrong
numbers. A WARNING is true but harmless: the stale stats of the default columns that LeRobot's own
``delete_episodes`` and ``aggregate_datasets`` leave behind, a damaged journal beside a whole
dataset. A dataset passes with warnings; ``strict`` makes them fail too. The fix names the tool:
``hilrec repair`` (rebuilds LeRobot's files from the journal and the intact files),
``hilrec edit recompute-stats`` (recomputes the stats from the data), or re-recording (the
recorded values themselves are missing or wrong).

The checks run in order of dependence: ``info.json`` first (nothing else can be read without it),
then tasks and episode metadata, then the data files, then stats and videos. A file that cannot be
read is itself a failure (``file.unreadable``), and the checks that needed it are skipped rather
than reported a second time. Decoding the videos, the one expensive check, runs on ``workers``
processes, episode by episode; the report is the same for any number of workers.

It accepts what LeRobot 0.4.4 writes and what the native writer writes; where the two differ
legitimately (float32 stats from LeRobot, float64 from us; histogram quantile estimates; LeRobot's
uint8-overflowed image std) the tolerance is chosen so that both pass and a wrong number does not.
See :mod:`.checks_stats` and :mod:`.checks_video` for the numbers.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final

from hilrec.daemon.dataset.check import data as checks_data
from hilrec.daemon.dataset.check import journal as checks_journal
from hilrec.daemon.dataset.check import rows as checks_rows
from hilrec.daemon.dataset.check import stats as checks_stats
from hilrec.daemon.dataset.check import video as checks_video
from hilrec.daemon.dataset.check.common import (
    Contents,
    Failure,
    Findings,
    Fix,
    Rule,
    Severity,
    resolve_workers,
)
from hilrec.daemon.dataset.format.edit_intent import (
    EDIT_INTENT_PATH,
    IntentState,
    describe_intent,
    load_edit_intent,
)
from hilrec.daemon.dataset.store.rootlock import LOCK_NAME, holds_only_edit_files, lock_path

ERROR, WARNING = Severity.ERROR, Severity.WARNING
REPAIR, RECOMPUTE_STATS, RERECORD = Fix.REPAIR, Fix.RECOMPUTE_STATS, Fix.RERECORD
EDIT_UNFINISHED, EDIT_PART, ROOT_EMPTY = "edit.unfinished", "edit.part", "root.empty"

# rule -> what it demands, its severity, its fix. The order is the order of the report.
RULES: Final[dict[str, Rule]] = {
    ROOT_EMPTY: Rule(
        "the folder is not empty (a writer killed as it created the dataset leaves it so)",
        ERROR,
        Fix.RECORD_AGAIN,
    ),
    EDIT_UNFINISHED: Rule(
        "the folder is not the unfinished output of a hilrec edit that ended early "
        f"({EDIT_INTENT_PATH} or only a lock file)",
        ERROR,
        Fix.RERUN_EDIT,
    ),
    EDIT_PART: Rule(
        f"the folder is not one part of an edit with several outputs that ended early ({EDIT_INTENT_PATH})",
        WARNING,
        Fix.RERUN_EDIT,
    ),
    "file.unreadable": Rule(
        "every metadata, data and video file named by the dataset can be read", ERROR, REPAIR
    ),
    "info.fields": Rule(
        "info.json has the fields of LeRobot v3.0 with valid values and the five default columns",
        ERROR,
        REPAIR,
    ),
    "info.totals": Rule(
        "total_episodes, total_frames, total_tasks and splits match the files", ERROR, REPAIR
    ),
    "schema.columns": Rule("each data file has exactly one column per non-video feature", ERROR, RERECORD),
    "schema.dtype": Rule("each column stores the dtype info.json declares", ERROR, RERECORD),
    "schema.shape": Rule(
        "each row of a column holds the shape info.json declares, no nulls", ERROR, RERECORD
    ),
    "data.finite": Rule("float columns hold no NaN or infinity", ERROR, RERECORD),
    "index.contiguous": Rule("index runs 0 .. total_frames-1 through the data files in order", ERROR, REPAIR),
    "episode_index.contiguous": Rule(
        "episodes are 0 .. N-1, each a single block of rows with a metadata row", ERROR, REPAIR
    ),
    "frame_index.contiguous": Rule("frame_index runs 0 .. length-1 in every episode", ERROR, REPAIR),
    "timestamp.grid": Rule("timestamp is frame_index / fps within 1e-4 s", ERROR, REPAIR),
    "tasks.table": Rule(
        "tasks.parquet maps task_index 0 .. T-1 to distinct non-empty strings", ERROR, REPAIR
    ),
    "tasks.unknown": Rule("every row's task_index is in tasks.parquet", ERROR, REPAIR),
    "tasks.episode": Rule("an episode's metadata lists exactly the tasks its rows use", ERROR, REPAIR),
    "episodes.range": Rule(
        "length, dataset_from/to_index and data chunk/file of each episode match "
        "its rows; the metadata row sits in the file it names",
        ERROR,
        REPAIR,
    ),
    "video.file": Rule(
        "each episode's video file exists and its stream can be demuxed and decoded", ERROR, REPAIR
    ),
    "video.range": Rule(
        "from/to timestamps: to - from = length / fps, no overlap inside a file", ERROR, REPAIR
    ),
    "video.frame_count": Rule("an episode's span of its video holds exactly `length` frames", ERROR, REPAIR),
    "video.timestamps": Rule(
        "frame i of an episode is presented at from_timestamp + i / fps (within 1e-4 s, LeRobot's tolerance)",
        ERROR,
        REPAIR,
    ),
    "video.fps": Rule("the stream's frame rate and info's video.fps equal info fps", ERROR, RERECORD),
    "video.size": Rule(
        "the stream's frame size equals the feature's [height, width] (and info's)", ERROR, RERECORD
    ),
    "stats.episode": Rule("each episode's stats/* columns match its data", ERROR, RECOMPUTE_STATS),
    "stats.dataset": Rule("meta/stats.json is the aggregate of the episodes' stats", ERROR, RECOMPUTE_STATS),
    "stats.default_columns": Rule(
        "the stats of timestamp, frame_index, episode_index, index and task_index match the data "
        "(no policy normalises by them)",
        WARNING,
        RECOMPUTE_STATS,
    ),
    checks_journal.RULE: Rule(checks_journal.RULES[checks_journal.RULE], WARNING, REPAIR),
    checks_journal.DATA_RULE: Rule(checks_journal.RULES[checks_journal.DATA_RULE], ERROR, REPAIR),
}
# A rule some module reports without registering it here counts as an error.
UNKNOWN_RULE: Final[Rule] = Rule("(unregistered rule)", ERROR, RERECORD)


@dataclass
class CheckReport:
    root: Path
    failures: list[Failure] = field(default_factory=list)  # every finding, errors and warnings
    summary: dict[str, Any] = field(default_factory=dict)
    replay: Any = None  # a hilrec.sim.replay ReplayReport when --replay ran
    strict: bool = False  # warnings fail too

    @property
    def errors(self) -> list[Failure]:
        return [f for f in self.failures if f.severity is Severity.ERROR]

    @property
    def warnings(self) -> list[Failure]:
        return [f for f in self.failures if f.severity is Severity.WARNING]

    @property
    def passed(self) -> bool:
        failing = self.failures if self.strict else self.errors
        return not failing and (self.replay is None or bool(self.replay.passed))

    def rules_failed(self) -> set[str]:
        return {f.rule for f in self.failures}

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "root": str(self.root),
            "passed": self.passed,
            "strict": self.strict,
            "errors": len(self.errors),
            "warnings": len(self.warnings),
            "summary": self.summary,
            "rules": {name: asdict(rule) for name, rule in RULES.items()},
            "failures": [asdict(f) for f in self.failures],
        }
        if self.replay is not None:
            out["replay"] = self.replay.to_dict()
        return out

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, default=str)

    def format_text(self) -> str:
        s = self.summary
        head = (
            f"hilrec check {self.root}: {s.get('episodes', '?')} episodes, "
            f"{s.get('frames', '?')} frames, fps {s.get('fps', '?')}, "
            f"video keys {s.get('video_keys', [])}"
        )
        lines = [head]
        if self.failures:
            lines.append(
                f"{'FAILED' if self.errors or self.strict else 'WARNINGS'}: {len(self.errors)} "
                f"error(s), {len(self.warnings)} warning(s) in {len(self.rules_failed())} rule(s)"
            )
            order = {rule: i for i, rule in enumerate(RULES)}
            for failure in sorted(
                self.failures,
                key=lambda f: (
                    f.severity is not Severity.ERROR,
                    order.get(f.rule, 99),
                    f.file,
                    -1 if f.episode is None else f.episode,
                ),
            ):
                lines.append(f"  {failure.severity.upper()} {failure.format()} (fix: {failure.fix})")
        else:
            lines.append(f"data checks: all {len(RULES)} rules passed")
        lines.extend(f"note: {note}" for note in s.get("notes", []))
        if self.replay is not None:
            lines.append(self.replay.format_text())
        if self.passed and self.warnings:
            lines.append(f"PASSED with {len(self.warnings)} warning(s)")
        else:
            lines.append("PASSED" if self.passed else "FAILED")
        return "\n".join(lines)


def check_dataset(
    root: str | Path, *, decode_video: bool = True, workers: int | None = 1, strict: bool = False
) -> CheckReport:
    """Check the dataset at ``root`` against every rule in :data:`RULES`.

    ``decode_video`` also decodes each episode's sampled frames to check the image stats; without
    it the videos are only demuxed (frame counts, timestamps, size and rate are still checked).
    ``workers`` processes decode (None: one per core). ``strict``: warnings fail the report too.
    """
    root = Path(root)
    findings = Findings(root)
    report = CheckReport(root=root, strict=strict)
    if _unfinished_edit(root, findings):  # nothing else to read: no rule about missing files
        report.failures = [classified(f) for f in findings.failures]
        return report
    contents = checks_data.load_contents(root, findings)
    if contents is not None:
        checks_rows.check_rows(contents, findings)
        checks_stats.check_episode_stats(contents, findings)
        checks_stats.check_image_feature_stats(contents, findings)
        checks_stats.check_dataset_stats(contents, findings)
        checks_video.check_videos(contents, findings, decode=decode_video, workers=resolve_workers(workers))
    notes = checks_journal.check_journal(root, contents, findings)  # rule checks_journal.RULE
    report.failures = [classified(f) for f in findings.failures]
    report.summary = _summary(contents) | ({"notes": notes} if notes else {})
    return report


def _unfinished_edit(root: Path, findings: Findings) -> bool:
    """Report what a ``hilrec edit`` that ended early left in ``root``, or that a writer left it
    empty; True when that is all there is (the folder holds no dataset yet)."""
    if root.is_dir() and not any(root.iterdir()):
        findings.add(ROOT_EMPTY, ".", "not a dataset: the folder is empty, no writer put anything in it")
        return True
    intent = load_edit_intent(root)
    if intent is not None:
        done = intent.get("state") == IntentState.DONE
        findings.add(EDIT_PART if done else EDIT_UNFINISHED, EDIT_INTENT_PATH, describe_intent(intent))
        return not done
    # Only the lock (and the edit's record half-written, in its temporary file): the command was
    # killed while it started, before the record or anything else was in place.
    if lock_path(root).exists() and holds_only_edit_files(root):
        try:
            holder = json.loads(lock_path(root).read_text())["command"]
        except (OSError, ValueError, KeyError, TypeError):
            holder = "a hilrec writer"
        findings.add(
            EDIT_UNFINISHED,
            LOCK_NAME,
            f"not a dataset: the folder holds only the lock file of `{holder}`, which ended before it "
            "wrote anything; run that command again (or delete this folder)",
        )
        return True
    return False


def classified(failure: Failure) -> Failure:
    """``failure`` with its rule's severity and fix."""
    rule = RULES.get(failure.rule, UNKNOWN_RULE)
    return dataclasses.replace(failure, severity=rule.severity, fix=rule.fix)


def _summary(contents: Contents | None) -> dict[str, Any]:
    if contents is None:
        return {}
    return {
        "fps": contents.fps,
        "episodes": len(contents.episodes),
        "frames": sum(r.length for r in contents.rows.values()),
        "tasks": len(contents.tasks or {}),
        "video_keys": contents.video_keys,
        "data_files": len(contents.data_files),
    }
