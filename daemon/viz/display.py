"""The daemon's telemetry, live, into rerun: a SUB client of the telemetry socket, like ``hilrec ui``.

It runs in a process of its own and only reads the PUB socket, so the loop gains no work and a
slow viewer never delays a tick: a subscriber that does not keep up loses messages (the PUB
socket's high-water mark drops them, counted here from the per-topic ``seq`` gaps).

Entity paths:

- ``camera/<name>``: the preview JPEGs (``telemetry.preview_hz``), logged as they come (encoded);
- ``state/<joint>``, ``action/<joint>``, ``leader/<joint>``, ``twin/<joint>``: per tick (a two-arm
  daemon's twelve grouped per arm, ``state/left/<joint>``, as ``hilrec view`` logs them);
- ``divergence/<kind>/<joint>``: ``commanded_vs_measured``, ``measured_vs_twin``, ``commanded_vs_twin``;
- ``timing/late_ms``, ``timing/duration_ms``: the loop's tick timing;
- ``flags/text``: the frame flags of the ticks that have any; ``faults``: fault events and changes
  of the faulted devices; ``verdicts``: per-take verdicts (``episode_verdict``); ``events``:
  every event as text; ``telemetry/dropped``: messages this subscriber missed, cumulative.

Timelines: ``tick`` (the pacer's slot), ``time`` (the tick's start, the daemon's monotonic
seconds), and ``frame`` (the dataset row, while recording).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from hilrec.daemon.dataset import EpisodeVerdict
from hilrec.daemon.errors import HilrecError
from hilrec.daemon.so101 import NUM_JOINTS, arm_groups, joint_names
from hilrec.daemon.viz.view import series_paths
from hilrec.daemon.wire.client import ClientKeys, TelemetryClient

log = logging.getLogger(__name__)

DIVERGENCES = ("commanded_vs_measured", "measured_vs_twin", "commanded_vs_twin")
JOINT_SERIES = ("state", "action", "leader", "twin")
VERDICT_LEVELS: dict[str, str] = {
    EpisodeVerdict.SOUND: "INFO",
    EpisodeVerdict.WARNING: "WARN",
    EpisodeVerdict.BAD: "ERROR",
}
RECEIVE_TIMEOUT_MS = 200
DRAIN_S = 2.0
SILENCE_S = 5.0  # a daemon publishes ticks at its fps: this long without one, nothing is there


@dataclass
class DisplaySummary:
    """What was logged: entity path -> messages logged to it, and what was missed."""

    entities: Counter[str] = field(default_factory=Counter)
    received: Counter[str] = field(default_factory=Counter)
    dropped: int = 0
    refused: int = 0


class Display:
    """Reads telemetry and logs it to ``recording`` until ``stop`` is set (or ``duration_s``)."""

    def __init__(self, rr: Any, recording: Any, endpoint: str, *, keys: ClientKeys | None = None) -> None:
        self.rr = rr
        self.recording = recording
        self.endpoint = endpoint
        self.keys = keys
        self.summary = DisplaySummary()
        self._last_seq: dict[str, int] = {}
        self._faults: tuple[str, ...] = ()
        self._tick: tuple[int, float] | None = None  # (slot, start) of the newest tick

    def run(self, stop: threading.Event, duration_s: float | None = None) -> DisplaySummary:
        client = TelemetryClient(self.endpoint, keys=self.keys)
        ends = None if duration_s is None else time.monotonic() + duration_s
        last, said = time.monotonic(), False
        try:
            while not stop.is_set() and (ends is None or time.monotonic() < ends):
                try:
                    message = client.receive(RECEIVE_TIMEOUT_MS)
                except HilrecError as exc:  # a message that does not parse: skip it
                    self.summary.refused += 1
                    log.warning("telemetry message refused: %s", exc)
                    continue
                if message is None:
                    if not said and time.monotonic() - last >= SILENCE_S:
                        said = True  # once per silence: a SUB socket cannot tell "no daemon" apart
                        print(self._silence_line(), flush=True)
                    continue
                last, said = time.monotonic(), False
                first_tick = message[0] == "tick" and not self.summary.received["tick"]
                self.handle(*message)
                if first_tick:  # what waits for this line wants the joints logged, not an event
                    print("hilrec display: receiving", flush=True)
            self._drain(client)
        finally:
            client.close()
        return self.summary

    def _silence_line(self) -> str:
        if not any(self.summary.received.values()):
            return (
                f"hilrec display: nothing received from {self.endpoint} in {SILENCE_S:.0f} s: is a daemon "
                "running there (hilrec daemon --config FILE, with its [zmq] telemetry_port)? Still listening"
            )
        return f"hilrec display: nothing received from {self.endpoint} for {SILENCE_S:.0f} s; still listening"

    def _drain(self, client: TelemetryClient) -> None:
        """What is already queued when the display is told to stop (the session's last ticks,
        the saved take, its verdict) still goes into the view; at most :data:`DRAIN_S`."""
        ends = time.monotonic() + DRAIN_S
        while time.monotonic() < ends:
            try:
                message = client.receive(0)
            except HilrecError:
                self.summary.refused += 1
                continue
            if message is None:
                return
            self.handle(*message)

    # --- one message --------------------------------------------------------------------------

    def handle(self, topic: str, header: dict[str, Any], frames: list[bytes]) -> None:
        self.summary.received[topic] += 1
        self._count_gap(topic, header.get("seq"))
        if topic == "tick":
            self._on_tick(header)
        elif topic == "preview":
            self._on_preview(header, frames)
        elif topic == "event":
            self._on_event(header)

    def _log(self, path: str, entity: Any) -> None:
        self.rr.log(path, entity, recording=self.recording)
        self.summary.entities[path] += 1

    def _scalar(self, path: str, value: Any) -> None:
        if isinstance(value, int | float) and not isinstance(value, bool):
            self._log(path, self.rr.Scalars(float(value)))

    def _joints(self, prefix: str, values: Any) -> None:
        if isinstance(values, list) and arm_groups(len(values)) is not None:
            names = list(joint_names(len(values) // NUM_JOINTS))
            for path, value in zip(series_paths(prefix, names), values, strict=True):
                self._scalar(path, value)

    def _set_time(self, frame_index: Any = None) -> None:
        rr = self.rr
        rr.reset_time(recording=self.recording)
        if self._tick is not None:
            rr.set_time("tick", sequence=self._tick[0], recording=self.recording)
            rr.set_time("time", duration=self._tick[1], recording=self.recording)
        if isinstance(frame_index, int):
            rr.set_time("frame", sequence=frame_index, recording=self.recording)

    def _count_gap(self, topic: str, seq: Any) -> None:
        if not isinstance(seq, int):
            return
        last = self._last_seq.get(topic)
        self._last_seq[topic] = seq
        if last is not None and seq > last + 1:
            self.summary.dropped += seq - last - 1
            self._set_time()
            self._scalar("telemetry/dropped", self.summary.dropped)

    def _on_tick(self, h: dict[str, Any]) -> None:
        timing = h.get("timing") or {}
        slot, start = h.get("slot"), timing.get("start")
        if isinstance(slot, int) and isinstance(start, int | float):
            self._tick = (slot, float(start))
        self._set_time(h.get("frame_index"))
        for series in JOINT_SERIES:
            self._joints(series, h.get(series))
        divergence = h.get("divergence") or {}
        for kind in DIVERGENCES:
            self._joints(f"divergence/{kind}", divergence.get(kind))
        self._scalar("timing/late_ms", timing.get("late_ms"))
        self._scalar("timing/duration_ms", timing.get("duration_ms"))
        flags = h.get("flags") or []
        if flags:
            self._log("flags/text", self.rr.TextLog(", ".join(map(str, flags)), level="WARN"))
        faults = tuple(sorted(map(str, h.get("faults") or [])))
        if faults != self._faults:
            text = f"faulted: {', '.join(faults)}" if faults else "no device faulted"
            self._log("faults", self.rr.TextLog(text, level="ERROR" if faults else "INFO"))
            self._faults = faults

    def _on_preview(self, h: dict[str, Any], frames: list[bytes]) -> None:
        self._set_time(h.get("frame_index"))
        for camera, data in zip(h.get("cameras") or [], frames, strict=False):
            name = str(camera.get("name", "camera")) if isinstance(camera, dict) else "camera"
            self._log(f"camera/{name}", self.rr.EncodedImage(contents=data, media_type="image/jpeg"))

    def _on_event(self, h: dict[str, Any]) -> None:
        self._set_time(h.get("frame_index"))
        name = str(h.get("event"))
        fields = {k: v for k, v in h.items() if k not in ("v", "type", "seq", "event", "t_wall", "details")}
        text = f"{name} " + " ".join(f"{k}={v}" for k, v in fields.items())
        self._log("events", self.rr.TextLog(text.strip()))
        if name in ("fault", "fault_cleared"):
            self._log("faults", self.rr.TextLog(text, level="ERROR" if name == "fault" else "INFO"))
        elif name == "episode_verdict":
            verdict = str(h.get("verdict"))
            line = f"episode {h.get('episode_index')}: {verdict}: {h.get('summary')}"
            self._log("verdicts", self.rr.TextLog(line, level=VERDICT_LEVELS.get(verdict, "WARN")))
