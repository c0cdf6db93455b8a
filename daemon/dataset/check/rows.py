"""Checker rules on rows: index, episode_index and frame_index contiguity, the timestamp grid,
finite floats, tasks used by rows, episode ranges and the totals of info.json."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from hilrec.daemon.dataset.check.common import Contents, EpisodeRows, Findings
from hilrec.daemon.dataset.format.features import TIMESTAMP_TOLERANCE_S
from hilrec.daemon.dataset.format.paths import DATA_DIR, INFO_PATH


def check_rows(contents: Contents, findings: Findings) -> None:
    _check_global_index(contents, findings)
    for episode in sorted(contents.episodes):
        if episode not in contents.rows and not findings.has("episode_index.contiguous", episode=episode):
            findings.add(
                "episode_index.contiguous",
                contents.episodes_file(episode),
                "has a metadata row but no data rows",
                episode=episode,
            )
    for episode, rows in sorted(contents.rows.items()):
        if episode not in contents.episodes:
            findings.add(
                "episode_index.contiguous",
                rows.file,
                f"{rows.length} data rows (from row {rows.first_row}) but no metadata row",
                episode=episode,
            )
        _check_episode_rows(contents, episode, rows, findings)
    _check_totals(contents, findings)


def _check_global_index(contents: Contents, findings: Findings) -> None:
    index = contents.global_index
    expected = np.arange(len(index))
    if len(index) and not np.array_equal(index, expected):
        at = int(np.flatnonzero(index != expected)[0])
        episode, file, row = _locate(contents, at)
        findings.add(
            "index.contiguous",
            file,
            f"row {row} has index {int(index[at])}, expected {at} (index must run "
            f"0 .. {len(index) - 1} through the files in order)",
            episode=episode,
            key="index",
        )


def _locate(contents: Contents, global_row: int) -> tuple[int | None, Path, int]:
    """(episode, file, row in file) of the ``global_row``-th row of the data files."""
    offset = 0
    for path, num_rows in contents.file_rows:
        if offset + num_rows > global_row:
            row = global_row - offset
            for episode, rows in contents.rows.items():
                if rows.file == path and rows.first_row <= row < rows.first_row + rows.length:
                    return episode, path, row
            return None, path, row
        offset += num_rows
    return None, contents.root / DATA_DIR, global_row


def _check_episode_rows(contents: Contents, episode: int, rows: EpisodeRows, findings: Findings) -> None:
    cols, n, file = rows.columns, rows.length, rows.file

    def first_bad(mask: np.ndarray) -> int:
        return int(np.flatnonzero(mask)[0])

    if "frame_index" in cols and not np.array_equal(cols["frame_index"], np.arange(n)):
        at = first_bad(cols["frame_index"] != np.arange(n))
        findings.add(
            "frame_index.contiguous",
            file,
            f"row {rows.first_row + at} has frame_index {int(cols['frame_index'][at])}, expected {at}",
            episode=episode,
            key="frame_index",
        )
    if "timestamp" in cols:
        expected = np.arange(n) / contents.fps
        error = np.abs(cols["timestamp"].astype(np.float64) - expected)
        if (error > TIMESTAMP_TOLERANCE_S).any():
            at = first_bad(error > TIMESTAMP_TOLERANCE_S)
            findings.add(
                "timestamp.grid",
                file,
                f"row {rows.first_row + at} (frame {at}): timestamp "
                f"{float(cols['timestamp'][at]):.6f} s is {error[at]:.6f} s off "
                f"{at}/{contents.fps} s (tolerance {TIMESTAMP_TOLERANCE_S} s; "
                f"{int((error > TIMESTAMP_TOLERANCE_S).sum())} rows off)",
                episode=episode,
                key="timestamp",
            )
    for key, values in cols.items():
        if values.dtype.kind == "f" and not np.isfinite(values).all():
            bad = np.argwhere(~np.isfinite(values.reshape(n, -1)))[0]
            findings.add(
                "data.finite",
                file,
                f"row {rows.first_row + int(bad[0])} holds {values.reshape(n, -1)[tuple(bad)]}",
                episode=episode,
                key=key,
            )
    _check_tasks(contents, episode, rows, findings)
    meta = contents.episodes.get(episode)
    if meta is not None:
        _check_range(contents, episode, rows, meta, findings)


def _check_tasks(contents: Contents, episode: int, rows: EpisodeRows, findings: Findings) -> None:
    if "task_index" not in rows.columns or contents.tasks is None:
        return
    used = sorted({int(t) for t in np.unique(rows.columns["task_index"])})
    unknown = [t for t in used if t not in contents.tasks]
    if unknown:
        at = int(np.flatnonzero(np.isin(rows.columns["task_index"], unknown))[0])
        findings.add(
            "tasks.unknown",
            rows.file,
            f"row {rows.first_row + at} has task_index {unknown[0]}, not in "
            f"{findings.rel(contents.tasks_file)} (known: {sorted(contents.tasks)})",
            episode=episode,
            key="task_index",
        )
    meta = contents.episodes.get(episode)
    if meta is None or not isinstance(meta.get("tasks"), list):
        return
    row_tasks = sorted(contents.tasks[t] for t in used if t in contents.tasks)
    if sorted(set(meta["tasks"])) != row_tasks or len(set(meta["tasks"])) != len(meta["tasks"]):
        findings.add(
            "tasks.episode",
            contents.episodes_file(episode),
            f"metadata lists tasks {meta['tasks']}, its rows use {row_tasks}",
            episode=episode,
            key="tasks",
        )


def _check_range(
    contents: Contents, episode: int, rows: EpisodeRows, meta: dict[str, Any], findings: Findings
) -> None:
    file = contents.episodes_file(episode)
    n = rows.length
    if meta["length"] != n:
        findings.add(
            "episodes.range",
            file,
            f"length is {meta['length']}, the data has {n} rows",
            episode=episode,
            key="length",
        )
    if meta["dataset_to_index"] - meta["dataset_from_index"] != meta["length"]:
        findings.add(
            "episodes.range",
            file,
            f"dataset_to_index - dataset_from_index = {meta['dataset_to_index']} - "
            f"{meta['dataset_from_index']} differs from length {meta['length']}",
            episode=episode,
            key="dataset_to_index",
        )
    index = rows.columns.get("index")
    if index is not None and n:
        if int(index[0]) != meta["dataset_from_index"]:
            findings.add(
                "episodes.range",
                file,
                f"dataset_from_index is "
                f"{meta['dataset_from_index']}, the first row's "
                f"index is {int(index[0])}",
                episode=episode,
                key="dataset_from_index",
            )
        if int(index[-1]) + 1 != meta["dataset_to_index"]:
            findings.add(
                "episodes.range",
                file,
                f"dataset_to_index is {meta['dataset_to_index']}, "
                f"the last row's index + 1 is {int(index[-1]) + 1}",
                episode=episode,
                key="dataset_to_index",
            )
    expected = contents.root / contents.info["data_path"].format(
        chunk_index=meta["data/chunk_index"], file_index=meta["data/file_index"]
    )
    if expected != rows.file:
        findings.add(
            "episodes.range",
            file,
            f"data/chunk_index, data/file_index point to {findings.rel(expected)}, the "
            f"rows are in {findings.rel(rows.file)}",
            episode=episode,
            key="data/file_index",
        )


def _check_totals(contents: Contents, findings: Findings) -> None:
    info, path = contents.info, contents.root / INFO_PATH
    frames = sum(r.length for r in contents.rows.values())
    actual = {"total_episodes": len(contents.episodes), "total_frames": frames}
    if contents.tasks is not None:
        actual["total_tasks"] = len(contents.tasks)
    for name, value in actual.items():
        if info.get(name) != value:
            findings.add("info.totals", path, f"{name} is {info.get(name)}, the files hold {value}", key=name)
    splits = info.get("splits")
    if (
        isinstance(splits, dict)
        and splits
        and "train" in splits
        and splits["train"] != f"0:{len(contents.episodes)}"
    ):
        findings.add(
            "info.totals",
            path,
            f"splits.train is {splits['train']!r}, expected '0:{len(contents.episodes)}'",
            key="splits",
        )
