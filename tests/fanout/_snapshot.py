"""What must not depend on how many workers recorded a dataset, read so it can be compared."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hilrec.daemon.cli import main
from hilrec.daemon.dataset.store.rootlock import LOCK_NAME
from hilrec.daemon.dataset.video.avlog import open_av

# The one value of the journal that is the wall clock: when the episode was saved.
SAVED_AT = "saved_unix_s"


def snapshot(root: Path) -> dict[str, Any]:
    """Every file under ``root`` as its bytes, but for: the lock file (the last writer's pid),
    each journal entry's ``saved_unix_s`` (the JSON without it), and videos (their decoded frames:
    how often the writer merged, which follows the clock, changes the mp4 container)."""
    files: dict[str, Any] = {}
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        rel = path.relative_to(root).as_posix()
        if path.name == LOCK_NAME:
            continue
        if rel.startswith("hilrec/journal/") and path.name == "episode.json":
            meta = json.loads(path.read_bytes())
            meta.pop(SAVED_AT)
            files[rel] = meta
        elif path.suffix == ".mp4":
            files[rel] = decoded_frames(path)
        else:
            files[rel] = path.read_bytes()
    return files


def decoded_frames(path: Path) -> list[bytes]:
    with open_av(str(path)) as container:
        return [frame.to_ndarray(format="rgb24").tobytes() for frame in container.decode(video=0)]


def differences(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """The files that differ or exist on one side only (empty: the same)."""
    return sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))


def record(root: Path, *flags: str) -> int:
    return main(["record", "--sim", "--root", str(root), "--no-progress", *flags])


def seeds_of(root: Path) -> list[int]:
    """The seed of every episode, in episode order (from the episode sidecars)."""
    paths = sorted((root / "hilrec" / "episodes").glob("episode-*.json"))
    return [json.loads(p.read_bytes())["sim"]["seed"] for p in paths]
