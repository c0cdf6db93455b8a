"""The ZeroMQ control server (REP) and the socket security shared by all three channels.

:class:`ControlServer` runs on the main thread: it polls its REP socket with a timeout (so a
signal or a shutdown is noticed within ``poll_ms``), checks each request with
:func:`hilrec.daemon.protocol.parse_request`, and always answers, whatever arrived: a refusal is an
error reply naming the problem, and the daemon carries on. A request ``id`` seen recently is
answered from a cache, so a Lazy-Pirate client that retries after a lost reply does not start two
episodes.

Security: on loopback no authentication is needed. Beyond loopback every socket is a CURVE server
and a ZAP authenticator admits only the client public keys found in ``authorized_clients``; an
unknown peer fails the handshake and never reaches the daemon.
"""

from __future__ import annotations

import collections
import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator

from hilrec.daemon.errors import ConfigError, HilrecError, ProtocolError, RequestRefusedError
from hilrec.daemon.protocol import (CODE_INTERNAL, Request, error_code, error_reply, ok_reply,
                                    parse_request, request_id_of)
from hilrec.daemon.settings import CurveSettings, ZmqSettings

log = logging.getLogger(__name__)

SocketConfigurer = Callable[[zmq.Socket[Any]], None]
_REPLY_CACHE_SIZE = 64


def endpoint(host: str, port: int) -> str:
    return f"tcp://[{host}]:{port}" if ":" in host else f"tcp://{host}:{port}"


def bind(sock: zmq.Socket[Any], address: str, key: str) -> None:
    """Bind, turning a busy or invalid address into an error that names the config key."""
    try:
        sock.bind(address)
    except zmq.ZMQError as exc:
        sock.close(linger=0)
        raise ConfigError(key, f"cannot bind {address}: {exc}") from None


class Security:
    """CURVE server keys plus the ZAP authenticator; a no-op on loopback without keys."""

    def __init__(self, context: zmq.Context[Any], curve: CurveSettings | None) -> None:
        self._auth: ThreadAuthenticator | None = None
        self._public: bytes | None = None
        self._secret: bytes | None = None
        if curve is None:
            return
        key_file = Path(curve.server_secret_key)
        clients = Path(curve.authorized_clients)
        if not key_file.is_file():
            raise ConfigError("zmq.curve.server_secret_key", f"no such certificate file: {key_file}")
        if not clients.is_dir():
            raise ConfigError("zmq.curve.authorized_clients", f"no such directory: {clients}")
        try:
            public, secret = zmq.auth.load_certificate(key_file)
        except (OSError, ValueError) as exc:
            raise ConfigError("zmq.curve.server_secret_key", f"cannot read {key_file}: {exc}") from exc
        if not secret:
            raise ConfigError("zmq.curve.server_secret_key", f"{key_file} holds no secret key "
                                                             "(give the .key_secret file)")
        self._public, self._secret = public, secret
        self._auth = ThreadAuthenticator(context)
        self._auth.start()
        # Only the public keys in this directory may complete a CURVE handshake.
        self._auth.configure_curve(domain="*", location=str(clients))

    @property
    def enabled(self) -> bool:
        return self._secret is not None

    def configure(self, sock: zmq.Socket[Any]) -> None:
        if self._secret is None:
            return
        sock.curve_secretkey = self._secret
        sock.curve_publickey = self._public
        sock.curve_server = True

    def close(self) -> None:
        if self._auth is not None:
            self._auth.stop()
            self._auth = None


class ControlServer:
    """REP socket, one request at a time, every wait bounded by ``poll_ms``."""

    def __init__(self, context: zmq.Context[Any], settings: ZmqSettings, security: Security,
                 handler: Callable[[Request], dict[str, Any]], *, poll_ms: int = 100) -> None:
        self._settings = settings
        self._handler = handler
        self._poll_ms = poll_ms
        self._replies: collections.OrderedDict[str, bytes] = collections.OrderedDict()
        self.requests = 0
        self.refused = 0
        sock = context.socket(zmq.REP)
        sock.setsockopt(zmq.LINGER, 0)
        # A transport cap well above the protocol limit: bigger messages are dropped by libzmq
        # before they are buffered; smaller-but-oversized ones get a named error reply.
        sock.setsockopt(zmq.MAXMSGSIZE, settings.max_request_bytes * 16)
        sock.setsockopt(zmq.SNDTIMEO, 1000)
        security.configure(sock)
        bind(sock, endpoint(settings.host, settings.control_port), "zmq.control_port")
        self._socket = sock

    def serve(self, stop: threading.Event) -> None:
        """Answer requests until ``stop`` is set (a handler may set it, e.g. ``shutdown``)."""
        poller = zmq.Poller()
        poller.register(self._socket, zmq.POLLIN)
        while not stop.is_set():
            events = dict(poller.poll(self._poll_ms))
            if self._socket in events:
                self.handle_one()

    def handle_one(self) -> None:
        frames = self._socket.recv_multipart()
        reply = self._answer(frames)
        try:
            self._socket.send(reply)
        except zmq.Again:
            log.warning("control reply could not be sent within 1 s; the client has gone")

    def _answer(self, frames: list[bytes]) -> bytes:
        self.requests += 1
        try:
            request = parse_request(frames, max_bytes=self._settings.max_request_bytes)
        except ProtocolError as exc:
            self.refused += 1
            log.warning("refused control request: %s", exc)
            return error_reply(request_id_of(frames), str(exc), error_code(exc))
        if request.id is not None and request.id in self._replies:
            return self._replies[request.id]
        try:
            reply = ok_reply(request.id, cmd=request.cmd, **self._handler(request))
        except RequestRefusedError as exc:
            self.refused += 1
            reply = error_reply(request.id, str(exc), exc.code)
        except HilrecError as exc:
            self.refused += 1
            reply = error_reply(request.id, str(exc), getattr(exc, "code", CODE_INTERNAL))
        except Exception as exc:  # noqa: BLE001 - the server boundary: answer, log, keep serving
            log.exception("control request %r failed", request.cmd)
            reply = error_reply(request.id, f"internal error in {request.cmd!r}: "
                                            f"{type(exc).__name__}: {exc}", CODE_INTERNAL)
        if request.id is not None:
            self._replies[request.id] = reply
            while len(self._replies) > _REPLY_CACHE_SIZE:
                self._replies.popitem(last=False)
        return reply

    def close(self) -> None:
        self._socket.close(linger=0)
