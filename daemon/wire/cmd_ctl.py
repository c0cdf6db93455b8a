"""``hilrec ctl status|start|stop|discard|finalize|shutdown``: talk to a running daemon.

Prints the daemon's JSON reply. Exit status: 0 when the reply is ``ok``, 1 when the daemon refused
(the reply says why), 3 when no reply came within ``--timeout-ms`` after ``--retries`` attempts.
``stop --wait`` and ``finalize --wait`` poll ``status`` (bounded by ``--wait-s``) until the save or
the finalize has finished, so a script knows the episode is on disk.
"""

from __future__ import annotations

import argparse
import json
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
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=5555)
    parser.add_argument("--timeout-ms", type=int, default=2000, help="wait per attempt")
    parser.add_argument("--retries", type=int, default=3, help="attempts before giving up")
    parser.add_argument("--server-key", type=Path, help="CURVE: the daemon's public certificate")
    parser.add_argument("--client-key", type=Path, help="CURVE: this client's secret certificate")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from hilrec.daemon.wire.client import ClientKeys, ControlClient
    from hilrec.daemon.wire.security import endpoint

    if args.verb == "start" and not args.task:
        print("hilrec ctl start: --task is required", file=sys.stderr)
        return 2
    keys = None
    if args.server_key or args.client_key:
        if not (args.server_key and args.client_key):
            print("hilrec ctl: CURVE needs both --server-key and --client-key", file=sys.stderr)
            return 2
        keys = ClientKeys.from_files(args.server_key, args.client_key)
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


def _wait(client: Any, verb: str, reply: dict[str, Any], wait_s: float) -> dict[str, Any]:
    """Poll status until the save (stop) or finalize is done; return the final status reply."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        status = client.request("status")
        dataset = status.get("dataset", {})
        if verb == "stop" and dataset.get("saving") == 0:
            last = status.get("last_episode") or {}
            status["ok"] = bool(last.get("saved", reply.get("discarded", False)))
            return status
        if verb == "finalize" and dataset.get("finalized"):
            return status
        time.sleep(0.1)  # a poll interval between bounded requests, not a wait on a result
    return {**reply, "ok": False, "error": f"not finished within {wait_s:.0f} s", "code": "timeout"}
