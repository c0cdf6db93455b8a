"""What ``hilrec edit`` reads and says: a source dataset, the episodes picked from it, the report."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from hilrec.daemon.atomic import read_json
from hilrec.daemon.dataset import (
    INFO_PATH,
    data_file_path,
    episode_json_path,
    journal,
    load_dataset_sidecar,
    load_episodes,
    load_info,
    load_task_list,
    read_parquet,
)
from hilrec.daemon.errors import DatasetError, DatasetStateError

# --- the report ----------------------------------------------------------------------------------


@dataclass
class EditReport:
    command: str
    target: Path
    episodes: int = 0
    frames: int = 0
    episode_map: list[tuple[int, int]] = field(default_factory=list)  # (source, old index) by new
    videos_linked: int = 0
    videos_cut: int = 0
    videos_reencoded: int = 0
    frames_reencoded: int = 0
    swap: str = ""  # "exchange", "two renames" or "written to --out"
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)

    def format_text(self) -> str:
        lines = [
            f"hilrec edit {self.command}: {self.episodes} episodes, {self.frames} frames -> {self.target} "
            f"({self.swap}, {self.seconds:.2f} s)",
            f"  videos: {self.videos_linked} file(s) linked unchanged, {self.videos_cut} cut by "
            f"packet copy, {self.videos_reencoded} re-encoded ({self.frames_reencoded} frames re-encoded)",
        ]
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {
            "command": self.command,
            "target": str(self.target),
            "episodes": self.episodes,
            "frames": self.frames,
            "episode_map": [list(p) for p in self.episode_map],
            "videos": {
                "linked": self.videos_linked,
                "cut": self.videos_cut,
                "reencoded": self.videos_reencoded,
                "frames_reencoded": self.frames_reencoded,
            },
            "swap": self.swap,
            "seconds": self.seconds,
            "notes": self.notes,
        }


# --- sources and picks ---------------------------------------------------------------------------


@dataclass
class Source:
    """A dataset an edit reads: its metadata, loaded once."""

    root: Path
    info: dict[str, Any]
    tasks: list[str]
    episodes: list[dict[str, Any]]  # load_episodes(with_stats=True) rows, by episode_index
    sidecar: dict[str, Any] | None
    _tables: dict[Path, pa.Table] = field(default_factory=dict)

    @classmethod
    def load(cls, root: Path) -> Source:
        root = Path(root)
        _refuse_unmerged(root)
        info = load_info(root)
        episodes = load_episodes(root, with_stats=True)
        indices = [int(r["episode_index"]) for r in episodes]
        if indices != list(range(len(indices))):
            raise DatasetError(f"{root}: episodes are not 0..N-1 ({indices[:10]}); run hilrec repair first")
        return cls(root, info, load_task_list(root), episodes, load_dataset_sidecar(root))

    @property
    def fps(self) -> int:
        return int(self.info["fps"])

    @property
    def features(self) -> dict[str, Any]:
        return dict(self.info["features"])

    def rows(self, episode: int) -> pa.Table:
        """The data rows of one episode (whole file read once, then filtered)."""
        row = self.episodes[episode]
        path = data_file_path(self.root, self.info, row)
        table = self._tables.get(path)
        if table is None:
            table = read_parquet(path)
            self._tables[path] = table
        picked = table.filter(pc.equal(table.column("episode_index"), episode))
        if picked.num_rows != int(row["length"]):
            raise DatasetError(
                f"{path}: episode {episode} has {picked.num_rows} rows, its metadata says {row['length']}; "
                "run hilrec check"
            )
        return picked

    def episode_sidecar(self, episode: int) -> dict[str, Any] | None:
        payload = read_json(episode_json_path(self.root, episode), if_missing=None)
        return payload if isinstance(payload, dict) else None


@dataclass(frozen=True)
class Pick:
    """One episode of the result: episode ``episode`` of source ``source``, with a new task."""

    source: int
    episode: int
    task: str | None = None


def _refuse_unmerged(root: Path) -> None:
    """An edit reads LeRobot's files: saved episodes still only in the journal would be lost."""
    if journal.intent_path(root).exists() or journal.open_episodes(root):
        raise DatasetStateError(f"{root}: an interrupted write is pending; run hilrec repair {root} first")
    committed = journal.committed_dirs(root)
    if committed:
        info = read_json(root / INFO_PATH, if_missing=None) or {}
        if max(committed) >= int(info.get("total_episodes", 0)):
            raise DatasetStateError(
                f"{root}: saved episodes are not merged into LeRobot's files yet; "
                f"run hilrec repair {root} first"
            )
