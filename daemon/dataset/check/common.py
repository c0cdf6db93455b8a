"""What the checker's rule modules share: a rule's severity and fix, a failure, the collector,
the loaded dataset, and the process pool the expensive checks run in."""

from __future__ import annotations

import multiprocessing
import os
import signal
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from hilrec.daemon import procs
from hilrec.daemon.dataset.format.paths import EPISODES_DIR

T = TypeVar("T")
R = TypeVar("R")


class Severity(StrEnum):
    """How much a broken rule matters."""

    ERROR = "error"  # LeRobot cannot load the dataset, or a policy would train on wrong numbers
    WARNING = "warning"  # true, but nothing that loads or trains on the dataset is affected


class Fix(StrEnum):
    """What a user runs to make a finding go away."""

    REPAIR = "hilrec repair"
    RECOMPUTE_STATS = "hilrec edit recompute-stats"
    RERECORD = "re-record the episode"
    RERUN_EDIT = "run the hilrec edit it names again"
    RECORD_AGAIN = "record into the folder again, or delete it"


@dataclass(frozen=True)
class Rule:
    """One rule of the checker: what it demands, how bad breaking it is, and what fixes it."""

    demand: str
    severity: Severity
    fix: Fix


@dataclass(frozen=True)
class Failure:
    """One broken rule: which rule, in which file (relative to the root), episode and key."""

    rule: str
    file: str
    message: str
    episode: int | None = None
    key: str | None = None
    # Filled from the rule table when the report is built (``checker.check_dataset``).
    severity: Severity = Severity.ERROR
    fix: Fix = Fix.RERECORD

    def format(self) -> str:
        where = [self.file]
        if self.episode is not None:
            where.append(f"episode {self.episode}")
        if self.key is not None:
            where.append(f"key '{self.key}'")
        return f"[{self.rule}] {', '.join(where)}: {self.message}"


class Findings:
    """Collects failures; one per (rule, file, episode, key), so a bad column is one line."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.failures: list[Failure] = []
        self._seen: set[tuple[str, str, int | None, str | None]] = set()

    def add(
        self, rule: str, file: str | Path, message: str, *, episode: int | None = None, key: str | None = None
    ) -> None:
        rel = self.rel(file)
        ident = (rule, rel, episode, key)
        if ident in self._seen:
            return
        self._seen.add(ident)
        self.failures.append(
            Failure(
                rule=rule,
                file=rel,
                message=message,
                episode=None if episode is None else int(episode),
                key=key,
            )
        )

    def rel(self, path: str | Path) -> str:
        path = Path(path)
        try:
            return path.relative_to(self.root).as_posix()
        except ValueError:
            return path.as_posix()

    def has(self, rule: str, *, episode: int | None = None) -> bool:
        return any(f.rule == rule and (episode is None or f.episode == episode) for f in self.failures)


@dataclass
class EpisodeRows:
    """The data rows of one episode, as read from its data file."""

    file: Path
    first_row: int  # row offset of the episode inside its file
    columns: dict[str, np.ndarray]  # key -> (n,) or (n, *shape), stored dtype

    @property
    def length(self) -> int:
        return len(next(iter(self.columns.values()))) if self.columns else 0


@dataclass
class Contents:
    """Everything of a dataset that could be read, for the rule modules to check."""

    root: Path
    info: dict[str, Any]
    features: dict[str, dict[str, Any]]
    fps: int
    tasks: dict[int, str] | None
    tasks_file: Path
    # episode_index -> metadata row (with "stats" unflattened) and the file it came from
    episodes: dict[int, dict[str, Any]] = field(default_factory=dict)
    episode_files: dict[int, Path] = field(default_factory=dict)
    data_files: list[Path] = field(default_factory=list)
    rows: dict[int, EpisodeRows] = field(default_factory=dict)
    # data files in read order with their row counts, and their index column end to end
    file_rows: list[tuple[Path, int]] = field(default_factory=list)
    global_index: np.ndarray = field(default_factory=lambda: np.array([], np.int64))

    @property
    def video_keys(self) -> list[str]:
        return [k for k, ft in self.features.items() if ft.get("dtype") == "video"]

    @property
    def image_keys(self) -> list[str]:
        return [k for k, ft in self.features.items() if ft.get("dtype") == "image"]

    @property
    def numeric_keys(self) -> list[str]:
        return [
            k
            for k, ft in self.features.items()
            if ft.get("dtype") not in ("video", "image", "string", "language")
        ]

    def episodes_file(self, episode: int) -> Path:
        return self.episode_files.get(episode, self.root / EPISODES_DIR)


# --- the process pool ----------------------------------------------------------------------------


def resolve_workers(workers: int | None) -> int:
    """``None`` means one worker per core (``os.cpu_count()``); anything else at least 1."""
    return max(1, os.cpu_count() or 1) if workers is None else max(1, int(workers))


def run_in_pool(function: Callable[[T], R], items: Sequence[T], workers: int) -> list[R]:
    """``[function(item) for item in items]``, in order, spread over ``workers`` processes.

    With one worker (or one item) everything runs in this process. The pool forks this process
    (the pool is made before any work starts, and its workers only decode with PyAV and count with
    numpy: no lock another thread of this process could hold matters to them). Forking, unlike a
    fork server or spawn, neither re-imports the caller's ``__main__`` nor pays an interpreter
    start per check. ``function`` and the items must be picklable module-level objects. The
    results come back in the order of ``items`` whatever order the workers finish in, so a caller
    that turns them into findings one by one reports exactly what a serial run reports.
    """
    workers = min(workers, len(items))
    if workers <= 1:
        return [function(item) for item in items]
    context = multiprocessing.get_context("fork")
    # Each worker dies with this process (a killed `hilrec check` leaves no decoder running).
    dies_with = (os.getpid(), signal.SIGKILL)
    with ProcessPoolExecutor(
        max_workers=workers, mp_context=context, initializer=procs.die_with, initargs=dies_with
    ) as pool:
        return list(pool.map(function, items))
