"""A program under test in a pseudo-terminal: keys in, screen text out, every wait bounded.

pexpect spawns it on a pty; a thread reads everything it prints (a live panel redraws several
times a second, and a pty whose output is not read blocks the writer), and :meth:`wait_for`
waits on that text, ANSI codes stripped, for a pattern after the last one found.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Sequence

import pexpect

_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*([@-~])|\x1b[()][0-9A-Za-z]|\x1b[=>78]|\r")
# Cursor moves and erasures end a line of the screen (a redraw of the live panel starts anew).
_LINE_BREAKS = frozenset("ABEFHJK")


def plain(data: str) -> str:
    """Terminal output as text: styles dropped, cursor moves and erasures as line breaks."""
    return _ANSI.sub(lambda m: "\n" if m.group(1) and m.group(1) in _LINE_BREAKS else "", data)


class Terminal:
    def __init__(self, argv: Sequence[str], *, env: dict[str, str] | None = None) -> None:
        self.child = pexpect.spawn(
            argv[0], list(argv[1:]), env=env, dimensions=(50, 160), encoding="utf-8", codec_errors="replace"
        )
        self._raw: list[str] = []
        self._text = ""
        self._cursor = 0
        self._cond = threading.Condition()
        self._eof = False
        self._carry = ""  # an escape sequence cut off at the end of a read
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        while True:
            try:
                data = self.child.read_nonblocking(4096, timeout=0.2)
            except pexpect.TIMEOUT:
                continue
            except (pexpect.EOF, OSError):  # OSError: closed under us by close()
                break
            data, self._carry = self._carry + data, ""
            cut = data.rfind("\x1b")
            if cut != -1 and not _ANSI.match(data, cut):
                data, self._carry = data[:cut], data[cut:]
            with self._cond:
                self._raw.append(data)
                self._text += plain(data)
                self._cond.notify_all()
        with self._cond:
            self._eof = True
            self._cond.notify_all()

    @property
    def text(self) -> str:
        with self._cond:
            return self._text

    def wait_for(self, pattern: str, timeout_s: float) -> re.Match[str]:
        """The first match of ``pattern`` after the previous match; AssertionError at the timeout."""
        regex = re.compile(pattern)
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while True:
                match = regex.search(self._text, self._cursor)
                if match is not None:
                    self._cursor = match.end()
                    return match
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self._eof:
                    raise AssertionError(
                        f"{pattern!r} not printed within {timeout_s} s (eof {self._eof}); "
                        f"the lines printed so far:\n{self.lines()}\nthe screen ends:\n{self._text[-3000:]}"
                    )
                self._cond.wait(min(remaining, 0.5))

    def lines(self) -> str:
        """What was printed outside the live panel (its lines are framed by box characters)."""
        return "\n".join(ln for ln in self._text.splitlines() if ln.strip() and ln.lstrip()[:1] not in "│╭╰")

    def send(self, keys: str) -> None:
        self.child.send(keys)

    def wait_exit(self, timeout_s: float) -> int:
        deadline = time.monotonic() + timeout_s
        while self.child.isalive():
            if time.monotonic() > deadline:
                self.child.kill(9)
                raise AssertionError(f"still running after {timeout_s} s:\n{self.text[-4000:]}")
            time.sleep(0.05)  # polling a process that has been told to finish
        self._thread.join(5)
        self.child.close()
        return int(self.child.exitstatus if self.child.exitstatus is not None else -1)

    def close(self) -> None:
        """SIGTERM (collect saves, finalizes and stops its daemon), SIGKILL if that takes too long
        (its daemon then gets SIGTERM from the kernel: collect asks for that when it starts it)."""
        if self.child.isalive():
            self.child.kill(15)
            deadline = time.monotonic() + 60.0
            while self.child.isalive() and time.monotonic() < deadline:
                time.sleep(0.1)  # bounded: then SIGKILL
            if self.child.isalive():
                self.child.kill(9)
        self._thread.join(5)
        self.child.close(force=True)
