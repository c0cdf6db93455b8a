"""hilrec: record, check and replay SO-101 teleoperation datasets (LeRobot v3.0).

The one console command, ``hilrec``, and its sub-commands.

Each sub-command lives in its own module exposing ``register(subparsers)`` (adds its parser and
sets ``func``) and is imported lazily, so ``hilrec ctl status`` never pays for MuJoCo or PyAV.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import re
import sys
from collections.abc import Sequence
from typing import Any

from hilrec.daemon.errors import HilrecError

# sub-command name -> (module, one-line help). The module's register() builds the parser.
COMMANDS: dict[str, tuple[str, str]] = {
    "record": ("hilrec.sim.cmd_record", "record episodes in the MuJoCo twin with the scripted operator"),
    "check": ("hilrec.daemon.replay.cmd_check", "check a LeRobot v3.0 dataset (and replay it with --replay)"),
    "repair": (
        "hilrec.sim.cmd_repair",
        "make a crashed dataset load again, keeping every saved episode",
    ),
    "render": ("hilrec.sim.cmd_render", "re-render the camera videos of sim episodes"),
    "replay": (
        "hilrec.daemon.control.cmd_replay",
        "replay-check hardware episodes on the twin, or play one on the arm (--on-arm)",
    ),
    "find-port": (
        "hilrec.drivers.cmd_find_port",
        "find an arm's serial port (unplug it), or list the ports with servos",
    ),
    "setup-motors": (
        "hilrec.drivers.cmd_setup_motors",
        "give each new servo of an arm its id and baud rate, one at a time",
    ),
    "calibrate": ("hilrec.drivers.cmd_calibrate", "calibrate an SO-101 arm (LeRobot's procedure and file)"),
    "find-cameras": (
        "hilrec.drivers.cmd_find_cameras",
        "list the cameras with their resolution and fps, and save a snapshot of each",
    ),
    "emulate": (
        "hilrec.drivers.emulated.cmd_emulate",
        "emulate an SO-101 arm (six STS3215) on a pseudo-terminal",
    ),
    "daemon": ("hilrec.daemon.control.cmd_daemon", "run the teleoperation and recording daemon"),
    "ctl": ("hilrec.daemon.wire.cmd_ctl", "talk to a running daemon over ZeroMQ"),
    "coverage": ("hilrec.daemon.tools.cmd_coverage", "how much of the task a dataset covers, and its gaps"),
    "eval": ("hilrec.daemon.tools.cmd_eval", "closed-loop success of a policy on the twin, held-out seeds"),
    "align": (
        "hilrec.daemon.tools.cmd_align",
        "check that two datasets (sim and real) line up column for column",
    ),
    "export": (
        "hilrec.daemon.tools.cmd_export",
        "write a dataset in another trainer's layout (robomimic HDF5)",
    ),
    "edit": (
        "hilrec.daemon.tools.cmd_edit",
        "edit a dataset safely: recompute-stats, delete-episodes, keep, set-task, remove-feature, "
        "merge, split, convert-units, for-lerobot",
    ),
    "ui": ("hilrec.daemon.ui.cmd_ui", "a local web page for a running daemon: cameras, joints, takes"),
    "collect": (
        "hilrec.daemon.collect.cmd_collect",
        "run a whole recording session: N timed takes with keys, verdicts and a summary",
    ),
    "rollout": (
        "hilrec.daemon.collect.cmd_rollout",
        "a bench session where a policy drives the follower and a person takes over (DAgger)",
    ),
    "view": ("hilrec.daemon.viz.cmd_view", "show a recorded episode in rerun: video, joints, timing, replay"),
    "display": ("hilrec.daemon.viz.cmd_display", "log a running daemon's telemetry to rerun (live)"),
}


_RST_LITERAL = re.compile(r"``(.+?)``")
_SPHINX_ROLE = re.compile(r":[a-z]+:`([^`]+)`")
_VERBOSE_HELP = "log debug messages"


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Every command's help: each option's default shown (unless its help already names one, or
    it has none), and the docstrings' RST literals (``x``) printed as plain text."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        if (
            "default" in text.lower()
            or default is None
            or default is False
            or default is argparse.SUPPRESS
            or default == []
            or not action.option_strings
            or action.nargs == 0  # a switch: its default is its absence
        ):
            return action.help
        return f"{text} (default: %(default)s)"

    def _format_text(self, text: str) -> str:
        return super()._format_text(_RST_LITERAL.sub(r"\1", text))

    def _expand_help(self, action: argparse.Action) -> str:
        return _RST_LITERAL.sub(r"\1", super()._expand_help(action))


class Parser(argparse.ArgumentParser):
    """ArgumentParser with hilrec's help formatter; a dataset root is ``ROOT`` in every command."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        given = kwargs.get("formatter_class", HelpFormatter)
        if not issubclass(given, HelpFormatter):  # a command's own (raw description...) on top
            given = type(f"Hilrec{given.__name__}", (HelpFormatter, given), {})
        kwargs["formatter_class"] = given
        super().__init__(*args, **kwargs)

    def add_argument(self, *args: Any, **kwargs: Any) -> argparse.Action:
        if args == ("root",) and "metavar" not in kwargs:
            kwargs["metavar"] = "ROOT"
        return super().add_argument(*args, **kwargs)


