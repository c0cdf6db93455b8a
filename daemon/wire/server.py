"""The ZeroMQ control server (REP).

:class:`ControlServer` runs on the main thread: it polls its REP socket with a timeout (so a
signal or a shutdown is noticed within ``poll_ms``), checks each request with
:func:`hilrec.daemon.wire.protocol.parse_request`, and always answers, whatever arrived: a refusal is an
error reply naming the problem, and the daemon carries on. A request ``id`` seen recently is
answered from a cache, so a Lazy-Pirate client that retries after a lost reply does not start two
episodes.

Socket security, shared by all three channels, is :mod:`hilrec.daemon.wire.security`.
"""

from __future__ import annotations

import collections
import logging
import threading
from collections.abc import Callable
from typing import Any

import zmq
import zmq.auth

from hilrec.daemon.errors import HilrecError, ProtocolError, RequestRefusedError
from hilrec.daemon.wire.protocol import (
    CODE_INTERNAL,
    Request,
    error_code,
    error_reply,
    ok_reply,
    parse_request,
    request_id_of,
)
from hilrec.daemon.wire.security import Security, ZmqSettings, bind, endpoint

log = logging.getLogger(__name__)

SocketConfigurer = Callable[[zmq.Socket[Any]], None]
_REPLY_CACHE_SIZE = 64


class ControlServer:
    """REP socket, one request at a time, every wait bounded by ``poll_ms``."""

    def __init__(
        self,
        context: zmq.Context[Any],
        settings: ZmqSettings,
        security: Security,
        handler: Callable[[Request], dict[str, Any]],
        *,
        poll_ms: int = 100,
    ) -> None:
        self._settings = settings
        self._handler = handler
        self._poll_ms = poll_ms
        self._replies: collections.OrderedDict[str, tuple[bytes, bool]] = collections.OrderedDict()
        # Shown in status (``control``): every request, and those answered ``ok: false``.
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
        """The reply to ``frames``, whatever they hold: no request, however made, and no
        handler's failure, reaches :meth:`serve`'s loop (it would end the daemon)."""
        self.requests += 1
        try:
            reply, refused = self._reply_to(frames)
        except Exception as exc:  # the last line of defence of the serving loop
            log.exception("control request could not be answered")
            reply, refused = (
                error_reply(None, f"request could not be read: {type(exc).__name__}", CODE_INTERNAL),
                True,
            )
        if refused:
            self.refused += 1
        return reply

    def _reply_to(self, frames: list[bytes]) -> tuple[bytes, bool]:
        """The reply and whether it is a refusal (``ok: false``, a cached one too)."""
        try:
            request = parse_request(frames, max_bytes=self._settings.max_request_bytes)
        except ProtocolError as exc:
            log.warning("refused control request: %s", exc)
            return error_reply(request_id_of(frames), str(exc), error_code(exc)), True
        if request.id is not None and request.id in self._replies:
            return self._replies[request.id]
        refused = True
        try:
            reply = ok_reply(request.id, cmd=request.cmd, **self._handler(request))
            refused = False
        except RequestRefusedError as exc:
            reply = error_reply(request.id, str(exc), exc.code)
        except HilrecError as exc:
            reply = error_reply(request.id, str(exc), getattr(exc, "code", CODE_INTERNAL))
        except Exception as exc:  # a handler's bug is an error reply, not the end
            log.exception("control request %r failed", request.cmd)
            reply = error_reply(
                request.id, f"internal error in {request.cmd!r}: {type(exc).__name__}: {exc}", CODE_INTERNAL
            )
        if request.id is not None:
            self._replies[request.id] = (reply, refused)
            while len(self._replies) > _REPLY_CACHE_SIZE:
                self._replies.popitem(last=False)
        return reply, refused

    def close(self) -> None:
        self._socket.close(linger=0)
