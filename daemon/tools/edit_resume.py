"""Rerunning a ``hilrec edit`` that ended early finishes it: the records of its ``--out`` folders.

An edit writing to ``--out`` puts a record (:mod:`hilrec.daemon.dataset.format.edit_intent`) in
the folder before it builds anything, and, for an edit of several outputs (``split``), in each
part it completes. Killed anywhere, it leaves every ``--out`` folder missing, half-built (its lock
and the record ``building``) or complete (the record ``done`` while other parts are missing).
Run again with the same inputs, outputs and arguments (:meth:`Intent.same_edit`, which also
compares a digest of the inputs), it keeps the parts that are done, starts the half-built one
over, and removes the records once every part is there (killed while it removed them, a part
without its record is known as done by the record still in another). A folder holding another
edit's record, or the inputs changed since, is refused, naming what the folder is and which
command made it; a folder holding a dataset and no record (a finished output among them) is
refused as not empty: an edit never writes over a dataset it cannot prove is its own.
"""

from __future__ import annotations

import hashlib
import os
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from hilrec.daemon.dataset import (
    EDIT_INTENT_PATH,
    LOCK_NAME,
    IntentState,
    describe_intent,
    holds_only_edit_files,
    load_edit_intent,
)
from hilrec.daemon.errors import DatasetStateError

_META_DIR = "meta"
# What makes two runs the same edit: a record holding these as this run has them is this edit's.
_IDENTITY = ("command_line", "inputs", "outs", "part", "inputs_digest")


@dataclass(frozen=True, kw_only=True)
class Intent:
    """What one ``--out`` folder of an edit is to become."""

    command: str
    command_line: str
    inputs: tuple[str, ...]
    outs: tuple[str, ...]
    part: int
    digest: str

    @classmethod
    def of(
        cls, command: str, roots: Sequence[Path], outs: Sequence[Path], target: Path, flags: Sequence[str]
    ) -> Intent:
        inputs = tuple(str(Path(r).absolute()) for r in roots)
        out_paths = tuple(str(Path(o).absolute()) for o in outs)
        line = shlex.join(["hilrec", "edit", command, *map(str, roots), "--out", *map(str, outs), *flags])
        return cls(
            command=command,
            command_line=line,
            inputs=inputs,
            outs=out_paths,
            part=out_paths.index(str(Path(target).absolute())),
            digest=inputs_digest(roots),
        )

    @property
    def parts(self) -> int:
        return len(self.outs)

    def record(self, state: IntentState) -> dict[str, Any]:
        return {
            "state": state.value,
            "command": self.command,
            "command_line": self.command_line,
            "inputs": list(self.inputs),
            "outs": list(self.outs),
            "part": self.part,
            "parts": self.parts,
            "inputs_digest": self.digest,
        }

    def same_edit(self, record: dict[str, Any]) -> bool:
        mine = self.record(IntentState.BUILDING)
        return all(record.get(k) == mine[k] for k in _IDENTITY)

    def finishing_began(self) -> bool:
        """Whether another output of this edit is a done part of it: every part was written, and
        a run that was removing the parts' records (:func:`finish_parts`) ended before the last."""
        for part, out in enumerate(self.outs):
            if part == self.part:
                continue
            record = load_edit_intent(out)
            if (
                record is not None
                and record.get("state") == IntentState.DONE
                and replace(self, part=part).same_edit(record)
            ):
                return True
        return False


def inputs_digest(roots: Sequence[Path]) -> str:
    """A digest of the inputs: every file's path and size, and the content of ``meta/`` (which
    every writer of a dataset rewrites when it changes anything)."""
    digest = hashlib.sha256()
    for given in roots:
        root = Path(given)
        digest.update(f"root {root.absolute()}\n".encode())
        for directory, dirs, files in os.walk(root):
            dirs.sort()
            here = Path(directory)
            for name in sorted(files):
                path = here / name
                rel = path.relative_to(root).as_posix()
                if name == LOCK_NAME or rel == EDIT_INTENT_PATH:
                    continue
                digest.update(f"{rel}\0{path.stat().st_size}\n".encode())
                if rel.startswith(_META_DIR + "/"):
                    digest.update(path.read_bytes())
    return digest.hexdigest()


def prior_part(intent: Intent, target: Path) -> bool:
    """Whether ``target`` is this edit's part, done by an earlier run; raises when ``target``
    holds anything that is not this edit's (a dataset, another edit's work)."""
    if not os.path.lexists(target) or holds_only_edit_files(target):
        return False  # new, or a half-built folder: (re)built from the start
    record = load_edit_intent(target)
    if record is None:
        if intent.finishing_began():
            return True  # a complete part whose record that run had already removed
        raise DatasetStateError(f"--out {target} exists and is not empty; give a new folder")
    if not intent.same_edit(record):
        changed = record.get("command_line") == intent.command_line
        why = "its inputs changed since" if changed else f"this is `{intent.command_line}`"
        raise DatasetStateError(
            f"--out {target} is {describe_intent(record)}; {why}, so it is not finished by this run "
            "(delete the folder to start over)"
        )
    if record.get("state") != IntentState.DONE:
        raise DatasetStateError(f"--out {target}: {describe_intent(record)}")
    return True
