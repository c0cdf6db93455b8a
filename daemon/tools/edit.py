"""``hilrec edit``: change a LeRobot v3.0 dataset, safe by construction.

Every edit writes a whole new dataset and never touches the source until that result has passed
the checker; then the result takes the source's place in one atomic step:

1. The source's root lock is taken (:class:`~hilrec.daemon.dataset.rootlock.RootLock`, ``hilrec
   edit <sub-command>``), and the lock of ``--out``, for the whole edit. Leftovers of an edit
   killed earlier (sibling folders ``.<name>.hilrec-edit-*`` whose owner is gone) are removed,
   and an interrupted fallback swap is finished (below).
2. The result is written into a sibling folder ``.<name>.hilrec-edit-<pid>-<token>`` of the
   target (same file system), locked too. Files the edit leaves as they were (videos, data, a
   sidecar's arrays) are hard-linked, not copied: no writer of a dataset ever writes a file in
   place, so sharing them cannot change the source. The result is fsynced.
3. :func:`hilrec.daemon.dataset.checker.check_dataset` checks the result: no error and no
   warning, or the edit stops, the folder is removed and the source is as it was.
4. The result and the target are exchanged by ``renameat2(RENAME_EXCHANGE)``: one rename that
   swaps two directory entries, so at every instant the target path holds either the source or
   the checked result. The old source, now in the sibling folder, is removed after.

Where the file system has no ``RENAME_EXCHANGE`` (ENOSYS/EINVAL), the swap is two renames
(target -> old folder, result -> target), with an intent file ``.<name>.hilrec-edit-<id>.json``
written (fsynced) before them. A kill between the two leaves the target missing; the next
``hilrec edit`` of that root (or :func:`recover`) reads the intent and renames the checked
result into place, then removes the old folder. Before the first rename it removes the result.

A SIGKILL at any moment therefore leaves at the target the source, bit for bit, or the complete
result (with the fallback: after :func:`recover`), never neither; ``tests/tools/test_edit_kill.py``
kills edits at named points and at random moments to show it.

What a result is (:func:`write_dataset`): the episodes chosen, renumbered 0..N-1 in order, their
rows with ``episode_index``, ``index`` and ``task_index`` rewritten (tasks renumbered in order of
first use, unused ones dropped), every numeric feature's per-episode stats recomputed from the
rows with the writer's own code (:mod:`hilrec.daemon.dataset.stats`), image and video stats
carried over (the frames are the same packets) or, for ``recompute-stats``, recomputed from the
decoded frames with the writer's :class:`~hilrec.daemon.dataset.stats.ImageSampler`;
``stats.json`` the aggregate. The sidecars follow their episodes: ``episode-NNNNNN.{json,npz}``
under the new number (the JSON gets ``episode_index`` and ``edited_from``), ``dataset.json``
copied with the edit appended to its ``edits`` list. The journal (``hilrec/journal``) is not
carried over: it describes the source's episodes; the result is whole without it.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import secrets
import shutil
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import av
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from hilrec.daemon.atomic import fsync_dir, fsync_file, json_bytes, read_json, write_synced
from hilrec.daemon.dataset import journal
from hilrec.daemon.dataset.checker import CheckReport, check_dataset
from hilrec.daemon.dataset.features import DEFAULT_FEATURES, data_keys, video_keys
from hilrec.daemon.dataset.layout import (
    PARQUET_OPTIONS,
    data_schema,
    episodes_table,
    meta_json_bytes,
    tasks_table,
)
from hilrec.daemon.dataset.paths import (
    INFO_PATH,
    STATS_PATH,
    TASKS_PATH,
    FileRef,
    data_file_path,
    data_path,
    episodes_path,
    video_file_path,
    video_path,
)
from hilrec.daemon.dataset.reader import (
    column_to_numpy,
    decoded_frames,
    load_episodes,
    load_info,
    load_task_list,
    read_parquet,
)
from hilrec.daemon.dataset.rootlock import LOCK_NAME, RootLock
from hilrec.daemon.dataset.sidecar import (
    episode_json_path,
    episode_npz_path,
    load_dataset_sidecar,
    sidecar_dir,
)
from hilrec.daemon.dataset.stats import (
    DatasetStats,
    ImageSampler,
    aggregate_stats,
    compute_episode_stats,
    flatten_episode_stats,
    stats_to_json,
)
from hilrec.daemon.dataset.video import Segment, VideoSettings
from hilrec.daemon.errors import (
    CorruptDatasetError,
    DatasetError,
    DatasetStateError,
    VideoEncodingError,
)
from hilrec.daemon.text import task_problem
from hilrec.daemon.tools import edit_video

Hook = Callable[[str], None] | None

TEMP_MARK: Final[str] = ".hilrec-edit-"
RENAME_EXCHANGE: Final[int] = 2
AT_FDCWD: Final[int] = -100
# renameat2 by syscall number where libc has no wrapper (glibc < 2.28).
_SYS_RENAMEAT2: Final[dict[str, int]] = {"x86_64": 316, "aarch64": 276, "armv7l": 382, "armv6l": 382}
# The checker rules whose findings are about the stats an edit recomputes.
IMAGE_DTYPES: Final[frozenset[str]] = frozenset({"image", "video"})


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


# --- writing a result ----------------------------------------------------------------------------


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
) -> EditReport:
    """Write the dataset made of ``picks`` into the empty folder ``out`` (see the module doc)."""
    if not picks:
        raise DatasetError(f"hilrec edit {command}: the result would hold no episode")
    report = report or EditReport(command=command, target=out)
    base = sources[0]
    features = dict(features if features is not None else base.features)
    fps = base.fps
    info = json.loads(json.dumps(base.info))
    info["features"] = features
    chunks_size = int(info.get("chunks_size") or 1000)
    numeric = [k for k in data_keys(features) if features[k]["dtype"] not in IMAGE_DTYPES]
    schema = data_schema(features)

    # tasks: in order of first use by the result's episodes
    tasks: list[str] = []
    known: dict[str, int] = {}

    def task_index(task: str) -> int:
        if task not in known:
            known[task] = len(tasks)
            tasks.append(task)
        return known[task]

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
            n = table.num_rows
            old_tasks = table.column("task_index").to_numpy()
            if pick.task is not None:
                new_tasks = np.full(n, task_index(pick.task), dtype=np.int64)
            else:
                lookup = {int(t): task_index(src.tasks[int(t)]) for t in dict.fromkeys(old_tasks.tolist())}
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
                    "tasks": list(dict.fromkeys(tasks[i] for i in new_tasks.tolist())),
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
    _hook(hook, "data-written")

    for video_key in video_keys(features):
        _write_videos(out, video_key, sources, picks, rows, chunks_size, fps, report)
    _hook(hook, "videos-written")

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
    pq.write_table(tasks_table(tasks), out / TASKS_PATH, **PARQUET_OPTIONS)
    aggregated = aggregate_stats(stats)
    stats_json = stats_to_json({k: aggregated[k] for k in features if k in aggregated})
    write_synced(out / STATS_PATH, meta_json_bytes(stats_json))
    info.update(
        total_episodes=len(rows),
        total_frames=next_index,
        total_tasks=len(tasks),
        splits={"train": f"0:{len(rows)}"},
    )
    if not video_keys(features):
        info["video_path"] = None
    written += [ep_path, out / TASKS_PATH]
    _hook(hook, "meta-written")

    _write_sidecars(out, sources, picks, tasks, command)
    write_synced(out / INFO_PATH, meta_json_bytes(info))  # last: info.json says "a dataset"
    _hook(hook, "sidecars-written")
    _sync_tree(out)
    report.episodes, report.frames = len(rows), next_index
    report.episode_map = [(p.source, p.episode) for p in picks]
    return report


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
    out: Path, sources: Sequence[Source], picks: Sequence[Pick], tasks: Sequence[str], command: str
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
    if dataset is None and len(sources) == 1:
        return
    dataset = json.loads(json.dumps(dataset or {}))
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


def _hook(hook: Hook, name: str) -> None:
    if hook is not None:
        hook(name)


# --- the safe swap -------------------------------------------------------------------------------


def temp_dirs(target: Path) -> list[Path]:
    """Sibling folders of edits of ``target`` (live, or left by a killed edit)."""
    target = Path(target)
    return sorted(
        p for p in target.parent.glob(f".{target.name}{TEMP_MARK}*") if p.is_dir() and not p.is_symlink()
    )


def _intent_files(target: Path) -> list[Path]:
    return sorted(target.parent.glob(f".{target.name}{TEMP_MARK}*.json"))


def recover(target: Path) -> list[str]:
    """Finish or undo what a killed edit of ``target`` left (see the module docstring); returns
    what it did. Call it with no edit of ``target`` running (``hilrec edit`` does, first)."""
    target = Path(target)
    done: list[str] = []
    for intent_path in _intent_files(target):
        intent = read_json(intent_path, if_missing=None) or {}
        new, old = Path(intent.get("new", "")), Path(intent.get("old", ""))
        if not os.path.lexists(target) and intent.get("new") and new.is_dir():
            os.rename(new, target)
            fsync_dir(target.parent)
            done.append(f"moved the checked result {new.name} into place at {target}")
        elif not os.path.lexists(target) and intent.get("old") and old.is_dir():
            os.rename(old, target)
            fsync_dir(target.parent)
            done.append(f"moved the source {old.name} back to {target}")
        intent_path.unlink(missing_ok=True)
    return done


def clean_leftovers(target: Path) -> list[Path]:
    """Remove the sibling folders of edits whose process is gone (their lock is free)."""
    removed = []
    for directory in temp_dirs(target):
        lock = RootLock(directory, "hilrec edit (cleaning)")
        try:
            lock.acquire()
        except DatasetStateError:
            continue  # a live edit's
        try:
            shutil.rmtree(directory)
            removed.append(directory)
        finally:
            lock.release()
    if removed:
        fsync_dir(Path(target).parent)
    return removed


def _libc_renameat2() -> Callable[..., int] | None:
    libc = ctypes.CDLL(None, use_errno=True)
    func = getattr(libc, "renameat2", None)
    if func is not None:
        func.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
        func.restype = ctypes.c_int
        return func  # type: ignore[no-any-return,unused-ignore]
    number = _SYS_RENAMEAT2.get(os.uname().machine)
    if number is None:
        return None
    syscall = libc.syscall

    def via_syscall(olddirfd: int, old: bytes, newdirfd: int, new: bytes, flags: int) -> int:
        return int(syscall(number, olddirfd, old, newdirfd, new, flags))

    return via_syscall


def exchange(a: Path, b: Path) -> bool:
    """Swap two directory entries atomically; False when the system cannot (then nothing moved)."""
    func = _libc_renameat2()
    if func is None or os.environ.get("HILREC_EDIT_NO_EXCHANGE") == "1":
        return False
    result = func(AT_FDCWD, os.fsencode(a), AT_FDCWD, os.fsencode(b), RENAME_EXCHANGE)
    if result == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP):
        return False
    raise OSError(err, f"renameat2({a}, {b}, RENAME_EXCHANGE): {os.strerror(err)}")


def swap_in(target: Path, result: Path, hook: Hook = None) -> tuple[str, Path]:
    """Put the checked ``result`` at ``target``; returns (how, the folder now holding the old
    target) for the caller to remove."""
    if exchange(result, target):
        fsync_dir(target.parent)
        _hook(hook, "exchanged")
        return "exchange", result
    old = target.parent / f".{target.name}{TEMP_MARK}{os.getpid()}-{secrets.token_hex(4)}-old"
    intent = target.parent / f".{target.name}{TEMP_MARK}{os.getpid()}-{secrets.token_hex(4)}.json"
    write_synced(intent, json_bytes({"target": str(target), "new": str(result), "old": str(old)}))
    fsync_dir(target.parent)
    _hook(hook, "intent-written")
    os.rename(target, old)
    try:
        _hook(hook, "renamed-old")
        os.rename(result, target)
    except BaseException:
        # Not a kill (that is recover()'s): an error between the renames puts the source back.
        if not os.path.lexists(target):
            os.rename(old, target)
        intent.unlink(missing_ok=True)
        fsync_dir(target.parent)
        raise
    fsync_dir(target.parent)
    intent.unlink()
    _hook(hook, "exchanged")
    return "two renames", old


# --- running an edit -----------------------------------------------------------------------------


@dataclass
class Options:
    """How an edit checks its result: ``decode`` the videos (the full check), on ``workers``."""

    decode: bool = True
    workers: int | None = 1
    hook: Hook = None


def run_edit(
    command: str,
    roots: Sequence[Path],
    target: Path,
    build: Callable[[Sequence[Source], Path, EditReport], None],
    options: Options | None = None,
) -> EditReport:
    """Lock ``roots`` and ``target``, build the result beside ``target``, check it, swap it in."""
    options = options or Options()
    hook = options.hook
    started = time.monotonic()
    roots = [Path(r) for r in roots]
    target = Path(target)
    in_place = target in roots
    label = f"hilrec edit {command}"
    for root in roots:
        recover(root)
    if not in_place:
        recover(target)
        if os.path.lexists(target) and any(c.name != LOCK_NAME for c in target.iterdir()):
            raise DatasetStateError(f"--out {target} exists and is not empty; give a new folder")
    created_out = not in_place and not os.path.lexists(target)
    locks: list[RootLock] = []
    result: Path | None = None
    done = False
    try:
        for root in dict.fromkeys([*roots, target]):
            if root in roots and not (root / INFO_PATH).exists():
                raise DatasetError(f"{root}: no meta/info.json: not a LeRobot dataset root")
            locks.append(RootLock(root, label).acquire())
        _hook(hook, "locked")
        for root in dict.fromkeys([*roots, target]):
            clean_leftovers(root)
        sources = [Source.load(r) for r in roots]
        result = target.parent / f".{target.name}{TEMP_MARK}{os.getpid()}-{secrets.token_hex(4)}"
        result.mkdir()
        locks.append(RootLock(result, label).acquire())
        _hook(hook, "temp-created")
        report = EditReport(command=command, target=target)
        build(sources, result, report)
        checked = check_dataset(result, decode_video=options.decode, workers=options.workers)
        _refuse_findings(checked, command)
        _hook(hook, "checked")
        how, old = swap_in(target, result, hook)
        result = old  # what is left to remove: the old target
        report.swap = how if in_place else f"written to --out ({how})"
        shutil.rmtree(old)
        result = None
        fsync_dir(target.parent)
        _hook(hook, "cleaned")
        report.seconds = time.monotonic() - started
        done = True
        return report
    finally:
        if result is not None:
            with contextlib.suppress(OSError):
                shutil.rmtree(result)
        # The --out folder this edit made for its lock, holding nothing else, goes too.
        if (
            created_out
            and not done
            and target.is_dir()
            and all(c.name == LOCK_NAME for c in target.iterdir())
        ):
            shutil.rmtree(target, ignore_errors=True)
        for lock in reversed(locks):
            lock.release()


def _refuse_findings(checked: CheckReport, command: str) -> None:
    if not checked.failures:
        return
    shown = "; ".join(f"{f.severity.upper()} {f.format()}" for f in checked.failures[:5])
    more = f" (and {len(checked.failures) - 5} more)" if len(checked.failures) > 5 else ""
    raise DatasetError(
        f"hilrec edit {command}: the result fails hilrec check ({len(checked.errors)} error(s), "
        f"{len(checked.warnings)} warning(s)): {shown}{more}; the source is unchanged"
    )


# --- the sub-commands ----------------------------------------------------------------------------


def _all(source: Source) -> list[Pick]:
    return [Pick(0, i) for i in range(len(source.episodes))]


def _episode_list(source: Source, episodes: Iterable[int], what: str) -> list[int]:
    wanted = sorted({int(e) for e in episodes})
    unknown = [e for e in wanted if not 0 <= e < len(source.episodes)]
    if unknown:
        raise DatasetError(
            f"{source.root}: {what}: no episode {unknown} (it has 0..{len(source.episodes) - 1})"
        )
    return wanted


def recompute_stats(root: Path, *, out: Path | None = None, options: Options | None = None) -> EditReport:
    """Every episode's stats from its rows and decoded frames, and stats.json from them."""

    def build(sources: Sequence[Source], result: Path, report: EditReport) -> None:
        write_dataset(
            result,
            sources,
            _all(sources[0]),
            recompute_images=True,
            command="recompute-stats",
            report=report,
            hook=_hook_of(options),
        )

    return run_edit("recompute-stats", [root], out or root, build, options)


