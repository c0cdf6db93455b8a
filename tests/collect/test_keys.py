"""The key parser (bytes -> keys, escape sequences parsed, a lone ESC by its timeout) and the
terminal mode it runs in (set on entry, given back on exit, whatever happens)."""

from __future__ import annotations

import os
import signal
import termios

import pytest

from hilrec.daemon.collect.keys import ESC_TIMEOUT_S, Key, KeyParser, KeyReader


def test_arrows_letters_space_and_ctrl_c() -> None:
    parser = KeyParser()
    keys = parser.feed(b"\x1b[C\x1b[Dnr qNRQ\x03\x1bOC\x1bOD", now=0.0)
    assert keys == [
        Key.NEXT,
        Key.REDO,
        Key.NEXT,
        Key.REDO,
        Key.PAUSE,
        Key.QUIT,
        Key.NEXT,
        Key.REDO,
        Key.QUIT,
        Key.INTERRUPT,
        Key.NEXT,
        Key.REDO,
    ]


def test_a_sequence_split_across_reads_is_one_key() -> None:
    parser = KeyParser()
    assert parser.feed(b"\x1b", now=0.0) == []
    assert parser.feed(b"[", now=0.01) == []
    assert parser.flush(now=0.02) == []  # still inside the timeout: not an Esc
    assert parser.feed(b"C", now=0.02) == [Key.NEXT]
    assert parser.flush(now=1.0) == []  # nothing left over


def test_a_lone_esc_is_esc_only_after_the_timeout() -> None:
    parser = KeyParser()
    assert parser.feed(b"\x1b", now=10.0) == []
    assert parser.flush(now=10.0 + ESC_TIMEOUT_S / 2) == []
    assert parser.waiting_s == ESC_TIMEOUT_S
    assert parser.flush(now=10.0 + ESC_TIMEOUT_S) == [Key.QUIT]
    assert parser.waiting_s is None


def test_other_sequences_are_ignored_whole() -> None:
    parser = KeyParser()
    # Up, Down, Ctrl+Left, F5, Home, Delete, a mouse report: none is a key of collect, and none
    # of their bytes (the "1;5" of Ctrl+Left, the "~") leaks out as one.
    data = b"\x1b[A\x1b[B\x1b[1;5D\x1b[15~\x1b[H\x1b[3~\x1b[<0;12;5M"
    assert parser.feed(data, now=0.0) == []
    assert parser.feed(b"x", now=0.0) == []  # unbound letters mean nothing either
    # An incomplete sequence that never completes is dropped, not taken for Esc.
    assert parser.feed(b"\x1b[1;", now=1.0) == []
    assert parser.flush(now=2.0) == []
    assert parser.feed(b"n", now=2.0) == [Key.NEXT]


def test_esc_then_a_letter_is_esc_then_that_letter() -> None:
    assert KeyParser().feed(b"\x1bn", now=0.0) == [Key.QUIT, Key.NEXT]
    assert KeyParser().feed(b"\x1b\x1b[C", now=0.0) == [Key.QUIT, Key.NEXT]


@pytest.fixture
def pty_stdin():
    main, child = os.openpty()
    stream = os.fdopen(child, "rb", buffering=0)
    yield main, stream
    stream.close()
    os.close(main)


def test_the_reader_sets_raw_keys_and_gives_the_terminal_back(pty_stdin) -> None:
    main, stream = pty_stdin
    fd = stream.fileno()
    before = termios.tcgetattr(fd)
    assert before[3] & termios.ECHO and before[3] & termios.ICANON
    with pytest.raises(RuntimeError, match="boom"), KeyReader(stream) as keys:
        assert keys.interactive
        during = termios.tcgetattr(fd)
        assert not during[3] & (termios.ECHO | termios.ICANON | termios.ISIG)
        assert during[1] == before[1]  # output processing untouched: the panel's lines stay lines
        os.write(main, b"\x1b[C")  # typed into the terminal
        assert keys.wait(2.0) is Key.NEXT
        os.write(main, b"\x03")  # Ctrl-C is a byte now, not a SIGINT
        assert keys.wait(2.0) is Key.INTERRUPT
        os.write(main, b"\x1b")
        assert keys.wait(2.0) is Key.QUIT  # the lone ESC, once its timeout has passed
        assert keys.wait(0.05) is None
        raise RuntimeError("boom")
    assert termios.tcgetattr(fd) == before


def test_sigint_and_sigterm_are_ctrl_c_without_a_terminal() -> None:
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    with open(os.devnull, "rb") as devnull, KeyReader(devnull) as keys:
        assert not keys.interactive
        os.kill(os.getpid(), signal.SIGTERM)
        assert keys.wait(2.0) is Key.INTERRUPT
        os.kill(os.getpid(), signal.SIGINT)
        assert keys.wait(2.0) is Key.INTERRUPT
        assert keys.signals == ["SIGTERM", "SIGINT"]
    assert {s: signal.getsignal(s) for s in handlers} == handlers
