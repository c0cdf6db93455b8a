"""Module-level tasks for the fan-out tests: a spawned worker imports them by name."""

from __future__ import annotations

import os
import signal

from hilrec.daemon.errors import CorruptDatasetError, SimError


def square_or_fail(item: int) -> tuple[int, int]:
    """``item`` squared with the worker's pid; -1 and -2 raise, -9 SIGKILLs its worker process,
    -5 never returns (it waits for a signal nobody sends)."""
    if item == -1:
        raise SimError(f"item {item} refused")
    if item == -2:  # an error whose __init__ is not (message): it does not unpickle
        raise CorruptDatasetError(f"item-{item}.parquet", "no footer")
    if item == -9:
        os.kill(os.getpid(), signal.SIGKILL)
    if item == -5:
        signal.pause()
    return item * item, os.getpid()
