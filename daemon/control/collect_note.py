"""The latest ``session_note`` a ``collect`` session sent, and whether it still describes the bench.

collect tells the daemon its phase, take i of N and countdown (``session_note``) whenever it
polls status, about twice a second, so the pages beside it (``hilrec ui``) show the session and
not only the daemon's idle/recording. The daemon keeps the newest note with its own monotonic
time of arrival and turns the countdown into a deadline on its own clock: no clock of collect's
is trusted. A note is reported only while it is live: one that has not been renewed for
:data:`NOTE_TTL_S` (collect went away, or hung) or whose countdown ended more than
:data:`NOTE_GRACE_S` ago is dropped from status, so nothing stale looks current.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, Final

NOTE_TTL_S: Final[float] = 5.0
NOTE_GRACE_S: Final[float] = 3.0


class CollectNotes:
    def __init__(self, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._note: dict[str, Any] | None = None
        self._at = 0.0
        self._ends_at: float | None = None

    def note(self, args: Mapping[str, Any]) -> dict[str, Any]:
        """Keep a checked note (its arguments as parsed); the reply's fields."""
        now = self._clock()
        left = args.get("seconds_left")
        with self._lock:
            self._note = {k: args.get(k) for k in ("phase", "take", "takes", "task")}
            self._at = now
            self._ends_at = None if left is None else now + float(left)
        return {"noted": True}

    def status(self) -> dict[str, Any] | None:
        """The live note for status: phase, take (1-based), takes, task, seconds_left, age_s."""
        now = self._clock()
        with self._lock:
            if self._note is None:
                return None
            stale = now - self._at > NOTE_TTL_S or (
                self._ends_at is not None and now > self._ends_at + NOTE_GRACE_S
            )
            if stale:
                self._note = None
                return None
            left = None if self._ends_at is None else max(0.0, self._ends_at - now)
            return {**self._note, "seconds_left": left, "age_s": now - self._at}
