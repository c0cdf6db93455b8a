"""Who may use the page: beyond loopback only with a token, and a request without it changes
nothing; the replay reports are served read-only from inside the dataset root only."""

from __future__ import annotations

import asyncio
import json
import socket
from pathlib import Path
from typing import Any

import aiohttp
import cv2
import numpy as np
import pytest
from _daemon import Daemon, run_cli, sim_config
from _ui import TOKEN, Ui

# Real daemons, processes or kill loops: the slow tier (make test runs it; make test-fast does not).
pytestmark = pytest.mark.slow

WS_TIMEOUT_S = 20.0


def fetch(method: str, url: str, **kwargs: Any) -> tuple[int, dict[str, str], bytes]:
    """One HTTP request (no redirects followed), bounded; returns status, headers and body."""

    async def go() -> tuple[int, dict[str, str], bytes]:
        timeout = aiohttp.ClientTimeout(total=30)
        async with (
            aiohttp.ClientSession(timeout=timeout) as session,
            session.request(method, url, allow_redirects=False, **kwargs) as response,
        ):
            return response.status, dict(response.headers), await response.read()

    return asyncio.run(go())


def first_ws_message(url: str, **kwargs: Any) -> dict[str, Any]:
    async def go() -> dict[str, Any]:
        async with aiohttp.ClientSession() as session, session.ws_connect(url, **kwargs) as ws:
            message = await ws.receive(timeout=WS_TIMEOUT_S)
            return dict(json.loads(message.data))

    return asyncio.run(go())


def ws_refused(url: str, **kwargs: Any) -> int:
    try:
        first_ws_message(url, **kwargs)
    except aiohttp.WSServerHandshakeError as exc:
        return exc.status
    raise AssertionError(f"the WebSocket {url} was let in")


def listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def unchanged(before: dict[str, Any], after: dict[str, Any]) -> None:
    for key in ("state", "episode", "last_episode", "faults"):
        assert after[key] == before[key], (key, before[key], after[key])
    for key in ("episodes", "saved_this_session", "discarded_this_session", "finalized"):
        assert after["dataset"][key] == before["dataset"][key], key


def test_a_page_beyond_loopback_is_refused_at_start_without_a_token(tmp_path: Path) -> None:
    config = tmp_path / "daemon.toml"
    config.write_text(sim_config(tmp_path / "ds"))
    ui = Ui(config, tmp_path, host="0.0.0.0")
    for extra in ([], ["--token", "short"]):
        result = run_cli(*ui.command()[3:], *extra, timeout_s=120)
        assert result.returncode == 2, result
        assert "config key 'ui.token'" in result.stderr and "16 characters" in result.stderr, result.stderr
        assert not listening(ui.port)
    # The same from the config's [ui] section.
    config.write_text(sim_config(tmp_path / "ds", extra='[ui]\nhost = "0.0.0.0"\n'))
    result = run_cli("ui", "--config", str(config), "--port", str(ui.port), timeout_s=120)
    assert result.returncode == 2 and "config key 'ui.token'" in result.stderr, result.stderr
    assert not listening(ui.port)


