"""A bounded wait on a condition: the one way a test waits for something to happen.

A test that waits must be able to fail: ``wait_until`` polls ``predicate`` until it returns a
truthy value or ``timeout`` passes, then fails with an AssertionError naming ``what`` it waited
for, how long, and the predicate's last value (or the exception it last raised), so a red run
says what did not happen instead of hanging until pytest-timeout kills the whole session.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class WaitTimeout(AssertionError):
    """``what`` did not happen within the timeout (an AssertionError: a test failure, not an error)."""


def wait_until(
    predicate: Callable[[], T],
    timeout: float,
    interval: float = 0.01,
    what: str = "the condition",
    *,
    retry_on: tuple[type[BaseException], ...] = (),
) -> T:
    """The first truthy value of ``predicate()``, polled every ``interval`` s for ``timeout`` s.

    The predicate is always called at least once, and once more at the deadline, so a wait that
    is slow to be scheduled (a loaded machine) is judged on the state at its end. Exceptions of
    ``retry_on`` count as "not yet" (a file half written, a socket not bound yet); the last one
    is named in the failure. Any other exception propagates at once.
    """
    if timeout < 0 or interval <= 0:
        raise ValueError(f"wait_until({what!r}): timeout {timeout} must be >= 0 and interval {interval} > 0")
    deadline = time.monotonic() + timeout
    last: object = None
    while True:
        at_deadline = time.monotonic() >= deadline
        try:
            value = predicate()
        except retry_on as exc:
            last = exc
        else:
            if value:
                return value
            last = value
        if at_deadline:
            raise WaitTimeout(f"timed out after {timeout:g} s waiting for {what} (last: {last!r})")
        time.sleep(min(interval, max(0.0, deadline - time.monotonic())))
