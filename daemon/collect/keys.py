"""The operator's keys, read from the terminal collect runs in: raw stdin, no X or Wayland, so it
works the same on the bench's console and over SSH.

| key | meaning |
|---|---|
| → or ``n`` | end the take now and save it (between takes: start the next one now) |
| ← or ``r`` | discard the take and record it again (between takes: record the last one again) |
| space | pause or resume between takes (``hilrec rollout``, during a take: take over / hand back) |
| ``s`` / ``f`` | ``hilrec rollout``: the take succeeded / failed; it is saved with that outcome |
| Esc or ``q`` | save the take, finalize, exit |
| Ctrl-C | as Esc (and collect says so) |

The terminal is switched to non-canonical mode without echo and without signals (so Ctrl-C
arrives as a byte, ``\\x03``, and reaches no child process), output processing left on; it is
restored on the way out, whatever happens (:class:`KeyReader` is a context manager). Escape
sequences are parsed, not guessed: → is ``ESC [ C`` (or ``ESC O C`` in application mode), any
other CSI sequence is ignored whole, and a lone ESC counts as Esc only once no byte has followed
it for :data:`ESC_TIMEOUT_S`. Without a terminal on stdin there are no keys (SIGINT still counts
as Ctrl-C, and so do SIGTERM and SIGHUP): the takes simply run their time.
"""

from __future__ import annotations

import contextlib
import enum
import os
import select
import signal
import sys
import time
from collections import deque
from types import FrameType, TracebackType
from typing import Any, Final

ESC_TIMEOUT_S: Final[float] = 0.05
_ESC = 0x1B


class Key(enum.Enum):
    NEXT = "next"  # → / n
    REDO = "redo"  # ← / r
    PAUSE = "pause"  # space
    QUIT = "quit"  # Esc / q
    SUCCESS = "success"  # s (hilrec rollout's outcome)
    FAILURE = "failure"  # f
    INTERRUPT = "interrupt"  # Ctrl-C


_PLAIN: Final[dict[int, Key]] = {
    ord("n"): Key.NEXT,
    ord("N"): Key.NEXT,
    ord("r"): Key.REDO,
    ord("R"): Key.REDO,
    ord(" "): Key.PAUSE,
    ord("s"): Key.SUCCESS,
    ord("S"): Key.SUCCESS,
    ord("f"): Key.FAILURE,
    ord("F"): Key.FAILURE,
    ord("q"): Key.QUIT,
    ord("Q"): Key.QUIT,
    0x03: Key.INTERRUPT,
}
_ARROWS: Final[dict[int, Key]] = {ord("C"): Key.NEXT, ord("D"): Key.REDO}


class KeyParser:
    """Bytes in, keys out. Pure: the time is passed in, so the ESC timeout is testable."""

    def __init__(self, esc_timeout_s: float = ESC_TIMEOUT_S) -> None:
        self._buffer = bytearray()
        self._esc_since: float | None = None
        self._timeout = esc_timeout_s

    def feed(self, data: bytes, now: float) -> list[Key]:
        self._buffer.extend(data)
        keys = self._parse()
        self._esc_since = (self._esc_since or now) if self._buffer else None
        return keys

    def flush(self, now: float) -> list[Key]:
        """A lone ESC left waiting longer than the timeout is the Esc key; an escape sequence
        left incomplete that long is dropped."""
        if not self._buffer or self._esc_since is None or now - self._esc_since < self._timeout:
            return []
        lone = bytes(self._buffer) == b"\x1b"
        self._buffer.clear()
        self._esc_since = None
        return [Key.QUIT] if lone else []

    @property
    def waiting_s(self) -> float | None:
        """How long until :meth:`flush` may decide (None: nothing is waiting)."""
        return self._timeout if self._buffer else None

    def _parse(self) -> list[Key]:
        keys: list[Key] = []
        buf = self._buffer
        while buf:
            if buf[0] != _ESC:
                key = _PLAIN.get(buf[0])
                del buf[0]
                if key is not None:
                    keys.append(key)
                continue
            if len(buf) == 1:
                break  # a lone ESC so far: the next byte, or the timeout, decides
            if buf[1] == ord("["):  # CSI: parameters 0x30-0x3F, intermediates 0x20-0x2F, final 0x40-0x7E
                end = next((i for i in range(2, len(buf)) if 0x40 <= buf[i] <= 0x7E), None)
                if end is None:
                    break  # incomplete: wait for the rest
                if end == 2 and buf[2] in _ARROWS:
                    keys.append(_ARROWS[buf[2]])
                del buf[: end + 1]
                continue
            if buf[1] == ord("O"):  # SS3: ESC O <one byte>
                if len(buf) < 3:
                    break
                if buf[2] in _ARROWS:
                    keys.append(_ARROWS[buf[2]])
                del buf[:3]
                continue
            if buf[1] == _ESC:  # ESC ESC: the first was the Esc key
                keys.append(Key.QUIT)
                del buf[0]
                continue
            # ESC then an ordinary byte (Alt+key): the Esc key, then that byte on its own.
            keys.append(Key.QUIT)
            del buf[0]
        return keys


