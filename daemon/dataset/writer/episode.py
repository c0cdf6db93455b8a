"""The episode being recorded: its numeric rows in memory, its camera frames in the encoders.

An :class:`OpenEpisode` lives in the journal's open directory (``.episode-NNNNNN.tmp/``, see
:mod:`.journal`) from its first frame until it is committed or discarded:

- numeric values are copied into one list per key, because the caller may reuse its arrays for
  the next frame;
- each camera's frames stream into an :class:`~.video.EpisodeVideoEncoder` that writes the
  episode's mp4 into the open directory on a thread of its own, and into an
  :class:`~.stats.ImageSampler` that keeps what the image stats need, so nothing is decoded at
  save time.

:meth:`OpenEpisode.finish_videos` closes the encoders and checks that every file holds exactly one
frame per row. From then on no frame can be added. Once encoded, :meth:`OpenEpisode.release_frames`
drops what the encoded bytes now carry; a save that fails after that keeps the finished videos in
the open directory, and the retry commits them with the same bytes.

With encoder processes (``workers``, see :mod:`.encoder_process`) each camera frame is handed to
that camera's worker through shared memory, and only when its ring is full written raw into the
camera's spill (:mod:`.spill`). :meth:`OpenEpisode.finish_videos` then ends the worker's episode;
a camera whose encoder is caught up is waited for (at most :data:`FINISH_WAIT_S`) and its mp4
placed in the open directory. Any other is left *pending*: every frame from its cut on is put
into its spill (the ones still in the ring by this side), which is fsynced and committed with the
episode, and the writer places the mp4 when the worker is done (:attr:`OpenEpisode.pending`).
"""

from __future__ import annotations

import errno
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from fractions import Fraction
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

import numpy as np

from hilrec.daemon.dataset.format.features import video_keys
from hilrec.daemon.dataset.format.stats import ImageSampler, Stats
from hilrec.daemon.dataset.store import journal
from hilrec.daemon.dataset.video.codec import EpisodeVideoEncoder, VideoSettings, probe_video
from hilrec.daemon.dataset.video.encoder_worker import SPILL_HOLES
from hilrec.daemon.dataset.video.spill import (
    SpillFile,
    release_spill,
    spill_name,
    write_spill_meta,
)
from hilrec.daemon.dataset.writer.checkpoint import sync_video, write_rows
from hilrec.daemon.dataset.writer.reserve import TakeReserve
from hilrec.daemon.errors import VideoEncodingError

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from hilrec.daemon.dataset.video.encoder_process import EncoderProcess

# save_episode waits this long for a caught-up encoder process before it saves with the spill
# (a test may set 0: every save then goes with its spill).
FINISH_WAIT_S: float = 5.0
# ... and at most this long for the worker to cut the episode (close the frames it has encoded)
# when some of them are no longer in the ring: a frame of encode and a flush, at idle priority.
CUT_WAIT_S: float = 120.0
# A writer with no clock to keep (realtime=False) waits at most this long for a lagging encoder
# before it spills or cuts as a real-time one does; and it polls the encoder this often.
CATCH_UP_S: float = 300.0
CATCH_UP_POLL_S: float = 0.005
# Passes at removing a discarded episode's directory (see EpisodeBuffer.discard).
DISCARD_ATTEMPTS: int = 4


class VideoSummary(TypedDict):
    """What ``episode.json`` records of one camera's staged mp4."""

    frames: int
    duration_s: float


