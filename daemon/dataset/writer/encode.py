"""An episode's bytes: its ``data.parquet``, its ``episode.json`` and its sidecar files.

:class:`EpisodeEncoder` turns an :class:`~.episode.OpenEpisode` whose videos are finished into an
:class:`EncodedEpisode`: everything the commit writes, as bytes, so the commit thread only writes
and fsyncs. The rows get their final columns here (the five the writer fills in: ``timestamp =
frame_index / fps``, ``frame_index``, ``episode_index``, the dataset-wide ``index`` and
``task_index``), in the schema LeRobot reads (:func:`.layout.data_schema`), with the episode's
stats (:mod:`.stats`) in ``episode.json`` for the merge to put into LeRobot's episodes file.

Numbers are given out by :class:`Numbering` at encoding time, ahead of the commits: an episode
encoded while the one before is still being committed already knows its ``index`` and its tasks'
``task_index``. A save that fails before anything after it was encoded gives its numbers back.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from hilrec.daemon.dataset.format.layout import PARQUET_OPTIONS, data_schema, episode_data_table
from hilrec.daemon.dataset.format.sidecar import episode_sidecar_files
from hilrec.daemon.dataset.format.stats import compute_episode_stats, stats_to_json
from hilrec.daemon.dataset.store import journal
from hilrec.daemon.dataset.writer.episode import OpenEpisode
from hilrec.daemon.errors import DatasetStateError


class Numbering:
    """The next episode_index, the next dataset-wide frame index and the task list.

    It runs ahead of what is durable by the episodes still on their way to the commit thread.
    """

    def __init__(self, *, episodes: int, frames: int, tasks: Sequence[str]) -> None:
        self.next_index = episodes
        self.next_frame = frames
        self.tasks: list[str] = list(tasks)

    def task_indices(self, tasks: Sequence[str]) -> tuple[list[int], list[str]]:
        """The task_index of each row's task, and the tasks that are new (in order of first use)."""
        known = {task: i for i, task in enumerate(self.tasks)}
        new_tasks: list[str] = []
        for task in tasks:
            if task not in known:
                known[task] = len(known)
                new_tasks.append(task)
        return [known[t] for t in tasks], new_tasks

    def advance(self, episode: OpenEpisode, new_tasks: Sequence[str]) -> None:
        """``episode`` (encoded with the current numbers) is on its way: number the next one."""
        self.next_index = episode.index + 1
        self.next_frame += episode.length
        self.tasks.extend(new_tasks)

    def give_back(self, episode: OpenEpisode, new_tasks: Sequence[str]) -> None:
        """Undo :meth:`advance` of the last episode, whose save failed."""
        self.next_index = episode.index
        self.next_frame -= episode.length
        del self.tasks[len(self.tasks) - len(new_tasks) :]


@dataclass(frozen=True)
class EncodedEpisode:
    """What the commit writes for one episode."""

    # name -> bytes, written into the episode's journal directory (beside its staged videos)
    files: dict[str, bytes]
    # path -> bytes, the episode's sidecar files outside the journal, in publishing order
    beside: dict[Path, bytes]
    # the tasks this episode adds to the dataset, in task_index order
    new_tasks: list[str]


class EpisodeEncoder:
    """Encodes the episodes of one dataset (see the module docstring)."""

    def __init__(self, root: Path, *, fps: int, features: Mapping[str, Mapping[str, Any]]) -> None:
        self.root = root
        self.fps = fps
        self.features = features
        self._schema = data_schema(features)

    def encode(
        self,
        episode: OpenEpisode,
        numbering: Numbering,
        *,
        sidecar: Mapping[str, Any] | None,
        arrays: Mapping[str, np.ndarray] | None,
    ) -> EncodedEpisode:
        """The bytes of data.parquet, episode.json and the sidecar files; the videos must be
        finished (:meth:`~.episode.OpenEpisode.finish_videos`)."""
        if episode.videos is None:
            raise DatasetStateError(
                f"{self.root}: episode {episode.index} encoded before its videos were finished"
            )
        n = episode.length
        task_index, new_tasks = numbering.task_indices(episode.tasks)
        first = numbering.next_frame
        frame_index = np.arange(n, dtype=np.int64)
        columns = episode.columns()
        columns.update(
            {
                "timestamp": (frame_index / self.fps).astype(np.float32),
                "frame_index": frame_index,
                "episode_index": np.full(n, episode.index, dtype=np.int64),
                "index": np.arange(first, first + n, dtype=np.int64),
                "task_index": np.array(task_index, dtype=np.int64),
            }
        )
        data = self._parquet_bytes(columns)
        stats = compute_episode_stats(columns, self.features)
        stats.update(episode.image_stats())
        ordered = {key: stats[key] for key in self.features if key in stats}
        meta = {
            "episode_index": episode.index,
            "length": n,
            "tasks": list(dict.fromkeys(episode.tasks)),
            "new_tasks": new_tasks,
            "dataset_from_index": first,
            "data_bytes": len(data),
            "videos": episode.videos,
            "stats": stats_to_json(ordered),
            "saved_unix_s": time.time(),
        }
        beside = (
            episode_sidecar_files(self.root, episode.index, sidecar, arrays)
            if sidecar is not None or arrays
            else {}
        )
        files = {journal.EPISODE_DATA: data, journal.EPISODE_META: journal.episode_meta_bytes(meta)}
        return EncodedEpisode(files=files, beside=beside, new_tasks=new_tasks)

    def _parquet_bytes(self, columns: Mapping[str, np.ndarray]) -> bytes:
        # In memory, so the commit thread's write is one call and the size is known for placement.
        stream = pa.BufferOutputStream()
        pq.write_table(episode_data_table(columns, self._schema), stream, **PARQUET_OPTIONS)
        return stream.getvalue().to_pybytes()
