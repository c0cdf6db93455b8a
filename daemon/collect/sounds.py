"""Spoken prompts for the operator, whose eyes are on the arm: optional and never fatal.

"recording episode 3", "reset", "done": spoken by ``espeak-ng`` or ``spd-say`` when one is
installed (found with ``shutil.which``), else the terminal bell. Each prompt runs in the
background (``Popen``, its output discarded, in its own session so Ctrl-C never reaches it) and is
never waited on; finished ones are reaped on the next prompt. A missing or failing speech program
is never an error: the prompt falls back to the bell, or to nothing with ``--no-sounds``.
"""

from __future__ import annotations

import logging
import shutil
import subprocess
import sys
from typing import IO, Final

log = logging.getLogger(__name__)

# Speech programs in order of preference, and how each is told to speak a sentence.
SPEAKERS: Final[dict[str, tuple[str, ...]]] = {
    "espeak-ng": ("espeak-ng", "-s", "170"),
    "spd-say": ("spd-say", "--wait"),
}


class Speaker:
    """``say(text)`` returns at once; the sound happens in the background."""

    def __init__(self, *, enabled: bool = True, bell_stream: IO[str] | None = None) -> None:
        self.enabled = enabled
        self._bell = bell_stream if bell_stream is not None else sys.stdout
        self._running: list[subprocess.Popen[bytes]] = []
        self.program: str | None = None
        if enabled:
            for name, argv in SPEAKERS.items():
                path = shutil.which(name)
                if path is not None:
                    self.program = name
                    self._argv: tuple[str, ...] = (path, *argv[1:])
                    break
        self.spoken: list[str] = []  # what was said (or belled), for the summary and the tests

    @property
    def describe(self) -> str:
        if not self.enabled:
            return "off (--no-sounds)"
        return f"spoken by {self.program}" if self.program else "terminal bell (no espeak-ng or spd-say)"

    def say(self, text: str) -> None:
        if not self.enabled:
            return
        self._reap()
        self.spoken.append(text)
        if self.program is not None:
            try:
                self._running.append(
                    subprocess.Popen(
                        [*self._argv, text],
                        stdin=subprocess.DEVNULL,
                        stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL,
                        start_new_session=True,
                    )
                )
                return
            except OSError as exc:  # gone since which(), not executable...: the bell instead
                log.debug("%s failed (%s); using the bell", self.program, exc)
                self.program = None
        self.bell()

    def bell(self) -> None:
        if not self.enabled:
            return
        try:
            if self._bell.isatty():
                self._bell.write("\a")
                self._bell.flush()
        except (OSError, ValueError):
            pass

    def close(self) -> None:
        """Reap what has finished; a prompt still speaking is left to finish on its own."""
        self._reap()

    def _reap(self) -> None:
        self._running = [p for p in self._running if p.poll() is None]