def test_with_a_token_a_request_without_it_gets_401_and_changes_nothing(tmp_path: Path, daemons, uis) -> None:
    daemon = daemons(Daemon(tmp_path, sim_config(tmp_path / "ds")))
    ui = uis(Ui(daemon.config_path, tmp_path, host="0.0.0.0", token=TOKEN))
    before = daemon.call("status")
    start = {"json": {"task": "never started"}}
    wrong = {"Authorization": "Bearer " + "x" * len(TOKEN)}
    refused: list[tuple[str, str, dict[str, Any]]] = [
        ("GET", "/", {}),
        ("GET", "/?token=wrong-token-0123456789", {}),
        ("GET", "/api/state", {}),
        ("GET", "/static/app.js", {}),
        ("GET", "/takes/0/replay.png", {}),
        ("POST", "/api/start", start),
        ("POST", "/api/start", {**start, "headers": wrong}),
        ("POST", f"/api/start?token={TOKEN}", start),  # the query counts on the page and /ws only
        ("POST", "/api/finalize", {"json": {}}),
    ]
    for method, path, kwargs in refused:
        status, headers, _ = fetch(method, ui.url + path, **kwargs)
        assert status == 401, (method, path, status)
        assert headers.get("WWW-Authenticate", "").startswith("Bearer")
    assert ws_refused(f"{ui.url.replace('http', 'ws')}/ws") == 401
    # A page of another site cannot drive the buttons, even with the cookie or token.
    bearer = {"Authorization": f"Bearer {TOKEN}"}
    status, _, _ = fetch(
        "POST", ui.url + "/api/start", **start, headers={**bearer, "Origin": "http://evil.example"}
    )
    assert status == 403
    status, _, _ = fetch("POST", ui.url + "/api/start", data="task=x", headers=bearer)
    assert status == 415
    unchanged(before, daemon.call("status"))

    # The token lets the same requests through, and they do change things.
    status, _, body = fetch("GET", ui.url + "/api/state", headers=bearer)
    assert status == 200 and json.loads(body)["type"] == "snapshot"
    status, _, body = fetch("POST", ui.url + "/api/start", **start, headers=bearer)
    reply = json.loads(body)
    assert status == 200 and reply["ok"] and reply["steps"][0]["reply"]["task"] == "never started", reply
    assert daemon.call("status")["state"] == "recording"
    status, _, body = fetch("POST", ui.url + "/api/discard", json={}, headers=bearer)
    assert json.loads(body)["ok"]
    # ?token= on the first page load becomes a cookie (and leaves the address bar).
    status, headers, _ = fetch("GET", f"{ui.url}/?token={TOKEN}")
    assert status == 303 and headers["Location"] == "/"
    cookie = headers["Set-Cookie"]
    assert (
        cookie.startswith(f"hilrec_ui_token={TOKEN}") and "HttpOnly" in cookie and "SameSite=Strict" in cookie
    )
    status, headers, body = fetch("GET", ui.url + "/", headers={"Cookie": f"hilrec_ui_token={TOKEN}"})
    assert status == 200 and b"<canvas" in body
    assert first_ws_message(f"{ui.url.replace('http', 'ws')}/ws?token={TOKEN}")["type"] == "snapshot"


def test_replay_reports_are_served_read_only_and_only_from_inside_the_root(
    tmp_path: Path, daemons, uis
) -> None:
    root = tmp_path / "ds"
    daemon = daemons(Daemon(tmp_path, sim_config(root)))
    ui = uis(Ui(daemon.config_path, tmp_path))  # loopback, the token made at start
    bearer = {"Authorization": f"Bearer {ui.printed_token()}"}
    reports = root / "hilrec" / "replay"
    reports.mkdir(parents=True, exist_ok=True)
    ok, png = cv2.imencode(".png", np.full((8, 8, 3), 200, np.uint8))
    assert ok
    (reports / "episode-000000.png").write_bytes(png.tobytes())
    outside = tmp_path / "secret.png"
    outside.write_bytes(png.tobytes())
    (reports / "episode-000001.png").symlink_to(outside)  # points out of the root

    status, headers, body = fetch("GET", ui.url + "/takes/0/replay.png", headers=bearer)
    assert status == 200 and headers["Content-Type"] == "image/png" and body == png.tobytes()
    for path in (
        "/takes/1/replay.png",  # a symlink out of the root
        "/takes/2/replay.png",  # none
        "/takes/-1/replay.png",
        "/takes/..%2F..%2Fsecret/replay.png",
        "/static/..%2F..%2F..%2Fpyproject.toml",
    ):
        status, _, body = fetch("GET", ui.url + path, headers=bearer)
        assert status in (403, 404), (path, status)
        assert body != png.tobytes()
    status, _, _ = fetch("PUT", ui.url + "/takes/0/replay.png", data=b"x", headers=bearer)
    assert status == 405
    assert (reports / "episode-000000.png").read_bytes() == png.tobytes()


REBOUND_HOSTS = [
    "127.evil.com",
    "127.0.0.1.nip.io",
    "127.1",  # not a literal ipaddress reads as loopback
    "0x7f000001",
    "localhost.evil.com",
    "evil.localhost.com",
    "[::1].evil.com",
    "[::ffff:7f00:1]",  # IPv4-mapped: not ::1
    "127.0.0.1:80:80",
    "127.0.0.1:port",
    "",
]
LOOPBACK_HOSTS = ["127.0.0.1", "127.3.2.1", "localhost", "LocalHost", "[::1]"]


