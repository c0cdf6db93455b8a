"""A bench session: N takes, each recorded, saved and judged, with a reset period between them.

Per take: ``start_episode``; record until ``--episode-time-s`` or a key; ``stop_episode`` (the
daemon saves it) or ``discard_episode``. Then the reset period (``--reset-time-s``): the operator
puts the scene back while teleoperation goes on (nothing is recorded), and the take's verdict,
which the daemon's idle-priority worker sends once the episode is durable and merged, is printed
as soon as it arrives. At the end the dataset is finalized, the verdicts still missing are waited
for (bounded), and a summary comes back to :mod:`hilrec.daemon.collect.cmd_collect`.

Keys (:mod:`hilrec.daemon.collect.keys`) during a take: → save now, ← discard and record it again,
Esc/q/Ctrl-C save and finish. During the reset: space pauses/resumes, → starts the next take now,
← records the last take again (it was saved, and a saved episode stays in the dataset with its
verdict beside it; the new take is recorded in addition), Esc/q/Ctrl-C finish. After the last
take the reset waits for its verdict, then runs its time (→ finishes now, ← records it again);
only then is the dataset finalized.

Only this thread uses the control client; the panel and the telemetry monitor run beside it.
Each time it polls status it first tells the daemon its phase, take i of N and countdown
(``session_note``), so the pages beside it (``hilrec ui``) show the session, not the daemon's idle.
"""

from __future__ import annotations

import enum
import json
import time
from dataclasses import dataclass, field
from typing import Any, Final

from hilrec.daemon.collect.keys import Key, KeyReader
from hilrec.daemon.collect.monitor import Monitor
from hilrec.daemon.collect.panel import VERDICT_STYLE, Panel
from hilrec.daemon.collect.sounds import Speaker
from hilrec.daemon.dataset import EpisodeVerdict, episode_json_path
from hilrec.daemon.errors import HilrecError, ProtocolError
from hilrec.daemon.wire.client import ControlClient
from hilrec.daemon.wire.protocol import CollectPhase

STATUS_PERIOD_S: Final[float] = 0.5
KEY_POLL_S: Final[float] = 0.1
FINALIZE_WAIT_S: Final[float] = 300.0
VERDICT_WAIT_S: Final[float] = 120.0
START_RETRY_S: Final[float] = 60.0


# The panel's phase -> the note's ("verdict": the last take's reset, waiting for its verdict).
_NOTE_PHASES: Final[dict[str, CollectPhase]] = {
    "recording": CollectPhase.RECORDING,
    "reset": CollectPhase.RESET,
    "verdict": CollectPhase.FINAL_RESET,
    "paused": CollectPhase.PAUSED,
    "finishing": CollectPhase.FINISHING,
}


class TakeEnd(enum.Enum):
    SAVED = "saved"
    REDO = "redo"  # discarded, to be recorded again
    QUIT = "quit"  # saved (or discarded if it had no frames), then finish
    LOST = "lost"  # nothing saved (the daemon discarded it on a fault, or it had no frame)
    NOTHING = "nothing"  # hilrec rollout --record corrections: no correction, nothing to record


@dataclass
class Take:
    number: int
    episode_index: int
    frames: int
    task: str
    ended_by: str
    superseded: bool = False  # recorded again with ← in the reset after it
    outcome: str | None = None  # hilrec rollout: the operator's mark (s / f), None unmarked


@dataclass
class Summary:
    root: str = ""
    kept: list[Take] = field(default_factory=list)
    rerecorded: int = 0
    discarded: int = 0
    late_ticks: int = 0  # the loop's, over the whole session (status)
    late_in_takes: int = 0  # ticks of recorded frames that were late (telemetry)
    skipped_slots: int = 0
    verdicts: dict[int, dict[str, Any]] = field(default_factory=dict)
    finalized: bool = False
    interrupted: bool = False

    @property
    def frames(self) -> int:
        return sum(t.frames for t in self.kept)