def delete_episodes(
    root: Path, episodes: Iterable[int], *, out: Path | None = None, options: Options | None = None
) -> EditReport:
    def build(sources: Sequence[Source], result: Path, report: EditReport) -> None:
        source = sources[0]
        drop = set(_episode_list(source, episodes, "--episodes"))
        if not drop:
            raise DatasetError(f"{root}: --episodes names no episode")
        picks = [p for p in _all(source) if p.episode not in drop]
        if not picks:
            raise DatasetError(f"{root}: deleting every episode leaves no dataset")
        write_dataset(
            result, sources, picks, command="delete-episodes", report=report, hook=_hook_of(options)
        )

    return run_edit("delete-episodes", [root], out or root, build, options)


def keep_episodes(
    root: Path,
    *,
    episodes: Iterable[int] | None = None,
    success: bool = False,
    verdicts: Sequence[str] | None = None,
    out: Path | None = None,
    options: Options | None = None,
) -> EditReport:
    """Keep the episodes that are listed, successful and/or have one of ``verdicts``."""

    def build(sources: Sequence[Source], result: Path, report: EditReport) -> None:
        source = sources[0]
        listed = None if episodes is None else set(_episode_list(source, episodes, "--episodes"))
        picks = []
        for pick in _all(source):
            meta = source.episode_sidecar(pick.episode) or {}
            if listed is not None and pick.episode not in listed:
                continue
            if success and not episode_success(meta):
                continue
            if verdicts and not (episode_verdicts(meta) & set(verdicts)):
                continue
            picks.append(pick)
        if not picks:
            raise DatasetError(f"{root}: no episode matches; nothing would be kept")
        report.notes.append(f"kept {len(picks)} of {len(source.episodes)} episodes")
        write_dataset(result, sources, picks, command="keep", report=report, hook=_hook_of(options))

    return run_edit("keep", [root], out or root, build, options)


