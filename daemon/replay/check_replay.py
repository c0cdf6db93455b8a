"""``hilrec check --replay``: which replay a dataset gets, running it, and its part of the report.

One command answers "is this recording sound" for both kinds of dataset:

- a sim dataset (its ``hilrec/dataset.json`` has the ``"sim"`` provenance that ``record --sim``,
  the daemon's sim mode and ``eval`` write) gets the bit-exact replay
  (:func:`hilrec.sim.replay.replay_check`): every state row and the outcome must equal the twin's;
- any other dataset (recorded on real or emulated hardware, or by another recorder) gets the
  hardware replay check that ``hilrec replay`` runs (:mod:`hilrec.daemon.replay.check`):
  consistent, lagging or diverged, with the lag and the worst joint.

The report says which check ran (``"check"`` in the JSON, the first line in the text). A hardware
replay passes when every episode is consistent or lagging (lagging fails under ``--strict``, as a
warning does); a diverged or not replayable episode fails it, and with it ``hilrec check``.

Episodes replay as independent tasks of :func:`hilrec.daemon.fanout.run_tasks` on ``workers``
processes or a Ray cluster, gathered in episode order, so the report is the same for any number
of workers and for Ray. The hardware part leaves out the run's wall time for that reason. Asked
for no number, the replay takes as many processes as the dataset repays (:func:`default_workers`).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from hilrec.daemon.dataset import load_dataset_sidecar, reader
from hilrec.daemon.errors import FlagError, ReplayError
from hilrec.daemon.replay.check import DatasetCheck, replay_dataset
from hilrec.daemon.replay.results import ReplayVerdict, verdict_table
from hilrec.daemon.replay.settings import DEFAULT_CONFIG_PATH, load_replay_settings
from hilrec.daemon.so101 import ARM_SIDES, STATE_KEY, arms_of

if TYPE_CHECKING:  # the twin imports MuJoCo; it is imported only when a replay runs
    from hilrec.sim.replay import ReplayReport

# A worker process costs a second or two to start (Python, NumPy, pyarrow, MuJoCo); the twin
# replays 2,000-4,500 frames/s. Below this many frames per worker, one more does not pay for itself.
FRAMES_PER_WORKER: Final[int] = 8000


class ReplayKind(StrEnum):
    """Which replay check ran: the value ``hilrec check --replay --json`` reports as ``"check"``."""

    SIM = "sim"
    HARDWARE = "hardware"


DESCRIPTIONS: dict[ReplayKind, str] = {
    ReplayKind.SIM: "bit-exact sim replay (every state row and the outcome equal the twin's)",
    ReplayKind.HARDWARE: "hardware replay check, as hilrec replay runs it (consistent / lagging / diverged)",
}
PASSING: dict[bool, frozenset[ReplayVerdict]] = {  # strict -> the verdicts that pass
    False: frozenset({ReplayVerdict.CONSISTENT, ReplayVerdict.LAGGING}),
    True: frozenset({ReplayVerdict.CONSISTENT}),
}


def replay_kind(sidecar: Mapping[str, Any] | None) -> ReplayKind:
    """The replay a dataset gets, from its hilrec sidecar (None: not recorded by hilrec)."""
    from hilrec.sim.provenance import SIDECAR_KEY  # loads MuJoCo, which the replay needs anyway

    if sidecar and isinstance(sidecar.get(SIDECAR_KEY), Mapping):
        return ReplayKind.SIM
    daemon = (sidecar or {}).get("daemon")
    if isinstance(daemon, Mapping) and daemon.get("mode") == "sim":
        return ReplayKind.SIM
    return ReplayKind.HARDWARE


@dataclass(frozen=True)
class SimReplaySection:
    """The bit-exact replay's verdicts, as one part of the check's report."""

    report: ReplayReport
    kind: ReplayKind = ReplayKind.SIM

    @property
    def passed(self) -> bool:
        return self.report.passed

    def to_dict(self) -> dict[str, Any]:
        return {
            "check": self.kind.value,
            "check_description": DESCRIPTIONS[self.kind],
            **self.report.to_dict(),
        }

    def format_text(self) -> str:
        return f"replay check: {DESCRIPTIONS[self.kind]}\n{self.report.format_text()}"


@dataclass(frozen=True)
class HardwareReplaySection:
    """The hardware replay check's verdicts, as one part of the check's report."""

    check: DatasetCheck
    strict: bool = False
    kind: ReplayKind = ReplayKind.HARDWARE

    @property
    def passed(self) -> bool:
        allowed = PASSING[self.strict]
        return bool(self.check.results) and all(r.verdict in allowed for r in self.check.results)

    def to_dict(self) -> dict[str, Any]:
        document = self.check.to_document()
        del document["seconds"]  # the run's wall time: the report is the same however it ran
        return {
            "check": self.kind.value,
            "check_description": DESCRIPTIONS[self.kind],
            "passed": self.passed,
            "strict": self.strict,
            **document,
        }

    def format_text(self) -> str:
        check = self.check
        counts = ", ".join(f"{n} {v}" for v, n in check.counts().items() if n) or "no episodes"
        lines = [
            f"replay check: {DESCRIPTIONS[self.kind]}",
            f"replay {'PASSED' if self.passed else 'FAILED'}: {counts} "
            f"({check.root}; thresholds {check.settings_source})",
        ]
        if not check.results:
            lines.append("  the dataset has no episode to replay")
        else:
            lines.extend(f"  {row}" for row in verdict_table(check.results).splitlines())
        for r in check.results:
            lines.extend(f"  episode {r.episode_index}: {note}" for note in r.notes)
        if self.strict and any(r.verdict is ReplayVerdict.LAGGING for r in check.results):
            lines.append("  --strict: a lagging episode fails the check")
        return "\n".join(lines)


@dataclass(frozen=True)
class ArmsReplaySection:
    """A two-arm hardware dataset's replay check: each arm's on a one-arm twin, both must pass."""

    arms: dict[str, HardwareReplaySection]
    kind: ReplayKind = ReplayKind.HARDWARE

    @property
    def passed(self) -> bool:
        return all(section.passed for section in self.arms.values())

    def to_dict(self) -> dict[str, Any]:
        return {
            "check": self.kind.value,
            "check_description": DESCRIPTIONS[self.kind],
            "passed": self.passed,
            "arms": {arm: section.to_dict() for arm, section in self.arms.items()},
        }

    def format_text(self) -> str:
        lines = []
        for arm, section in self.arms.items():
            text = section.format_text().splitlines()
            lines += [f"{arm} arm: {text[0]}", *(f"  {line}" for line in text[1:])]
        return "\n".join(lines)


@dataclass(frozen=True, kw_only=True)
class SimJob:
    """One sim episode's bit-exact replay, as a task another process can run alone."""

    root: Path
    index: int


