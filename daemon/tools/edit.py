"""``hilrec edit``: change a LeRobot v3.0 dataset, safe by construction.

Every edit writes a whole new dataset and never touches the source until that result has passed
the checker; then the result takes the source's place in one atomic step:

1. The source's root lock is taken (:class:`~hilrec.daemon.dataset.store.rootlock.RootLock`, ``hilrec
   edit <sub-command>``), and the lock of ``--out``, for the whole edit. Leftovers of an edit
   killed earlier (sibling folders ``.<name>.hilrec-edit-*`` whose owner is gone) are removed,
   and an interrupted fallback swap is finished (below).
2. The result is written into a sibling folder ``.<name>.hilrec-edit-<pid>-<token>`` of the
   target (same file system), locked too. Files the edit leaves as they were (videos, data, a
   sidecar's arrays) are hard-linked, not copied: no writer of a dataset ever writes a file in
   place, so sharing them cannot change the source. The result is fsynced.
3. :func:`hilrec.daemon.dataset.check.checker.check_dataset` checks the result: no error and no
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

What a result is: :mod:`hilrec.daemon.tools.edit_write`; the swap and its recovery:
:mod:`hilrec.daemon.tools.edit_swap`; changing units: :mod:`hilrec.daemon.tools.edit_units`;
the LeRobot version's spelling of ``info.json``: :mod:`hilrec.daemon.tools.edit_spelling`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from hilrec.daemon.dataset import DEFAULT_FEATURES, EpisodeVerdict, LeRobotInfo
from hilrec.daemon.errors import DatasetError, FlagError
from hilrec.daemon.text import task_problem
from hilrec.daemon.tools.edit_run import Options, finish_parts, hook_of, run_edit
from hilrec.daemon.tools.edit_source import EditReport, Pick, Source
from hilrec.daemon.tools.edit_spelling import merge_view, merged_features
from hilrec.daemon.tools.edit_swap import TEMP_MARK, clean_leftovers, hook_point, recover, temp_dirs
from hilrec.daemon.tools.edit_write import write_dataset
from hilrec.daemon.tools.episode_ranges import episode_list, ranges_text

__all__ = [
    "TEMP_MARK",
    "EditReport",
    "Options",
    "Pick",
    "Source",
    "clean_leftovers",
    "delete_episodes",
    "keep_episodes",
    "merge",
    "recompute_stats",
    "recover",
    "remove_feature",
    "run_edit",
    "set_task",
    "split",
    "temp_dirs",
    "write_dataset",
]


# --- the sub-commands ----------------------------------------------------------------------------


def _all(source: Source) -> list[Pick]:
    return [Pick(0, i) for i in range(len(source.episodes))]


def _episode_list(source: Source, episodes: Iterable[int], what: str) -> list[int]:
    return episode_list(episodes, len(source.episodes), source.root, what)


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
            hook=hook_of(options),
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
        write_dataset(result, sources, picks, command="delete-episodes", report=report, hook=hook_of(options))

    flags = ["--episodes", ranges_text(episodes)]
    return run_edit("delete-episodes", [root], out or root, build, options, flags=flags)


def keep_episodes(
    root: Path,
    *,
    episodes: Iterable[int] | None = None,
    success: bool = False,
    verdicts: Sequence[str] | None = None,
    with_corrections: bool = False,
    outcome: str | None = None,
    out: Path | None = None,
    options: Options | None = None,
) -> EditReport:
    """Keep the episodes that are listed, successful and/or have one of ``verdicts``; of a
    rollout's, those a human corrected (``with_corrections``) or of one ``outcome``."""
    from hilrec.daemon.policy.record import Outcome, episode_outcome, has_corrections

    if outcome is not None and outcome not in set(Outcome):
        raise FlagError("--outcome", f"expected {' or '.join(Outcome)}, got {outcome!r}")
    unknown = sorted(set(verdicts or ()) - {v.value for v in EpisodeVerdict})
    if unknown:
        raise FlagError(
            "--verdict",
            f"unknown verdict(s) {', '.join(unknown)}; the verdicts are "
            + ", ".join(v.value for v in EpisodeVerdict),
        )

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
            if with_corrections and not has_corrections(meta):
                continue
            if outcome is not None and episode_outcome(meta) != outcome:
                continue
            picks.append(pick)
        if not picks:
            raise DatasetError(f"{root}: no episode matches; nothing would be kept")
        report.notes.append(f"kept {len(picks)} of {len(source.episodes)} episodes")
        write_dataset(result, sources, picks, command="keep", report=report, hook=hook_of(options))

    flags = [*(["--episodes", ranges_text(episodes)] if episodes is not None else [])]
    flags += [*(["--success"] if success else []), *(["--verdict", ",".join(verdicts)] if verdicts else [])]
    flags += [
        *(["--with-corrections"] if with_corrections else []),
        *(["--outcome", outcome] if outcome else []),
    ]
    return run_edit("keep", [root], out or root, build, options, flags=flags)


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
        write_dataset(result, sources, picks, command="set-task", report=report, hook=hook_of(options))

    flags = ["--episodes", ranges_text(episodes), "--task", task]
    return run_edit("set-task", [root], out or root, build, options, flags=flags)


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
            hook=hook_of(options),
        )

    return run_edit("remove-feature", [root], out or root, build, options, flags=["--feature", key])


