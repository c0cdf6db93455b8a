"""What the page knows about the bench, folded from the daemon's replies and telemetry.

:class:`BenchModel` runs on the server's event loop only (the bridge's threads hand it their
messages there), so it needs no lock. Each input returns the messages to push to every open
page; :meth:`BenchModel.snapshot` is the first message a page gets. Every value carries ``at``,
the wall time it was received: the page never shows a value as live without knowing its age,
and :data:`LINK` messages say when the daemon stopped answering.

Messages to the page (JSON objects, ``type`` first):

- ``link``: ``daemon`` (``up``/``down``/``unknown``), ``last_answer``, ``down_since``, ``error``;
- ``status``: ``status`` (the daemon's status reply), ``session`` (what the Session panel
  shows: :func:`session_view`), ``takes`` (newest first, each with its ``verdict`` or null),
  ``faults_log``;
- ``tick``: the telemetry tick (joints, command, twin, timing, flags, faulted devices);
- ``preview``: ``cameras`` ``[{name, width, height, jpeg}]`` with ``jpeg`` in base64;
- ``event``: the telemetry event's header (``event`` names it);
- ``snapshot``: all of the above that is known, for a page that just connected.
"""

from __future__ import annotations

import base64
import collections
from typing import Any, Final

LINK: Final[str] = "link"
FAULT_LOG_LENGTH: Final[int] = 50
# Fields of a tick the page uses; the rest (divergence...) stays on the wire.
TICK_FIELDS: Final[tuple[str, ...]] = (
    "slot",
    "recording",
    "episode_index",
    "frame_index",
    "state",
    "action",
    "leader",
    "twin",
    "flags",
    "faults",
)
TIMING_FIELDS: Final[tuple[str, ...]] = ("late_ms", "duration_ms", "skipped", "overrun")


def session_view(status: dict[str, Any], now: float) -> dict[str, Any]:
    """The Session panel's phase, take and countdown, from a status reply received at ``now``.

    With a ``collect`` beside the daemon (its live ``session_note`` in ``status.collect``): its
    phase, "take i of N" (1-based: take 1 is episode 0 of a fresh dataset) and ``ends_at``, the
    wall time its countdown ends (null when the phase has none). Without one: the daemon's state
    and its episode, numbered from 1 for the eye (episode indices in files stay 0-based).
    """
    note = status.get("collect")
    if isinstance(note, dict):
        left = note.get("seconds_left")
        return {
            "source": "collect",
            "phase": note.get("phase"),
            "take": f"take {note.get('take')} of {note.get('takes')}",
            "task": note.get("task"),
            "ends_at": None if left is None else now + float(left),
        }
    episode = status.get("episode")
    if isinstance(episode, dict):
        take = f"take {int(episode['index']) + 1}"
    else:
        take = f"next: take {int((status.get('dataset') or {}).get('episodes') or 0) + 1}"
    return {
        "source": "daemon",
        "phase": status.get("state"),
        "take": take,
        "task": episode.get("task") if isinstance(episode, dict) else None,
        "ends_at": None,
    }