def episode_success(meta: Mapping[str, Any]) -> bool:
    """The take's success: ``success`` (sim, judged), else ``success_reported`` (the operator)."""
    value = meta.get("success", meta.get("success_reported"))
    return value is True


def episode_verdicts(meta: Mapping[str, Any]) -> set[str]:
    """Every verdict word the sidecar's ``verdict`` holds (its own, and its replay's)."""
    found: set[str] = set()

    def walk(value: Any) -> None:
        if isinstance(value, str):
            found.add(value)
        elif isinstance(value, Mapping):
            for k, v in value.items():
                if k in ("verdict", "status") and isinstance(v, str):
                    found.add(v)
                elif isinstance(v, Mapping):
                    walk(v)

    walk(meta.get("verdict"))
    return found


def set_task(
    root: Path,
    episodes: Iterable[int],
    task: str,
    *,
    out: Path | None = None,
    options: Options | None = None,
) -> EditReport:
    problem = task_problem(task)
    if problem:
        raise DatasetError(f"--task {task!r}: {problem}")

    def build(sources: Sequence[Source], result: Path, report: EditReport) -> None:
        source = sources[0]
        chosen = set(_episode_list(source, episodes, "--episodes"))
        picks = [Pick(0, p.episode, task if p.episode in chosen else None) for p in _all(source)]
        write_dataset(result, sources, picks, command="set-task", report=report, hook=_hook_of(options))

    return run_edit("set-task", [root], out or root, build, options)


