"""Faults an emulated arm can be told to show, chosen per run (CLI) or injected live (tests).

Event faults act on single replies or packets:

- ``drop``: a servo does not answer (the client times out);
- ``corrupt``: a reply's checksum is wrong (the SDK reports "Incorrect status packet");
- ``late``: a reply leaves ``delay_ms`` late, after the client gave up, and lands in its buffer
  (what a loaded host does to a reply; the replies after it on the line wait behind it);
- ``echo``: the adapter echoes every instruction back, as some half-duplex adapters do.

Conditions hold from when they start until cleared:

- ``overload`` / ``voltage``: the servo reports those error bits (status packets and the Status
  register); overload also unloads its torque;
- ``missing``: the servo is not on the bus at all, not even for PING;
- ``vanish``: the port disappears (the pty closes under the client), like a pulled USB cable.

Selectors: ``id`` (a servo id; default every servo), ``after`` (let that many matching events
pass first; for conditions, instruction packets), ``count`` (fire that many times; default
always), ``p`` (fire with that probability, from the plan's seeded generator), ``delay_ms``
(late), ``after_s`` (vanish after that many seconds). CLI syntax: ``KIND[:key=value,...]``,
e.g. ``drop:id=3,count=2`` or ``vanish:after_s=5``.
"""

from __future__ import annotations

import random
import threading
from collections import Counter
from dataclasses import dataclass, fields
from typing import Any, Final, Literal, get_args

from hilrec.daemon.errors import ConfigError
from hilrec.drivers.tables import StatusBit

FaultKind = Literal["drop", "corrupt", "late", "echo", "overload", "voltage", "missing", "vanish"]
EVENT_KINDS: Final[frozenset[str]] = frozenset({"drop", "corrupt", "late", "echo"})
CONDITION_BITS: Final[dict[str, int]] = {"overload": StatusBit.OVERLOAD, "voltage": StatusBit.VOLTAGE}
ReplyFate = Literal["send", "drop", "corrupt", "late"]


@dataclass(frozen=True, kw_only=True)
class Fault:
    kind: FaultKind
    servo_id: int | None = None
    after: int = 0
    count: int | None = None
    probability: float = 1.0
    delay_ms: float = 60.0
    after_s: float | None = None

    def __post_init__(self) -> None:
        if self.kind not in get_args(FaultKind):
            raise ConfigError(
                "fault.kind", f"unknown fault {self.kind!r} (known: {', '.join(get_args(FaultKind))})"
            )
        if not 0.0 < self.probability <= 1.0:
            raise ConfigError("fault.p", f"probability must be in (0, 1], got {self.probability}")
        if self.after < 0 or (self.count is not None and self.count < 1):
            raise ConfigError("fault.count", "after must be >= 0 and count >= 1")
        if self.kind == "late" and self.delay_ms <= 0:
            raise ConfigError("fault.delay_ms", f"a late reply needs a positive delay, got {self.delay_ms}")
        if self.kind == "missing" and self.servo_id is None:
            raise ConfigError("fault.id", "'missing' needs the id of the servo to remove")

    def matches(self, servo_id: int | None) -> bool:
        return self.servo_id is None or servo_id is None or self.servo_id == servo_id


_KEYS: Final[dict[str, tuple[str, type]]] = {
    "id": ("servo_id", int),
    "after": ("after", int),
    "count": ("count", int),
    "p": ("probability", float),
    "delay_ms": ("delay_ms", float),
    "after_s": ("after_s", float),
}


def parse_fault(text: str) -> Fault:
    """``drop:id=3,count=2`` -> Fault(kind='drop', servo_id=3, count=2); errors name the key."""
    kind, _, rest = text.partition(":")
    # Any: each key's value has its own type (cast below); Fault checks the kind itself.
    values: dict[str, Any] = {"kind": kind.strip()}
    for item in filter(None, (part.strip() for part in rest.split(","))):
        key, sep, raw = item.partition("=")
        if not sep or key not in _KEYS:
            raise ConfigError(
                f"--fault {text}", f"expected key=value with key in {', '.join(_KEYS)}, got {item!r}"
            )
        name, cast = _KEYS[key]
        try:
            values[name] = cast(raw)
        except ValueError:
            raise ConfigError(f"--fault {text}", f"{key} must be a {cast.__name__}, got {raw!r}") from None
    return Fault(**values)


