"""One exponential backoff for the retries hilrec makes on its own (a held commit, a failed merge).

The first retry waits :data:`FIRST_S`; every further failure in a row doubles the wait, up to
:data:`MAX_S`; a success starts over. A full disk is then retried every few seconds at first,
and at most once a minute while it stays full, never in a tight loop.
"""

from __future__ import annotations

from typing import Final

FIRST_S: Final[float] = 2.0
MAX_S: Final[float] = 60.0


class Backoff:
    """The wait before the next attempt after ``failures`` failures in a row (not thread-safe:
    its owner's lock or thread guards it)."""

    def __init__(self, first_s: float = FIRST_S, max_s: float = MAX_S) -> None:
        if not 0 < first_s <= max_s:
            raise ValueError(f"a backoff needs 0 < first_s <= max_s, got {first_s} and {max_s}")
        self.first_s = first_s
        self.max_s = max_s
        self.failures = 0

    @property
    def delay_s(self) -> float:
        """The wait before the next attempt: ``first_s`` after one failure (or none), doubling."""
        return min(self.max_s, self.first_s * 2 ** max(0, self.failures - 1))

    def failed(self) -> float:
        """Count one more failure in a row; the wait before the next attempt."""
        self.failures += 1
        return self.delay_s

    def succeeded(self) -> None:
        self.failures = 0