def remove_feature(
    root: Path, key: str, *, out: Path | None = None, options: Options | None = None
) -> EditReport:
    def build(sources: Sequence[Source], result: Path, report: EditReport) -> None:
        source = sources[0]
        features = source.features
        if key not in features:
            raise DatasetError(f"{root}: no feature '{key}' (it has {sorted(features)})")
        if key in DEFAULT_FEATURES:
            raise DatasetError(f"{root}: '{key}' is one of LeRobot's default columns and cannot be removed")
        del features[key]
        write_dataset(
            result,
            sources,
            _all(source),
            features=features,
            command="remove-feature",
            report=report,
            hook=_hook_of(options),
        )

    return run_edit("remove-feature", [root], out or root, build, options)


def merge(roots: Sequence[Path], out: Path, *, options: Options | None = None) -> EditReport:
    """The episodes of ``roots``, in order, into ``out``: fps, features and robot type agree."""
    if len(roots) < 2:
        raise DatasetError("merge needs at least two datasets")
    if Path(out) in [Path(r) for r in roots]:
        raise DatasetError(f"--out {out} is one of the inputs; give a new folder")

    def build(sources: Sequence[Source], result: Path, report: EditReport) -> None:
        problem = merge_problem(sources)
        if problem:
            raise DatasetError(f"cannot merge: {problem}")
        picks = [Pick(s, p.episode) for s, src in enumerate(sources) for p in _all(src)]
        write_dataset(result, sources, picks, command="merge", report=report, hook=_hook_of(options))

    return run_edit("merge", roots, out, build, options)