class KeyReader:
    """Keys from stdin when it is a terminal, and SIGINT as Ctrl-C either way."""

    def __init__(self, stream: Any = None) -> None:
        self._stream = stream if stream is not None else sys.stdin
        try:
            self._fd: int | None = self._stream.fileno()
        except (AttributeError, OSError, ValueError):
            self._fd = None
        self.interactive = self._fd is not None and os.isatty(self._fd)
        self._parser = KeyParser()
        self._keys: deque[Key] = deque()
        self.signals: list[str] = []  # the signals that arrived, by name
        self._saved_tty: list[Any] | None = None
        self._saved_signals: dict[int, Any] = {}

    def __enter__(self) -> KeyReader:
        # SIGINT (no terminal, or kill -INT), SIGTERM and SIGHUP (the SSH session closed) all
        # finish the session as Ctrl-C does: the take is saved and the dataset finalized.
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            self._saved_signals[signum] = signal.signal(signum, self._on_signal)
        if self.interactive:
            import termios

            assert self._fd is not None
            self._saved_tty = termios.tcgetattr(self._fd)
            mode = termios.tcgetattr(self._fd)
            mode[0] &= ~(termios.IXON | termios.ICRNL)  # iflag: ^S/^Q and CR->NL off
            mode[3] &= ~(termios.ECHO | termios.ICANON | termios.ISIG | termios.IEXTEN)  # lflag
            mode[6][termios.VMIN] = 1
            mode[6][termios.VTIME] = 0
            termios.tcsetattr(self._fd, termios.TCSANOW, mode)
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.restore()

    def restore(self) -> None:
        """Give the terminal back as it was (idempotent)."""
        if self._saved_tty is not None and self._fd is not None:
            import termios

            with contextlib.suppress(termios.error, OSError):
                termios.tcsetattr(self._fd, termios.TCSADRAIN, self._saved_tty)
            self._saved_tty = None
        for signum, handler in self._saved_signals.items():
            signal.signal(signum, handler)
        self._saved_signals.clear()

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        self.signals.append(signal.Signals(signum).name)
        self._keys.append(Key.INTERRUPT)

    def wait(self, timeout_s: float) -> Key | None:
        """The next key, or None when none came within ``timeout_s``."""
        deadline = time.monotonic() + max(0.0, timeout_s)
        while True:
            if self._keys:
                return self._keys.popleft()
            now = time.monotonic()
            self._keys.extend(self._parser.flush(now))
            if self._keys:
                continue
            remaining = deadline - now
            if remaining <= 0:
                return None
            if not self.interactive or self._fd is None:
                time.sleep(min(remaining, 0.05))  # no terminal: only SIGINT can arrive
                continue
            waiting = self._parser.waiting_s
            step = min(remaining, waiting) if waiting is not None else remaining
            try:
                ready, _, _ = select.select([self._fd], [], [], step)
            except InterruptedError:
                continue
            if ready:
                data = os.read(self._fd, 64)
                if not data:  # the terminal went away: no more keys
                    self.interactive = False
                    continue
                self._keys.extend(self._parser.feed(data, time.monotonic()))
