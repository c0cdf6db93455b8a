"""A rollout session: collect's takes, resets and verdicts, with a policy driving each take.

The daemon runs the policy (``[policy]``, the flags ``hilrec rollout`` gives it); this session
only says when takes begin and end, and who has the arm. Keys during a take, beside collect's:
space takes the arm from the policy (``takeover``) and gives it back (``handback``), the same
requests ``hilrec ctl`` sends; ``s`` / ``f`` end the take and save it marked a success / a
failure (the sidecar's ``success``; an unmarked take has none). Between takes space keeps
collect's meaning, pause; the human's leader has the arm for the reset.

``--record corrections`` (LeRobot's ``record_autonomous=False``): each correction window is an
episode of its own. The policy drives the take unrecorded; when the human takes over (space, the
leader moved away with ``--takeover leader``, the scripted expert with ``--takeover expert``) a
window's episode starts, and when the arm is handed back (space) it is saved. ``s`` / ``f``
mark the window that is open. A take with no correction records nothing, and counts.
"""

from __future__ import annotations

import time
from typing import Any, Final

from hilrec.daemon.collect.keys import Key
from hilrec.daemon.collect.session import KEY_POLL_S, CollectSession, TakeEnd
from hilrec.daemon.policy.record import ControlSource, RecordMode

ROLLOUT_KEYS_HELP: Final[str] = (
    "space take over / hand back (in a take; pause between)   s success   f failure   "
    "→/n save   ←/r again   Esc/q finish"
)
_OUTCOMES: Final[dict[Key, bool]] = {Key.SUCCESS: True, Key.FAILURE: False}
# What ended a correction window, as the summary says it.
_ENDED_BY: Final[dict[Key, str]] = {
    Key.PAUSE: "handback",
    Key.NEXT: "→",
    Key.SUCCESS: "s",
    Key.FAILURE: "f",
    Key.QUIT: "Esc",
    Key.INTERRUPT: "Ctrl-C",
}


class RolloutSession(CollectSession):
    def __init__(self, *, record: RecordMode, **common: Any) -> None:
        super().__init__(**common)
        self.record = record
        self._control = ""

    # --- who has the arm -------------------------------------------------------------------------

    def _status(self, *, force: bool = False) -> dict[str, Any]:
        status = super()._status(force=force)
        control = str((status.get("leader") or {}).get("control") or "")
        if control and control != self._control:
            if self._control and self.panel.state.phase == "recording":
                self.panel.line(f"the {control} has the arm", "cyan")
            self._control = control
        self.panel.state.control = control
        return status

    def _switch(self, verb: str) -> bool:
        """``takeover`` / ``handback``; False (said on the panel) when the daemon refuses it."""
        reply = self.client.request(verb)
        if not reply["ok"]:
            self.panel.line(f"{verb} refused: {reply['error']}", "red")
            return False
        self._status(force=True)
        return True

    def _take_key(self, key: Key, number: int, index: int, task: str) -> TakeEnd | None:
        if key is Key.PAUSE:
            self._status(force=True)  # the leader or the expert may have taken over since the last poll
            self._switch("handback" if self._control == ControlSource.HUMAN else "takeover")
            return None
        if key in _OUTCOMES:
            mark = "s" if _OUTCOMES[key] else "f"
            return self._stop(number, index, task, mark, success=_OUTCOMES[key])
        return super()._take_key(key, number, index, task)

    def _advances(self, end: TakeEnd) -> bool:
        return end in (TakeEnd.SAVED, TakeEnd.NOTHING)

    # --- --record corrections ----------------------------------------------------------------------

    def _take(self, number: int) -> TakeEnd:
        if self.record != RecordMode.CORRECTIONS:
            return super()._take(number)
        task = self.tasks[(number - 1) % len(self.tasks)]
        state = self.panel.state
        state.take, state.phase, state.task, state.episode_index = number, "recording", task, None
        state.started, state.limit_s, state.frames, state.message = (
            time.monotonic(),
            self.episode_time_s,
            0,
            "",
        )
        if not self._switch("handback"):  # the policy drives, nothing recorded
            self._quit = True
            return TakeEnd.QUIT
        self.speaker.say(f"rollout {number}")
        self.panel.line(f"take {number} of {self.episodes}: the policy drives; corrections are recorded")
        end = self._corrections(number, task, state.started + self.episode_time_s)
        if self._control == ControlSource.POLICY:
            self._switch("takeover")  # the human's leader has the arm for the reset
        return end

    def _corrections(self, number: int, task: str, deadline: float) -> TakeEnd:
        window: int | None = None
        saved = 0
        while True:
            key = self.keys.wait(min(KEY_POLL_S, max(0.0, deadline - time.monotonic())))
            if window is not None:
                ended = self._daemon_ended_take(window)
                if ended is not None:  # a fault closed the window (saved, as every take)
                    saved += self._lost(number, window, task, ended) is TakeEnd.SAVED
                    return TakeEnd.SAVED if saved else TakeEnd.NOTHING
            else:
                status = self._status(force=True)  # a takeover by the leader or the expert opens a window now
                self._poll_events()  # a fault while the policy drives unrecorded is said too
                if any(f.get("kind") == "policy" for f in status.get("faults") or []):
                    self.panel.line("the policy is gone (its fault above): the session ends", "red")
                    self._quit = True
                    return TakeEnd.SAVED if saved else TakeEnd.NOTHING
            if window is None and self._control == ControlSource.HUMAN:
                window = self._open_window(task)
                if window is None:
                    return TakeEnd.QUIT
            over = time.monotonic() >= deadline
            if key is Key.PAUSE and window is None:
                self._switch("takeover")  # the window opens on the next pass, with the human's hand
                continue
            if key is Key.REDO:
                if window is not None:
                    self.client.call("discard_episode")
                self.panel.line(f"take {number}: its open correction discarded; the take again", "yellow")
                return TakeEnd.REDO
            if window is not None and (
                key in (Key.PAUSE, Key.NEXT, Key.QUIT, Key.INTERRUPT, *_OUTCOMES) or over
            ):
                success = _OUTCOMES.get(key) if key is not None else None
                why = _ENDED_BY[key] if key is not None else f"{self.episode_time_s:g} s"
                saved += self._stop(number, window, task, why, success=success) is TakeEnd.SAVED
                window = None
                if key is Key.PAUSE and not over:
                    self._switch("handback")
                    continue
            if key in (Key.QUIT, Key.INTERRUPT):
                self._say_quit(key)
                return TakeEnd.QUIT
            if over or key in (Key.NEXT, *_OUTCOMES):
                return TakeEnd.SAVED if saved else TakeEnd.NOTHING

    def _open_window(self, task: str) -> int | None:
        index = self._start(task)
        if index is not None:
            self.panel.state.episode_index = index
            self.panel.line(f"correction: recording episode {index}", "cyan")
        return index
