"""Writing the result of ``hilrec edit``: a whole dataset made of picked episodes.

The episodes chosen, renumbered 0..N-1 in order, their rows with ``episode_index``, ``index`` and
``task_index`` rewritten (tasks renumbered in order of first use, unused ones dropped), every
numeric feature's per-episode stats recomputed from the rows with the writer's own code
(:mod:`hilrec.daemon.dataset.format.stats`), image and video stats carried over (the frames are the same
packets) or, for ``recompute-stats``, recomputed from the decoded frames with the writer's
:class:`~hilrec.daemon.dataset.format.stats.ImageSampler`; ``stats.json`` the aggregate. The sidecars
follow their episodes: ``episode-NNNNNN.{json,npz}`` under the new number (the JSON gets
``episode_index`` and ``edited_from``), ``dataset.json`` copied with the edit appended to its
``edits`` list. The journal (``hilrec/journal``) is not carried over: it describes the source's
episodes; the result is whole without it.

Files the edit leaves as they were (videos, data, a sidecar's arrays) are hard-linked, not copied:
no writer of a dataset ever writes a file in place, so sharing them cannot change the source. The
result is fsynced.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import av
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from hilrec.daemon.atomic import fsync_dir, fsync_file, json_bytes, write_synced
from hilrec.daemon.dataset import (
    INFO_PATH,
    LOCK_NAME,
    PARQUET_OPTIONS,
    STATS_PATH,
    TASKS_PATH,
    DatasetStats,
    FileRef,
    ImageSampler,
    Segment,
    VideoSettings,
    aggregate_stats,
    column_to_numpy,
    compute_episode_stats,
    data_file_path,
    data_keys,
    data_path,
    data_schema,
    decoded_frames,
    episode_json_path,
    episode_npz_path,
    episodes_path,
    episodes_table,
    flatten_episode_stats,
    meta_json_bytes,
    sidecar_dir,
    stats_to_json,
    tasks_table,
    video_file_path,
    video_keys,
    video_path,
)
from hilrec.daemon.errors import CorruptDatasetError, DatasetError, VideoEncodingError
from hilrec.daemon.tools import edit_video
from hilrec.daemon.tools.edit_source import EditReport, Pick, Source
from hilrec.daemon.tools.edit_swap import Hook, hook_point

IMAGE_DTYPES: Final[frozenset[str]] = frozenset({"image", "video"})
# An edit that changes values, not which rows: (the pick, its rows as read) -> the rows to write.
Transform = Callable[[Pick, pa.Table], pa.Table]


def write_dataset(
    out: Path,
    sources: Sequence[Source],
    picks: Sequence[Pick],
    *,
    features: Mapping[str, Any] | None = None,
    recompute_images: bool = False,
    command: str = "edit",
    report: EditReport | None = None,
    hook: Hook = None,
    transform: Transform | None = None,
    sidecar: Mapping[str, Any] | None = None,
) -> EditReport:
    """Write the dataset made of ``picks`` into the empty folder ``out`` (see the module doc).

    ``transform`` changes each episode's rows (same rows, same columns) before they are written
    and their stats computed; ``sidecar`` holds keys set in the result's ``hilrec/dataset.json``.
    """
    if not picks:
        raise DatasetError(f"hilrec edit {command}: the result would hold no episode")
    report = report or EditReport(command=command, target=out)
    base = sources[0]
    features = dict(features if features is not None else base.features)
    fps = base.fps
    info = json.loads(json.dumps(base.info))
    info["features"] = features
    chunks_size = int(info.get("chunks_size") or 1000)
    tasks = _Tasks()
    rows, stats, written = _write_rows(out, sources, picks, features, chunks_size, tasks, transform)
    next_index = rows[-1]["dataset_to_index"]
    hook_point(hook, "data-written")

    for video_key in video_keys(features):
        _write_videos(out, video_key, sources, picks, rows, chunks_size, fps, report)
    hook_point(hook, "videos-written")

    if recompute_images:
        _recompute_video_stats(out, info, features, rows, stats)
    for feature, spec in features.items():
        for new, episode_stats in enumerate(stats):
            if feature not in episode_stats:
                raise DatasetError(
                    f"{sources[picks[new].source].root}: episode {picks[new].episode} has no stats "
                    f"for '{feature}' ({spec['dtype']}); run hilrec edit recompute-stats on it first"
                )
    for row, episode_stats in zip(rows, stats, strict=True):
        ordered = {k: episode_stats[k] for k in features}
        row.update(flatten_episode_stats(ordered))
    ep_path = episodes_path(out, FileRef())
    ep_path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(episodes_table(rows, features), ep_path, **PARQUET_OPTIONS)
    pq.write_table(tasks_table(tasks.names), out / TASKS_PATH, **PARQUET_OPTIONS)
    aggregated = aggregate_stats(stats)
    stats_json = stats_to_json({k: aggregated[k] for k in features if k in aggregated})
    write_synced(out / STATS_PATH, meta_json_bytes(stats_json))
    info.update(
        total_episodes=len(rows),
        total_frames=next_index,
        total_tasks=len(tasks.names),
        splits={"train": f"0:{len(rows)}"},
    )
    if not video_keys(features):
        info["video_path"] = None
    written += [ep_path, out / TASKS_PATH]
    hook_point(hook, "meta-written")

    _write_sidecars(out, sources, picks, command, sidecar or {})
    write_synced(out / INFO_PATH, meta_json_bytes(info))  # last: info.json says "a dataset"
    hook_point(hook, "sidecars-written")
    _sync_tree(out)
    report.episodes, report.frames = len(rows), next_index
    report.episode_map = [(p.source, p.episode) for p in picks]
    return report


class _Tasks:
    """The result's task strings, in order of first use by its episodes."""

    def __init__(self) -> None:
        self.names: list[str] = []
        self._known: dict[str, int] = {}

    def index(self, task: str) -> int:
        if task not in self._known:
            self._known[task] = len(self.names)
            self.names.append(task)
        return self._known[task]


