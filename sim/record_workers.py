"""``record --sim --workers N`` / ``--ray ADDRESS``: many twins at once, one dataset in seed order.

Each seed is one task (:func:`record_seed`, run by :func:`hilrec.daemon.fanout.run_tasks` in this
process, in spawned worker processes or as Ray tasks): it records that one episode with the
ordinary recorder into a private one-episode dataset (its own twin; the video encoded there) and
returns it as an :class:`~hilrec.daemon.dataset.writer.adopt.EpisodeBundle`, bytes that travel through a
pipe or Ray's object store alike. The parent appends the bundles to ``--root`` in seed order with
:class:`~hilrec.daemon.dataset.writer.adopt.Adopter`, as soon as every earlier seed is in (or failed).

Every worker count runs the same code on the same bytes, so the dataset is byte-identical for
any ``N`` and for Ray. A worker that dies, a seed that cannot be appended (a full disk) or one
recorded in another world (another node's MuJoCo) costs that seed only: the later seeds are
still appended in order, and the summary names the seeds to record again.

Scratch datasets live in a directory of this run (``mkdtemp``, named after the destination and
this process's pid); a run finding one whose process is dead (killed) removes it.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import hashlib
import os
import shutil
import signal
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Final

from hilrec.daemon.dataset import (
    Adopter,
    EpisodeBundle,
    bundle_episode,
    load_dataset_sidecar,
    sigint_deferred,
    sigint_noted,
    update_dataset_sidecar,
)
from hilrec.daemon.errors import DatasetError
from hilrec.daemon.fanout import TaskOutcome, check_ray_address, run_tasks
from hilrec.daemon.so101 import robot_type
from hilrec.sim.features import sim_features
from hilrec.sim.recorder import (
    MERGE_INTERVAL_S,
    EpisodeSummary,
    RecordConfig,
    RecordSummary,
    check_root,
    progress_bar,
    record,
    twin_for,
)
from hilrec.sim.twin import Twin

# Tests only: "SEED:FRAME" makes the worker recording SEED SIGKILL itself before adding frame
# FRAME, i.e. a worker dying with an episode open.
KILL_ENV: Final[str] = "HILREC_TEST_KILL_AT"
WRITER_FIELDS: Final[str] = "writer"  # the dataset sidecar's key the destination's own writer sets
SHARED_MEMORY: Final[str] = "/dev/shm"
# A container's /dev/shm can be 64 MB: below this free, the scratch goes beside the destination.
SHARED_MEMORY_MIN: Final[int] = 1 << 30
SCRATCH_MARK: Final[str] = ".hilrec-scratch-"
# Provenance keys that say where a file is installed, not what it is: not compared across nodes.
_INSTALL_KEYS: Final[frozenset[str]] = frozenset({"path"})
_TWINS: dict[str, Twin] = {}
_CLOSING: list[bool] = []  # close_twins is registered to run at exit


@dataclass(frozen=True, kw_only=True)
class SeedTask:
    config: RecordConfig  # episodes=1, seed=the seed; its root is replaced by a scratch one
    scratch: str | None = None  # where the scratch root goes, if that exists on the worker's host


@dataclass(frozen=True, kw_only=True)
class SeedRecording:
    seed: int
    frames: int
    success: bool
    bundle: EpisodeBundle
    provenance: dict[str, Any]  # the dataset sidecar's sim part (same for every seed of a run)


@dataclass(kw_only=True)
class FanoutSummary(RecordSummary):
    """A :class:`RecordSummary` whose seeds may have failed or not run (interrupted)."""

    failed: dict[int, str] = field(default_factory=dict)  # seed -> why
    interrupted: bool = False
    not_recorded: list[int] = field(default_factory=list)  # seeds lost: failed, or cut by Ctrl-C


def record_seed(task: SeedTask) -> SeedRecording:
    """Record one seed into a scratch dataset and return it as bytes (runs in a worker)."""
    config = task.config
    # On another host (Ray) the parent's scratch is not there: the system's temp dir, under a
    # name that says what it is.
    here = task.scratch if task.scratch and os.path.isdir(task.scratch) else None
    prefix = f"seed-{config.seed}-" if here else f"hilrec{SCRATCH_MARK}seed-{config.seed}-"
    tmp = Path(tempfile.mkdtemp(prefix=prefix, dir=here))
    try:
        root = tmp / "episode"
        one = replace(config, root=root, episodes=1, resume=False)
        summary = record(one, progress=False, sink_factory=_scratch_writer(config.seed), twin=_twin(one))
        if not _CLOSING:
            # After the first render: MuJoCo's EGL registers its own exit hook (terminating the
            # display) then, and exit hooks run last-registered first.
            atexit.register(close_twins)
            _CLOSING.append(True)
        bundle = bundle_episode(root)
        sidecar = load_dataset_sidecar(root) or {}
    finally:
        # The worker's own: the parent's removal of the whole scratch may come first (a
        # cancelled Ray task still running), or never (another host).
        shutil.rmtree(tmp, ignore_errors=True)
    episode = summary.episodes[0]
    return SeedRecording(
        seed=config.seed,
        frames=episode.frames,
        success=episode.success,
        bundle=bundle,
        provenance={k: v for k, v in sidecar.items() if k != WRITER_FIELDS},
    )


def _twin(config: RecordConfig) -> Twin:
    """This worker's twin for ``config``, built once: a build and its first render cost ~0.4 s,
    a third of a short episode. Kept until the worker process ends."""
    key = repr((config.fps, config.cameras, config.image_size, config.scene, config.render_quality))
    if key not in _TWINS:
        _TWINS[key] = twin_for(config)
    return _TWINS[key]


def close_twins() -> None:
    """Close the twins kept by :func:`_twin` while their EGL context can still be released (at
    interpreter teardown it cannot, and says so on stderr)."""
    while _TWINS:
        _TWINS.popitem()[1].close()


def record_many(
    config: RecordConfig, *, workers: int, ray_address: str | None = None, progress: bool = True
) -> FanoutSummary:
    """Record ``config.episodes`` seeds with ``workers`` processes (or on Ray) into ``config.root``.

    Ctrl-C, wherever it comes, keeps every episode already recorded (in seed order) and
    finalizes; the summary says it was ``interrupted`` and which seeds were not recorded.
    """
    began = time.perf_counter()
    seeds = [config.seed + k for k in range(config.episodes)]
    summary = FanoutSummary(root=config.root, fps=config.fps, not_recorded=list(seeds))
    adopter: Adopter | None = None
    try:
        if ray_address is not None:
            check_ray_address(ray_address)  # before the destination is made
        with sigint_deferred():  # the destination is made whole, and its lock held, or not at all
            adopter = _open_destination(config)
    except KeyboardInterrupt:
        summary.interrupted = True
        if adopter is None:
            return summary
    remove_dead_scratch(config.root)
    scratch: Path | None = None
    gather = _Gatherer(adopter, seeds, summary)
    bar = progress_bar(config.episodes, enabled=progress)

    def on_done(outcome: TaskOutcome[SeedRecording]) -> None:
        gather.finished(outcome)
        bar.update(1)
        bar.set_postfix(successes=summary.successes, frames=summary.frames, failed=len(summary.failed))

    try:
        if not summary.interrupted:
            scratch = new_scratch_dir(config.root)
            tasks = [
                SeedTask(config=replace(config, seed=s, episodes=1), scratch=str(scratch)) for s in seeds
            ]
            run_tasks(record_seed, tasks, workers=workers, ray_address=ray_address, on_done=on_done)
    except KeyboardInterrupt:
        summary.interrupted = True
    finally:
        # A second Ctrl-C waits for the end of this: it is what keeps the episodes recorded.
        with sigint_noted() as again:
            try:
                bar.close()
                gather.flush()  # what finished behind a seed still running when interrupted
            finally:
                adopter.finalize()
                if scratch is not None:
                    shutil.rmtree(scratch, ignore_errors=True)
                close_twins()  # those of an in-process run (workers=1); a worker's go with it
                summary.not_recorded = [s for s in seeds if s not in gather.adopted]
                summary.wall_seconds = time.perf_counter() - began
        summary.interrupted = summary.interrupted or bool(again)
    return summary


def _open_destination(config: RecordConfig) -> Adopter:
    """The destination, made (or recovered) by the writer itself, so its files and provenance
    are the ones a one-process recording has; the adopter then holds its lock."""
    from hilrec.daemon.dataset import DatasetWriter

    features = sim_features(dict.fromkeys(config.cameras, config.image_size), arms=config.scene.arms)
    resuming = check_root(config, features)
    writer = (
        DatasetWriter.open(config.root, video_codec=config.video_codec)
        if resuming
        else DatasetWriter.create(
            config.root,
            fps=config.fps,
            features=features,
            robot_type=robot_type(config.scene.arms),
            video_codec=config.video_codec,
        )
    )
    writer.finalize()
    return Adopter(config.root, merge_interval_s=MERGE_INTERVAL_S)


def scratch_base(root: Path) -> Path:
    """Where the workers of this host put their one-episode datasets: in shared memory where
    there is some (a scratch dataset is thrown away, so the writer's fsyncs, a few per episode
    and each a wait on a busy disk, cost nothing there), else beside the destination."""
    shm = Path(SHARED_MEMORY)
    if shm.is_dir() and os.access(shm, os.W_OK) and shutil.disk_usage(shm).free >= SHARED_MEMORY_MIN:
        return shm
    return root.resolve().parent


def _scratch_prefix(root: Path) -> str:
    # The whole path's hash: two destinations of the same name never share a prefix.
    resolved = root.resolve()
    digest = hashlib.sha256(str(resolved).encode()).hexdigest()[:12]
    return f".{resolved.name}-{digest}{SCRATCH_MARK}"


def new_scratch_dir(root: Path) -> Path:
    """A new scratch directory of this process for recordings into ``root`` (its own, never
    another's: ``mkdtemp``)."""
    return Path(tempfile.mkdtemp(prefix=f"{_scratch_prefix(root)}{os.getpid()}-", dir=scratch_base(root)))


def scratch_dirs(root: Path) -> list[Path]:
    """Every scratch directory of recordings into ``root`` on this host, wherever it may be."""
    prefix = _scratch_prefix(root)
    found: list[Path] = []
    for base in {Path(SHARED_MEMORY), root.resolve().parent}:
        with contextlib.suppress(OSError):
            found.extend(p for p in base.iterdir() if p.name.startswith(prefix) and p.is_dir())
    return sorted(found)


def remove_dead_scratch(root: Path) -> list[Path]:
    """Remove the scratch directories (of any destination) whose recording process is dead, as a
    killed run leaves them; return what was removed."""
    removed = []
    for base in {Path(SHARED_MEMORY), root.resolve().parent}:
        try:
            entries = [p for p in base.iterdir() if SCRATCH_MARK in p.name and p.is_dir()]
        except OSError:
            continue
        for path in entries:
            owner = path.name.rpartition(SCRATCH_MARK)[2].partition("-")[0]
            if owner.isdigit() and not _alive(int(owner)):
                shutil.rmtree(path, ignore_errors=True)
                removed.append(path)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive
        return True
    return True


class _Gatherer:
    """Appends finished seeds to the dataset in seed order, each once every earlier one is in."""

    def __init__(self, adopter: Adopter, seeds: list[int], summary: FanoutSummary) -> None:
        self._adopter = adopter
        self._seeds = seeds
        self._summary = summary
        self._done: dict[int, TaskOutcome[SeedRecording]] = {}
        self._next = 0
        self.adopted: set[int] = set()
        self._provenance: tuple[int, dict[str, Any]] | None = None  # (seed, provenance) written

    def finished(self, outcome: TaskOutcome[SeedRecording]) -> None:
        self._done[outcome.index] = outcome
        while self._next in self._done:
            # Taken off the queue, appended and counted as one step: a Ctrl-C in between would
            # lose the seed from the summary, or append it twice (flush).
            with sigint_deferred():
                self._take(self._done.pop(self._next))
                self._next += 1

    def flush(self) -> None:
        for index in sorted(self._done):
            with sigint_deferred():
                self._take(self._done.pop(index))

    def _take(self, outcome: TaskOutcome[SeedRecording]) -> None:
        seed = self._seeds[outcome.index]
        recording = outcome.result
        if recording is None:
            self._summary.failed[seed] = outcome.error or "no result"
            return
        differ = self._provenance_differs(recording)
        if differ:
            self._summary.failed[seed] = differ
            return
        try:
            if self._provenance is None:
                update_dataset_sidecar(self._adopter.root, recording.provenance)
                self._provenance = (seed, recording.provenance)
            index = self._adopter.adopt(recording.bundle, origin=f"seed {seed}")
        except (DatasetError, OSError) as exc:  # a full disk: this seed is lost, not the others
            self._summary.failed[seed] = str(exc)
            return
        self.adopted.add(seed)
        self._summary.episodes.append(
            EpisodeSummary(episode_index=index, seed=seed, frames=recording.frames, success=recording.success)
        )

    def _provenance_differs(self, recording: SeedRecording) -> str | None:
        """Why the recording's world is not the dataset's (another node's MuJoCo, model), if so."""
        if self._provenance is None:
            return None
        first_seed, first = self._provenance
        paths = _differing_paths(first, recording.provenance)
        if not paths:
            return None
        shown = ", ".join(paths[:5]) + (f" and {len(paths) - 5} more" if len(paths) > 5 else "")
        return f"recorded in another world than seed {first_seed} (on another node?): {shown} differ"


def _differing_paths(a: Any, b: Any, where: str = "") -> list[str]:
    """The dotted keys at which two provenances differ, but for where files were installed (a
    node's venv is where it is; the files' hashes say whether they are the same)."""
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        found: list[str] = []
        for key in sorted((set(a) | set(b)) - _INSTALL_KEYS, key=str):
            found += _differing_paths(a.get(key), b.get(key), f"{where}.{key}" if where else str(key))
        return found
    return [] if a == b else [where or "(all)"]


def _scratch_writer(seed: int) -> Any:
    """The writer of a seed's scratch dataset: the native one, encoding video on a thread of the
    worker (the worker is the unit that runs beside others; an encoder process per episode would
    cost a spawn each), or the test's kill switch around it for this seed (see :data:`KILL_ENV`)."""
    from hilrec.daemon.dataset import DatasetWriter

    create = functools.partial(
        DatasetWriter.create, merge_interval_s=MERGE_INTERVAL_S, video_encoder="thread", realtime=False
    )
    spec = os.environ.get(KILL_ENV, "")
    target, _, frame = spec.partition(":")
    if not spec or int(target) != seed:
        return create

    def factory(root: Path, **options: Any) -> Any:
        return _KillAt(create(root, **options), int(frame))

    return factory


class _KillAt:
    """A writer that SIGKILLs its own process before frame ``at``: a worker dying mid-episode."""

    def __init__(self, sink: Any, at: int) -> None:
        self._sink = sink
        self._at = at
        self._frames = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sink, name)

    def add_frame(self, frame: Mapping[str, Any]) -> None:
        if self._frames == self._at:
            os.kill(os.getpid(), signal.SIGKILL)
        self._frames += 1
        self._sink.add_frame(frame)

    def __enter__(self) -> _KillAt:
        self._sink.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._sink.__exit__(*exc)