def merge_problem(sources: Sequence[Source]) -> str | None:
    """What differs between datasets to be merged (fps, robot type, features, sim world), or None."""
    first = sources[0]
    for other in sources[1:]:
        where = f"{first.root} and {other.root}"
        if first.fps != other.fps:
            return f"fps differs: {first.fps} in {first.root}, {other.fps} in {other.root}"
        if first.info.get("robot_type") != other.info.get("robot_type"):
            return (
                f"robot_type differs: {first.info.get('robot_type')!r} in {first.root}, "
                f"{other.info.get('robot_type')!r} in {other.root}"
            )
        a, b = first.features, other.features
        if list(a) != list(b):
            only_a = [k for k in a if k not in b]
            only_b = [k for k in b if k not in a]
            if only_a or only_b:
                return (
                    f"features differ between {where}: only in the first {only_a}, "
                    f"only in the second {only_b}"
                )
            return f"features are in a different order in {where}: {list(a)} vs {list(b)}"
        for key in a:
            if a[key] != b[key]:
                fields = sorted(k for k in set(a[key]) | set(b[key]) if a[key].get(k) != b[key].get(k))
                return f"feature '{key}' differs between {where} in {fields}: {a[key]} vs {b[key]}"
        sim_a = (first.sidecar or {}).get("sim")
        sim_b = (other.sidecar or {}).get("sim")
        if json.dumps(sim_a, sort_keys=True) != json.dumps(sim_b, sort_keys=True):
            return (
                f"the simulated world differs between {where} (hilrec/dataset.json 'sim'): "
                "their episodes could not be replayed in one twin"
            )
    return None