def _version() -> str:
    import importlib.metadata  # here, not at the top: its import costs every command ~25 ms

    try:
        return importlib.metadata.version("hilrec")
    except importlib.metadata.PackageNotFoundError:
        return "unknown (not installed)"


class _VersionAction(argparse.Action):
    """``--version``, with the version looked up when it is asked for, not for every command
    (argparse's own action takes the text when the parser is built)."""

    def __init__(self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS, **kwargs: Any) -> None:
        super().__init__(option_strings, dest=dest, default=argparse.SUPPRESS, nargs=0, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, *_: Any) -> None:
        parser._print_message(f"{parser.prog} {_version()}\n", sys.stdout)
        parser.exit()


def build_parser(argv: Sequence[str]) -> argparse.ArgumentParser:
    parser = Parser(prog="hilrec", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action=_VersionAction, help="show the installed version and exit")
    parser.add_argument("-v", "--verbose", action="store_true", help=_VERBOSE_HELP)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    sub.required = True
    wanted = next((a for a in argv if not a.startswith("-")), None)
    for name, (module_name, help_text) in COMMANDS.items():
        if name == wanted:
            module = importlib.import_module(module_name)
            module.register(sub)
            command = sub.choices[name]
            taken = command._option_string_actions
            if "-v" not in taken and "--verbose" not in taken:
                # -v also after the sub-command (hilrec calibrate ... -v), unless it has its own.
                command.add_argument(
                    "-v", "--verbose", action="store_true", default=argparse.SUPPRESS, help=_VERBOSE_HELP
                )
        else:
            # A placeholder keeps `hilrec --help` complete without importing every command.
            sub.add_parser(name, help=help_text, add_help=False)
    return parser


def doc_summary(doc: str | None) -> str | None:
    """A module docstring's first paragraph as one line, for a command's ``description``: the
    whole first sentence, never its first line only; Sphinx roles (:mod:`x`) as their text."""
    if not doc:
        return None
    first = " ".join(doc.strip().split("\n\n")[0].split())
    return _SPHINX_ROLE.sub(r"\1", first)


def error_prefix(command: str) -> str:
    """How every command's error line starts (collect finds its daemon's by it)."""
    return f"hilrec {command}: error: "


def main(argv: Sequence[str] | None = None) -> int:
    try:
        return _main(list(sys.argv[1:] if argv is None else argv))
    except BrokenPipeError:
        # `hilrec check ROOT | head`: the reader has gone, which is not an error of hilrec's.
        # Output still buffered must not fail again at exit: stdout goes to /dev/null.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141  # 128 + SIGPIPE, as a shell reports a writer the pipe's end stopped


def _main(argv: list[str]) -> int:
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    # PyOpenGL (imported with MuJoCo) says at INFO on every run that an optional speed-up is absent.
    logging.getLogger("OpenGL.acceleratesupport").setLevel(logging.WARNING)
    func = getattr(args, "func", None)
    if func is None:
        parser.error(f"'{args.command}' needs its arguments; see 'hilrec {args.command} --help'")
    try:
        return int(func(args) or 0)
    except HilrecError as exc:
        print(f"{error_prefix(args.command)}{exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
