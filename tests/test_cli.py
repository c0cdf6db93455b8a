"""The `hilrec` command line as a new user reads it: --version, -v anywhere, defaults in the
help, no RST markup, one spelling of the dataset argument, the setup commands listed."""

from __future__ import annotations

import argparse
import importlib.metadata
import logging
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from hilrec.daemon.cli import COMMANDS, build_parser, main


def help_of(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    with pytest.raises(SystemExit) as exit_:
        main([*args, "--help"])
    assert exit_.value.code == 0
    return capsys.readouterr().out


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.strip() == f"hilrec {importlib.metadata.version('hilrec')}"


@pytest.mark.parametrize("argv", [["-v", "find-port", "--list"], ["find-port", "--list", "-v"]])
def test_verbose_before_or_after_the_command(argv: list[str]) -> None:
    args = build_parser(argv).parse_args(argv)
    assert args.verbose is True and args.command == "find-port"
    assert build_parser(["find-port"]).parse_args(["find-port", "--list"]).verbose is False


def test_verbose_after_the_command_logs_debug(capsys: pytest.CaptureFixture[str], tmp_path) -> None:
    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    root.handlers = []
    try:
        main(["find-port", "--list", "--port", str(tmp_path / "none*"), "-v"])
        assert root.level == logging.DEBUG
    finally:
        root.handlers, root.level = handlers, level
    assert "No port matches" in capsys.readouterr().out


def test_setup_commands_are_listed(capsys: pytest.CaptureFixture[str]) -> None:
    for name in ("find-port", "setup-motors", "calibrate", "find-cameras"):
        assert name in COMMANDS
    text = help_of(capsys)
    for name in ("find-port", "setup-motors", "find-cameras"):
        assert name in text


@pytest.mark.parametrize(
    ("command", "shown"),
    [
        (
            "ctl",
            [
                "(default: 127.0.0.1; with --config, its host)",
                "(default: 5555)",
                "(default: 2000)",
                "(default: 3)",
                "(default: 120.0)",
            ],
        ),
        ("find-cameras", ["(default: outputs/captured_images)"]),
        ("emulate", ["(default: auto)"]),
        ("calibrate", ["so101_follower", "so101_leader"]),
    ],
)
def test_flags_show_their_defaults(
    capsys: pytest.CaptureFixture[str], command: str, shown: list[str]
) -> None:
    text = " ".join(help_of(capsys, command).split())  # argparse wraps lines
    for words in shown:
        assert words in text, (words, text)


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_help_has_no_rst_literals(capsys: pytest.CaptureFixture[str], command: str) -> None:
    try:
        text = help_of(capsys, command)
    except ModuleNotFoundError as exc:  # an optional extra a command needs
        pytest.skip(str(exc))
    assert "``" not in text


@pytest.mark.parametrize("command", ["check", "repair", "replay", "render"])
def test_the_dataset_argument_is_ROOT_everywhere(capsys: pytest.CaptureFixture[str], command: str) -> None:
    if command not in COMMANDS:
        pytest.skip(f"no {command} command")
    usage = help_of(capsys, command).split("\n\n", 1)[0]
    assert re.search(r"\bROOT\b", usage), usage
    assert not re.search(r"\broot\b", usage), usage


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_help_description_is_whole_sentences(command: str) -> None:
    """A description cut at the docstring's first line ended mid-sentence (view, display)."""
    parser = build_parser([command])
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[command]
    text = (sub.description or "").strip()
    assert text.endswith((".", ")", ":")), text
    assert text.count("(") == text.count(")") and text.count("[") == text.count("]"), text
    assert ":mod:" not in text, text


def _hilrec(*args: str, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hilrec.daemon.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        **kwargs,
    )


@pytest.mark.slow
def test_no_opengl_accelerate_line(tmp_path: Path) -> None:
    """The daemon's config checks import MuJoCo, whose PyOpenGL said at INFO on every run that an
    optional module is missing; the error is the only line now."""
    root = tmp_path / "ds"
    root.mkdir()
    (root / "x").write_text("x")
    config = tmp_path / "d.toml"
    config.write_text(f'mode = "sim"\nfps = 25\n[dataset]\nroot = "{root}"\n[leader]\nsource = "scripted"\n')
    done = _hilrec("daemon", "--config", str(config))
    assert done.returncode == 2
    assert "OpenGL" not in done.stderr, done.stderr
    assert done.stderr.strip().splitlines() == [done.stderr.strip()], done.stderr


def test_the_edit_help_line_names_every_edit_sub_command(capsys: pytest.CaptureFixture[str]) -> None:
    import argparse

    def sub_commands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
        return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices

    edit = sub_commands(build_parser(["edit"]))["edit"]
    names = list(sub_commands(edit))
    line = COMMANDS["edit"][1]
    missing = [name for name in names if name not in line]
    assert names and not missing, f"`hilrec --help` says {line!r}, without {missing}"
    listed = "".join(help_of(capsys).split())  # wrapped lines (argparse breaks after a hyphen) joined
    assert all(name in listed for name in names), listed