def merge(
    roots: Sequence[Path],
    out: Path,
    *,
    lerobot: LeRobotInfo | None = None,
    options: Options | None = None,
) -> EditReport:
    """The episodes of ``roots``, in order, into ``out``: fps, features and robot type agree
    (video ``info`` in either LeRobot's spelling; the result's is ``lerobot``, else the first's)."""
    if len(roots) < 2:
        raise DatasetError("merge needs at least two datasets")
    if Path(out) in [Path(r) for r in roots]:
        raise DatasetError(f"--out {out} is one of the inputs; give a new folder")

    def build(sources: Sequence[Source], result: Path, report: EditReport) -> None:
        problem = merge_problem(sources)
        if problem:
            raise DatasetError(f"cannot merge: {problem}")
        picks = [Pick(s, p.episode) for s, src in enumerate(sources) for p in _all(src)]
        features = merged_features([s.features for s in sources], lerobot)
        write_dataset(
            result,
            sources,
            picks,
            features=features,
            command="merge",
            report=report,
            hook=hook_of(options),
        )

    flags = ["--lerobot", lerobot.value] if lerobot is not None else []
    return run_edit("merge", roots, out, build, options, flags=flags)


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
            # LeRobot's spelling of the depth flag and the encoder settings may differ
            va, vb = merge_view(a[key]), merge_view(b[key])
            if va != vb:
                fields = sorted(k for k in set(va) | set(vb) if va.get(k) != vb.get(k))
                return f"feature '{key}' differs between {where} in {fields}: {va} vs {vb}"
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
        if len(fractions) != len(outs) or any(f <= 0 for f in fractions) or abs(sum(fractions) - 1) > 1e-9:
            raise DatasetError(
                f"--fractions {','.join(f'{f:g}' for f in fractions)}: one positive fraction per --out "
                f"({len(outs)}), summing to 1 (they sum to {sum(fractions):g}; a split keeps every "
                "episode: to leave some out, use edit keep or delete-episodes first)"
            )
        counts = [int(f * n) for f in fractions]
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
        _refuse_overlap(groups, outs)
    if fractions is not None:
        flags = ["--fractions", ",".join(f"{f:g}" for f in fractions)]
    else:
        flags = ["--episodes", *(ranges_text(g) for g in groups)]
    reports = []
    for group, out in zip(groups, outs, strict=True):

        def build(
            sources: Sequence[Source], result: Path, report: EditReport, group: list[int] = group
        ) -> None:
            picks = [Pick(0, e) for e in group]
            write_dataset(result, sources, picks, command="split", report=report, hook=hook_of(options))

        reports.append(run_edit("split", [Path(root)], Path(out), build, options, flags=flags, outs=outs))
        hook_point(hook_of(options), "part-written")
    finish_parts(outs, hook_of(options))
    return reports


def _refuse_overlap(groups: Sequence[Sequence[int]], outs: Sequence[Path]) -> None:
    """An episode in two parts of a split would be trained on and validated on: refused."""
    owner: dict[int, int] = {}
    for part, group in enumerate(groups):
        for episode in group:
            if episode in owner:
                raise DatasetError(
                    f"split: episode {episode} is in the --episodes lists of both {outs[owner[episode]]} "
                    f"and {outs[part]}; the parts must not overlap"
                )
            owner[episode] = part