def replay_sim_job(job: SimJob) -> ReplayReport:
    from hilrec.sim.replay import replay_check

    return replay_check(job.root, episodes=[job.index])


def default_workers(root: Path) -> int:
    """The replay's processes when none are asked for: as many as the dataset repays."""
    frames = sum(int(e["length"]) for e in reader.load_episodes(root))
    # The CPUs this process may run on (a container's or taskset's share), not the machine's.
    return max(1, min(len(os.sched_getaffinity(0)), frames // FRAMES_PER_WORKER))


def replay_for_check(
    root: Path,
    *,
    workers: int | None = None,
    ray_address: str | None = None,
    strict: bool = False,
    units_flag: str | None = None,
    calibration_flag: Path | None = None,
    config: Path | None = None,
) -> SimReplaySection | HardwareReplaySection | ArmsReplaySection:
    """Run the replay check the dataset at ``root`` calls for (see the module); ``workers``
    processes replay it (None: :func:`default_workers`)."""
    kind = replay_kind(load_dataset_sidecar(root))
    if workers is None:
        workers = 1 if ray_address is not None else default_workers(root)
    if kind is ReplayKind.SIM:
        given = [
            flag for flag, value in (("--units", units_flag), ("--calibration", calibration_flag)) if value
        ]
        if given:
            raise FlagError(
                given[0],
                f"{root} is a sim dataset, whose units and calibration are the twin's own; "
                "the flag is for datasets recorded on hardware",
            )
        return SimReplaySection(_sim_replay(root, workers=workers, ray_address=ray_address))
    settings = load_replay_settings(config)
    names = reader.load_info(root).get("features", {}).get(STATE_KEY, {}).get("names")
    two_arms = isinstance(names, list) and arms_of(names) == len(ARM_SIDES)
    sections = {}
    for arm in ARM_SIDES if two_arms else (None,):
        check = replay_dataset(
            root,
            settings=settings,
            settings_source=str(config or DEFAULT_CONFIG_PATH),
            units_flag=units_flag,
            calibration_flag=calibration_flag,
            workers=workers,
            ray_address=ray_address,
            arm=arm,
        )
        sections[arm] = HardwareReplaySection(check, strict=strict)
    if not two_arms:
        return sections[None]
    return ArmsReplaySection({str(arm): section for arm, section in sections.items()})


def _sim_replay(root: Path, *, workers: int, ray_address: str | None) -> ReplayReport:
    try:
        from hilrec.sim.replay import replay_check
    except ImportError as exc:
        raise ReplayError(
            f"--replay needs hilrec.sim.replay.replay_check, which is not "
            f"available in this installation ({exc})"
        ) from exc
    # Resolved: a Ray worker runs in a directory of its own, where a relative root is nothing.
    jobs = [SimJob(root=root.resolve(), index=int(e["episode_index"])) for e in reader.load_episodes(root)]
    # One episode gains nothing from a worker process but the cost of starting it.
    if ray_address is None and min(workers, len(jobs)) <= 1:
        return replay_check(root)
    from hilrec.daemon.fanout import run_tasks

    outcomes = run_tasks(replay_sim_job, jobs, workers=workers, ray_address=ray_address)
    parts: list[ReplayReport] = []
    for job, outcome in zip(jobs, outcomes, strict=True):
        if outcome.result is None:
            # In this process the same failure would have stopped the command: so it does here.
            raise ReplayError(f"{root}: the replay of episode {job.index} failed: {outcome.error}")
        parts.append(outcome.result)
    if not parts:  # no episode: the whole-dataset replay says what it says of an empty dataset
        return replay_check(root)
    # Every part judged the same dataset and world; only the episodes differ.
    first = parts[0]
    return dataclasses.replace(first, root=str(root), episodes=[e for part in parts for e in part.episodes])
