"""Text that goes into a dataset: what a task string may be, checked once at every edge.

A task becomes a row of ``meta/tasks.parquet``, a key LeRobot looks frames up by, a field of
JSON sidecars and a line on an operator's screen. A string that cannot be written as UTF-8 (a
lone surrogate such as ``"\\ud800"``, which JSON and Python both accept) would be acknowledged
and then fail every later write of those files, so it is refused where it arrives: at the control
socket, at ``hilrec record --sim`` and at the dataset writer.

The limits: 1 to 1000 characters, not only white space, valid Unicode (encodes to UTF-8 and back
unchanged), and no control characters (U+0000-U+001F, U+007F-U+009F): a task is one line.
"""

from __future__ import annotations

import unicodedata
from typing import Final

MAX_TASK_CHARS: Final[int] = 1000
# The task of a take nobody named (``hilrec record --sim``, ``hilrec collect``, ``hilrec eval``).
DEFAULT_TASK: Final[str] = "Pick up the red cube and place it in the blue bin."


def task_problem(task: object) -> str | None:
    """Why ``task`` cannot be a task string, or None when it can."""
    if not isinstance(task, str):
        return f"must be a string, got {type(task).__name__}"
    if not task.strip():
        return "must not be empty or only white space"
    if len(task) > MAX_TASK_CHARS:
        return f"must be at most {MAX_TASK_CHARS} characters, got {len(task)}"
    try:
        round_trip = task.encode("utf-8").decode("utf-8")
    except UnicodeEncodeError as exc:
        return f"is not valid Unicode: {exc.object[exc.start]!r} at character {exc.start} cannot be UTF-8"
    if round_trip != task:  # pragma: no cover - UTF-8 round-trips every encodable string
        return "does not survive a UTF-8 round trip"
    for index, char in enumerate(task):
        if unicodedata.category(char) == "Cc":
            return f"must be one line without control characters, got {char!r} at character {index}"
    return None
