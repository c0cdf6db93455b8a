"""What the daemon says while collect runs, from its telemetry: ticks, events, verdicts.

A :class:`Monitor` thread subscribes to the ``tick`` and ``event`` topics (never ``preview``) and
keeps, under a lock, what the panel and the session need: the newest tick (follower joints,
leader reading, timing, flags, faults), counts of late and skipped ticks, the recent tick
lateness for jitter percentiles, and the events that matter between takes (saved, discarded,
save failed, fault, verdict). PUB drops messages for a slow subscriber rather than slow the
daemon; a gap in ``seq`` is counted as ``dropped``, and the session reads anything it must not
miss (a verdict) from the episode's sidecar as well.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Final

import numpy as np

from hilrec.daemon.errors import ProtocolError
from hilrec.daemon.wire.client import TelemetryClient
from hilrec.daemon.wire.protocol import TOPIC_EVENT, TOPIC_TICK

log = logging.getLogger(__name__)

JITTER_WINDOW: Final[int] = 250  # ticks: 10 s at 25 Hz
# Events the session hears about (everything else is only counted).
SESSION_EVENTS: Final[frozenset[str]] = frozenset(
    {
        "episode_stopped",
        "episode_saved",
        "episode_save_failed",
        "episode_discarded",
        "episode_verdict",
        "fault",
        "fault_cleared",
        "finalized",
        "finalize_failed",
        "daemon_stopped",
    }
)


@dataclass
class LoopView:
    """The loop as the ticks show it (since collect subscribed)."""

    ticks: int = 0
    late: int = 0
    skipped_slots: int = 0
    overruns: int = 0
    dropped: int = 0  # tick messages lost on the way (seq gaps)
    late_ms: deque[float] = field(default_factory=lambda: deque(maxlen=JITTER_WINDOW))
    last_late: tuple[float, float] | None = None  # (late_ms, monotonic time) of the last late tick
    late_in_takes: int = 0
    skipped_in_takes: int = 0
    # Seconds of video waiting for the encoder processes (the tick's optional field; None when
    # the daemon does not send it), and the most seen.
    video_backlog_s: float | None = None
    max_video_backlog_s: float = 0.0

    def jitter_ms(self) -> tuple[float, float, float] | None:
        """p50, p99 and max of the recent ticks' lateness (ms)."""
        if not self.late_ms:
            return None
        values = np.fromiter(self.late_ms, dtype=np.float64)
        return float(np.percentile(values, 50)), float(np.percentile(values, 99)), float(values.max())


@dataclass
class Snapshot:
    loop: LoopView
    tick: dict[str, Any] | None
    faults: list[str]
    verdicts: dict[int, dict[str, Any]]
    connected: bool


class Monitor:
    def __init__(self, endpoint: str) -> None:
        self._client = TelemetryClient(endpoint, topics=(TOPIC_TICK, TOPIC_EVENT))
        self._lock = threading.Lock()
        self._loop = LoopView()
        self._tick: dict[str, Any] | None = None
        self._last_seq: dict[str, int] = {}
        self._verdicts: dict[int, dict[str, Any]] = {}
        self._events: deque[dict[str, Any]] = deque()
        self._stop = threading.Event()
        self._heard = threading.Event()
        self._thread = threading.Thread(target=self._run, name="collect-telemetry", daemon=True)

    def start(self) -> Monitor:
        self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5.0)
        self._client.close()

    def wait_connected(self, timeout_s: float) -> bool:
        """True once a tick has arrived (the subscription is live)."""
        return self._heard.wait(timeout_s)

    # --- views (any thread) --------------------------------------------------------------------

    def snapshot(self) -> Snapshot:
        with self._lock:
            loop = LoopView(**{k: getattr(self._loop, k) for k in LoopView.__dataclass_fields__})
            loop.late_ms = deque(self._loop.late_ms, maxlen=JITTER_WINDOW)
            tick = dict(self._tick) if self._tick is not None else None
            faults = list((tick or {}).get("faults") or [])
            return Snapshot(
                loop=loop,
                tick=tick,
                faults=faults,
                verdicts=dict(self._verdicts),
                connected=self._heard.is_set(),
            )

    def events(self) -> list[dict[str, Any]]:
        """The session events received since the last call, oldest first."""
        with self._lock:
            out = list(self._events)
            self._events.clear()
        return out

    def verdict(self, episode_index: int) -> dict[str, Any] | None:
        with self._lock:
            return self._verdicts.get(episode_index)

    # --- the thread ------------------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                message = self._client.receive(100)
            except ProtocolError as exc:
                log.warning("telemetry message refused: %s", exc)
                continue
            if message is None:
                continue
            topic, header, _ = message
            with self._lock:
                self._count_gap(topic, header.get("seq"))
                if topic == "tick":
                    self._on_tick(header)
                elif topic == "event":
                    self._on_event(header)
            if topic == "tick":
                self._heard.set()

    def _count_gap(self, topic: str, seq: Any) -> None:
        if not isinstance(seq, int):
            return
        last = self._last_seq.get(topic)
        if last is not None and seq > last + 1 and topic == "tick":
            self._loop.dropped += seq - last - 1
        self._last_seq[topic] = seq

    def _on_tick(self, tick: dict[str, Any]) -> None:
        loop = self._loop
        timing = tick.get("timing") or {}
        flags = set(tick.get("flags") or [])
        loop.ticks += 1
        late_ms = float(timing.get("late_ms") or 0.0)
        loop.late_ms.append(late_ms)
        skipped = int(timing.get("skipped") or 0)
        loop.skipped_slots += skipped
        recording = bool(tick.get("recording"))
        if "late" in flags:
            loop.late += 1
            loop.last_late = (late_ms, time.monotonic())
            loop.late_in_takes += recording
        if recording:
            loop.skipped_in_takes += skipped
        if timing.get("overrun"):
            loop.overruns += 1
        backlog = tick.get("video_backlog_s")
        if isinstance(backlog, (int, float)) and not isinstance(backlog, bool):
            loop.video_backlog_s = float(backlog)
            loop.max_video_backlog_s = max(loop.max_video_backlog_s, float(backlog))
        self._tick = tick

    def _on_event(self, event: dict[str, Any]) -> None:
        name = event.get("event")
        if name == "episode_verdict" and isinstance(event.get("episode_index"), int):
            self._verdicts[event["episode_index"]] = event
        if name in SESSION_EVENTS:
            self._events.append(event)
