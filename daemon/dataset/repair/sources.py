"""Every readable copy of every episode at a root, for the rebuild to choose from.

Rows come from the journal or a data file's block of the episode (when both are readable and
differ, the one that reproduces the episode's stored stats); frames from the staged mp4 or the
episode's span of its video file, located by the episodes metadata or, when that is unreadable,
by aligning the video files' frame counts with the episodes' lengths (:func:`_align`).
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any, Final

import av
import numpy as np
import pyarrow as pa

from hilrec.daemon.dataset.check.journal import same_rows, stats_reproduced, table_columns
from hilrec.daemon.dataset.format.features import TIMESTAMP_TOLERANCE_S, video_keys
from hilrec.daemon.dataset.format.layout import DEFAULT_CHUNK_SIZE, data_schema
from hilrec.daemon.dataset.format.paths import (
    TASKS_PATH,
    VIDEOS_DIR,
    FileRef,
    chunk_file_index,
    data_files,
    data_path,
    data_ref,
    episodes_files,
    video_path,
    video_ref,
)
from hilrec.daemon.dataset.format.reader import column_to_numpy, decode_video, read_parquet, tasks_from_table
from hilrec.daemon.dataset.format.stats import (
    STAT_KEYS,
    downsample_image,
    image_stats,
    sample_indices,
    stats_to_json,
    unflatten_episode_stats,
)
from hilrec.daemon.dataset.repair.space import out_of_space
from hilrec.daemon.dataset.store import journal
from hilrec.daemon.dataset.video.codec import Segment, VideoProbe, concat_segments, probe_video
from hilrec.daemon.dataset.video.spill import spill_name
from hilrec.daemon.errors import CorruptDatasetError, VideoEncodingError


@dataclass
class Rows:
    """The rows chosen for one episode, or why there are none."""

    table: pa.Table | None
    origin: str
    reason: str = ""
    phantom: bool = False  # only a stray block in a data file speaks of this episode


STAGED_ORIGIN: Final[str] = "journal (staged mp4)"


class Sources:
    """Every readable copy of every episode at the root, read once."""

    def __init__(self, root: Path, info: dict[str, Any], on_disk_total: int | None) -> None:
        self.root = root
        self.info = info
        self.features: dict[str, Any] = info["features"]
        self.fps = int(info["fps"])
        self.schema = data_schema(self.features)
        self.keys = video_keys(self.features)
        self.chunks_size = int(info.get("chunks_size") or DEFAULT_CHUNK_SIZE)
        self.on_disk_total = on_disk_total
        self.entries = {i: journal.read_entry(root, i) for i in journal.committed_dirs(root)}
        self.rows: dict[int, dict[str, Any]] = {}
        self.problems: list[str] = []
        for path in episodes_files(root):
            try:
                for row in read_parquet(path).to_pylist():
                    if isinstance(row.get("episode_index"), int) and isinstance(row.get("length"), int):
                        self.rows[int(row["episode_index"])] = row
            except CorruptDatasetError as exc:
                self.problems.append(f"{path.relative_to(root)}: {exc.problem}")
        self.data: dict[int, pa.Table | str] = {}
        self.data_problems: dict[str, str] = {}
        for path in data_files(root):
            self._split(path)
        try:
            self.tasks_on_disk: dict[int, str] | None = tasks_from_table(
                read_parquet(root / TASKS_PATH), root / TASKS_PATH
            )
        except CorruptDatasetError:
            self.tasks_on_disk = None
        self._probes: dict[Path, VideoProbe | str] = {}
        self._inferred: dict[str, dict[int, tuple[Path, float, float]]] = {}
        self.lengths: dict[int, int] = {}

    def _split(self, path: Path) -> None:
        rel = path.relative_to(self.root).as_posix()
        try:
            table = read_parquet(path)
            episodes = column_to_numpy(table.column("episode_index"))
        except (CorruptDatasetError, KeyError, pa.ArrowException) as exc:
            self.data_problems[rel] = getattr(exc, "problem", str(exc))
            return
        if not len(episodes):
            return
        change = np.flatnonzero(np.diff(episodes)) + 1
        starts = [0, *change.tolist()]
        ends = [*change.tolist(), len(episodes)]
        for start, end in zip(starts, ends, strict=True):
            episode = int(episodes[start])
            if episode in self.data:
                self.data[episode] = f"its rows are split over several blocks ({rel} row {start})"
            else:
                self.data[episode] = table.slice(start, end - start)

    def candidates(self) -> list[int]:
        return sorted(set(self.entries) | set(self.rows) | set(self.data))

    def probe(self, path: Path) -> VideoProbe | str:
        if path not in self._probes:
            try:
                self._probes[path] = probe_video(path)
            except CorruptDatasetError as exc:
                self._probes[path] = exc.problem
        return self._probes[path]

    def stored_stats(self, episode: int) -> dict[str, Any] | None:
        entry = self.entries.get(episode)
        if entry is not None and entry.meta is not None:
            return dict(entry.meta["stats"])
        row = self.rows.get(episode)
        return dict(unflatten_episode_stats(row)) if row is not None else None

    def tasks_of(self, episode: int) -> list[str] | None:
        entry = self.entries.get(episode)
        if entry is not None and entry.meta is not None:
            return [str(t) for t in entry.meta["tasks"]]
        row = self.rows.get(episode)
        return (
            [str(t) for t in row["tasks"]] if row is not None and isinstance(row.get("tasks"), list) else None
        )

    def rel(self, path: Path) -> str:
        try:
            return path.relative_to(self.root).as_posix()
        except ValueError:
            return str(path)

    # --- rows ---

    def choose_rows(self, episode: int) -> Rows:
        entry = self.entries.get(episode)
        row = self.rows.get(episode)
        expected = (
            entry.meta["length"] if entry is not None and entry.meta else row["length"] if row else None
        )
        reasons: list[str] = []
        found: list[tuple[str, pa.Table]] = []
        if entry is None:
            reasons.append("no journal entry")
        elif entry.table is None:
            reasons.append(
                "journal: " + "; ".join(m for p, m in entry.problems if p.name == journal.EPISODE_DATA)
            )
        else:
            problem = self._rows_problem(entry.table, episode, expected)
            (reasons.append(f"journal: {problem}") if problem else found.append(("journal", entry.table)))
        data = self.data.get(episode)
        if data is None:
            named = data_path(self.root, data_ref(row)).relative_to(self.root).as_posix() if row else None
            why = self.data_problems.get(named or "") if named else None
            reasons.append(f"data file {named}: {why}" if why else "in no readable data file")
        elif isinstance(data, str):
            reasons.append(f"data file: {data}")
        else:
            problem = self._rows_problem(data, episode, expected)
            (reasons.append(f"data file: {problem}") if problem else found.append(("data file", data)))
        if not found:
            # Rows that name an episode neither the journal nor the episodes metadata know of are
            # a damaged block of another episode's, not an episode.
            phantom = entry is None and row is None and bool(self.entries or self.rows)
            return Rows(None, "-", "rows unreadable: " + "; ".join(reasons), phantom=phantom)
        origin, table = found[0]
        if len(found) == 2:
            cols = [table_columns(t, self.features, Path(o)) for o, t in found]
            if not same_rows(cols[0], cols[1]):
                stored = self.stored_stats(episode)
                verdict = [stats_reproduced(c, stored, self.features) for c in cols]
                if verdict == [False, True]:
                    origin, table = found[1]
                    origin += " (the journal copy differs and does not reproduce the episode's stats)"
                elif verdict == [True, False]:
                    origin += " (the data file's rows differ and do not reproduce the episode's stats)"
                else:
                    origin += " (the data file's rows differ; neither copy can be told right by the stats)"
        self.lengths[episode] = table.num_rows
        return Rows(table.select(self.schema.names), origin)

    def _rows_problem(self, table: pa.Table, episode: int, expected: int | None) -> str | None:
        missing = [n for n in self.schema.names if n not in table.column_names]
        if missing:
            return f"columns {missing} missing"
        for f in self.schema:
            if table.schema.field(f.name).type != f.type:
                return f"column '{f.name}' is {table.schema.field(f.name).type}, expected {f.type}"
        n = table.num_rows
        if n == 0:
            return "no rows"
        if expected is not None and n != expected:
            return f"{n} rows, the episode has {expected}"
        try:
            cols = table_columns(table, self.features, Path("rows"))
        except CorruptDatasetError as exc:
            return exc.problem
        if not (cols["episode_index"] == episode).all():
            return "episode_index is not the episode's in every row"
        if not np.array_equal(cols["frame_index"], np.arange(n)):
            return "frame_index is not 0 .. length-1"
        grid = np.arange(n) / self.fps
        if np.abs(cols["timestamp"].astype(np.float64) - grid).max() > TIMESTAMP_TOLERANCE_S:
            return f"timestamp is off the 1/{self.fps} s grid"
        if n > 1 and not (np.diff(cols["index"]) == 1).all():
            return "index is not contiguous"
        for key, values in cols.items():
            if values.dtype.kind == "f" and not np.isfinite(values).all():
                return f"column '{key}' holds NaN or infinity"
        return None

    # --- frames ---

    def place_frames(self, episode: int, key: str, length: int, out: Path) -> tuple[str | None, str]:
        """Write the episode's frames of ``key`` to ``out``; (where they came from, why not)."""
        reasons = []
        staged = journal.episode_dir(self.root, episode) / journal.video_file_name(key)
        if staged.exists():
            probe = self.probe(staged)
            if isinstance(probe, str):
                reasons.append(f"staged {self.rel(staged)}: {probe}")
            elif probe.frames != length:
                reasons.append(f"staged {self.rel(staged)}: {probe.frames} frames for {length} rows")
            else:
                shutil.copyfile(staged, out)
                return STAGED_ORIGIN, ""
        spill = journal.episode_dir(self.root, episode) / spill_name(key)
        if spill.exists():
            reasons.append(f"its frames wait in {self.rel(spill)}, which cannot be encoded (see above)")
        row = self.rows.get(episode)
        if row is not None and row.get(f"videos/{key}/chunk_index") is not None:
            prefix = f"videos/{key}/"
            where = (
                video_path(self.root, key, video_ref(row, key)),
                float(row[prefix + "from_timestamp"]),
                float(row[prefix + "to_timestamp"]),
            )
            how = "the episodes metadata"
        else:
            located = self.inferred(key).get(episode)
            if located is None:
                reasons.append(f"no readable video file holds it ({self._video_files_text(key)})")
                return None, "; ".join(reasons)
            where, how = located, "aligned by frame counts"
        path, start, end = where
        problem = self._extract(path, start, end, out, length)
        if problem is None:
            return f"{self.rel(path)} [{start:.3f}, {end:.3f}) s ({how})", ""
        reasons.append(f"{self.rel(path)}: {problem}")
        return None, "; ".join(reasons)

    def _video_files_text(self, key: str) -> str:
        bad = [
            f"{self.rel(p)}: {r}"
            for p, r in self._probes.items()
            if isinstance(r, str) and p.parent.parent.name == key
        ]
        return "; ".join(bad) if bad else f"the files under videos/{key}/ hold other episodes"

    def _extract(self, path: Path, start: float, end: float, out: Path, length: int) -> str | None:
        probe = self.probe(path)
        if isinstance(probe, str):
            return probe
        try:
            placed = concat_segments(out, [Segment(path, start, end)], fps=self.fps)
        except (VideoEncodingError, CorruptDatasetError, av.FFmpegError, OSError) as exc:
            if out_of_space(exc):
                raise
            out.unlink(missing_ok=True)
            return str(exc)
        if placed[0][2] != length:
            out.unlink(missing_ok=True)
            return f"only {placed[0][2]} of its {length} frames are readable in [{start:.3f}, {end:.3f}) s"
        return None

    def inferred(self, key: str) -> dict[int, tuple[Path, float, float]]:
        """Where each episode's frames sit in LeRobot's video files of ``key``, found without the
        episodes metadata: the files hold the merged episodes in order, each file a run of
        consecutive episodes, so a file whose frame count only one run of episodes adds up to
        holds that run. Files that cannot be read (or are missing from the numbering) hold
        unknown runs; episodes of an ambiguous placement are left out."""
        if key in self._inferred:
            return self._inferred[key]
        placed: dict[int, tuple[Path, float, float]] = {}
        self._inferred[key] = placed
        existing = sorted(
            FileRef(*ref)
            for p in (self.root / VIDEOS_DIR / key).glob("chunk-*/file-*.mp4")
            if (ref := chunk_file_index(p.relative_to(self.root / VIDEOS_DIR / key))) is not None
        )
        if not existing:
            return placed
        refs = [FileRef()]
        while refs[-1] < existing[-1]:
            refs.append(refs[-1].next(self.chunks_size))
        paths = [video_path(self.root, key, ref) for ref in refs]
        counts: list[int | None] = []
        for path in paths:
            probe = self.probe(path) if path.exists() else "missing"
            counts.append(probe.frames if isinstance(probe, VideoProbe) else None)
        staged = {
            e
            for e in self.candidates()
            if (journal.episode_dir(self.root, e) / journal.video_file_name(key)).exists()
        }
        options = []
        if self.on_disk_total is not None:
            options.append(self.on_disk_total)
        options += [len([e for e in self.candidates() if e not in staged]), len(self.candidates())]
        for merged in dict.fromkeys(options):
            lengths = [self.length(e) for e in range(merged)]
            if any(n is None for n in lengths):
                continue
            runs = _align([int(n) for n in lengths if n is not None], counts)
            if not runs:
                continue
            for i, (s, t) in runs.items():
                offset = 0
                for episode in range(s, t):
                    n = int(lengths[episode] or 0)
                    start = float(Fraction(offset, self.fps))
                    placed[episode] = (paths[i], start, float(Fraction(offset + n, self.fps)))
                    offset += n
            break
        return placed

    def length(self, episode: int) -> int | None:
        if episode in self.lengths:
            return self.lengths[episode]
        entry = self.entries.get(episode)
        if entry is not None and entry.meta is not None:
            return int(entry.meta["length"])
        row = self.rows.get(episode)
        if row is not None:
            return int(row["length"])
        data = self.data.get(episode)
        return data.num_rows if isinstance(data, pa.Table) else None

    def image_stats(self, episode: int, key: str, mp4: Path, length: int) -> dict[str, Any]:
        stored = self.stored_stats(episode) or {}
        stats = stored.get(key)
        if isinstance(stats, Mapping) and all(n in stats for n in STAT_KEYS):
            return stats_to_json({key: {n: np.asarray(stats[n]) for n in STAT_KEYS}})[key]
        frames = decode_video(mp4, np.asarray(sample_indices(length), dtype=np.float64) / self.fps)
        return stats_to_json({key: image_stats(np.stack([downsample_image(f) for f in frames]))})[key]


