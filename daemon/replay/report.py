"""The replay check as people read it: a PNG per episode and a Markdown summary page.

Each PNG shows, per joint, the recorded position, the twin's replayed position and the command,
and next to it the error before and after the lag alignment against the joint's limit; the last
row is the lag search curve and the verdict. The summary page (``summary.md``) has the dataset's
table of verdicts, each episode's numbers and its plot. ``report.json`` beside them is the
document of :meth:`hilrec.daemon.replay.check.DatasetCheck.to_document`.

matplotlib runs on the Agg backend (no display), imported only here so the check itself does not
pay for it.
"""

from __future__ import annotations

import io
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import numpy as np

from hilrec.daemon.atomic import atomic_write_bytes, atomic_write_json
from hilrec.daemon.replay.check import DatasetCheck
from hilrec.daemon.replay.results import GRIPPER, EpisodeResult, LagResult, ReplayVerdict
from hilrec.daemon.so101 import JOINT_NAMES

if TYPE_CHECKING:
    from matplotlib.axes import Axes

_COLOURS = {
    "recorded": "#1f77b4",
    "replayed": "#ff7f0e",
    "action": "#7f7f7f",
    "raw": "#bbbbbb",
    "aligned": "#d62728",
    "limit": "#2ca02c",
}
_VERDICT_MARK = {
    ReplayVerdict.CONSISTENT: "OK",
    ReplayVerdict.LAGGING: "LAG",
    ReplayVerdict.DIVERGED: "FAIL",
    ReplayVerdict.NOT_REPLAYABLE: "N/A",
}


REPORT_DIR: Final[str] = "replay"  # under the dataset's hilrec/: where the take's verdict puts its PNG


def plot_name(episode_index: int) -> str:
    return f"episode-{episode_index:06d}.png"


def episode_plot_path(root: str | os.PathLike[str], episode_index: int) -> Path:
    """``<root>/hilrec/replay/episode-NNNNNN.png``: where a take's verdict writes its figure, and
    where ``hilrec ui`` looks for it (``hilrec replay --report`` writes the same file there)."""
    from hilrec.daemon.dataset import sidecar_dir

    return sidecar_dir(Path(root)) / REPORT_DIR / plot_name(episode_index)


