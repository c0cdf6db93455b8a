"""Clients of the daemon's three channels: control (Lazy Pirate), telemetry, remote leader.

Every wait is bounded. :class:`ControlClient` follows zguide's Lazy Pirate: send, poll for the
reply up to ``timeout_ms``, and on silence close the REQ socket with ``LINGER=0`` (a REQ socket
that lost its reply is stuck), open a new one and resend the *same* request (same ``id``, which
the daemon answers from its cache instead of running it twice), ``retries`` times in all.

With CURVE (the daemon bound beyond loopback) a client needs the daemon's public certificate and
its own secret certificate, whose public half is in the daemon's ``authorized_clients``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import zmq
import zmq.auth

from hilrec.daemon.errors import ConfigError, DaemonUnreachableError, ProtocolError
from hilrec.daemon.wire.protocol import (
    TOPIC_EVENT,
    TOPIC_PREVIEW,
    TOPIC_TICK,
    encode_leader,
    new_request,
    parse_reply,
    parse_telemetry,
)


@dataclass(frozen=True)
class ClientKeys:
    server_public: bytes
    public: bytes
    secret: bytes

    @classmethod
    def from_files(cls, server_certificate: Path, client_secret_certificate: Path) -> ClientKeys:
        server_public, _ = zmq.auth.load_certificate(server_certificate)
        public, secret = zmq.auth.load_certificate(client_secret_certificate)
        if not secret:
            raise ConfigError("--client-key", f"{client_secret_certificate} holds no secret key")
        return cls(server_public=server_public, public=public, secret=secret)

    def configure(self, sock: zmq.Socket[Any]) -> None:
        sock.curve_serverkey = self.server_public
        sock.curve_publickey = self.public
        sock.curve_secretkey = self.secret


class ControlClient:
    def __init__(
        self,
        endpoint: str,
        *,
        timeout_ms: int = 2000,
        retries: int = 3,
        keys: ClientKeys | None = None,
        context: zmq.Context[Any] | None = None,
    ) -> None:
        self.endpoint = endpoint
        self.timeout_ms = timeout_ms
        self.retries = max(1, retries)
        self._keys = keys
        self._own_context = context is None
        self._context = context or zmq.Context()
        self._socket: zmq.Socket[Any] | None = None

    def __enter__(self) -> ControlClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._drop_socket()
        if self._own_context:
            self._context.term()

    def request(self, cmd: str, **args: Any) -> dict[str, Any]:
        """Send a checked request; return the reply (``ok`` true or false)."""
        return self.send_raw(new_request(cmd, **args).encode())

    def send_raw(self, payload: bytes | list[bytes]) -> dict[str, Any]:
        """Send any bytes (tests use this for malformed requests) and return the checked reply."""
        frames = payload if isinstance(payload, list) else [payload]
        for _attempt in range(self.retries):
            sock = self._get_socket()
            sock.send_multipart(frames)
            deadline = time.monotonic() + self.timeout_ms / 1000.0
            while (remaining := deadline - time.monotonic()) > 0:
                if sock.poll(max(1, int(remaining * 1000)), zmq.POLLIN):
                    return parse_reply(sock.recv())
            self._drop_socket()  # the REQ socket is stuck without its reply: rebuild it
        raise DaemonUnreachableError(
            f"no reply from a daemon at {self.endpoint} within {self.timeout_ms} ms, "
            f"{self.retries} attempt(s): is one running (hilrec daemon --config FILE), and are "
            "this host and port its [zmq] host and control_port? A daemon that is still opening "
            "its arms and cameras, or is hung, does not answer either (see its log)"
        )

    def call(self, cmd: str, **args: Any) -> dict[str, Any]:
        """Like :meth:`request`, but an error reply raises ProtocolError with its message."""
        reply = self.request(cmd, **args)
        if not reply["ok"]:
            raise ProtocolError(f"daemon refused {cmd!r}: {reply['error']} ({reply.get('code')})")
        return reply

    def _get_socket(self) -> zmq.Socket[Any]:
        if self._socket is None:
            sock = self._context.socket(zmq.REQ)
            sock.setsockopt(zmq.LINGER, 0)
            if self._keys is not None:
                self._keys.configure(sock)
            sock.connect(self.endpoint)
            self._socket = sock
        return self._socket

    def _drop_socket(self) -> None:
        if self._socket is not None:
            self._socket.setsockopt(zmq.LINGER, 0)
            self._socket.close()
            self._socket = None


class TelemetryClient:
    """SUB socket on the telemetry port; :meth:`receive` waits at most ``timeout_ms``."""

    def __init__(
        self,
        endpoint: str,
        *,
        topics: tuple[bytes, ...] = (TOPIC_TICK, TOPIC_EVENT, TOPIC_PREVIEW),
        keys: ClientKeys | None = None,
        context: zmq.Context[Any] | None = None,
    ) -> None:
        self._own_context = context is None
        self._context = context or zmq.Context()
        sock = self._context.socket(zmq.SUB)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.RCVHWM, 1000)
        if keys is not None:
            keys.configure(sock)
        for topic in topics:
            sock.setsockopt(zmq.SUBSCRIBE, topic)
        sock.connect(endpoint)
        self._socket = sock

    def receive(self, timeout_ms: int) -> tuple[str, dict[str, Any], list[bytes]] | None:
        if not self._socket.poll(timeout_ms, zmq.POLLIN):
            return None
        return parse_telemetry(self._socket.recv_multipart())

    def wait_for(self, predicate: Any, timeout_s: float) -> tuple[str, dict[str, Any], list[bytes]] | None:
        """The first message for which ``predicate(topic, header)`` holds, or None at the timeout."""
        deadline = time.monotonic() + timeout_s
        while (remaining := deadline - time.monotonic()) > 0:
            message = self.receive(max(1, int(remaining * 1000)))
            if message is not None and predicate(message[0], message[1]):
                return message
        return None

    def close(self) -> None:
        self._socket.close(linger=0)
        if self._own_context:
            self._context.term()


class LeaderClient:
    """PUSH socket to the remote-leader port; only the newest command matters (CONFLATE)."""

    def __init__(
        self, endpoint: str, *, keys: ClientKeys | None = None, context: zmq.Context[Any] | None = None
    ) -> None:
        self._own_context = context is None
        self._context = context or zmq.Context()
        sock = self._context.socket(zmq.PUSH)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.CONFLATE, 1)
        if keys is not None:
            keys.configure(sock)
        sock.connect(endpoint)
        self._socket = sock
        self.seq = 0

    def send(self, action: np.ndarray | list[float]) -> bool:
        """Queue the newest command; False if it could not be queued (no peer yet)."""
        self.seq += 1
        return self.send_raw(encode_leader(action, self.seq))

    def send_raw(self, payload: bytes) -> bool:
        try:
            self._socket.send(payload, zmq.NOBLOCK)
        except zmq.Again:
            return False
        return True

    def close(self) -> None:
        self._socket.close(linger=0)
        if self._own_context:
            self._context.term()


__all__ = ["TOPIC_PREVIEW", "ClientKeys", "ControlClient", "LeaderClient", "TelemetryClient"]
