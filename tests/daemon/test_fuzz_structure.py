"""Structure-aware hostile messages through a live daemon, on loopback and with CURVE.

A real ``hilrec daemon`` (sim mode, remote leader) gets the named requests of
:data:`_hostile.HOSTILE_REQUESTS` (``[`` x 1000 made ``json.loads`` raise RecursionError, which
killed it) and then a bounded, seeded set of requests and leader commands built from the JSON
grammar (:mod:`_hostile`). Every request gets a reply, every refusal is counted in
``status.control.refused``, and afterwards status still answers with the loop ticking. The same
runs on a daemon bound beyond loopback behind CURVE, through an authorized client's keys: CURVE
admits the peer, it does not vet what the peer sends.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq
import zmq.auth
from _daemon import Daemon, sim_config
from _hostile import HOSTILE_REQUESTS, structured_leader, structured_request
from hypothesis import HealthCheck, given, settings
from support import wait_until

from hilrec.daemon.wire.client import ClientKeys, ControlClient
from hilrec.daemon.wire.protocol import PROTOCOL_VERSION, new_request, parse_reply

# Real daemons, processes or kill loops: the slow tier (make test runs it; make test-fast does not).
pytestmark = pytest.mark.slow

REQUEST_EXAMPLES = 150
LEADER_EXAMPLES = 100
REPLY_TIMEOUT_MS = 10_000
JUDGED_WITHIN_S = 30.0  # a loaded machine's CURVE handshake and first judged message


class Peer:
    """A raw REQ and PUSH pair (with CURVE keys when given), sending bytes as they are."""

    def __init__(self, daemon: Daemon, keys: ClientKeys | None) -> None:
        self.daemon = daemon
        self.keys = keys
        self.context = zmq.Context()
        self.req = self._socket(zmq.REQ, daemon.control)
        self.push = self._socket(zmq.PUSH, f"tcp://127.0.0.1:{daemon.leader_port}")
        self.refusals = 0

    def _socket(self, kind: int, address: str) -> zmq.Socket[Any]:
        sock = self.context.socket(kind)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.RCVTIMEO, REPLY_TIMEOUT_MS)
        if self.keys is not None:
            self.keys.configure(sock)
        sock.connect(address)
        return sock

    def send(self, payload: bytes) -> dict[str, Any]:
        self.req.send(payload)
        try:
            raw = self.req.recv()
        except zmq.Again:
            code = self.daemon.process.poll() if self.daemon.process else None
            raise AssertionError(
                f"no reply to {payload[:80]!r}... ({len(payload)} bytes); daemon exit code {code}\n"
                + self.daemon.log()[-3000:]
            ) from None
        reply = parse_reply(raw)
        if not reply["ok"]:
            self.refusals += 1
        return reply

    def status(self) -> dict[str, Any]:
        reply = self.send(new_request("status").encode())
        assert reply["ok"], reply
        return reply

    def close(self) -> None:
        self.context.destroy(0)


def _curve(tmp: Path) -> tuple[str, ClientKeys]:
    keys = tmp / "keys"
    clients = keys / "clients"
    clients.mkdir(parents=True)
    _, server_secret = zmq.auth.create_certificates(keys, "server")
    _, client_secret = zmq.auth.create_certificates(clients, "operator")
    table = f'[zmq.curve]\nserver_secret_key = "{server_secret}"\nauthorized_clients = "{clients}"\n'
    return table, ClientKeys.from_files(keys / "server.key", Path(client_secret))


@pytest.fixture(scope="module", params=["loopback", "curve"])
def live(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Peer]:
    tmp = tmp_path_factory.mktemp(f"fuzz-{request.param}")
    config = sim_config(tmp / "ds", leader="remote", realtime=True, size=(24, 32))
    if request.param == "loopback":
        daemon, keys = Daemon(tmp, config), None
        daemon.start()
    else:
        table, keys = _curve(tmp)
        daemon = Daemon(tmp, config, host="0.0.0.0", zmq_extra=table)
        daemon.start(expect_ready=False)
        with ControlClient(daemon.control, timeout_ms=1000, retries=90, keys=keys) as client:
            assert client.call("status")["ok"]
    peer = Peer(daemon, keys)
    try:
        yield peer
    finally:
        peer.close()
        daemon.close()


def _refused_count(peer: Peer) -> int:
    return int(peer.status()["control"]["refused"])


@pytest.mark.parametrize("name", sorted(HOSTILE_REQUESTS))
def test_a_hostile_request_is_refused_naming_why_and_the_daemon_keeps_serving(live: Peer, name: str) -> None:
    before = _refused_count(live)
    reply = live.send(HOSTILE_REQUESTS[name])
    assert reply["ok"] is False and reply["code"] in ("bad_request", "too_large"), reply
    assert len(reply["error"]) < 500, reply["error"][:600]  # the reason, not the payload back
    status = live.status()
    assert status["loop"]["crashed"] is None
    assert status["control"]["refused"] == before + 1


def test_too_deep_or_too_long_numbers_are_refused_before_parsing(live: Peer) -> None:
    deep = live.send(b'{"cmd":"status","id":' + b"[" * 40 + b"]" * 40 + b"}")
    assert "nested" in deep["error"] and "32" in deep["error"], deep
    long = live.send(b'{"cmd":"start_episode","task":"t","seed":' + b"9" * 5000 + b"}")
    assert "5000 characters" in long["error"], long


FUZZ = settings(
    deadline=None,
    derandomize=True,  # the same messages on every run and machine
    database=None,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.function_scoped_fixture,
        HealthCheck.data_too_large,
    ],
)


def test_every_structured_request_gets_a_reply_and_each_refusal_is_counted(live: Peer) -> None:
    before = _refused_count(live)
    live.refusals = 0
    sent = 0

    @settings(FUZZ, max_examples=REQUEST_EXAMPLES)
    @given(structured_request())
    def one(payload: bytes) -> None:
        nonlocal sent
        reply = live.send(payload)
        sent += 1
        assert isinstance(reply["ok"], bool) and (reply["ok"] or reply["error"])
        if reply["ok"] and reply["cmd"] == "start_episode":
            live.send(new_request("discard_episode").encode())

    one()
    status = live.status()
    assert sent >= REQUEST_EXAMPLES and status["loop"]["crashed"] is None
    assert status["control"]["refused"] == before + live.refusals
    assert live.refusals > 0.8 * sent  # the payloads are hostile: almost all are refused


def test_structured_leader_commands_leave_the_loop_ticking(live: Peer) -> None:
    judged = live.status()["leader"]

    @settings(FUZZ, max_examples=LEADER_EXAMPLES)
    @given(structured_leader())
    def one(payload: bytes) -> None:
        live.push.send(payload)

    one()
    # The socket keeps only the newest message (CONFLATE), and a message queued before CURVE's
    # handshake is done may never arrive: a well-formed one, sent until it is judged, shows the
    # socket still takes messages after the fuzz.
    canary = json.dumps({"v": PROTOCOL_VERSION, "type": "leader", "seq": 2**40, "action": [0.0] * 6})

    def canary_judged() -> dict[str, Any] | None:
        live.push.send(canary.encode())
        status = live.status()
        leader = status["leader"]
        counted = leader["rejected"] + leader["received"] > judged["rejected"] + judged["received"]
        return status if counted else None

    status = wait_until(canary_judged, JUDGED_WITHIN_S, interval=0.2, what="a leader message judged")
    deadline = time.monotonic() + 10.0
    ticks = status["loop"]["ticks"]
    while live.status()["loop"]["ticks"] <= ticks:
        assert time.monotonic() < deadline, "the loop stopped ticking"
    assert live.status()["loop"]["crashed"] is None


def test_every_field_of_every_verb_has_a_well_typed_strategy() -> None:
    """A new verb's fields must be fuzzed with good values too, or its accepting path goes untried."""
    from _hostile import well_typed

    from hilrec.daemon.wire.protocol import COMMANDS

    assert not sorted({name for fields in COMMANDS.values() for name in fields} - set(well_typed))
