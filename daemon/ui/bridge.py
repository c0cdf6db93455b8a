"""The page server's side of the daemon's sockets: control REQ and telemetry SUB, off the event loop.

ZeroMQ sockets are blocking and not thread-safe, so each one lives on a thread of its own:

- ``hilrec-ui-telemetry`` owns a :class:`TelemetryClient` (SUB) and hands every message on;
- ``hilrec-ui-status`` asks ``status`` every ``poll_s`` with a short timeout (one attempt), so a
  daemon that stops answering is noticed within about a second, and reads the saved takes'
  files beside the dataset (blocking disk reads stay off the loop too);
- ``hilrec-ui-ctl`` (a one-thread executor) owns the :class:`ControlClient` that carries the
  page's buttons, one request at a time, with Lazy Pirate retries (the daemon answers a resent id
  from its cache, so a retried start is not run twice).

The daemon's loop gains no work: the SUB socket costs only the daemon's publisher thread a send,
and ``status`` is served by its control thread as ``hilrec ctl status`` is.
``deliver(kind, payload)`` is called on these threads; the server passes it to its event loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

import zmq

from hilrec.daemon.errors import DaemonUnreachableError, HilrecError
from hilrec.daemon.ui.takes import TakeFiles
from hilrec.daemon.wire.client import ClientKeys, ControlClient, TelemetryClient

log = logging.getLogger(__name__)

Deliver = Callable[[str, tuple[Any, ...]], None]

# The page's buttons, each the control requests `hilrec ctl` would send, in order.
ACTIONS: Final[dict[str, tuple[str, ...]]] = {
    "start": ("start_episode",),
    "stop": ("stop_episode",),
    "rerecord": ("discard_episode", "start_episode"),
    "discard": ("discard_episode",),
    "finalize": ("finalize",),
    # A rollout's switches (hilrec ctl takeover / handback, space in hilrec rollout).
    "takeover": ("takeover",),
    "handback": ("handback",),
}
_ENVELOPE: Final[frozenset[str]] = frozenset({"v", "id", "ok", "cmd"})


class Bridge:
    def __init__(
        self,
        *,
        control: str,
        telemetry: str,
        root: Path,
        keys: ClientKeys | None = None,
        poll_s: float = 0.5,
        status_timeout_ms: int = 1000,
        command_timeout_ms: int = 5000,
    ) -> None:
        self.control_endpoint = control
        self.telemetry_endpoint = telemetry
        self.config_root = root
        self._keys = keys
        self._poll_s = poll_s
        self._status_timeout_ms = status_timeout_ms
        self._command_timeout_ms = command_timeout_ms
        self._context: zmq.Context[Any] = zmq.Context()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="hilrec-ui-ctl"
        )
        self._command_client: ControlClient | None = None
        self._deliver: Deliver | None = None

    # --- lifecycle --------------------------------------------------------------------------

    def start(self, deliver: Deliver) -> None:
        self._deliver = deliver
        for name, target in (("hilrec-ui-telemetry", self._telemetry), ("hilrec-ui-status", self._status)):
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)

    def close(self, timeout_s: float = 3.0) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout_s)
        self._executor.submit(self._close_command_client).result(timeout_s)
        self._executor.shutdown(wait=True)
        self._context.term()

    # --- the page's buttons -----------------------------------------------------------------

    async def command(self, action: str, task: str | None) -> dict[str, Any]:
        """Run a button's requests on the control thread; the result says what the daemon said."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self._run_action, action, task)

    def _run_action(self, action: str, task: str | None) -> dict[str, Any]:
        steps: list[dict[str, Any]] = []
        for cmd in ACTIONS[action]:
            args: dict[str, Any] = {"task": task} if cmd == "start_episode" else {}
            try:
                reply = self._client().request(cmd, **args)
            except DaemonUnreachableError as exc:
                reply = {"ok": False, "error": str(exc), "code": "unreachable"}
            except HilrecError as exc:  # the request itself is malformed (a bad task text)
                reply = {"ok": False, "error": str(exc), "code": "bad_request"}
            steps.append({"cmd": cmd, "reply": reply})
            if not reply.get("ok"):
                break
        last = steps[-1]
        ok = bool(last["reply"].get("ok")) and len(steps) == len(ACTIONS[action])
        return {"action": action, "ok": ok, "steps": steps, "message": describe(last["cmd"], last["reply"])}

    def _client(self) -> ControlClient:
        if self._command_client is None:
            self._command_client = ControlClient(
                self.control_endpoint,
                timeout_ms=self._command_timeout_ms,
                retries=2,
                keys=self._keys,
                context=self._context,
            )
        return self._command_client

    def _close_command_client(self) -> None:
        if self._command_client is not None:
            self._command_client.close()
            self._command_client = None

    # --- threads ----------------------------------------------------------------------------

    def _telemetry(self) -> None:
        client = TelemetryClient(self.telemetry_endpoint, keys=self._keys, context=self._context)
        try:
            while not self._stop.is_set():
                try:
                    message = client.receive(200)
                except HilrecError as exc:  # a message that does not parse: skip it, keep listening
                    log.warning("telemetry message refused: %s", exc)
                    continue
                if message is not None:
                    self._send("telemetry", (*message, time.time()))
        finally:
            client.close()

    def _status(self) -> None:
        client = ControlClient(
            self.control_endpoint,
            timeout_ms=self._status_timeout_ms,
            retries=1,
            keys=self._keys,
            context=self._context,
        )
        files = TakeFiles(self.config_root)
        try:
            while not self._stop.is_set():
                try:
                    reply = client.request("status")
                except DaemonUnreachableError as exc:
                    self._send("down", (str(exc), time.time()))
                else:
                    if reply.get("ok"):
                        dataset = reply.get("dataset") or {}
                        root = Path(dataset.get("root") or self.config_root)
                        if root != files.root:
                            files = TakeFiles(root)
                        takes = files.scan(int(dataset.get("episodes") or 0))
                        self._send("status", (reply, takes, time.time()))
                    else:
                        self._send("down", (f"status refused: {reply.get('error')}", time.time()))
                self._stop.wait(self._poll_s)  # the poll period between bounded requests
        finally:
            client.close()

    def _send(self, kind: str, payload: tuple[Any, ...]) -> None:
        if self._deliver is not None:
            self._deliver(kind, payload)


def describe(cmd: str, reply: dict[str, Any]) -> str:
    """One line for the page: what the daemon answered to ``cmd``, or why it refused."""
    if not reply.get("ok"):
        code = reply.get("code")
        return f"{cmd} refused: {reply.get('error')}" + (f" ({code})" if code else "")
    fields = ", ".join(f"{k} {v}" for k, v in reply.items() if k not in _ENVELOPE and v is not None)
    return f"{cmd}: ok" + (f" ({fields})" if fields else "")
