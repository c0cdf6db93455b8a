"""``hilrec ui --config FILE [--host H] [--port P] [--token T]``: the bench's web page.

It reads the daemon's config (the same file ``hilrec daemon --config`` runs): the ``[zmq]``
ports (and CURVE keys) to reach the daemon, ``dataset.root`` for the takes' files, and ``[ui]``
``host``, ``port``, ``token``, which the flags override; without a token it makes one for this
start and prints it in the page's URL. The result is checked like the config
itself: a page reachable beyond loopback without a token of at least 16 characters is refused
before anything listens (exit status 2, the message names ``ui.token``).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import secrets
import signal
import sys
from pathlib import Path
from typing import Any

from hilrec.daemon.errors import ConfigError


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "ui",
        help="a local web page for a running daemon: cameras, joints, faults, takes, buttons",
        description="Serve a web page that watches and drives the daemon run with this config, "
        "as a client of its ZeroMQ sockets (control and telemetry).",
    )
    parser.add_argument("--config", required=True, type=Path, help="the daemon's TOML config")
    parser.add_argument("--host", help="listen address (overrides [ui] host; default 127.0.0.1)")
    parser.add_argument("--port", type=int, help="listen port (overrides [ui] port; default 8765)")
    parser.add_argument(
        "--token", help="access token (overrides [ui] token); required, >= 16 characters, beyond loopback"
    )
    parser.add_argument(
        "--client-key",
        type=Path,
        help="CURVE: this client's secret certificate, when the daemon's sockets use CURVE",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from hilrec.daemon.ui.bridge import Bridge
    from hilrec.daemon.wire.security import client_host, endpoint
    from hilrec.daemon.wire.settings import load_settings

    settings = load_settings(args.config)
    overrides = {
        k: v for k, v in (("host", args.host), ("port", args.port), ("token", args.token)) if v is not None
    }
    ui = dataclasses.replace(settings.ui, **overrides)
    try:
        ui.validate()
    except ConfigError as exc:
        raise ConfigError(f"ui.{exc.key}", exc.problem, source=str(args.config)) from None
    zmq = settings.zmq
    # A daemon bound to a wildcard is reached on loopback; else at the address it names.
    host = client_host(zmq.host)
    bridge = Bridge(
        control=endpoint(host, zmq.control_port),
        telemetry=endpoint(host, zmq.telemetry_port),
        root=settings.dataset.root,
        keys=_client_keys(settings.zmq.curve, args.client_key),
        command_timeout_ms=zmq.apply_timeout_ms + 3000,
    )
    info = {
        "config": str(args.config),
        "control": bridge.control_endpoint,
        "telemetry": bridge.telemetry_endpoint,
        "mode": settings.mode,
        "fps": settings.fps,
        "preview_hz": settings.telemetry.preview_hz,
        "cameras": sorted(settings.cameras),
    }
    # As Jupyter does: without a configured token, a new one for every start, printed in the URL.
    token = ui.token or secrets.token_urlsafe(32)
    return asyncio.run(_serve(bridge, ui.host, ui.port, token, info))


def _client_keys(curve: Any, client_key: Path | None) -> Any:
    from hilrec.daemon.wire.client import ClientKeys

    if curve is None:
        return None
    if client_key is None:
        raise ConfigError(
            "--client-key",
            "the daemon's sockets use CURVE ([zmq.curve]); give this client's secret "
            "certificate, whose public key is in authorized_clients",
        )
    # The daemon's certificate file holds its public key beside the secret one.
    return ClientKeys.from_files(Path(curve.server_secret_key), client_key)


async def _serve(bridge: Any, host: str, port: int, token: str, info: dict[str, Any]) -> int:
    from aiohttp import web

    from hilrec.daemon.ui.server import build_app
    from hilrec.daemon.wire.security import is_loopback

    app = build_app(bridge, token=token, loopback_only=is_loopback(host), info=info)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port).start()
    except OSError as exc:
        await runner.cleanup()
        raise ConfigError("ui.port", f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    shown = f"[{host}]" if ":" in host else host
    print(f"hilrec ui: http://{shown}:{port}/?token={token} watching {info['control']}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    try:
        await stop.wait()
    finally:
        print("hilrec ui: stopping", file=sys.stderr, flush=True)
        await runner.cleanup()
    return 0
