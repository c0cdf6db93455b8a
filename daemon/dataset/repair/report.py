"""What ``hilrec repair`` tells: every episode kept, encoded from its spill or lost, and why.

Like ``mcap recover``'s summary, the report names each episode (by its index before the repair)
with where its rows and frames came from, or why it was dropped, and the exit code sums it up:
0 nothing lost, 3 episodes were dropped, 2 the dataset still fails ``hilrec check`` and was left
as it was, 4 not enough disk space. :func:`format_report` is its text, :meth:`RepairReport.to_json`
its JSON.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final

from hilrec.daemon.dataset.check.checker import CheckReport
from hilrec.daemon.dataset.check.common import Failure

EXIT_OK: Final[int] = 0
EXIT_NOT_REPAIRED: Final[int] = 2
EXIT_DROPPED: Final[int] = 3
EXIT_NO_SPACE: Final[int] = 4
# How the table names frames repair itself encoded from a spill.
SPILL_ORIGIN: Final[str] = "its spill (encoded by repair)"


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
    # Saved episodes whose mp4 a crash left unfinished, encoded from their spill: each
    # {"episode", "camera", "frames"}; the episode is in ``kept`` too unless a later step lost it.
    encoded_from_spill: list[dict[str, Any]] = field(default_factory=list)
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

    def spilled(self, episode: int, camera: str | None = None) -> bool:
        """Whether repair encoded ``camera`` (any, if None) of ``episode`` (its index before the
        repair) from its spill."""
        return any(e["episode"] == episode and camera in (None, e["camera"]) for e in self.encoded_from_spill)

    def to_json(self) -> dict[str, Any]:
        return {
            "root": self.root,
            "kept_episodes": self.kept,
            "dropped": self.dropped,
            "encoded_from_spill": self.encoded_from_spill,
            "renumbered": {str(k): v for k, v in self.renumbered.items()},
            "rebuilt": self.rebuilt,
            "episodes": [asdict(e) for e in self.episodes],
            "actions": self.actions,
            "unrepaired": self.unrepaired,
            "no_space": self.no_space,
            "exit_code": self.exit_code,
        }


@dataclass
class Problem:
    """Why the dataset does not pass yet."""

    reason: str
    files: set[str] = field(default_factory=set)  # files the checker named (relative)


def check_errors(verdict: CheckReport) -> list[Failure]:
    """The findings that make ``hilrec check`` fail (all of them, for a checker without severities)."""
    return list(getattr(verdict, "errors", verdict.failures))


def check_summary(verdict: CheckReport, limit: int = 3) -> str:
    errors = check_errors(verdict)
    lines = [f.format() for f in errors[:limit]]
    more = len(errors) - limit
    return "; ".join(lines) + (f" (and {more} more)" if more > 0 else "")


# --- the text -------------------------------------------------------------------------------------


def format_report(report: RepairReport) -> str:
    if report.no_space:
        how = "STOPPED (disk full)"
    elif report.unrepaired:
        how = "NOT repaired (left as it was)"
    else:
        how = "rebuilt" if report.rebuilt else "recovered"
    lines = [f"repair {report.root}: {how}"]
    lines += _table(report.episodes)
    for action in report.actions:
        lines.append(f"  - {action}")
    for problem in report.unrepaired:
        lines.append(f"  UNREPAIRED: {problem}")
    if report.no_space:
        lines.append(f"  NO SPACE: {report.no_space}")
    elif report.unrepaired:
        lines.append("  nothing was changed for these; hilrec check still fails")
    else:
        lines.append("  " + "; ".join(_totals(report)))
    return "\n".join(lines)


def _totals(report: RepairReport) -> list[str]:
    """What was kept, encoded from a spill and lost, each with the episodes' indices."""
    kept = f"kept {len(report.kept)} episode(s)" + (f" ({_ranges(report.kept)})" if report.kept else "")
    parts = [kept]
    spilled = sorted({int(e["episode"]) for e in report.encoded_from_spill})
    if spilled:
        parts.append(f"encoded from their spill: {len(spilled)} episode(s) ({_ranges(spilled)})")
    lost = sorted({int(d["episode"]) for d in report.dropped})
    parts.append(f"{len(report.dropped)} episode(s) dropped ({_ranges(lost)})" if lost else "nothing lost")
    return parts


def _table(outcomes: list[EpisodeOutcome]) -> list[str]:
    """One line per episode; consecutive kept episodes with the same sources share one."""
    if not outcomes:
        return []
    lines = [f"  {'episode':>9} {'now':>9} {'frames':>7}  outcome"]
    groups: list[list[EpisodeOutcome]] = []
    for outcome in outcomes:
        last = groups[-1][-1] if groups else None
        if (
            last is not None
            and outcome.kept
            and last.kept
            and outcome.episode == last.episode + 1
            and outcome.new_index == (last.new_index or 0) + 1
            and (outcome.rows, outcome.frames) == (last.rows, last.frames)
            and outcome.rows == "dataset"
        ):
            groups[-1].append(outcome)
        else:
            groups.append([outcome])
    for group in groups:
        first, end = group[0], group[-1]
        span = str(first.episode) if len(group) == 1 else f"{first.episode}-{end.episode}"
        now = (
            "-"
            if first.new_index is None
            else (str(first.new_index) if len(group) == 1 else f"{first.new_index}-{end.new_index}")
        )
        frames = sum(o.length or 0 for o in group) if all(o.length is not None for o in group) else "?"
        if first.kept:
            what = (
                "kept, unchanged"
                if first.rows == "dataset"
                else f"kept: rows from {first.rows}; frames from {first.frames}"
            )
        else:
            what = f"DROPPED: {first.reason}"
        lines.append(f"  {span:>9} {now:>9} {frames!s:>7}  {what}")
    return lines


def _ranges(values: list[int]) -> str:
    parts = []
    start = prev = values[0]
    following: list[int | None] = [*values[1:], None]  # None closes the last range
    for value in following:
        if value is not None and value == prev + 1:
            prev = value
            continue
        parts.append(f"{start}" if start == prev else f"{start}-{prev}")
        if value is not None:
            start = prev = value
    return ", ".join(parts)
