"""The one retry backoff (daemon/backoff.py) the commit thread and the merge share."""

from __future__ import annotations

import pytest

from hilrec.daemon.backoff import FIRST_S, MAX_S, Backoff


def test_the_wait_doubles_with_each_failure_in_a_row_up_to_the_cap() -> None:
    backoff = Backoff()
    assert backoff.delay_s == FIRST_S  # before any failure: the first wait
    waits = [backoff.failed() for _ in range(8)]
    assert waits == [2.0, 4.0, 8.0, 16.0, 32.0, MAX_S, MAX_S, MAX_S]
    assert backoff.failures == 8


def test_a_success_starts_over() -> None:
    backoff = Backoff(first_s=0.5, max_s=3.0)
    backoff.failed(), backoff.failed(), backoff.failed()
    assert backoff.delay_s == 2.0
    backoff.succeeded()
    assert (backoff.failures, backoff.delay_s, backoff.failed()) == (0, 0.5, 0.5)


@pytest.mark.parametrize("first_s, max_s", [(0.0, 1.0), (-1.0, 1.0), (2.0, 1.0)])
def test_a_backoff_that_cannot_wait_is_refused(first_s: float, max_s: float) -> None:
    with pytest.raises(ValueError, match="first_s"):
        Backoff(first_s=first_s, max_s=max_s)