class BenchModel:
    def __init__(self, *, started_at: float) -> None:
        self.started_at = started_at
        self.daemon = "unknown"
        self.last_answer: float | None = None
        self.down_since: float | None = None
        self.error: str | None = None
        self.status: dict[str, Any] | None = None
        self.status_at: float | None = None
        self.tick: dict[str, Any] | None = None
        self.preview: dict[str, Any] | None = None
        self.disk_takes: list[dict[str, Any]] = []
        self.verdicts: dict[int, dict[str, Any]] = {}
        self.saving: dict[int, dict[str, Any]] = {}  # stopped, handed to the writer, not yet counted
        self.faults_log: collections.deque[dict[str, Any]] = collections.deque(maxlen=FAULT_LOG_LENGTH)
        self.restarts = 0

    # --- inputs -----------------------------------------------------------------------------

    def on_status(self, reply: dict[str, Any], takes: list[dict[str, Any]], now: float) -> list[dict]:
        out: list[dict[str, Any]] = []
        previous = self.status
        if previous is not None and reply.get("uptime_s", 0.0) + 1.0 < previous.get("uptime_s", 0.0):
            self._restarted()
        was = self.daemon
        self.daemon, self.last_answer, self.down_since, self.error = "up", now, None, None
        if was != "up":
            out.append(self.link_message())
        self.status, self.status_at = reply, now
        self.disk_takes = takes
        counted = {t["episode_index"] for t in takes}
        for index in [i for i in self.saving if i in counted]:
            del self.saving[index]
        out.append(self.status_message())
        return out

    def on_unreachable(self, error: str, now: float) -> list[dict[str, Any]]:
        self.error = error
        if self.daemon == "down":
            return []
        self.daemon = "down"
        # Since its last answer: that is when it stopped answering (or since this page server
        # started, if it never answered).
        self.down_since = self.last_answer if self.last_answer is not None else self.started_at
        return [self.link_message()]

    def on_tick(self, header: dict[str, Any], now: float) -> list[dict[str, Any]]:
        tick = {key: header.get(key) for key in TICK_FIELDS}
        timing = header.get("timing") or {}
        tick["timing"] = {key: timing.get(key) for key in TIMING_FIELDS}
        tick.update(type="tick", at=now)
        self.tick = tick
        return [tick]

    def on_preview(self, header: dict[str, Any], blobs: list[bytes], now: float) -> list[dict[str, Any]]:
        cameras = []
        for meta, blob in zip(header.get("cameras", []), blobs, strict=False):
            cameras.append(
                {
                    "name": meta.get("name"),
                    "width": meta.get("width"),
                    "height": meta.get("height"),
                    "jpeg": base64.b64encode(blob).decode("ascii"),
                }
            )
        self.preview = {
            "type": "preview",
            "at": now,
            "frame_index": header.get("frame_index"),
            "cameras": cameras,
        }
        return [self.preview]

    def on_event(self, header: dict[str, Any], now: float) -> list[dict[str, Any]]:
        name = header.get("event")
        out: list[dict[str, Any]] = [{"type": "event", "at": now, "event": header}]
        if name == "daemon_started":
            self.saving.clear()  # a new daemon process: its writer owes nothing of the old one's
        elif name in ("fault", "fault_cleared"):
            fault = header.get("fault") or {}
            self.faults_log.appendleft(
                {
                    "at": header.get("t_wall", now),
                    "cleared": name == "fault_cleared",
                    "kind": fault.get("kind"),
                    "device": fault.get("device"),
                    "message": fault.get("message"),
                }
            )
        elif name == "episode_verdict" and isinstance(header.get("episode_index"), int):
            self.verdicts[header["episode_index"]] = {
                "verdict": header.get("verdict"),
                "summary": header.get("summary"),
                "at": now,
            }
        elif (
            name == "episode_stopped"
            and header.get("saving")
            and isinstance(header.get("episode_index"), int)
        ):
            self.saving[header["episode_index"]] = {"frames": header.get("frames"), "at": now}
        elif name in ("episode_saved", "episode_save_failed") and isinstance(
            header.get("episode_index"), int
        ):
            self.saving.pop(header["episode_index"], None)
        else:
            return out
        if self.status is not None:
            out.append(self.status_message())  # the lists changed: push them at once
        return out

    # --- outputs ----------------------------------------------------------------------------

    def link_message(self) -> dict[str, Any]:
        return {
            "type": LINK,
            "daemon": self.daemon,
            "last_answer": self.last_answer,
            "down_since": self.down_since,
            "error": self.error,
            "restarts": self.restarts,
        }

    def status_message(self) -> dict[str, Any]:
        return {
            "type": "status",
            "at": self.status_at,
            "status": self.status,
            "session": session_view(self.status, self.status_at or 0.0) if self.status is not None else None,
            "takes": self.takes(),
            "faults_log": list(self.faults_log),
        }

    def takes(self) -> list[dict[str, Any]]:
        listed = [{**t, "saving": False} for t in self.disk_takes]
        known = {t["episode_index"] for t in listed}
        pending = [
            {"episode_index": i, "frames": s["frames"], "saving": True, "replay_png": False}
            for i, s in sorted(self.saving.items(), reverse=True)
            if i not in known
        ]
        # A verdict heard on the wire, else the one stored in the take's sidecar, else none.
        return [
            {**t, "verdict": self.verdicts.get(t["episode_index"]) or t.get("verdict")}
            for t in pending + listed
        ]

    def snapshot(self) -> dict[str, Any]:
        return {
            "type": "snapshot",
            "link": self.link_message(),
            "status": self.status_message() if self.status is not None else None,
            "tick": self.tick,
            "preview": self.preview,
        }

    def _restarted(self) -> None:
        if self.status is None:
            return  # the first start this page server sees is no restart
        self.restarts += 1
        self.saving.clear()