class CollectSession:
    def __init__(
        self,
        *,
        client: ControlClient,
        monitor: Monitor,
        panel: Panel,
        keys: KeyReader,
        speaker: Speaker,
        episodes: int,
        episode_time_s: float,
        reset_time_s: float,
        tasks: list[str],
    ) -> None:
        self.client, self.monitor, self.panel, self.keys, self.speaker = client, monitor, panel, keys, speaker
        self.episodes = episodes
        self.episode_time_s = episode_time_s
        self.reset_time_s = reset_time_s
        self.tasks = tasks
        self.summary = Summary()
        self._printed: set[int] = set()
        self._next_status = 0.0
        self._next_sidecar = 0.0
        self._quit = False
        self._final = False  # in the reset after the last take
        self._notes = True  # off once a daemon refuses session_note (an older one)

    # --- the session -------------------------------------------------------------------------------

    def run(self) -> Summary:
        status = self._status(force=True)
        self.summary.root = str((status.get("dataset") or {}).get("root") or "")
        late0 = int((status.get("loop") or {}).get("late_ticks") or 0)
        self.panel.state.takes = self.episodes
        number = 1
        while number <= self.episodes and not self._quit:
            end = self._take(number)
            if end is TakeEnd.QUIT:
                break
            if end is TakeEnd.REDO:
                self.summary.rerecorded += 1
            # After the last take too: its verdict arrives in this reset, while ← can still use it.
            again = self._reset(number, end, final=end is TakeEnd.SAVED and number == self.episodes)
            if self._quit:
                continue
            if again and end is TakeEnd.SAVED:  # ← in the reset: a saved take once more
                self.summary.rerecorded += 1
                self.summary.kept[-1].superseded = True
            elif not again and self._advances(end):
                number += 1
            # REDO (counted above), or LOST (nothing saved: the daemon discarded it): the same take again
        self._finish()
        status = self._status(force=True)
        self.summary.late_ticks = int((status.get("loop") or {}).get("late_ticks") or 0) - late0
        snap = self.monitor.snapshot()
        self.summary.late_in_takes = snap.loop.late_in_takes
        self.summary.skipped_slots = snap.loop.skipped_in_takes
        return self.summary

    def _take(self, number: int) -> TakeEnd:
        task = self.tasks[(number - 1) % len(self.tasks)]
        index = self._start(task)
        if index is None:
            self._quit = True
            return TakeEnd.QUIT
        state = self.panel.state
        state.take, state.phase, state.task, state.episode_index = number, "recording", task, index
        state.started, state.limit_s, state.frames = time.monotonic(), self.episode_time_s, 0
        state.message = ""
        self._status(force=True)  # a status from before the start would say no take is open
        self.speaker.say(f"recording episode {number}")
        self.panel.line(f"take {number} of {self.episodes}: recording episode {index} ({task!r})")
        deadline = state.started + self.episode_time_s
        while True:
            key = self.keys.wait(min(KEY_POLL_S, max(0.0, deadline - time.monotonic())))
            ended = self._daemon_ended_take(index)
            if ended is not None:
                return self._lost(number, index, task, ended)
            if key is not None and (end := self._take_key(key, number, index, task)) is not None:
                return end
            if time.monotonic() >= deadline:
                return self._stop(number, index, task, f"{self.episode_time_s:g} s")

    def _take_key(self, key: Key, number: int, index: int, task: str) -> TakeEnd | None:
        """A key pressed during take ``number`` (episode ``index``): how the take ends, or None."""
        if key is Key.NEXT:
            return self._stop(number, index, task, "→")
        if key is Key.REDO:
            reply = self.client.call("discard_episode")  # counted as re-recorded, not discarded
            self.panel.line(
                f"take {number}: episode {index} discarded ({reply.get('frames')} frames); "
                "recording it again",
                "yellow",
            )
            return TakeEnd.REDO
        if key in (Key.QUIT, Key.INTERRUPT):
            self._say_quit(key)
            self._stop(number, index, task, "Ctrl-C" if key is Key.INTERRUPT else "Esc")
            return TakeEnd.QUIT
        if key is Key.PAUSE:
            self.panel.state.message = "space pauses between takes; → ends this take now"
        return None

    def _advances(self, end: TakeEnd) -> bool:
        """Whether the take that ended so counts, and the next one follows."""
        return end is TakeEnd.SAVED

    def _reset(self, number: int, end: TakeEnd, *, final: bool = False) -> bool:
        """The reset period after take ``number``; True when ← asks for that take again.

        After the last take (``final``) the countdown starts only once the take's verdict is
        in (bounded by ``VERDICT_WAIT_S``), so ← can still act on it; → finishes at once.
        """
        state = self.panel.state
        state.phase, state.episode_index, state.limit_s = "reset", None, self.reset_time_s
        state.started = time.monotonic()
        self._final = final
        self._status(force=True)  # the pages beside it hear of the reset at once
        self.speaker.say("reset")
        remaining = self.reset_time_s
        paused = False
        last = time.monotonic()
        waiting = self._verdict_wait(number) if final else None
        while remaining > 0 or paused or waiting is not None:
            key = self.keys.wait(KEY_POLL_S if paused or waiting else min(KEY_POLL_S, remaining))
            now = time.monotonic()
            if not paused and waiting is None:
                remaining -= now - last
            last = now
            self._poll_events()
            self._status()
            if waiting is not None and (self._verdict_known(waiting[0], now) or now >= waiting[1]):
                waiting = None
                self._verdict_in(number, now)
            if key is Key.PAUSE:
                paused = not paused
                state.phase = "paused" if paused else "reset"
                if not paused:
                    state.started = now - (self.reset_time_s - remaining)
                state.message = "paused: space resumes" if paused else ""
                self.panel.line("paused: space resumes" if paused else "resumed")
                self.speaker.say("paused" if paused else "resumed")
            elif key is Key.NEXT:
                break
            elif key is Key.REDO:
                self.panel.line(self._redo_line(number, end), "yellow")
                return True
            elif key in (Key.QUIT, Key.INTERRUPT):
                self._say_quit(key)
                self._quit = True
                break
        return False

    def _verdict_wait(self, number: int) -> tuple[int, float] | None:
        """The last take's episode and the time its verdict is waited for until, shown."""
        index = self.summary.kept[-1].episode_index
        if index in self._printed:
            return None
        state = self.panel.state
        state.phase, state.limit_s = "verdict", None
        state.message = f"waiting for take {number}'s verdict: ← records it again, → finishes now"
        return index, time.monotonic() + VERDICT_WAIT_S

    def _verdict_known(self, index: int, now: float) -> bool:
        """Printed from its event, or (an event dropped) read from the sidecar, once a second."""
        if index not in self._printed and now >= self._next_sidecar:
            self._next_sidecar = now + 1.0
            if (verdict := self._sidecar_verdict(index)) is not None:
                self._report_verdict(verdict)
        return index in self._printed

    def _verdict_in(self, number: int, now: float) -> None:
        state = self.panel.state
        state.phase, state.started, state.limit_s = "reset", now, self.reset_time_s
        state.message = f"last take: ← records take {number} again, → finishes now"
        self.panel.line(
            f"the last take is in: {self.reset_time_s:g} s to press ← to record it again, → to finish now"
        )

    def _redo_line(self, number: int, end: TakeEnd) -> str:
        if end is TakeEnd.SAVED:
            return (
                f"take {number} will be recorded again; its episode stays in the dataset "
                "(a saved episode is never taken back), its verdict beside it"
            )
        return f"take {number}: nothing of it was saved; recording it now"

    def _finish(self) -> None:
        state = self.panel.state
        state.phase, state.limit_s, state.started, state.message = "finishing", None, time.monotonic(), ""
        self.panel.line("finalizing the dataset")
        try:
            self.client.call("finalize")
        except ProtocolError as exc:
            self.panel.line(f"finalize refused: {exc}", "red")
        deadline = time.monotonic() + FINALIZE_WAIT_S
        while time.monotonic() < deadline:
            self._poll_events()
            if (self._status(force=True).get("dataset") or {}).get("finalized"):
                self.summary.finalized = True
                break
            self.keys.wait(KEY_POLL_S)  # keeps Ctrl-C from killing collect mid-finalize
        wanted = [t.episode_index for t in self.summary.kept]
        deadline = time.monotonic() + VERDICT_WAIT_S
        while any(i not in self._printed for i in wanted) and time.monotonic() < deadline:
            self.keys.wait(KEY_POLL_S)
            self._poll_events()
            for index in wanted:
                if index not in self._printed and (verdict := self._sidecar_verdict(index)) is not None:
                    self._report_verdict(verdict)
        for index in wanted:
            if index not in self._printed:
                self.panel.line(f"episode {index}: no verdict within {VERDICT_WAIT_S:.0f} s", "magenta")
        self.speaker.say("done")

    # --- one take's end ------------------------------------------------------------------------------

    def _start(self, task: str) -> int | None:
        deadline = time.monotonic() + START_RETRY_S
        while True:
            reply = self.client.request("start_episode", task=task)
            if reply["ok"]:
                return int(reply["episode_index"])
            self.panel.state.message = f"cannot start a take: {reply['error']}"
            if reply.get("code") != "fault" or time.monotonic() > deadline:
                self.panel.line(f"cannot start a take: {reply['error']}", "red")
                return None
            key = self.keys.wait(1.0)  # a device is faulted: wait for it to come back
            if key in (Key.QUIT, Key.INTERRUPT):
                return None

    def _stop(self, number: int, index: int, task: str, why: str, success: bool | None = None) -> TakeEnd:
        reply = self.client.request("stop_episode", **({} if success is None else {"success": success}))
        if not reply["ok"]:
            status = self._status(force=True)
            last = status.get("last_episode") or {}
            if status.get("episode") is None and last.get("episode_index") == index:
                return self._lost(number, index, task, last)  # the daemon closed it just now
            # No frame yet: nothing to save.
            if self.client.request("discard_episode")["ok"]:
                self.summary.discarded += 1
            self.panel.line(f"take {number}: nothing saved ({reply['error']})", "yellow")
            return TakeEnd.LOST
        frames = int(reply["frames"])
        outcome = None if success is None else ("success" if success else "failure")
        self.summary.kept.append(Take(number, index, frames, task, why, outcome=outcome))
        self.panel.line(f"take {number} saved: episode {index}, {frames} frames (ended by {why})", "green")
        return TakeEnd.SAVED

    def _lost(self, number: int, index: int, task: str, last: dict[str, Any]) -> TakeEnd:
        ended_by = str(last.get("ended_by"))
        if last.get("discarded") or last.get("saved") is False:
            self.summary.discarded += 1
            self.panel.line(
                f"take {number}: episode {index} ended by the daemon ({ended_by}), not saved", "red"
            )
        else:
            frames = int(last.get("frames") or 0)
            self.summary.kept.append(Take(number, index, frames, task, ended_by))
            self.panel.line(f"take {number}: episode {index} ended by the daemon ({ended_by}), saved", "red")
            return TakeEnd.SAVED
        return TakeEnd.LOST

    def _daemon_ended_take(self, index: int) -> dict[str, Any] | None:
        """The daemon's last_episode when it closed the open take itself (a fault), else None."""
        status = self._status()
        self.panel.state.frames = int((status.get("episode") or {}).get("frames") or self.panel.state.frames)
        tick = self.monitor.snapshot().tick or {}
        if tick.get("episode_index") == index and tick.get("frame_index") is not None:
            self.panel.state.frames = max(self.panel.state.frames, int(tick["frame_index"]) + 1)
        self._poll_events()
        if status.get("episode") is None and status.get("state") != "recording":
            last = status.get("last_episode") or {}
            if last.get("episode_index") == index or str(last.get("ended_by")).startswith("fault"):
                return last
        return None

    def _say_quit(self, key: Key) -> None:
        if key is Key.INTERRUPT:
            self.panel.line("Ctrl-C: saving the take and finishing, as Esc does", "yellow")
        else:
            self.panel.line("Esc: saving the take and finishing")
        self._quit = True

    # --- the daemon's news ---------------------------------------------------------------------------

    def _status(self, *, force: bool = False) -> dict[str, Any]:
        now = time.monotonic()
        if force or now >= self._next_status:
            self._next_status = now + STATUS_PERIOD_S
            self._send_note(now)
            self.panel.state.status = self.client.call("status")
        return self.panel.state.status or {}

    def _send_note(self, now: float) -> None:
        """Tell the daemon what the panel shows: phase, take i of N (1-based), time left."""
        state = self.panel.state
        phase = _NOTE_PHASES.get(state.phase)
        if not self._notes or phase is None or state.take < 1:
            return
        if phase is CollectPhase.RESET and self._final:
            phase = CollectPhase.FINAL_RESET
        args: dict[str, Any] = {"phase": phase.value, "take": state.take, "takes": self.episodes}
        if state.task:
            args["task"] = state.task
        if state.limit_s is not None and state.started is not None and phase is not CollectPhase.PAUSED:
            args["seconds_left"] = max(0.0, state.started + state.limit_s - now)
        reply = self.client.request("session_note", **args)
        if not reply["ok"]:
            self._notes = False  # a daemon that does not know it: the session goes on without
            self.panel.line(f"the daemon refused session_note ({reply['error']}); the ui shows no take")

    def _poll_events(self) -> None:
        for event in self.monitor.events():
            name = event.get("event")
            if name == "episode_verdict":
                self._report_verdict(event)
            elif name == "fault":
                fault = event.get("fault") or {}
                self.panel.line(
                    f"FAULT {fault.get('kind')} on {fault.get('device')}: {fault.get('message')}", "red"
                )
            elif name == "fault_cleared":
                self.panel.line(f"fault on {(event.get('fault') or {}).get('device')} cleared", "green")
            elif name == "episode_save_failed":
                index = event.get("episode_index")
                self.panel.line(f"episode {index} was NOT saved: {event.get('error')}", "red")
                for take in [t for t in self.summary.kept if t.episode_index == index]:
                    self.summary.kept.remove(take)  # handed to the writer, then lost: not kept
                    self.summary.discarded += 1

    def _report_verdict(self, verdict: dict[str, Any]) -> None:
        index = int(verdict["episode_index"])
        if index in self._printed:
            return
        self._printed.add(index)
        self.summary.verdicts[index] = verdict
        take = next((t.number for t in self.summary.kept if t.episode_index == index), None)
        who = f"take {take} (episode {index})" if take is not None else f"episode {index}"
        text = f"verdict {who}: {verdict['verdict'].upper()}: {verdict['summary']}"
        self.panel.state.last_verdict = text
        self.panel.line(text, VERDICT_STYLE.get(str(verdict["verdict"])))
        if verdict["verdict"] == EpisodeVerdict.BAD:
            self.speaker.say(f"episode {take or index} is bad")

    def _sidecar_verdict(self, index: int) -> dict[str, Any] | None:
        """The verdict as stored beside the episode (for one whose event was dropped)."""
        if not self.summary.root:
            return None
        path = episode_json_path(self.summary.root, index)
        try:
            stored = json.loads(path.read_text()).get("verdict")
        except (OSError, ValueError, HilrecError):
            return None
        return {"episode_index": index, **stored} if isinstance(stored, dict) else None