def _write_rows(
    out: Path,
    sources: Sequence[Source],
    picks: Sequence[Pick],
    features: Mapping[str, Any],
    chunks_size: int,
    tasks: _Tasks,
    transform: Transform | None,
) -> tuple[list[dict[str, Any]], list[DatasetStats], list[Path]]:
    """Every picked episode's rows renumbered into ``out``'s data files, with its stats and its
    row of meta/episodes (no stats flattened in yet); and the files written."""
    numeric = [k for k in data_keys(features) if features[k]["dtype"] not in IMAGE_DTYPES]
    schema = data_schema(features)
    rows: list[dict[str, Any]] = []
    stats: list[DatasetStats] = []
    # data: one output file per run of episodes from the same source data file
    next_index = 0
    data_ref: FileRef | None = None
    run_key: tuple[int, Path] | None = None
    writer: pq.ParquetWriter | None = None
    written: list[Path] = []
    try:
        for new, pick in enumerate(picks):
            src = sources[pick.source]
            meta = src.episodes[pick.episode]
            table = src.rows(pick.episode)
            if transform is not None:
                table = transform(pick, table)
            n = table.num_rows
            old_tasks = table.column("task_index").to_numpy()
            if pick.task is not None:
                new_tasks = np.full(n, tasks.index(pick.task), dtype=np.int64)
            else:
                lookup = {int(t): tasks.index(src.tasks[int(t)]) for t in dict.fromkeys(old_tasks.tolist())}
                new_tasks = np.array([lookup[int(t)] for t in old_tasks], dtype=np.int64)
            columns = {key: table.column(key) for key in data_keys(features)}
            columns["episode_index"] = _int64(np.full(n, new))
            columns["index"] = _int64(np.arange(next_index, next_index + n))
            columns["task_index"] = _int64(new_tasks)
            out_table = pa.Table.from_arrays([columns[f.name] for f in schema], names=schema.names).cast(
                schema
            )
            key = (pick.source, data_file_path(src.root, src.info, meta))
            if key != run_key:
                if writer is not None:
                    writer.close()
                data_ref = FileRef() if data_ref is None else data_ref.next(chunks_size)
                path = data_path(out, data_ref)
                path.parent.mkdir(parents=True, exist_ok=True)
                writer = pq.ParquetWriter(path, schema, **PARQUET_OPTIONS)
                written.append(path)
                run_key = key
            assert writer is not None and data_ref is not None
            writer.write_table(out_table)
            values = {
                k: column_to_numpy(out_table.column(k), features[k]["shape"], name=k)
                for k in numeric
                if k in features
            }
            episode_stats = compute_episode_stats(values, features)
            for k in features:
                if k not in episode_stats and k in meta.get("stats", {}):
                    episode_stats[k] = meta["stats"][k]  # image/video: the same frames
            stats.append(episode_stats)
            rows.append(
                {
                    "episode_index": new,
                    "tasks": list(dict.fromkeys(tasks.names[i] for i in new_tasks.tolist())),
                    "length": n,
                    "data/chunk_index": data_ref.chunk,
                    "data/file_index": data_ref.file,
                    "dataset_from_index": next_index,
                    "dataset_to_index": next_index + n,
                    "meta/episodes/chunk_index": 0,
                    "meta/episodes/file_index": 0,
                }
            )
            next_index += n
    finally:
        if writer is not None:
            writer.close()
    return rows, stats, written


