"""``hilrec display --config FILE (--rrd OUT.rrd | --spawn | --serve) [--duration S]``: the running
daemon's telemetry, live, in rerun (:mod:`hilrec.daemon.viz.display`).

A subscriber of the daemon's telemetry socket only (the ports come from the daemon's config, as
for ``hilrec ui``, or ``--telemetry`` names the socket): it never slows the loop, it can only miss
messages. SIGINT or SIGTERM (or ``--duration``) ends it; the recording is flushed first, so an
``.rrd`` is complete. The daemon's ``[display]`` and ``hilrec collect --display rerun`` run it as
a child (:mod:`hilrec.daemon.wire.display_child`).
"""

from __future__ import annotations

import argparse
import threading
from pathlib import Path
from typing import Any

from hilrec.daemon import procs
from hilrec.daemon.errors import FlagError


def register(subparsers: Any) -> None:
    from hilrec.daemon.cli import doc_summary
    from hilrec.daemon.viz.sink import add_output_flags

    parser: argparse.ArgumentParser = subparsers.add_parser(
        "display",
        help="log a running daemon's telemetry to rerun: cameras, joints, twin, faults, verdicts",
        description=doc_summary(__doc__),
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--config", type=Path, help="the daemon's TOML config (gives the telemetry port)")
    source.add_argument(
        "--telemetry", metavar="ENDPOINT", help="the telemetry socket itself, e.g. tcp://127.0.0.1:5556"
    )
    parser.add_argument("--duration", type=float, help="stop after this many seconds (default: at SIGINT)")
    parser.add_argument(
        "--client-key", type=Path, help="CURVE: this client's secret certificate, when the daemon uses CURVE"
    )
    add_output_flags(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from hilrec.daemon.viz.display import Display
    from hilrec.daemon.viz.sink import check_output_flags, import_rerun, open_output
    from hilrec.daemon.wire.security import client_host, endpoint
    from hilrec.daemon.wire.settings import load_settings

    if args.duration is not None and args.duration <= 0:
        raise FlagError("--duration", f"must be positive, got {args.duration}")
    # First: a stop asked for while rerun still imports (seconds) ends the display cleanly too.
    stop = threading.Event()
    procs.stop_on_signals(stop)  # SIGTERM is the death signal: a burst of them when a daemon dies
    check_output_flags(args)
    rr = import_rerun()
    if args.config is not None:
        zmq = load_settings(args.config).zmq
        host = client_host(zmq.host)
        keys = _client_keys(zmq.curve, args.client_key)
        telemetry, name = endpoint(host, zmq.telemetry_port), Path(args.config).stem
    else:
        if args.client_key is not None:
            raise FlagError("--client-key", "goes with --config, which names the server's CURVE key")
        keys, telemetry = None, args.telemetry
        name = telemetry.rsplit(":", 1)[-1]
    out = open_output(args, f"display-{name}", command="display")
    display = Display(rr, out.recording, telemetry, keys=keys)
    print(f"hilrec display: {display.endpoint} -> {out.rrd or out.url or 'viewer'}", flush=True)
    try:
        summary = display.run(stop, args.duration)
    finally:
        out.close()
    ticks = summary.received["tick"]
    print(
        f"hilrec display: {ticks} ticks, {summary.received['preview']} previews, "
        f"{summary.received['event']} events; missed {summary.dropped}, refused {summary.refused}",
        flush=True,
    )
    return 0


def _client_keys(curve: Any, client_key: Path | None) -> Any:
    from hilrec.daemon.wire.client import ClientKeys

    if curve is None:
        return None
    if client_key is None:
        raise FlagError(
            "--client-key",
            "the daemon's sockets use CURVE ([zmq.curve]); give this client's secret certificate",
        )
    return ClientKeys.from_files(Path(curve.server_secret_key), client_key)