def split(
    root: Path,
    outs: Sequence[Path],
    *,
    fractions: Sequence[float] | None = None,
    lists: Sequence[Sequence[int]] | None = None,
    options: Options | None = None,
) -> list[EditReport]:
    """Write the source's episodes into ``outs``: consecutive shares by ``fractions``, or the
    episodes of ``lists``. The source is not changed."""
    source = Source.load(Path(root))
    n = len(source.episodes)
    if (fractions is None) == (lists is None):
        raise DatasetError("split needs either --fractions or --episodes lists")
    if fractions is not None:
        if len(fractions) != len(outs) or any(f <= 0 for f in fractions) or sum(fractions) > 1 + 1e-9:
            raise DatasetError(
                f"--fractions {list(fractions)}: one positive fraction per --out ({len(outs)}), "
                "summing to at most 1"
            )
        counts = [int(f * n) for f in fractions]
        if abs(sum(fractions) - 1) <= 1e-9:
            counts[-1] = n - sum(counts[:-1])
        if any(c <= 0 for c in counts):
            raise DatasetError(f"--fractions {list(fractions)} of {n} episodes leaves an empty part {counts}")
        groups, start = [], 0
        for c in counts:
            groups.append(list(range(start, start + c)))
            start += c
    else:
        assert lists is not None
        if len(lists) != len(outs):
            raise DatasetError(f"{len(lists)} --episodes lists for {len(outs)} --out folders")
        groups = [_episode_list(source, g, "--episodes") for g in lists]
    reports = []
    for group, out in zip(groups, outs, strict=True):

        def build(
            sources: Sequence[Source], result: Path, report: EditReport, group: list[int] = group
        ) -> None:
            picks = [Pick(0, e) for e in group]
            write_dataset(result, sources, picks, command="split", report=report, hook=_hook_of(options))

        reports.append(run_edit("split", [Path(root)], Path(out), build, options))
    return reports


def _hook_of(options: Options | None) -> Hook:
    return options.hook if options is not None else None