def _int64(values: np.ndarray) -> pa.Array:
    # From the buffer, as the writer builds its columns: pa.array() would import pandas.
    data = np.ascontiguousarray(values, dtype=np.int64)
    return pa.Array.from_buffers(pa.int64(), len(data), [None, pa.py_buffer(data)])


def _write_videos(
    out: Path,
    key: str,
    sources: Sequence[Source],
    picks: Sequence[Pick],
    rows: list[dict[str, Any]],
    chunks_size: int,
    fps: int,
    report: EditReport,
) -> None:
    """One output file per run of episodes from the same source file: linked when the run is
    that whole file, cut by packet copy otherwise, re-encoded only where a cut cannot land."""
    runs: list[tuple[tuple[int, Path], list[int]]] = []
    for new, pick in enumerate(picks):
        src = sources[pick.source]
        path = video_file_path(src.root, src.info, src.episodes[pick.episode], key)
        if runs and runs[-1][0] == (pick.source, path):
            runs[-1][1].append(new)
        else:
            runs.append(((pick.source, path), [new]))
    ref: FileRef | None = None
    for (source_index, path), news in runs:
        src = sources[source_index]
        ref = FileRef() if ref is None else ref.next(chunks_size)
        target = video_path(out, key, ref)
        target.parent.mkdir(parents=True, exist_ok=True)
        metas = [src.episodes[picks[n].episode] for n in news]
        in_file = [
            r["episode_index"] for r in src.episodes if video_file_path(src.root, src.info, r, key) == path
        ]
        whole = [picks[n].episode for n in news] == in_file
        if whole:
            edit_video.link_or_copy(path, target)
            placed = [
                (
                    float(m[f"videos/{key}/from_timestamp"]),
                    float(m[f"videos/{key}/to_timestamp"]),
                    int(m["length"]),
                )
                for m in metas
            ]
            report.videos_linked += 1
        else:
            segments = [
                Segment(
                    path, float(m[f"videos/{key}/from_timestamp"]), float(m[f"videos/{key}/to_timestamp"])
                )
                for m in metas
            ]
            lengths = [int(m["length"]) for m in metas]
            if edit_video.starts_on_keyframes(segments):
                placed = edit_video.cut_spans(target, segments, fps=fps)
                report.videos_cut += 1
            else:
                settings = _video_settings(src)
                try:
                    placed, frames = edit_video.splice_spans(
                        target, segments, fps=fps, lengths=lengths, settings=settings
                    )
                    report.videos_cut += 1
                    report.frames_reencoded += frames
                    report.notes.append(
                        f"{key}: {path.name} of {src.root} has episode starts between key frames; "
                        f"{frames} frames up to the next key frame were re-encoded, the rest copied"
                    )
                except (VideoEncodingError, CorruptDatasetError, av.FFmpegError) as exc:
                    target.unlink(missing_ok=True)
                    placed = edit_video.reencode_spans(
                        target, segments, fps=fps, lengths=lengths, settings=settings
                    )
                    report.videos_reencoded += 1
                    report.frames_reencoded += sum(lengths)
                    report.notes.append(
                        f"{key}: {path.name} of {src.root}: a splice failed ({exc}); its kept "
                        f"episodes were re-encoded into {target.relative_to(out)}"
                    )
            for (_, _, frames), length in zip(placed, lengths, strict=True):
                if frames != length:
                    raise DatasetError(
                        f"{path}: the cut holds {frames} frames of an episode of {length}; run hilrec check"
                    )
        for n, (start, end, _) in zip(news, placed, strict=True):
            rows[n].update(
                {
                    f"videos/{key}/chunk_index": ref.chunk,
                    f"videos/{key}/file_index": ref.file,
                    f"videos/{key}/from_timestamp": start,
                    f"videos/{key}/to_timestamp": end,
                }
            )


