"""compat-latest: what root_load.py and root_write.py share (inside the Python 3.13 root)."""

from __future__ import annotations

import logging
import sys
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any


class Results:
    """PASS/FAIL lines, then the closing 'N passed, N failed' line; exit 1 on any failure."""

    def __init__(self) -> None:
        self.passed = 0
        self.failed = 0

    def check(self, name: str, ok: bool, detail: str = "") -> bool:
        if ok:
            self.passed += 1
            print(f"PASS {name}")
        else:
            self.failed += 1
            print(f"FAIL {name}: {detail}")
        return ok

    def run(self, name: str, test: Callable[[], Any]) -> Any:
        """``test()``; an exception is one failure, reported with its last frames."""
        try:
            return test()
        except Exception as exc:  # noqa: BLE001 - a broken case must not hide the others
            where = traceback.extract_tb(exc.__traceback__)[-1]
            message = str(exc) if len(str(exc)) <= 300 else f"{str(exc)[:300]}..."
            self.check(name, False, f"{type(exc).__name__}: {message} ({where.filename}:{where.lineno})")
            return None

    def finish(self) -> None:
        print(f"{self.passed} passed, {self.failed} failed")
        sys.stdout.flush()
        sys.exit(1 if self.failed else 0)


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(f"{record.name}: {record.getMessage()}")


@contextmanager
def warnings_logged() -> Iterator[list[str]]:
    """The WARNING+ log records emitted inside the block (LeRobot logs through ``logging``)."""
    handler = _Collect()
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        yield handler.messages
    finally:
        root.removeHandler(handler)
