"""``hilrec collect --config FILE --episodes N``: a whole bench session in one command.

Starts the daemon from ``--config`` (a child ``hilrec daemon``, its log in a file collect names)
or, with ``--attach``, drives the one already running on that config's ports. Then N takes:
each recorded until ``--episode-time-s`` or a key, saved, and judged by the daemon's verdict
worker while teleoperation goes on through ``--reset-time-s``. At the end the dataset is
finalized and a summary printed: takes kept, re-recorded and discarded, frames, late ticks,
verdicts. Exit status 0; 2 when the daemon cannot be started or reached.

Keys, read from this terminal (raw stdin, works over SSH): → or n save the take now; ← or r
record it again; space pause between takes; Esc or q (or Ctrl-C) save, finalize and exit.
Without a terminal on stdin the takes simply run their time.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hilrec.daemon.text import DEFAULT_TASK

if TYPE_CHECKING:
    from hilrec.daemon.collect.launch import DaemonProcess, Endpoints


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "collect",
        help="run a whole recording session: N timed takes with keys, verdicts and a summary",
        description=__doc__.split("\n\n")[1],
        epilog="\n\n".join(__doc__.split("\n\n")[2:]),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--config", type=Path, required=True, help="daemon TOML config (gives the ports)")
    parser.add_argument(
        "--attach", action="store_true", help="drive the daemon already running on the config's ports"
    )
    parser.add_argument("--root", type=Path, help="dataset directory (overrides dataset.root in the config)")
    parser.add_argument("--episodes", type=_positive_int, required=True, metavar="N", help="takes to keep")
    parser.add_argument(
        "--episode-time-s", type=_positive_float, default=60.0, metavar="T", help="length of a take"
    )
    parser.add_argument(
        "--reset-time-s", type=_non_negative_float, default=10.0, metavar="R", help="reset between takes"
    )
    tasks = parser.add_mutually_exclusive_group()
    tasks.add_argument("--task", help=f"task text of every take (default {DEFAULT_TASK!r})")
    tasks.add_argument("--tasks", type=Path, metavar="FILE", help="one task per line, cycling per take")
    parser.add_argument(
        "--resume", action="store_true", help="add to the dataset already in the root (passed to the daemon)"
    )
    parser.add_argument("--no-sounds", dest="sounds", action="store_false", help="no spoken prompts, no bell")
    parser.add_argument("--daemon-log", type=Path, help="the started daemon's log (default: ROOT.daemon.log)")
    live = parser.add_argument_group(
        "live view in rerun (needs rerun-sdk: pip install 'hilrec[rerun]')",
        "A `hilrec display` child logs cameras, joints, leader, twin, divergence, faults and "
        "verdicts; it replaces the config's [display] for the daemon collect starts.",
    )
    live.add_argument(
        "--display",
        choices=("rerun",),
        help="log the session to rerun; the viewer: --display-rrd, --display-serve or, by default, "
        "--display-spawn",
    )
    viewer = live.add_mutually_exclusive_group()
    viewer.add_argument("--display-rrd", type=Path, metavar="OUT.rrd", help="write the view to this file")
    viewer.add_argument("--display-spawn", action="store_true", help="open rerun's native viewer")
    viewer.add_argument(
        "--display-serve", action="store_true", help="serve rerun's web viewer on 127.0.0.1 only"
    )
    live.add_argument(
        "--display-web-port",
        type=int,
        default=9090,
        metavar="PORT",
        help="--display-serve's HTTP port",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from hilrec.daemon.collect.session import CollectSession

    tasks = _tasks(args)
    return run_bench(args, "collect", lambda **kw: CollectSession(**kw, tasks=tasks), attach=args.attach)


def run_bench(
    args: argparse.Namespace,
    name: str,
    make_session: Any,
    *,
    settings: Any = None,
    daemon_flags: Sequence[str] = (),
    panel_options: Mapping[str, Any] | None = None,
    attach: bool = False,
) -> int:
    """A bench session (``hilrec collect``, ``hilrec rollout``): the daemon started with
    ``daemon_flags`` (or attached to), the keys, the panel and the monitor, then
    ``make_session(**common).run()``, the daemon shut down and the summary printed."""
    from hilrec.daemon.collect.keys import KeyReader
    from hilrec.daemon.collect.launch import Endpoints, LiveDisplay, default_log_path
    from hilrec.daemon.collect.monitor import Monitor
    from hilrec.daemon.collect.panel import Panel, backlog_line
    from hilrec.daemon.collect.session import Summary
    from hilrec.daemon.collect.sounds import Speaker
    from hilrec.daemon.errors import DaemonUnreachableError, HilrecError
    from hilrec.daemon.wire.client import ControlClient
    from hilrec.daemon.wire.settings import load_settings

    if settings is None:
        settings = load_settings(args.config, root=args.root)
    endpoints = Endpoints.from_settings(settings)
    display_argv = _display_argv(args, endpoints.telemetry) if hasattr(args, "display") else None
    speaker = Speaker(enabled=args.sounds)
    out = sys.stdout
    display: LiveDisplay | None = None
    daemon: DaemonProcess | None = (
        None if attach else _spawn_daemon(args, name, settings, endpoints, display_argv, daemon_flags)
    )
    if attach and (args.resume or args.root):
        print(f"{name}: --attach records where the daemon does; --resume and --root are ignored", file=out)
    with ControlClient(endpoints.control, timeout_ms=3000, retries=3) as client:
        if daemon is not None:
            try:
                daemon.wait_ready(client)
            except BaseException:
                daemon.kill()
                raise
        else:
            try:
                client.call("status")
            except DaemonUnreachableError as exc:
                raise HilrecError(f"no daemon to attach to at {endpoints.control}: {exc}") from None
        monitor: Monitor | None = None
        summary: Summary | None = None
        backlog: str | None = None
        try:
            if display_argv is not None:
                display = LiveDisplay(display_argv, default_log_path(Path(settings.dataset.root), "display"))
                display.start(out)
            monitor = Monitor(endpoints.telemetry).start()
            monitor.wait_connected(10.0)
            with KeyReader() as keys, Panel(monitor, **(panel_options or {})) as panel:
                if not keys.interactive:
                    panel.line("no terminal on stdin: no keys, the takes run their time")
                panel.line(f"sounds: {speaker.describe}")
                session = make_session(
                    client=client,
                    monitor=monitor,
                    panel=panel,
                    keys=keys,
                    speaker=speaker,
                    episodes=args.episodes,
                    episode_time_s=args.episode_time_s,
                    reset_time_s=args.reset_time_s,
                )
                summary = session.run()
                backlog = backlog_line(monitor.snapshot())
        except DaemonUnreachableError as exc:
            tail = f"; its log ends:\n{daemon.log_tail()}" if daemon is not None else ""
            raise HilrecError(f"the daemon stopped answering: {exc}{tail}") from None
        finally:
            if monitor is not None:
                monitor.close()
            speaker.close()
            if daemon is not None:
                code = daemon.shutdown(client)
                if code != 0:
                    print(f"{name}: the daemon exited with {code}; see {daemon.log_path}", file=out)
            if display is not None:
                display.stop(out)  # after the daemon: the view holds the session's very end
    assert summary is not None
    print(format_summary(summary, name), file=out, flush=True)
    if backlog is not None:
        print(f"{name}: {backlog}", file=out, flush=True)
    return 0


def _spawn_daemon(
    args: argparse.Namespace,
    name: str,
    settings: Any,
    endpoints: Endpoints,
    display_argv: list[str] | None,
    daemon_flags: Sequence[str],
) -> DaemonProcess:
    from hilrec.daemon.collect.launch import DaemonProcess, default_log_path
    from hilrec.daemon.wire.root import check_settings_root

    # The daemon's own rule, before anything starts: a refused root is one line, at once.
    check_settings_root(settings, resume=args.resume)
    log_path = getattr(args, "daemon_log", None) or default_log_path(Path(settings.dataset.root))
    daemon = DaemonProcess(
        args.config,
        endpoints=endpoints,
        log_path=log_path,
        root=args.root,
        resume=args.resume,
        display_off=display_argv is not None,
        extra=daemon_flags,
    )
    print(f"{name}: starting the daemon ({settings.mode} mode); its log: {log_path}", file=sys.stdout)
    sys.stdout.flush()
    daemon.spawn()  # before any thread of this process (the ZeroMQ context below starts some)
    return daemon


def format_summary(summary: Any, name: str = "collect") -> str:
    kept = [t for t in summary.kept if not t.superseded]
    lines = [
        f"{name}: {len(kept)} take(s) kept, {summary.rerecorded} re-recorded, "
        f"{summary.discarded} discarded; {summary.frames} frames in {len(summary.kept)} saved "
        f"episode(s); late ticks {summary.late_in_takes} in takes ({summary.late_ticks} in the "
        f"session), {summary.skipped_slots} skipped slot(s) in takes",
    ]
    for take in summary.kept:
        verdict = summary.verdicts.get(take.episode_index)
        said = f"{verdict['verdict']}: {verdict['summary']}" if verdict else "no verdict"
        again = " (recorded again; still in the dataset)" if take.superseded else ""
        marked = f", marked {take.outcome}" if take.outcome else ""
        lines.append(
            f"  take {take.number}: episode {take.episode_index}, {take.frames} frames, ended by "
            f"{take.ended_by}{marked}{again}; {said}"
        )
    lines.append(f"dataset: {summary.root} ({'finalized' if summary.finalized else 'NOT finalized'})")
    return "\n".join(lines)


def _display_argv(args: argparse.Namespace, telemetry: str) -> list[str] | None:
    """``hilrec display``'s command line for ``--display rerun`` and its viewer flags (a viewer
    flag alone implies ``--display rerun``); None without them."""
    from hilrec.daemon.errors import FlagError
    from hilrec.daemon.wire.display_child import display_argv, no_screen
    from hilrec.daemon.wire.settings import RerunViewer

    if args.display_rrd is not None:
        if args.display_rrd.is_dir():
            raise FlagError("--display-rrd", f"{args.display_rrd} is a folder; name the .rrd file to write")
        return display_argv(telemetry, RerunViewer.RRD, rrd=args.display_rrd.resolve())
    if args.display_serve:
        if not 1 <= args.display_web_port <= 65535:
            raise FlagError(
                "--display-web-port", f"must be a TCP port in 1..65535, got {args.display_web_port}"
            )
        return display_argv(telemetry, RerunViewer.SERVE, web_port=args.display_web_port)
    if args.display_spawn or args.display == "rerun":
        if (problem := no_screen()) is not None:
            raise FlagError(
                "--display-spawn" if args.display_spawn else "--display",
                f"{problem}: add --display-rrd OUT.rrd to write the view to a file, or --display-serve",
            )
        return display_argv(telemetry, RerunViewer.SPAWN)
    return None


def _tasks(args: argparse.Namespace) -> list[str]:
    from hilrec.daemon.errors import ConfigError, FlagError
    from hilrec.daemon.text import task_problem

    if args.tasks is not None:
        try:
            lines = args.tasks.read_text(encoding="utf-8").splitlines()
        except OSError as exc:
            raise ConfigError("--tasks", f"cannot read {args.tasks}: {exc}") from None
        tasks = [line.strip() for line in lines if line.strip()]
        if not tasks:
            raise ConfigError("--tasks", f"{args.tasks} holds no task (one per line)")
    else:
        tasks = [DEFAULT_TASK if args.task is None else args.task]  # '' is refused, not the default
    for number, task in enumerate(tasks, 1):
        problem = task_problem(task)
        if problem is not None:
            if args.tasks is None:
                raise FlagError("--task", f"{problem} (leave --task out for the default task)")
            raise FlagError("--tasks", f"task {number} of {args.tasks} {problem}")
    return tasks


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text}")
    return value


def _non_negative_float(text: str) -> float:
    value = float(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be zero or more, got {text}")
    return value