def _video_settings(src: Source) -> VideoSettings | None:
    """The encoder settings the source was written with (hilrec's provenance), else None
    (LeRobot's defaults for the stream's codec)."""
    recorded = ((src.sidecar or {}).get("writer") or {}).get("video")
    if not isinstance(recorded, dict):
        return None
    try:
        return VideoSettings.from_json(recorded)
    except (VideoEncodingError, TypeError):
        return None


def _recompute_video_stats(
    out: Path,
    info: Mapping[str, Any],
    features: Mapping[str, Any],
    rows: Sequence[Mapping[str, Any]],
    stats: list[DatasetStats],
) -> None:
    """Image stats of every video feature from its decoded frames, as the writer samples them.

    Each file is decoded once; each frame goes to the sampler of the episode whose span holds it.
    """
    fps = int(info["fps"])
    for key in video_keys(features):
        files: dict[Path, list[int]] = {}
        for new, row in enumerate(rows):
            files.setdefault(video_file_path(out, info, row, key), []).append(new)
        for path, news in files.items():
            spans = sorted((float(rows[n][f"videos/{key}/from_timestamp"]), n) for n in news)
            samplers = {n: ImageSampler() for n in news}
            starts = np.array([s for s, _ in spans])
            for ts, frame in decoded_frames(path):
                at = int(np.searchsorted(starts, ts + 1e-6, side="right")) - 1
                if at < 0:
                    continue
                start, n = spans[at]
                index = round((ts - start) * fps)
                if index >= int(rows[n]["length"]):
                    continue
                sampler = samplers[n]
                if index != sampler.num_frames:
                    raise DatasetError(f"{path}: frame {index} of episode {n} decoded out of order")
                sampler.add(frame.to_ndarray(format="rgb24"))
            for n, sampler in samplers.items():
                if sampler.num_frames != int(rows[n]["length"]):
                    raise DatasetError(
                        f"{path}: {sampler.num_frames} frames decoded for episode {n} of "
                        f"{rows[n]['length']}; run hilrec check"
                    )
                stats[n][key] = sampler.stats()


def _write_sidecars(
    out: Path, sources: Sequence[Source], picks: Sequence[Pick], command: str, updates: Mapping[str, Any]
) -> None:
    directory = sidecar_dir(out)
    for new, pick in enumerate(picks):
        src = sources[pick.source]
        payload = src.episode_sidecar(pick.episode)
        if payload is None:
            continue
        npz = episode_npz_path(src.root, pick.episode)
        if npz.exists():
            edit_video.link_or_copy(npz, episode_npz_path(out, new))
        payload["episode_index"] = new
        moved: dict[str, Any] = {"episode_index": pick.episode, "command": f"hilrec edit {command}"}
        if len(sources) > 1:
            moved["dataset"] = str(src.root)
        if "edited_from" in payload:
            moved["previous"] = payload["edited_from"]  # the chain of edits, newest first
        payload["edited_from"] = moved
        if pick.task is not None:
            payload["task"] = pick.task
        path = episode_json_path(out, new)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_synced(path, json_bytes(payload))
    dataset = sources[0].sidecar
    if dataset is None and len(sources) == 1 and not updates:
        return
    dataset = {**json.loads(json.dumps(dataset or {})), **updates}
    edits = list(dataset.get("edits") or [])
    edits.append(
        {
            "command": f"hilrec edit {command}",
            "unix_s": round(time.time(), 3),
            "sources": [str(s.root) for s in sources],
            "episodes_from": [[p.source, p.episode] for p in picks],
        }
    )
    dataset["edits"] = edits
    directory.mkdir(parents=True, exist_ok=True)
    write_synced(directory / "dataset.json", json_bytes(dataset))


def _sync_tree(root: Path) -> None:
    for directory, _dirs, files in os.walk(root):
        for name in files:
            if name != LOCK_NAME:
                fsync_file(Path(directory) / name)
        fsync_dir(directory)