def _align(lengths: Sequence[int], counts: Sequence[int | None]) -> dict[int, tuple[int, int]]:
    """For each file of known frame count whose run of episodes is certain: (first, end) episode.

    Files hold consecutive runs of at least one episode, in order; a file of unknown count
    (unreadable, missing) holds an unknown run; after the last file, episodes may be in files that
    are gone. A run is certain when every split of the episodes consistent with the counts gives
    that file the same run.
    """
    total = len(lengths)
    sums = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64).tolist()
    at = {value: index for index, value in enumerate(sums)}
    m = len(counts)
    forward: list[set[int]] = [set() for _ in range(m + 1)]
    forward[0] = {0}
    for i, count in enumerate(counts):
        if not forward[i]:
            return {}
        if count is None:
            forward[i + 1] = set(range(min(forward[i]) + 1, total + 1))
            continue
        for s in forward[i]:
            t = at.get(sums[s] + count)
            if t is not None and t > s:
                forward[i + 1].add(t)
    backward: list[set[int]] = [set() for _ in range(m + 1)]
    backward[m] = set(range(total + 1))
    for i in reversed(range(m)):
        count = counts[i]
        if not backward[i + 1]:
            return {}
        if count is None:
            backward[i] = set(range(max(backward[i + 1])))
            continue
        for t in backward[i + 1]:
            first = at.get(sums[t] - count)
            if first is not None and first < t:
                backward[i].add(first)
    if 0 not in backward[0]:
        return {}
    runs: dict[int, tuple[int, int]] = {}
    for i, count in enumerate(counts):
        if count is None:
            continue
        options = set()
        for s in forward[i]:
            t = at.get(sums[s] + count)
            if t is not None and t > s and t in backward[i + 1]:
                options.add((s, t))
        if len(options) == 1:
            runs[i] = options.pop()
    return runs