def plot_episode(result: EpisodeResult, path: str | os.PathLike[str], *, dpi: int = 72) -> Path:
    """Write the episode's figure to ``path`` (atomically) and return it."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    from matplotlib.figure import Figure  # a bare Figure: no pyplot state, no GUI

    traj = result.trajectories
    lag = result.lag
    if traj is None or lag is None or result.aligned_replay is None or result.judged_error is None:
        raise ValueError(f"episode {result.episode_index} has no trajectories to plot")
    fps = result.fps
    t = np.arange(result.frames) / fps
    # Fixed margins: matplotlib's constrained layout would draw the figure twice to place them.
    fig = Figure(figsize=(13, 2.0 * (len(JOINT_NAMES) + 1)))
    grid = fig.add_gridspec(
        len(JOINT_NAMES) + 1,
        2,
        width_ratios=(3, 2),
        left=0.08,
        right=0.98,
        top=0.93,
        bottom=0.05,
        hspace=0.5,
        wspace=0.15,
    )
    lag_text = "n/a" if lag.frames is None else f"{lag.frames:.2f} frames ({result.ms(lag.frames):.0f} ms)"
    fig.suptitle(
        f"episode {result.episode_index}: {result.verdict.value} - lag {lag_text}\n"
        f"{_wrap(result.reason, 140)}",
        fontsize=10,
    )
    first: Axes | None = None
    last_row = len(JOINT_NAMES) - 1
    for j, name in enumerate(JOINT_NAMES):
        unit = "0..100" if j == GRIPPER else "deg"
        ax = fig.add_subplot(grid[j, 0], sharex=first)
        first = first or ax
        ax.plot(t, traj.action[:, j], color=_COLOURS["action"], lw=0.8, label="action")
        ax.plot(t, traj.recorded[:, j], color=_COLOURS["recorded"], lw=1.4, label="recorded")
        ax.plot(t, traj.replayed[:, j], color=_COLOURS["replayed"], lw=1.2, ls="--", label="replayed")
        ax.set_ylabel(f"{name}\n[{unit}]", fontsize=8)
        # Time labels on the bottom row only: text is most of what a figure costs to draw.
        ax.tick_params(labelsize=7, labelbottom=j == last_row)
        joint = result.joints[j]
        if joint.divergence is not None:
            ax.axvline(joint.divergence.onset / fps, color=_COLOURS["aligned"], lw=1.0)
        if j == GRIPPER and result.gripper is not None:
            for a, b in result.gripper.grasps:
                ax.axvspan(a / fps, b / fps, color="#9467bd", alpha=0.15, lw=0)
        for s in joint.stalls:
            ax.axvspan(s.start / fps, s.stop / fps, color="#8c564b", alpha=0.15, lw=0)
        if j == 0:
            ax.legend(loc="upper right", fontsize=7, ncols=3)

        ex = fig.add_subplot(grid[j, 1], sharex=first)
        limits = joint.limits
        ex.plot(
            t,
            traj.recorded[:, j] - traj.replayed[:, j],
            color=_COLOURS["raw"],
            lw=0.8,
            label="error, as recorded",
        )
        judged = result.judged_error[:, j] * np.sign(traj.recorded[:, j] - result.aligned_replay[:, j])
        ex.plot(t, judged, color=_COLOURS["aligned"], lw=1.0, label="error judged (lag removed)")
        for sign in (-1, 1):
            ex.axhline(sign * limits.max, color=_COLOURS["limit"], lw=0.8, ls=":")
        if j == GRIPPER and result.gripper is not None:  # grasps are not judged as errors
            for a, b in result.gripper.grasps:
                ex.axvspan(a / fps, b / fps, color="#9467bd", alpha=0.15, lw=0)
        ex.set_title(
            f"RMS {joint.judged_rms_error:.2f}  max {joint.judged_max_error:.2f}  "
            f"lag {_fmt(joint.lag_frames)} fr",
            fontsize=8,
        )
        ex.tick_params(labelsize=7, labelbottom=j == last_row)
        if j == 0:
            ex.legend(loc="upper right", fontsize=7)
    ax.set_xlabel("time [s]", fontsize=8)
    ex.set_xlabel("time [s]", fontsize=8)

    _plot_lag_curve(fig.add_subplot(grid[len(JOINT_NAMES), 0]), lag)
    info = fig.add_subplot(grid[len(JOINT_NAMES), 1])
    info.axis("off")
    info.text(
        0.0, 1.0, _summary_text(result), va="top", family="monospace", fontsize=7, transform=info.transAxes
    )

    path = Path(path)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    atomic_write_bytes(path, buf.getvalue())
    return path


def _plot_lag_curve(curve: Axes, lag: LagResult) -> None:
    """The bottom row: the RMS error of each shift tried, and the lag estimated from them."""
    if lag.mse is not None:
        curve.plot(lag.shifts, np.sqrt(lag.mse), marker="o", color=_COLOURS["recorded"])
        if lag.frames is not None:
            curve.axvline(lag.frames, color=_COLOURS["aligned"], lw=1.0, label=f"estimate {lag.frames:.2f}")
            curve.legend(fontsize=7)
    else:
        curve.text(0.5, 0.5, "lag not estimable (too little motion)", ha="center", transform=curve.transAxes)
    curve.set_xlabel("shift k [frames]: recorded[t] vs replayed[t - k]", fontsize=8)
    curve.set_ylabel("RMS error [deg]", fontsize=8)
    curve.tick_params(labelsize=7)


def _summary_text(result: EpisodeResult) -> str:
    lag = result.lag
    lines = [f"frames {result.frames} @ {result.fps} fps"]
    if lag is not None:
        lines.append(
            f"action->state: recorded {_fmt(lag.response_recorded)} fr, twin {_fmt(lag.response_replayed)} fr"
        )
    if result.gripper is not None:
        g = result.gripper
        lines.append(
            f"gripper cmd {g.commanded[0]:.0f}..{g.commanded[1]:.0f}, "
            f"achieved {g.achieved[0]:.0f}..{g.achieved[1]:.0f}, "
            f"grasp {g.grasp_frames} fr"
        )
    sat = [
        f"{j.name} {j.at_limit_frames}/{j.beyond_range_frames}"
        for j in result.joints
        if j.at_limit_frames or j.beyond_range_frames
    ]
    lines.append("commands at limit/beyond: " + (", ".join(sat) if sat else "none"))
    lines.extend(_wrap(note, 70) for note in result.notes)
    return "\n".join(lines)


def _fmt(x: float | None, digits: int = 2) -> str:
    return "n/a" if x is None else f"{x:.{digits}f}"


def _wrap(text: str, width: int) -> str:
    words, lines, line = text.split(), [], ""
    for w in words:
        if line and len(line) + 1 + len(w) > width:
            lines.append(line)
            line = w
        else:
            line = f"{line} {w}" if line else w
    if line:
        lines.append(line)
    return "\n".join(lines)


def summary_markdown(
    document: Mapping[str, Any], results: Sequence[EpisodeResult], plots: Mapping[int, str]
) -> str:
    """The dataset's summary page: verdict table, then one section per episode with its plot."""
    ds = document["dataset"]
    lines = [f"# Replay check: `{ds['root']}`", ""]
    lines.append(f"- fps {ds['fps']}, robot type `{ds.get('robot_type')}`, {len(results)} episode(s) checked")
    units = document["units"]
    lines.append(
        f"- units: {units['body']} (body), {units['gripper']} (gripper), from "
        f"{units['source']}"
        + (f"; calibration {units['calibration']}" if units.get("calibration") else "")
        + (f" (overriding: {units['overridden']})" if units.get("overridden") else "")
    )
    twin = document.get("twin") or {}
    if twin:
        lines.append(
            f"- twin: {twin.get('substeps')} steps of {twin.get('timestep', 0) * 1000:g} ms "
            f"per frame ({twin.get('timestep_source')}); {twin.get('scene')}"
        )
    lines.append(f"- thresholds: `{document['settings_source']}`")
    counts = ", ".join(f"{n} {v}" for v, n in document["counts"].items() if n)
    lines.append(
        f"- result: **{document['worst_verdict']}** ({counts}); exit status {document['exit_status']}"
    )
    lines += [
        "",
        "| episode | frames | verdict | lag [frames] | lag [ms] | worst joint | judged RMS / max | reason |",
        "|---:|---:|---|---:|---:|---|---|---|",
    ]
    for r in results:
        if r.verdict is ReplayVerdict.NOT_REPLAYABLE or r.lag is None:
            lines.append(
                f"| {r.episode_index} | {r.frames} | {_VERDICT_MARK[r.verdict]} "
                f"{r.verdict.value} | | | | | {_cell(r.reason)} |"
            )
            continue
        worst_joint = r.worst_joint()
        assert worst_joint is not None
        lines.append(
            f"| [{r.episode_index}](#episode-{r.episode_index}) | {r.frames} | "
            f"{_VERDICT_MARK[r.verdict]} {r.verdict.value} | {_fmt(r.lag.frames)} | "
            f"{_fmt(r.ms(r.lag.frames), 0)} | {worst_joint.name} | "
            f"{worst_joint.judged_rms_error:.2f} / {worst_joint.judged_max_error:.2f} | "
            f"{_cell(r.reason)} |"
        )
    for r in results:
        if r.verdict is ReplayVerdict.NOT_REPLAYABLE or r.lag is None:
            continue
        lines += ["", f"## Episode {r.episode_index}", "", f"**{r.verdict.value}**: {r.reason}", ""]
        for note in r.notes:
            lines.append(f"- {note}")
        lines += [
            "",
            "| joint | motion | RMS | max | aligned RMS | aligned max | judged RMS | "
            "judged max | lag [frames] | blips | stalls | cmd at limit | cmd beyond |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for j in r.joints:
            lines.append(
                f"| {j.name} | {j.motion:.1f} | {j.rms_error:.2f} | {j.max_error:.2f} | "
                f"{j.aligned_rms_error:.2f} | {j.aligned_max_error:.2f} | "
                f"{j.judged_rms_error:.2f} | {j.judged_max_error:.2f} | "
                f"{_fmt(j.lag_frames)} | {j.blips} | {len(j.stalls)} | "
                f"{j.at_limit_frames} | {j.beyond_range_frames} |"
            )
        g = r.gripper
        if g is not None:
            held = "" if g.held_opening is None else f", held at {g.held_opening:.1f}"
            lines += [
                "",
                f"Gripper: commanded {g.commanded[0]:.1f}..{g.commanded[1]:.1f}, "
                f"achieved {g.achieved[0]:.1f}..{g.achieved[1]:.1f}, twin "
                f"{g.replayed[0]:.1f}..{g.replayed[1]:.1f}; mean tracking gap "
                f"{g.mean_tracking_gap:.1f}; {len(g.grasps)} grasp(s), "
                f"{g.grasp_frames} frames{held}.",
            ]
        lag = r.lag
        lines.append(
            f"Action->state response: recorded {_fmt(lag.response_recorded)} frames, "
            f"twin {_fmt(lag.response_replayed)} frames."
        )
        if r.episode_index in plots:
            lines += ["", f"![episode {r.episode_index}]({plots[r.episode_index]})"]
    not_replayable = [r for r in results if r.verdict is ReplayVerdict.NOT_REPLAYABLE]
    if not_replayable:
        lines += ["", "## Not replayable", ""]
        lines += [f"- episode {r.episode_index}: {r.reason}" for r in not_replayable]
    return "\n".join(lines) + "\n"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def write_report(directory: str | os.PathLike[str], check: DatasetCheck, document: Mapping[str, Any]) -> Path:
    """Write every replayed episode's PNG, ``report.json`` (``document``, the check's
    :meth:`~hilrec.daemon.replay.check.DatasetCheck.to_document`) and ``summary.md`` into
    ``directory``; returns the summary's path."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    plots: dict[int, str] = {}
    for result in check.results:
        if result.verdict is ReplayVerdict.NOT_REPLAYABLE or result.trajectories is None:
            continue
        name = plot_name(result.episode_index)
        plot_episode(result, directory / name)
        plots[result.episode_index] = name
    atomic_write_json(directory / "report.json", document)
    summary = directory / "summary.md"
    atomic_write_bytes(summary, summary_markdown(document, check.results, plots).encode())
    return summary
