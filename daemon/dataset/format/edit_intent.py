"""The record an unfinished ``hilrec edit`` leaves in each ``--out`` folder it writes.

``hilrec/edit-intent.json`` names the command (as a line to run again), its inputs and outputs,
which part of them this folder is, and a digest of the inputs; ``state`` says how far the folder
got:

- ``building``: the folder holds only the edit's lock and this record (the result is written
  beside it and swapped in once checked);
- ``done``: the folder is a complete, checked part of an edit with several outputs (``split``),
  some of which may still be missing.

The edit removes the records once every output is complete. Rerunning the same command reads
them to finish the work (parts already done are kept, a half-built one is started over);
``hilrec check`` reads them to say what the folder is and which command to run. This module is
the file; the policy is :mod:`hilrec.daemon.tools.edit_resume`.
"""

from __future__ import annotations

import os
from enum import StrEnum
from pathlib import Path
from typing import Any, Final

from hilrec.daemon.atomic import atomic_write_json, fsync_dir, read_json
from hilrec.daemon.errors import CorruptDatasetError

EDIT_INTENT_PATH: Final[str] = "hilrec/edit-intent.json"


class IntentState(StrEnum):
    BUILDING = "building"
    DONE = "done"


def edit_intent_path(root: str | os.PathLike[str]) -> Path:
    return Path(root) / EDIT_INTENT_PATH


def load_edit_intent(root: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The record in ``root``, or None; an unreadable one is returned as ``{"unreadable": why}``."""
    try:
        record = read_json(edit_intent_path(root), what="edit intent", if_missing=None)
    except CorruptDatasetError as exc:
        return {"unreadable": str(exc)}
    if record is not None and not isinstance(record, dict):
        return {"unreadable": f"{EDIT_INTENT_PATH} holds {type(record).__name__}, not an object"}
    return record


def write_edit_intent(root: str | os.PathLike[str], record: dict[str, Any]) -> None:
    path = edit_intent_path(root)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(path, record)


def remove_edit_intent(root: str | os.PathLike[str]) -> None:
    """Drop the record (and its ``hilrec/`` folder when that is all the folder held)."""
    path = edit_intent_path(root)
    if not path.exists():
        return
    path.unlink()
    fsync_dir(path.parent)


def describe_intent(record: dict[str, Any]) -> str:
    """What the folder holding ``record`` is, and what to run, for a person."""
    if "unreadable" in record:
        why = record["unreadable"]
        return f"{EDIT_INTENT_PATH} cannot be read ({why}); delete the folder and run the edit again"
    command = record.get("command_line") or f"hilrec edit {record.get('command', '?')}"
    if record.get("state") == IntentState.DONE:
        part = f"{int(record.get('part', 0)) + 1} of {record.get('parts', '?')}"
        return (
            f"a complete part ({part}) of `{command}`, "
            "which ended before it wrote the others; run that command again to finish them"
        )
    return (
        f"not a dataset yet: the unfinished output of `{command}`, which ended before it finished; "
        "run that command again to finish it (or delete this folder and start over)"
    )