class OpenEpisode:
    """Frames of the episode being recorded (see the module docstring)."""

    def __init__(self, index: int, directory: Path, numeric_keys: Sequence[str]) -> None:
        self.index = index
        self.directory = directory
        self.values: dict[str, list[np.ndarray]] = {key: [] for key in numeric_keys}
        self.tasks: list[str] = []
        self.encoders: dict[str, EpisodeVideoEncoder] = {}
        self.samplers: dict[str, ImageSampler] = {}
        # Encoder-process mode: the workers, each camera's spill and its mp4's future.
        self.workers: dict[str, EncoderProcess] = {}
        self.spills: dict[str, SpillFile] = {}
        self.futures: dict[str, Future[int]] = {}
        # Per camera and frame: its ring sequence number (see EncoderProcess.ring_frame), or -1
        # when it was written into the spill.
        self.sequences: dict[str, list[int]] = {}
        self.cameras: dict[str, tuple[int, int]] = {}
        self.settings: VideoSettings | None = None
        # Cameras whose mp4 is still being encoded when the episode is saved (their spill is
        # committed): key -> (future, the worker's output path).
        self.pending: dict[str, tuple[Future[int], Path]] = {}
        self.root: Path | None = None
        self.fps = 0
        # Set once the encoders are closed (by a save attempt): no frame may be added after that.
        self.videos: dict[str, VideoSummary] | None = None
        # The room held back for this take's save (see .reserve); set by start().
        self.reserve: TakeReserve | None = None
        # Rows checkpointed (see .checkpoint), and the frames a crash would keep of the take.
        self.checkpointed = 0
        self.durable_frames = 0
        # False: the writer is fed by no real-time loop (record --sim), see catch_up().
        self.realtime = True

    @classmethod
    def start(
        cls,
        root: Path,
        index: int,
        *,
        features: Mapping[str, Mapping[str, Any]],
        numeric_keys: Sequence[str],
        fps: int,
        settings: VideoSettings,
        max_queue_bytes: int,
        workers: Mapping[str, EncoderProcess] | None = None,
        realtime: bool = True,
    ) -> OpenEpisode:
        """A fresh open directory for episode ``index`` with one running encoder per camera.

        A directory of that name left by an earlier attempt is removed first.
        """
        directory = journal.open_episode_dir(root, index)
        if directory.exists():
            journal.remove_dir(directory)
        directory.mkdir(parents=True)
        episode = cls(index, directory, numeric_keys)
        episode.root = root
        episode.fps = fps
        episode.realtime = realtime
        episode.reserve = TakeReserve(directory, fps=fps, features=features)
        try:
            if workers:
                try:
                    return _start_spilled(episode, root, index, features, fps, settings, workers)
                except OSError as exc:
                    raise VideoEncodingError(
                        f"episode {index}: its video spill cannot be started in {directory}: {exc}; "
                        "the disk is full: this episode's frames cannot be kept and are lost, the "
                        "episodes saved before are not affected; free space before the next take"
                    ) from exc
            for key in video_keys(features):
                height, width, _ = features[key]["shape"]
                episode.encoders[key] = EpisodeVideoEncoder(
                    directory / journal.video_file_name(key),
                    key=key,
                    episode_index=index,
                    fps=fps,
                    height=height,
                    width=width,
                    settings=settings,
                    max_queue_bytes=max_queue_bytes,
                )
                episode.samplers[key] = ImageSampler()
        except BaseException:
            episode.discard()
            raise
        return episode

    @property
    def length(self) -> int:
        return len(self.tasks)

    @property
    def finished(self) -> bool:
        """Whether the videos are closed (a save was attempted): frames can no longer be added."""
        return self.videos is not None

    def add(self, values: Mapping[str, np.ndarray], task: str) -> None:
        """Append one validated frame (see :class:`~.features.FrameValidator`)."""
        if not self.realtime:
            self.catch_up(whole=False)
        for encoder in self.encoders.values():
            encoder.raise_if_failed()
            encoder.check_room()
        for key, column in self.values.items():
            column.append(np.array(values[key], copy=True))
        for key, encoder in self.encoders.items():
            encoder.put(values[key])
            self.samplers[key].add(values[key])
        frame_index = len(self.tasks)
        for key, spill in self.spills.items():
            image = values[key]
            worker = self.workers[key]
            sequence = worker.offer(self.index, frame_index, image)
            if sequence < 0:
                try:
                    spill.write_at(frame_index, image)
                except OSError as exc:
                    full = exc.errno in (errno.ENOSPC, errno.EDQUOT)
                    raise VideoEncodingError(
                        f"video '{key}' episode {self.index}: frame {frame_index} fits neither the "
                        f"encoder's ring nor the spill ({spill.path}: {exc})"
                        + (
                            "; the disk is full: this episode's frames cannot be kept and are lost, "
                            "the episodes saved before are not affected; free space before the next take"
                            if full
                            else ""
                        )
                    ) from exc
                worker.send_spilled(self.index, frame_index)
            else:
                spill.refresh()  # the worker's tee of a cut episode
            self.sequences[key].append(sequence)
            self.samplers[key].add(image)
        self.tasks.append(task)

    @property
    def spill_bytes(self) -> int:
        # A snapshot: the loop thread asks while the writer thread clears the spills.
        return sum(spill.bytes for spill in tuple(self.spills.values()))

    def catch_up(self, *, whole: bool) -> None:
        """Wait until every encoder has room for a frame (``whole``: has encoded every frame).

        For a writer no real-time loop feeds (``realtime=False``: ``record --sim``, ``render``,
        ``eval``): it waits for a lagging encoder instead of spilling, cutting or ending the take,
        so what it writes never depends on the machine's load. An encoder process is hurried
        meanwhile (at SCHED_IDLE a busy machine may give it nothing). One that has failed or
        stopped, or a wait past :data:`CATCH_UP_S`, is left to the real-time path."""
        deadline = time.monotonic() + CATCH_UP_S

        def behind(worker: EncoderProcess) -> bool:
            lagging = worker.backlog_frames > 0 if whole else worker.free_slots == 0
            return lagging and worker.alive and worker.error is None

        for worker in self.workers.values():
            if behind(worker):
                with worker.hurried():
                    while behind(worker) and time.monotonic() < deadline:
                        time.sleep(CATCH_UP_POLL_S)
        for encoder in self.encoders.values():
            while encoder.full and encoder.running and time.monotonic() < deadline:
                time.sleep(CATCH_UP_POLL_S)

    def finish_videos(self) -> dict[str, VideoSummary]:
        """Close the encoders (once) and check each mp4 holds one frame per row."""
        if self.videos is not None:
            return self.videos
        if not self.realtime:
            self.catch_up(whole=True)
        n = self.length
        videos: dict[str, VideoSummary] = {}
        if self.spills:
            self.videos = self._finish_processes(n)
            return self.videos
        for key, encoder in self.encoders.items():
            encoded = encoder.finish()
            probe = probe_video(encoder.path)
            if encoded != n or probe.frames != n:
                raise VideoEncodingError(
                    f"video '{key}' episode {self.index}: "
                    f"{probe.frames} frames in {encoder.path} for {n} rows"
                )
            videos[key] = {"frames": probe.frames, "duration_s": probe.duration_s}
        self.videos = videos
        return videos

    def _finish_processes(self, n: int) -> dict[str, VideoSummary]:
        assert self.root is not None
        videos: dict[str, VideoSummary] = {}
        caught_up = {key: worker.backlog_frames == 0 for key, worker in self.workers.items()}
        finish_wait = FINISH_WAIT_S if self.realtime else CATCH_UP_S
        for key, worker in self.workers.items():
            if not caught_up[key]:
                worker.request_cut(self.index)  # before its end: the worker reads it per frame
            worker.end(self.index, n)
        cuts: dict[str, int] = {}
        for key in self.workers:
            future = self.futures[key]
            out = self.directory / journal.video_file_name(key)
            try:
                with self.workers[key].hurried():
                    frames: int | None = future.result(finish_wait if caught_up[key] else 0)
            except FutureTimeout:
                frames = None
            except VideoEncodingError:
                frames = None  # the worker failed: the writer encodes it from the spill
            if frames is None:
                cut = self._spill_from_cut(key, n)
                if cut is not None:
                    # Saved with its spill (the commit fsyncs it): durable then, encoded after.
                    cuts[key] = cut
                    self.pending[key] = (future, out)
                    videos[key] = {"frames": n, "duration_s": float(Fraction(n, self.fps))}
                    continue
                frames = future.result()  # the mp4 was done before a cut was needed
            self.spills[key].close()
            release_spill(self.directory, key)
            probe = probe_video(out)
            if frames != n or probe.frames != n:
                raise VideoEncodingError(
                    f"video '{key}' episode {self.index}: {probe.frames} frames in {probe.path} for {n} rows"
                )
            videos[key] = {"frames": probe.frames, "duration_s": probe.duration_s}
        if cuts:
            assert self.settings is not None
            write_spill_meta(
                self.directory, fps=self.fps, cameras=self.cameras, settings=self.settings, cuts=cuts
            )
        return videos

    def _spill_from_cut(self, key: str, n: int) -> int | None:
        """Put every frame of camera ``key`` from its cut on into its spill (fsynced) and return
        the cut; None when the mp4 turned out done first. Raises when neither can be had."""
        worker = self.workers[key]
        spill = self.spills[key]
        sequences = self.sequences[key]
        # The frames from first_kept on are still in the ring or already in the spill.
        first_kept = n
        while first_kept > 0:
            sequence = sequences[first_kept - 1]
            if sequence >= 0 and worker.ring_frame(sequence) is None:
                break
            first_kept -= 1
        if first_kept == 0:
            cut = 0  # every frame is here: the worker's own cut, if any, does not matter
        else:
            worker.request_cut(self.index)
            with worker.hurried():
                found = worker.cut_of(self.index, CUT_WAIT_S)
            if found is None:
                future = self.futures[key]
                if future.done() and future.exception() is None:
                    return None
                raise VideoEncodingError(
                    f"video '{key}' episode {self.index}: its encoder process "
                    f"({worker.error or 'no cut within ' + format(CUT_WAIT_S, '.0f') + ' s'}) holds "
                    f"frames 0..{first_kept - 1} that are no longer in the ring: the episode "
                    "cannot be saved; the episodes saved before are not affected"
                )
            cut = found
        failure = self.futures[key].exception() if self.futures[key].done() else None
        if first_kept > 0 and failure is not None and SPILL_HOLES in str(failure):
            # Saved, these frames would read back black: the take is refused instead.
            raise VideoEncodingError(
                f"video '{key}' episode {self.index}: {failure}: the episode cannot be saved; "
                "the episodes saved before are not affected"
            )
        for frame_index in range(cut, n):
            image = worker.ring_frame(sequences[frame_index])
            if image is not None:
                spill.write_at(frame_index, image)
        spill.sync()
        spill.close()
        return cut

    def columns(self) -> dict[str, np.ndarray]:
        """The numeric values by key, frame axis first: ``(n, d)``."""
        return {key: np.stack(column) for key, column in self.values.items()}

    def image_stats(self) -> dict[str, Stats]:
        """Each camera's image stats, from the frames its sampler kept."""
        return {key: sampler.stats() for key, sampler in self.samplers.items()}

    def release_frames(self) -> None:
        """Drop the rows and image samples once the episode is encoded (its bytes carry them):
        an episode held for a retry (see :mod:`.commit`) keeps only its length and its videos."""
        for column in self.values.values():
            column.clear()
        self.samplers.clear()

    def checkpoint(self) -> None:
        """Make the frames so far durable (see :mod:`.checkpoint`): the rows since the last
        checkpoint, then every camera's mp4 (and spill) fsynced. Writer thread only."""
        n = self.length
        videos: list[int] = []
        for encoder in self.encoders.values():
            in_file = encoder.frames_in_file  # before the fsync: all of these are then durable
            sync_video(encoder.path)
            videos.append(in_file)
        for key, worker in self.workers.items():
            muxed = worker.muxed_of(self.index)
            self.spills[key].sync()
            sync_video(self.directory / journal.video_file_name(key))
            videos.append(self.durable_frames if muxed is None else muxed)
        if n > self.checkpointed:
            first = self.checkpointed
            columns = {key: column[first:n] for key, column in self.values.items()}
            write_rows(self.directory, first, columns, self.tasks[first:n])
            self.checkpointed = n
        self.durable_frames = min([self.checkpointed, *videos])

    def check_room(self) -> None:
        """Raise :class:`DiskFullError` when the disk cannot take this episode's next frame and
        still hold its save (see :mod:`.reserve`); grows the room held back when due."""
        assert self.reserve is not None and self.root is not None
        unencoded = sum(
            min(worker.backlog_frames, worker.slots) * worker.frame_bytes for worker in self.workers.values()
        )
        self.reserve.check(root=self.root, index=self.index, length=self.length, unencoded_bytes=unencoded)

    def release_reserve(self) -> None:
        """Give the room held back for the save to the save (before it writes)."""
        if self.reserve is not None:
            self.reserve.release()

    def discard(self) -> None:
        """Stop the encoders and delete the open directory with everything in it."""
        self.release_reserve()
        for encoder in self.encoders.values():
            encoder.abort()
        for key, spill in self.spills.items():
            spill.close()
            if self.videos is None:
                self.workers[key].abort(self.index)
            elif key in self.pending:
                future, out = self.pending[key]
                future.add_done_callback(_unlink_when_done(out))
                self.workers[key].abort(self.index)
        self.spills.clear()
        # An encoder process told to abort may still be creating its mp4 in the directory while
        # it is removed (rmdir then meets ENOTEMPTY); it creates that file once, so a pass or two
        # more removes what it left.
        for attempt in range(DISCARD_ATTEMPTS):
            try:
                journal.remove_dir(self.directory)
                return
            except OSError as exc:
                if exc.errno != errno.ENOTEMPTY or attempt == DISCARD_ATTEMPTS - 1:
                    raise


def _unlink_when_done(path: Path) -> Callable[[Future[int]], None]:
    """A done-callback deleting ``path``: a discarded episode's late mp4."""

    def unlink(_future: Future[int]) -> None:
        path.unlink(missing_ok=True)

    return unlink


def _start_spilled(
    episode: OpenEpisode,
    root: Path,
    index: int,
    features: Mapping[str, Mapping[str, Any]],
    fps: int,
    settings: VideoSettings,
    workers: Mapping[str, EncoderProcess],
) -> OpenEpisode:
    directory = episode.directory
    cameras = {key: (features[key]["shape"][0], features[key]["shape"][1]) for key in video_keys(features)}
    episode.cameras = cameras
    episode.settings = settings
    write_spill_meta(directory, fps=fps, cameras=cameras, settings=settings)
    for key in video_keys(features):
        height, width, _ = features[key]["shape"]
        worker = workers[key]
        spill = SpillFile(directory / spill_name(key), height * width * 3)
        episode.spills[key] = spill
        episode.sequences[key] = []
        episode.workers[key] = worker
        episode.futures[key] = worker.begin(
            index, directory / journal.video_file_name(key), spill.path, journal.episode_dir(root, index)
        )
        episode.samplers[key] = ImageSampler()
    return episode
