"""The episode journal and the consolidation intent: how a saved episode stays saved.

An episode is written into ``hilrec/journal/.episode-NNNNNN.tmp/`` while it is recorded (its mp4
streams there). ``save_episode`` adds ``data.parquet`` (the episode's rows, final columns) and
``episode.json`` (length, tasks, stats, video frame counts) and the episode's sidecar files, fsyncs
every file once and every directory that gained an entry once, and renames it to
``episode-NNNNNN/``. That rename is the commit: once it is fsynced, the episode
is durable whatever happens next. A ``.tmp`` directory found later is an episode that was never
saved; it is dropped.

Consolidation then merges committed episodes into LeRobot's files. Each of those files is
rewritten to ``<file>.hilrec-new`` and renamed over the old one, never changed in place. A batch
of renames is bracketed by ``hilrec/journal/consolidation.json`` (the intent): before the first
rename every target's old version is hard-linked to ``<file>.hilrec-old``; after the last one
(info.json) the intent is marked done. :func:`recover_intent` rolls an interrupted batch back to
the state before it, so the batch's episodes are simply consolidated again.

An episode counts as consolidated when its index is below info.json's ``total_episodes``. The
journal keeps ``data.parquet`` and ``episode.json`` of every episode for good (a few kB per
minute), so ``hilrec repair`` can rebuild data and metadata files from them; the staged mp4 is
deleted once the episode is in LeRobot's video files.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import pyarrow as pa

from hilrec.daemon.atomic import (
    atomic_write_bytes,
    fsync_dir,
    fsync_file,
    is_temp_name,
    json_bytes,
    read_json,
    temp_path,
    write_synced,
)
from hilrec.daemon.dataset.format.paths import DATA_DIR, META_DIR, VIDEOS_DIR
from hilrec.daemon.dataset.format.reader import column_to_numpy, read_parquet
from hilrec.daemon.dataset.format.sidecar import SIDECAR_DIR
from hilrec.daemon.errors import CorruptDatasetError

# Called with the name of each step of a save or a merge (tests only: a crash test kills there).
Hook = Callable[[str], None] | None

JOURNAL_DIR: Final[str] = SIDECAR_DIR + "/journal"
INTENT_FILE: Final[str] = "consolidation.json"
EPISODE_META: Final[str] = "episode.json"
EPISODE_DATA: Final[str] = "data.parquet"
NEW_SUFFIX: Final[str] = ".hilrec-new"
OLD_SUFFIX: Final[str] = ".hilrec-old"
JOURNAL_FORMAT: Final[int] = 1
# A copy of info.json's fixed fields (features, fps, robot_type, file sizes) kept in the journal,
# for repair to rebuild info.json from when it is unreadable. Read here; written by the writer.
INFO_COPY: Final[str] = "info.json"
_COMMITTED = re.compile(r"^episode-(\d{6,})$")
_OPEN = re.compile(r"^\.episode-(\d{6,})\.tmp$")


def journal_dir(root: Path) -> Path:
    return root / JOURNAL_DIR


def episode_dir(root: Path, episode_index: int) -> Path:
    return journal_dir(root) / f"episode-{episode_index:06d}"


def open_episode_dir(root: Path, episode_index: int) -> Path:
    return journal_dir(root) / f".episode-{episode_index:06d}.tmp"


def video_file_name(key: str) -> str:
    return f"{key}.mp4"


def episode_meta_bytes(meta: Mapping[str, Any]) -> bytes:
    payload = dict(meta)
    payload["format"] = JOURNAL_FORMAT
    return json_bytes(payload, indent=None, final_newline=False)


def write_episode_meta(directory: Path, meta: Mapping[str, Any]) -> None:
    write_synced(directory / EPISODE_META, episode_meta_bytes(meta))


def commit_episode(
    root: Path,
    episode_index: int,
    *,
    files: Mapping[str, bytes] | None = None,
    beside: Mapping[Path, bytes] | None = None,
    hook: Hook = None,
) -> Path:
    """Make the open episode durable and rename it to its committed name.

    ``files`` (name -> bytes) are written into the open directory, next to what is there already
    (the staged videos); ``beside`` (path -> bytes) are the episode's files outside the journal
    (its sidecar), each published by a rename, in the given order. Every file is fsynced once and
    every directory that gained an entry once; then the rename is the commit, and the journal
    directory's fsync makes it durable. A failed commit can be run again with the same arguments
    (see :mod:`.commit`): every step rewrites or republishes what the attempt before left.
    """
    src = open_episode_dir(root, episode_index)
    dst = episode_dir(root, episode_index)
    if not src.exists() and (dst / EPISODE_META).is_file():
        # A retry of a commit that failed after its rename (at the last fsync): it is done.
        fsync_dir(dst.parent)
        return dst
    written = set()
    for name, content in (files or {}).items():
        write_synced(src / name, content)
        written.add(name)
    for child in src.iterdir():
        if child.name not in written:
            fsync_file(child)
    directories: dict[Path, None] = {}
    for path, content in (beside or {}).items():
        if not path.parent.is_dir():
            path.parent.mkdir(parents=True, exist_ok=True)
            directories[path.parent.parent] = None  # the new directory's own entry
        tmp = temp_path(path)
        write_synced(tmp, content)
        os.replace(tmp, path)
        directories[path.parent] = None
    directories[src] = None
    for directory in directories:
        fsync_dir(directory)
    _hook(hook, "episode-written")
    os.replace(src, dst)
    fsync_dir(dst.parent)
    return dst


def committed_episodes(root: Path) -> list[int]:
    directory = journal_dir(root)
    if not directory.is_dir():
        return []
    found = []
    for child in directory.iterdir():
        match = _COMMITTED.match(child.name)
        if match and (child / EPISODE_META).is_file():
            found.append(int(match.group(1)))
    return sorted(found)


def committed_dirs(root: Path) -> list[int]:
    """Every committed episode directory, intact or not (:func:`committed_episodes` lists only the
    ones with an ``episode.json``)."""
    directory = journal_dir(root)
    if not directory.is_dir():
        return []
    return sorted(
        int(m.group(1)) for c in directory.iterdir() if (m := _COMMITTED.match(c.name)) and c.is_dir()
    )


def open_episodes(root: Path) -> list[int]:
    """Episodes that were being recorded and never saved (their .tmp directories)."""
    directory = journal_dir(root)
    if not directory.is_dir():
        return []
    return sorted(int(m.group(1)) for c in directory.iterdir() if (m := _OPEN.match(c.name)))


def load_episode_meta(root: Path, episode_index: int) -> dict[str, Any]:
    path = episode_dir(root, episode_index) / EPISODE_META
    meta = read_json(path, what="journal entry")
    if not isinstance(meta, dict):
        raise CorruptDatasetError(str(path), "is not a journal entry (a JSON object)")
    if meta.get("episode_index") != episode_index:
        raise CorruptDatasetError(
            str(path), f"says episode {meta.get('episode_index')}, expected {episode_index}"
        )
    return meta


# What episode.json must hold, and of which type, for the entry to be usable.
_META_FIELDS: Final[dict[str, type]] = {
    "episode_index": int,
    "length": int,
    "tasks": list,
    "new_tasks": list,
    "dataset_from_index": int,
    "stats": dict,
}


@dataclass
class JournalEntry:
    """What a committed journal entry holds, as far as it can be read.

    ``meta`` is its episode.json and ``table`` its data.parquet, each None when unreadable or
    inconsistent; ``problems`` says why, one (file, problem) each.
    """

    index: int
    directory: Path
    meta: dict[str, Any] | None = None
    table: pa.Table | None = None
    problems: list[tuple[Path, str]] = field(default_factory=list)

    @property
    def intact(self) -> bool:
        return self.meta is not None and self.table is not None and not self.problems


def read_entry(root: Path, episode_index: int) -> JournalEntry:
    """Read and cross-check one committed entry: episode.json (fields and types) and data.parquet
    (readable, ``length`` rows, every row of this episode). Never raises for a damaged entry."""
    directory = episode_dir(root, episode_index)
    entry = JournalEntry(episode_index, directory)
    meta_path = directory / EPISODE_META
    try:
        meta = load_episode_meta(root, episode_index)
        bad = [
            name
            for name, kind in _META_FIELDS.items()
            if not isinstance(meta.get(name), kind) or isinstance(meta.get(name), bool)
        ]
        if bad:
            entry.problems.append((meta_path, f"fields {bad} missing or of the wrong type"))
        elif meta["length"] <= 0 or meta["dataset_from_index"] < 0:
            entry.problems.append((meta_path, f"length {meta['length']}, from {meta['dataset_from_index']}"))
        else:
            entry.meta = meta
    except CorruptDatasetError as exc:
        entry.problems.append((meta_path, exc.problem))
    data_path = directory / EPISODE_DATA
    try:
        table = read_parquet(data_path)
        if "episode_index" not in table.column_names:
            raise CorruptDatasetError(str(data_path), "has no episode_index column")
        episodes = column_to_numpy(table.column("episode_index"), name="episode_index", path=data_path)
        if not (episodes == episode_index).all():
            raise CorruptDatasetError(
                str(data_path), f"holds rows of episodes {sorted(set(episodes.tolist()))}"
            )
        if entry.meta is not None and table.num_rows != entry.meta["length"]:
            raise CorruptDatasetError(
                str(data_path), f"{table.num_rows} rows, episode.json says {entry.meta['length']}"
            )
        entry.table = table
    except (CorruptDatasetError, pa.ArrowException, ValueError) as exc:
        entry.problems.append((data_path, getattr(exc, "problem", str(exc))))
    return entry


def load_info_copy(root: Path) -> dict[str, Any] | None:
    """The journal's copy of info.json's fixed fields, None when there is none or it is unreadable."""
    try:
        info = read_json(journal_dir(root) / INFO_COPY, what="info copy", if_missing=None)
    except CorruptDatasetError:
        return None
    return info if isinstance(info, dict) and isinstance(info.get("features"), dict) else None


def remove_dir(path: Path) -> None:
    if path.exists():
        shutil.rmtree(path)
        fsync_dir(path.parent)


# --- consolidation intent ------------------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    """One file a consolidation batch replaces (``path`` relative to the root)."""

    path: str
    existed: bool


def intent_path(root: Path) -> Path:
    return journal_dir(root) / INTENT_FILE


def new_path(path: Path) -> Path:
    return path.with_name(path.name + NEW_SUFFIX)


def old_path(path: Path) -> Path:
    return path.with_name(path.name + OLD_SUFFIX)


def publish_batch(root: Path, episodes: Sequence[int], targets: Sequence[str], hook: Hook = None) -> None:
    """Rename every ``<target>.hilrec-new`` over its target, recoverably, in the given order.

    ``hook(name)`` (tests only) is called at each step so a crash test can kill the process there.
    """
    plan = [Target(t, (root / t).exists()) for t in targets]
    _write_intent(
        root,
        {
            "episodes": list(episodes),
            "state": "renaming",
            "targets": [{"path": t.path, "existed": t.existed} for t in plan],
        },
    )
    _hook(hook, "intent-written")
    synced: set[Path] = set()
    for number, target in enumerate(plan):
        path = root / target.path
        if number == len(plan) - 1:
            # Every earlier rename is durable before the last one (info.json) is made.
            for directory in dict.fromkeys((root / t.path).parent for t in plan[:-1]):
                fsync_dir(directory)
                synced.add(directory)
        if target.existed and not old_path(path).exists():
            os.link(path, old_path(path))
        os.replace(new_path(path), path)
        _hook(hook, f"renamed {target.path}")
    # A new file can come with new directories (a new chunk, a new video key): their entries,
    # up to the root. Each directory once, the deepest first.
    directories = {(root / plan[-1].path).parent} if plan else set()
    for target in plan:
        if not target.existed:
            directories.update(p for p in (root / target.path).parents if p == root or root in p.parents)
    for directory in sorted(directories, key=lambda d: len(d.parts), reverse=True):
        if directory not in synced or directory == (root / plan[-1].path).parent:
            fsync_dir(directory)
    _write_intent(
        root,
        {
            "episodes": list(episodes),
            "state": "done",
            "targets": [{"path": t.path, "existed": t.existed} for t in plan],
        },
    )
    _hook(hook, "intent-done")
    finish_intent(root)


def _hook(hook: Hook, name: str) -> None:
    if hook is not None:
        hook(name)


def _write_intent(root: Path, payload: dict[str, Any]) -> None:
    atomic_write_bytes(intent_path(root), json_bytes(payload, indent=None, final_newline=False))


def read_intent(root: Path) -> dict[str, Any] | None:
    path = intent_path(root)
    intent = read_json(path, what="consolidation intent", if_missing=None)
    if intent is not None and not isinstance(intent, dict):
        raise CorruptDatasetError(str(path), "is not a consolidation intent (a JSON object)")
    return intent


def finish_intent(root: Path) -> None:
    """After a completed batch: drop the old versions, then the intent."""
    intent = read_intent(root)
    if intent is None:
        return
    dirs = set()
    for target in intent["targets"]:
        old = old_path(root / target["path"])
        if old.exists():
            old.unlink()
            dirs.add(old.parent)
    for directory in dirs:
        fsync_dir(directory)
    intent_path(root).unlink(missing_ok=True)
    fsync_dir(journal_dir(root))


def recover_intent(root: Path) -> str | None:
    """Complete or roll back an interrupted batch. Returns what was done (None: nothing pending)."""
    intent = read_intent(root)
    if intent is None:
        return None
    if intent.get("state") == "done":
        finish_intent(root)
        return "completed"
    for target in reversed(intent["targets"]):
        path = root / target["path"]
        old = old_path(path)
        if old.exists():
            os.replace(old, path)
        elif not target["existed"]:
            path.unlink(missing_ok=True)
        new_path(path).unlink(missing_ok=True)
        fsync_dir(path.parent)
    intent_path(root).unlink(missing_ok=True)
    fsync_dir(journal_dir(root))
    return "rolled back"


def orphan_files(root: Path) -> list[Path]:
    """Temp files a crash can leave: ``*.hilrec-new``, stray ``*.hilrec-old``, atomic.py temps."""
    found: list[Path] = []
    for top in (META_DIR, DATA_DIR, VIDEOS_DIR, SIDECAR_DIR):
        base = root / top
        if not base.is_dir():
            continue
        for dirpath, _dirnames, filenames in os.walk(base):
            for name in filenames:
                if name.endswith((NEW_SUFFIX, OLD_SUFFIX)) or is_temp_name(name):
                    found.append(Path(dirpath) / name)
    return sorted(found)
