"""What the checker's rule modules share: a failure, the collector, and the loaded dataset."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from hilrec.daemon.dataset.paths import EPISODES_DIR


@dataclass(frozen=True)
class Failure:
    """One broken rule: which rule, in which file (relative to the root), episode and key."""

    rule: str
    file: str
    message: str
    episode: int | None = None
    key: str | None = None

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