def describe(fault: Fault) -> str:
    defaults = {f.name: f.default for f in fields(Fault)}
    extras = [
        f"{k}={getattr(fault, k)}" for k in defaults if k != "kind" and getattr(fault, k) != defaults[k]
    ]
    return fault.kind + (":" + ",".join(extras) if extras else "")


class FaultPlan:
    """The active faults of one emulated bus, decided event by event; safe to change live."""

    def __init__(self, faults: tuple[Fault, ...] = (), *, seed: int = 0) -> None:
        self._lock = threading.Lock()
        self._faults: list[Fault] = []
        self._matched: Counter[int] = Counter()
        self._fired: Counter[int] = Counter()
        self._rng = random.Random(seed)
        self.fired: Counter[str] = Counter()  # kind -> times it acted, for tests and logs
        self.packets_seen = 0
        self.fired_event = threading.Condition(self._lock)
        for fault in faults:
            self.add(fault)

    def add(self, fault: Fault) -> None:
        with self._lock:
            self._faults.append(fault)
            key = id(fault)
            self._matched[key] = self._fired[key] = 0

    def clear(self) -> None:
        with self._lock:
            self._faults.clear()

    @property
    def faults(self) -> tuple[Fault, ...]:
        with self._lock:
            return tuple(self._faults)

    def _fire(self, fault: Fault) -> bool:
        key = id(fault)
        self._matched[key] += 1
        if self._matched[key] <= fault.after:
            return False
        if fault.count is not None and self._fired[key] >= fault.count:
            return False
        if fault.probability < 1.0 and self._rng.random() >= fault.probability:
            return False
        self._fired[key] += 1
        self.fired[fault.kind] += 1
        self.fired_event.notify_all()
        return True

    def packet_received(self) -> None:
        with self._lock:
            self.packets_seen += 1

    def echo(self) -> bool:
        with self._lock:
            return any(self._fire(f) for f in self._faults if f.kind == "echo")

    def reply_fate(self, servo_id: int) -> tuple[ReplyFate, float]:
        """What happens to this servo's next reply: sent, dropped, corrupted, or late (+ delay)."""
        with self._lock:
            for fault in self._faults:
                if (
                    fault.kind in ("drop", "corrupt", "late")
                    and fault.matches(servo_id)
                    and self._fire(fault)
                ):
                    delay = fault.delay_ms / 1000.0 if fault.kind == "late" else 0.0
                    return fault.kind, delay
        return "send", 0.0

    def _active(self, fault: Fault) -> bool:
        return self.packets_seen >= fault.after

    def condition_bits(self, servo_id: int) -> int:
        with self._lock:
            bits = 0
            for fault in self._faults:
                if fault.kind in CONDITION_BITS and fault.matches(servo_id) and self._active(fault):
                    bits |= CONDITION_BITS[fault.kind]
            return bits

    def is_missing(self, servo_id: int) -> bool:
        with self._lock:
            return any(
                f.kind == "missing" and f.servo_id == servo_id and self._active(f) for f in self._faults
            )

    def vanish_due(self, elapsed_s: float) -> bool:
        with self._lock:
            for fault in self._faults:
                if fault.kind != "vanish":
                    continue
                if fault.after_s is not None and elapsed_s >= fault.after_s:
                    return True
                if fault.after_s is None and self._active(fault):
                    return True
            return False

    def next_vanish_time(self) -> float | None:
        with self._lock:
            times = [f.after_s for f in self._faults if f.kind == "vanish" and f.after_s is not None]
            return min(times) if times else None

    def record(self, event: str) -> None:
        """Count something the emulator did (e.g. 'late_written') and wake waiters."""
        with self._lock:
            self.fired[event] += 1
            self.fired_event.notify_all()

    def wait_fired(self, kind: str, times: int = 1, timeout: float = 5.0) -> bool:
        """Block until ``kind`` has acted ``times`` times (tests wait on this, never sleep)."""
        with self._lock:
            return self.fired_event.wait_for(lambda: self.fired[kind] >= times, timeout)
