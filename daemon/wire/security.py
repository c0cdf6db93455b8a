"""Where the daemon's sockets bind, and who may talk to them: the ``[zmq]`` settings, binding
with errors that name the key, and CURVE.

On loopback no authentication is needed. Beyond loopback every socket is a CURVE server and a
ZAP authenticator admits only the client public keys found in ``authorized_clients``; an unknown
peer fails the handshake and never reaches the daemon.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator

from hilrec.daemon.errors import ConfigError
from hilrec.daemon.wire.protocol import DEFAULT_MAX_LEADER_BYTES, DEFAULT_MAX_REQUEST_BYTES

LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})


def is_loopback(host: str) -> bool:
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # "*", "0.0.0.0"-style wildcards and interface names reach beyond loopback


def client_host(host: str) -> str:
    """Where a client on this machine reaches a daemon bound to ``host`` (a wildcard: loopback)."""
    return "127.0.0.1" if host in ("*", "0.0.0.0", "::", "") else host


@dataclass(frozen=True, kw_only=True)
class CurveSettings:
    """CURVE keys, required whenever the sockets bind beyond loopback.

    ``server_secret_key`` is a ZeroMQ certificate file holding the daemon's secret key (made by
    ``zmq.auth.create_certificates``); ``authorized_clients`` is a directory of client public
    certificates: a peer whose key is not there is refused during the handshake.
    """

    server_secret_key: Path
    authorized_clients: Path


@dataclass(frozen=True, kw_only=True)
class ZmqSettings:
    host: str = "127.0.0.1"
    control_port: int = 5555
    telemetry_port: int = 5556
    leader_port: int = 5557
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES
    max_leader_bytes: int = DEFAULT_MAX_LEADER_BYTES
    # How long a control request may wait for the loop to apply it (start/stop at a tick edge).
    apply_timeout_ms: int = 2000
    telemetry_hwm: int = 100
    curve: CurveSettings | None = None

    def validate(self) -> None:
        ports = {
            "control_port": self.control_port,
            "telemetry_port": self.telemetry_port,
            "leader_port": self.leader_port,
        }
        for key, port in ports.items():
            if not 1 <= port <= 65535:
                raise ConfigError(key, f"must be a TCP port in 1..65535, got {port}")
        if len(set(ports.values())) != 3:
            raise ConfigError("leader_port", "control, telemetry and leader ports must differ")
        for key, value in (
            ("max_request_bytes", self.max_request_bytes),
            ("max_leader_bytes", self.max_leader_bytes),
        ):
            if not 64 <= value <= 16 * 1024 * 1024:
                raise ConfigError(key, f"must be in 64..16777216 bytes, got {value}")
        if self.apply_timeout_ms <= 0:
            raise ConfigError("apply_timeout_ms", "must be positive")
        if not is_loopback(self.host) and self.curve is None:
            raise ConfigError(
                "curve",
                f"binding to host {self.host!r} reaches beyond loopback and "
                "requires CURVE keys ([zmq.curve] server_secret_key, "
                "authorized_clients)",
            )


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
            raise ConfigError(
                "zmq.curve.server_secret_key", f"{key_file} holds no secret key (give the .key_secret file)"
            )
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