def test_dns_rebound_names_foreign_origins_and_missing_or_wrong_tokens_are_refused(
    tmp_path: Path, daemons, uis
) -> None:
    daemon = daemons(Daemon(tmp_path, sim_config(tmp_path / "ds")))
    ui = uis(Ui(daemon.config_path, tmp_path))  # loopback, no token configured
    url = ui.printed_url()
    token = ui.printed_token()
    assert url.startswith(f"http://127.0.0.1:{ui.port}/?token=") and len(token) >= 32, url
    bearer = {"Authorization": f"Bearer {token}"}
    before = daemon.call("status")
    start = {"json": {"task": "never started"}}
    # No token, a wrong one, or the right one a byte short: 401.
    for headers in (
        {},
        {"Authorization": "Bearer " + "x" * len(token)},
        {"Authorization": f"Bearer {token[:-1]}"},
    ):
        for method, path, kwargs in (("GET", "/api/state", {}), ("POST", "/api/start", start)):
            status, _, _ = fetch(method, ui.url + path, headers=headers, **kwargs)
            assert status == 401, (headers, path, status)
    status, _, _ = fetch("GET", f"{ui.url}/?token={token[:-1]}x")
    assert status == 401
    # A rebound name carries the right token no further than a 403, on every port spelling.
    for name in REBOUND_HOSTS:
        for host in (name, f"{name}:{ui.port}") if name else ("",):
            status, _, _ = fetch("GET", ui.url + "/api/state", headers={**bearer, "Host": host})
            assert status == 403, (host, status)
            status, _, _ = fetch(
                "POST",
                ui.url + "/api/start",
                **start,
                headers={**bearer, "Host": host, "Origin": f"http://{host}"},
            )
            assert status == 403, (host, status)
    # An Origin that is not the Host it came to, or not http(s), is refused.
    for origin in (
        "http://127.evil.com",
        f"http://127.evil.com:{ui.port}",
        f"http://localhost:{ui.port}",  # a loopback name, but not the Host
        f"https://127.0.0.1:{ui.port}.evil.com",
        "null",
        f"file://127.0.0.1:{ui.port}",
    ):
        status, _, _ = fetch("POST", ui.url + "/api/start", **start, headers={**bearer, "Origin": origin})
        assert status == 403, (origin, status)
        assert ws_refused(f"ws://127.0.0.1:{ui.port}/ws?token={token}", origin=origin) == 403
    # A body nested deeper than the JSON parser recurses is a malformed body, not a server error.
    json_type = {"Content-Type": "application/json"}
    status, _, _ = fetch("POST", ui.url + "/api/start", data=b"[" * 10_000, headers={**bearer, **json_type})
    assert status == 400
    unchanged(before, daemon.call("status"))

    # Literal loopback Hosts, with and without a port, are served; so is a matching Origin.
    for name in LOOPBACK_HOSTS:
        for host in (name, f"{name}:{ui.port}"):
            status, _, _ = fetch("GET", ui.url + "/api/state", headers={**bearer, "Host": host})
            assert status == 200, (host, status)
    status, headers, _ = fetch("GET", url)  # the printed URL, once: a cookie
    assert status == 303 and headers["Set-Cookie"].startswith(f"hilrec_ui_token={token}")
    status, _, body = fetch("GET", ui.url + "/", headers={"Cookie": f"hilrec_ui_token={token}"})
    assert status == 200 and b"<canvas" in body
    same = {"Origin": f"http://127.0.0.1:{ui.port}"}
    status, _, body = fetch("POST", ui.url + "/api/start", **start, headers={**bearer, **same})
    assert status == 200 and json.loads(body)["ok"], body
    assert daemon.call("status")["state"] == "recording"
    assert (
        first_ws_message(f"ws://127.0.0.1:{ui.port}/ws?token={token}", origin=same["Origin"])["type"]
        == "snapshot"
    )


def test_each_start_makes_a_new_token_unless_one_is_configured(tmp_path: Path, uis) -> None:
    config = tmp_path / "daemon.toml"
    config.write_text(sim_config(tmp_path / "ds"))
    first, second = uis(Ui(config, tmp_path)), uis(Ui(config, tmp_path))
    assert first.printed_token() != second.printed_token()
    configured = uis(Ui(config, tmp_path, token=TOKEN))
    assert configured.printed_token() == TOKEN
