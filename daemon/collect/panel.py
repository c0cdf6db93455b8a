"""The live status panel (rich), and the lines collect prints above it.

While a session runs, the panel is redrawn a few times a second from the session's
:class:`PanelState` and the telemetry :class:`~hilrec.daemon.collect.monitor.Snapshot`: take i of
N and its phase, elapsed and remaining time, frames; the loop's ticks, late and skipped ticks and
jitter; faults and the writer queue; the follower's joints against the leader's (a two-arm
bench's twelve as two tables side by side, left and right); the last take's verdict. A late
tick shows in red as it happens (for a few seconds), a fault at once.

Without a terminal on stdout there is no panel: only the lines (take started, saved, verdict...),
so a log or a CI run reads cleanly.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Final

from rich.console import Console, Group
from rich.live import Live
from rich.panel import Panel as RichPanel
from rich.table import Table
from rich.text import Text

from hilrec.daemon.collect.monitor import Monitor, Snapshot
from hilrec.daemon.dataset import EpisodeVerdict
from hilrec.daemon.so101 import JOINT_NAMES, NUM_JOINTS, arm_groups

LATE_HIGHLIGHT_S: Final[float] = 3.0
BACKLOG_WARN_S: Final[float] = 1.0  # a backlog this long is shown in colour: the encoder is behind
KEYS_HELP: Final[str] = "→/n save   ←/r record again   space pause (between takes)   Esc/q finish"
VERDICT_STYLE: Final[dict[str, str]] = {
    EpisodeVerdict.SOUND: "bold green",
    EpisodeVerdict.WARNING: "bold yellow",
    EpisodeVerdict.BAD: "bold red",
    EpisodeVerdict.NOT_CHECKED: "bold magenta",
}


@dataclass
class PanelState:
    """What the session is doing; replaced or changed by the session thread, read by the panel."""

    take: int = 0
    takes: int = 0
    phase: str = "starting"  # recording, reset, paused, finishing
    task: str = ""
    episode_index: int | None = None
    started: float | None = None  # monotonic start of the phase
    limit_s: float | None = None  # the phase's length
    frames: int = 0
    status: dict[str, Any] | None = None  # the daemon's last status reply
    last_verdict: str = ""
    message: str = ""
    control: str = ""  # hilrec rollout: who has the arm (policy, human)


class Panel:
    def __init__(
        self,
        monitor: Monitor,
        *,
        console: Console | None = None,
        title: str = "hilrec collect",
        keys_help: str = KEYS_HELP,
    ) -> None:
        self.console = console or Console(highlight=False)
        self.monitor = monitor
        self.title = title
        self.keys_help = keys_help
        self.state = PanelState()
        self.live_enabled = self.console.is_terminal
        self._live: Live | None = None

    def __enter__(self) -> Panel:
        if self.live_enabled:
            self._live = Live(
                get_renderable=self.render,
                console=self.console,
                refresh_per_second=4,
                transient=True,
                redirect_stdout=False,
                redirect_stderr=False,
            )
            self._live.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None

    def line(self, text: str, style: str | None = None) -> None:
        """A line above the panel (or on its own, without a terminal)."""
        self.console.print(Text(text, style=style or ""), soft_wrap=True)

    # --- rendering ---------------------------------------------------------------------------------

    def render(self) -> RichPanel:
        state = self.state
        snap = self.monitor.snapshot()
        now = time.monotonic()
        head = Text()
        head.append(f"take {state.take} of {state.takes}  ", style="bold")
        head.append(state.phase.upper(), style=_phase_style(state.phase))
        if state.episode_index is not None and state.phase == "recording":
            head.append(f"  episode {state.episode_index}")
        if state.task:
            head.append(f"  {state.task!r}", style="dim")
        if state.control:
            head.append(f"  {state.control} drives", style="bold cyan")
        rows: list[Any] = [head, self._timing_line(state, now), self._loop_line(snap, now)]
        rows.append(self._health_line(state, snap))
        rows.append(_joints_table(snap.tick))
        if state.last_verdict:
            rows.append(Text(f"last verdict: {state.last_verdict}"))
        if state.message:
            rows.append(Text(state.message, style="italic"))
        rows.append(Text(self.keys_help, style="dim"))
        return RichPanel(Group(*rows), title=self.title, expand=False)

    def _timing_line(self, state: PanelState, now: float) -> Text:
        elapsed = 0.0 if state.started is None else now - state.started
        text = Text(f"elapsed {elapsed:5.1f} s")
        if state.limit_s is not None and state.phase != "paused":
            text.append(f"   remaining {max(0.0, state.limit_s - elapsed):5.1f} s of {state.limit_s:.1f} s")
        if state.phase == "recording":
            text.append(f"   frames {state.frames}")
        return text

    def _loop_line(self, snap: Snapshot, now: float) -> Text:
        loop = snap.loop
        text = Text(f"loop: {loop.ticks} ticks, ")
        text.append(f"{loop.late} late", style="bold red" if loop.late else "")
        text.append(f", {loop.skipped_slots} skipped, {loop.overruns} overruns")
        jitter = loop.jitter_ms()
        if jitter is not None:
            text.append(f"; lateness p50 {jitter[0]:.2f} ms p99 {jitter[1]:.2f} ms max {jitter[2]:.2f} ms")
        if loop.last_late is not None and now - loop.last_late[1] < LATE_HIGHLIGHT_S:
            text.append(f"  LATE TICK {loop.last_late[0]:.1f} ms", style="bold white on red")
        if loop.dropped:
            text.append(f"  ({loop.dropped} tick messages dropped)", style="dim")
        if not snap.connected:
            text.append("  (no telemetry yet)", style="yellow")
        return text

    def _health_line(self, state: PanelState, snap: Snapshot) -> Text:
        status = state.status or {}
        dataset = status.get("dataset") or {}
        faults = status.get("faults") or []
        text = Text()
        if faults or snap.faults:
            names = [f"{f.get('kind')} on {f.get('device')}" for f in faults] or snap.faults
            text.append("FAULT: " + "; ".join(map(str, names)), style="bold white on red")
        else:
            text.append("faults: none", style="green")
        text.append(
            f"   writer queue {dataset.get('writer_queue', '?')}/{dataset.get('writer_capacity', '?')}"
            f", saving {dataset.get('saving', '?')}, episodes {dataset.get('episodes', '?')}"
        )
        verdicts = status.get("verdicts") or {}
        if verdicts.get("pending"):
            text.append(f", verdicts pending {verdicts['pending']}")
        backlog = snap.loop.video_backlog_s
        if backlog is None and isinstance(dataset.get("video_backlog_s"), (int, float)):
            backlog = float(dataset["video_backlog_s"])
        if backlog is not None:
            text.append(", video backlog ")
            text.append(f"{backlog:.1f} s", style="bold yellow" if backlog >= BACKLOG_WARN_S else "")
            spill = dataset.get("spill_bytes")
            if isinstance(spill, int) and spill > 0:
                text.append(
                    f" ({spill / 2**20:.0f} MiB spilled of {dataset.get('spill_bytes_limit', 0) / 2**20:.0f})"
                )
        return text


def backlog_line(snap: Snapshot) -> str | None:
    """What the summary says of the video backlog, or None when the daemon does not send it."""
    loop = snap.loop
    if loop.video_backlog_s is None:
        return None
    return f"video backlog: {loop.video_backlog_s:.1f} s at the end, at most {loop.max_video_backlog_s:.1f} s"


def _joints_table(tick: dict[str, Any] | None) -> Table:
    """The follower against the leader per joint: one table, or one per arm side by side."""
    state = (tick or {}).get("state")
    leader = (tick or {}).get("leader")
    count = next((len(v) for v in (state, leader) if isinstance(v, list)), NUM_JOINTS)
    groups = arm_groups(count) or ((None, slice(0, NUM_JOINTS)),)
    tables = [_arm_table(side, where, state, leader) for side, where in groups]
    if len(tables) == 1:
        return tables[0]
    grid = Table.grid(padding=(0, 4))
    grid.add_row(*tables)
    return grid


def _arm_table(
    side: str | None, where: slice, state: list[float] | None, leader: list[float] | None
) -> Table:
    table = Table(box=None, pad_edge=False, show_edge=False, title=None if side is None else f"{side} arm")
    for name, justify in (("joint", "left"), ("follower", "right"), ("leader", "right"), ("|diff|", "right")):
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    for i, name in zip(range(where.start, where.stop), JOINT_NAMES, strict=True):
        follower = _num(state, i)
        lead = _num(leader, i)
        diff = "" if state is None or leader is None else f"{abs(state[i] - leader[i]):7.2f}"
        table.add_row(name, follower, lead, diff)
    return table


def _num(values: list[float] | None, i: int) -> str:
    return "-" if values is None else f"{values[i]:8.2f}"


def _phase_style(phase: str) -> str:
    return {"recording": "bold white on red", "reset": "bold black on yellow", "paused": "bold cyan"}.get(
        phase, "bold"
    )
