"""The saved takes as the page lists them: what is on disk beside the dataset, read-only.

A take is a saved episode. Its number comes from the daemon (``status.dataset.episodes``); what
else the page shows is read from the files beside the dataset: the episode's sidecar JSON
(task, frames, how it ended) and the replay's PNG, which a hardware take's verdict writes (as
``hilrec replay --report <root>/hilrec/replay`` does). Only those two file names, built from an
integer episode index, are ever opened, and a path that resolves outside the dataset root (a
symlink pointing away) is refused: the page can show nothing else from the disk.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from hilrec.daemon.dataset import episode_json_path
from hilrec.daemon.replay.report import episode_plot_path

log = logging.getLogger(__name__)

# The page lists the newest takes only; older ones are in the dataset all the same.
MAX_LISTED: Final[int] = 200


def replay_png_path(root: Path, episode_index: int) -> Path | None:
    """``<root>/hilrec/replay/episode-NNNNNN.png`` if it is a file inside ``root``, else None."""
    if episode_index < 0:
        return None
    candidate = episode_plot_path(root, episode_index)
    return _inside(root, candidate)


def _inside(root: Path, candidate: Path) -> Path | None:
    try:
        real = candidate.resolve(strict=True)
        real_root = root.resolve(strict=True)
    except (OSError, RuntimeError):  # missing, or a symlink loop
        return None
    if not real.is_relative_to(real_root) or not real.is_file():
        return None
    return real


@dataclass
class TakeFiles:
    """Reads each take's sidecar again only when it changed (the daemon adds the verdict to it
    after the save), and the replay PNG's presence on every scan."""

    root: Path

    def __post_init__(self) -> None:
        self._sidecars: dict[int, tuple[tuple[int, int], dict[str, Any]]] = {}

    def scan(self, count: int) -> list[dict[str, Any]]:
        """The newest ``MAX_LISTED`` of takes ``0..count-1``, newest first."""
        out = []
        for index in range(count - 1, max(-1, count - 1 - MAX_LISTED), -1):
            out.append(
                {
                    "episode_index": index,
                    **self._sidecar(index),
                    "replay_png": replay_png_path(self.root, index) is not None,
                }
            )
        return out

    def _sidecar(self, index: int) -> dict[str, Any]:
        path = _inside(self.root, episode_json_path(self.root, index))
        if path is None:
            return {}  # not written yet (the save is still under way) or not ours: ask again later
        try:
            stat = path.stat()
            stamp = (stat.st_mtime_ns, stat.st_size)
            cached = self._sidecars.get(index)
            if cached is not None and cached[0] == stamp:
                return cached[1]
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            log.warning("take %d: cannot read %s: %s", index, path, exc)
            return {}
        summary = summarise(data)
        self._sidecars[index] = (stamp, summary)
        return summary


def summarise(sidecar: Any) -> dict[str, Any]:
    """What the take list shows from an episode sidecar, and its stored verdict if it has one."""
    if not isinstance(sidecar, dict):
        return {}
    out = {k: sidecar[k] for k in ("task", "frames", "success", "ended_by", "started_wall") if k in sidecar}
    verdict = sidecar.get("verdict")
    if isinstance(verdict, dict) and "verdict" in verdict:
        out["verdict"] = {"verdict": verdict["verdict"], "summary": verdict.get("summary")}
    return out
