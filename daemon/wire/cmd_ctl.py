"""``hilrec ctl status|start|stop|discard|finalize|shutdown|takeover|handback``: talk to a running
daemon (``takeover`` / ``handback``: a person takes the arm from the policy, and gives it back).

Prints the daemon's JSON reply. ``--config FILE`` takes the host, control port and CURVE key
from the daemon's config ([zmq]), as ``ui``, ``display`` and ``collect`` do. Exit status: 0 when
the reply is ``ok``, 1 when the daemon refused (the reply says why), 3 when no reply came
within ``--timeout-ms`` after ``--retries`` attempts, or at once when nothing listens on the
control port (no daemon is running there).
``stop --wait`` and ``finalize --wait`` poll ``status`` (bounded by ``--wait-s``) until the save or
the finalize has finished, so a script knows the episode is on disk; they print the stop's (or
the finalize's) reply completed with its outcome (``saved``, ``frames``, ``error``...).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import socket
import sys
import time
from pathlib import Path
from typing import Any

from hilrec.daemon.errors import DaemonUnreachableError

VERBS: dict[str, str] = {
    "status": "status",
    "start": "start_episode",
    "stop": "stop_episode",
    "discard": "discard_episode",
    "finalize": "finalize",
    "shutdown": "shutdown",
    "takeover": "takeover",
    "handback": "handback",
}
EXIT_REFUSED = 1
EXIT_UNREACHABLE = 3


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "ctl",
        help="talk to a running daemon over ZeroMQ",
        description="Send one control request to a running hilrec daemon and print its reply.",
    )
    parser.add_argument("verb", choices=sorted(VERBS), help="what to ask for")
    parser.add_argument("--task", help="start: the task text recorded with every frame")
    parser.add_argument("--seed", type=int, help="start: the episode seed (sim mode places the cube from it)")
    outcome = parser.add_mutually_exclusive_group()
    outcome.add_argument(
        "--success",
        dest="success",
        action="store_true",
        default=None,
        help="stop: the operator says the episode succeeded",
    )
    outcome.add_argument(
        "--failure", dest="success", action="store_false", help="stop: the operator says the episode failed"
    )
    parser.add_argument(
        "--wait", action="store_true", help="stop/finalize: wait until the save or the finalize has finished"
    )
    parser.add_argument("--wait-s", type=float, default=120.0, help="longest --wait (seconds)")
    parser.add_argument(
        "--config", type=Path, help="the daemon's TOML config: its [zmq] host, control_port and CURVE key"
    )
    parser.add_argument(
        "--host", help="the daemon's [zmq] host (default: 127.0.0.1; with --config, its host)"
    )
    parser.add_argument("--port", type=int, help="the daemon's [zmq] control_port (default: 5555)")
    parser.add_argument("--timeout-ms", type=int, default=2000, help="wait per attempt (ms)")
    parser.add_argument("--retries", type=int, default=3, help="attempts before giving up")
    parser.add_argument("--server-key", type=Path, help="CURVE: the daemon's public certificate")
    parser.add_argument("--client-key", type=Path, help="CURVE: this client's secret certificate")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from hilrec.daemon.wire.client import ClientKeys, ControlClient
    from hilrec.daemon.wire.security import endpoint

    if args.verb == "start" and args.task is None:  # an empty one goes to the daemon, which names why
        print("hilrec ctl start: --task is required", file=sys.stderr)
        return 2
    host, port, server_key = _address(args)
    keys = None
    if server_key or args.client_key:
        if not (server_key and args.client_key):
            print("hilrec ctl: CURVE needs both --server-key and --client-key", file=sys.stderr)
            return 2
        keys = ClientKeys.from_files(server_key, args.client_key)
    args.host, args.port = host, port
    refused = _nobody_listening(args.host, args.port)
    if refused is not None:
        print(f"hilrec ctl: {refused}", file=sys.stderr)
        return EXIT_UNREACHABLE
    request_args: dict[str, Any] = {}
    if args.verb == "start":
        request_args = {"task": args.task, "seed": args.seed}
    elif args.verb == "stop":
        request_args = {"success": args.success}
    with ControlClient(
        endpoint(args.host, args.port), timeout_ms=args.timeout_ms, retries=args.retries, keys=keys
    ) as client:
        try:
            reply = client.request(VERBS[args.verb], **request_args)
            if reply["ok"] and args.wait and args.verb in ("stop", "finalize"):
                reply = _wait(client, args.verb, reply, args.wait_s)
        except DaemonUnreachableError as exc:
            print(f"hilrec ctl: {exc}", file=sys.stderr)
            return EXIT_UNREACHABLE
    print(json.dumps(reply, indent=2))
    return 0 if reply["ok"] else EXIT_REFUSED


def _address(args: argparse.Namespace) -> tuple[str, int, Path | None]:
    """Host, control port and the server's CURVE certificate: the flags', else the config's."""
    from hilrec.daemon.config import from_mapping, read_toml
    from hilrec.daemon.errors import ConfigError, FlagError
    from hilrec.daemon.wire.security import ZmqSettings, client_host

    if args.config is None:
        return args.host or "127.0.0.1", 5555 if args.port is None else args.port, args.server_key
    if args.port is not None:
        raise FlagError("--port", "goes without --config, which gives the daemon's control_port")
    data = read_toml(args.config).get("zmq", {})
    if not isinstance(data, dict):
        raise ConfigError("zmq", f"expected a table, got {type(data).__name__}", source=str(args.config))
    zmq = from_mapping(ZmqSettings, data, source=str(args.config), prefix="zmq")
    host = args.host or client_host(zmq.host)
    server_key = args.server_key or (zmq.curve.server_secret_key if zmq.curve is not None else None)
    return host, zmq.control_port, server_key


def _nobody_listening(host: str, port: int) -> str | None:
    """Why no daemon can answer, when the control port refuses TCP connections outright (no
    process listens there); None when something listens or it cannot be told (then the request
    itself finds out, bounded by its timeout and retries)."""
    try:
        with contextlib.closing(socket.create_connection((host, port), timeout=1.0)):
            return None
    except ConnectionRefusedError:
        return (
            f"no daemon is running at {host}:{port}: nothing listens on that port. Start one with "
            "`hilrec daemon --config FILE` and give ctl the same --config (or --host/--port: its [zmq] "
            "host and control_port)"
        )
    except OSError:
        return None


def _wait(client: Any, verb: str, reply: dict[str, Any], wait_s: float) -> dict[str, Any]:
    """Poll status until the save (stop) or the finalize is done; return the stop's or the
    finalize's reply, completed with how it ended."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        status = client.request("status")
        dataset = status.get("dataset", {})
        if verb == "stop" and dataset.get("saving") == 0:
            last = status.get("last_episode") or {}
            if last.get("episode_index") not in (None, reply.get("episode_index")):
                last = {}  # not this episode's outcome (should not happen: one save at a time)
            error = last.get("error")
            saved = bool(last.get("saved")) and not error
            done = {**reply, **{k: v for k, v in last.items() if k != "saving"}, "saving": False}
            done["saved"] = saved
            if not saved:
                done.update(ok=False, error=error or "the episode was not saved", code="save_failed")
            return done
        if verb == "finalize" and dataset.get("finalized"):
            return {
                **reply,
                "finalized": True,
                "root": dataset.get("root"),
                "episodes": dataset.get("episodes"),
            }
        time.sleep(0.1)  # a poll interval between bounded requests, not a wait on a result
    return {**reply, "ok": False, "error": f"not finished within {wait_s:.0f} s", "code": "timeout"}
