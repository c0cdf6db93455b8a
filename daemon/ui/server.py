"""The page server (aiohttp): the page's files, its WebSocket, its buttons, the replay reports.

Routes (all behind :func:`guard`):

- ``GET /`` the page; ``GET /static/...`` its script and style sheet (package files);
- ``GET /ws`` a WebSocket that pushes :mod:`hilrec.daemon.ui.model` messages, a ``snapshot``
  first; the page sends nothing on it;
- ``GET /api/state`` the same snapshot as JSON (for scripts and tests);
- ``POST /api/{start,stop,rerecord,discard,finalize}`` with ``{"task": ...}`` (start, rerecord):
  the control requests :data:`hilrec.daemon.ui.bridge.ACTIONS` names; the reply says what the
  daemon answered, or why it refused (HTTP 200 either way; 400 for a malformed body);
- ``GET /takes/{n}/replay.png`` the take's replay report, read-only, if it is inside the root.

The :class:`Hub` is the one place the bridge's messages arrive on the event loop: it feeds the
model and fans the model's messages out to every page, dropping the oldest for a page that does
not keep up (a slow browser costs its own messages, never the server).

Access (:func:`guard`, a middleware in front of every route). There is always a token: ``[ui]
token`` or ``--token`` when given (required beyond loopback), else a new one that ``hilrec ui``
makes at every start (``secrets.token_urlsafe``, as Jupyter does) and prints in the page's URL.
Every HTTP request and the WebSocket must carry it: ``Authorization: Bearer <token>``, or the
cookie the page gets when it is first opened as ``/?token=<token>`` (the server then sets an
HttpOnly, SameSite=Strict cookie and redirects to ``/`` so the token leaves the address bar), or
``?token=`` on the WebSocket URL. It is compared in constant time. Anything else gets 401
before any handler runs, so it changes nothing.

Two browser-side holes are closed besides:

- a page of another site must not drive the buttons: a POST must be ``application/json`` (a
  cross-site form cannot send that without a CORS preflight, which is never granted) and a
  request whose ``Origin`` is not exactly this request's ``Host`` is refused (403);
- served on loopback, the ``Host`` header must be a literal loopback address or ``localhost``
  (:func:`host_is_loopback`), so a DNS-rebound name (``127.evil.com``) cannot reach the page
  through the browser (403).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import ipaddress
import json
import logging
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Final
from urllib.parse import urlsplit

from aiohttp import WSCloseCode, WSMsgType, web
from aiohttp.typedefs import Handler, Middleware

from hilrec.daemon.ui.bridge import ACTIONS, Bridge
from hilrec.daemon.ui.model import BenchModel
from hilrec.daemon.ui.takes import replay_png_path

log = logging.getLogger(__name__)

STATIC_DIR: Final[Path] = Path(__file__).parent / "static"
PAGE_QUEUE: Final[int] = 200  # messages a page may lag behind before the oldest are dropped
MAX_BODY: Final[int] = 16 * 1024

BRIDGE: Final = web.AppKey("bridge", Bridge)


class Hub:
    def __init__(self, model: BenchModel, info: dict[str, Any]) -> None:
        self.model = model
        self.info = info
        self.pages: dict[asyncio.Queue[str], web.WebSocketResponse] = {}
        self.dropped = 0

    def receive(self, kind: str, payload: tuple[Any, ...]) -> None:
        """On the event loop: one message from the bridge."""
        if kind == "telemetry":
            topic, header, blobs, now = payload
            if topic == "tick":
                messages = self.model.on_tick(header, now)
            elif topic == "preview":
                messages = self.model.on_preview(header, blobs, now)
            elif topic == "event":
                messages = self.model.on_event(header, now)
            else:
                messages = []
        elif kind == "status":
            messages = self.model.on_status(*payload)
        else:
            messages = self.model.on_unreachable(*payload)
        for message in messages:
            self.broadcast(message)

    def broadcast(self, message: dict[str, Any]) -> None:
        if not self.pages:
            return
        text = encode(message)
        for queue in self.pages:
            if queue.full():
                queue.get_nowait()
                self.dropped += 1
            queue.put_nowait(text)

    def snapshot(self) -> dict[str, Any]:
        return {**self.model.snapshot(), "info": self.info}


HUB: Final = web.AppKey("hub", Hub)


def encode(message: dict[str, Any]) -> str:
    """JSON with the server's clock (``now``), from which the page reckons every value's age."""
    return json.dumps({**message, "now": time.time()}, separators=(",", ":"))


def build_app(bridge: Bridge, *, token: str, loopback_only: bool, info: dict[str, Any]) -> web.Application:
    app = web.Application(middlewares=[guard(token, loopback_only=loopback_only)], client_max_size=MAX_BODY)
    app[BRIDGE] = bridge
    app[HUB] = Hub(BenchModel(started_at=time.time()), info)
    app.router.add_get("/", page)
    app.router.add_static("/static/", STATIC_DIR, show_index=False, follow_symlinks=False)
    app.router.add_get("/ws", websocket)
    app.router.add_get("/api/state", state)
    app.router.add_post("/api/{action}", action)
    app.router.add_get(r"/takes/{index:\d{1,9}}/replay.png", replay_png)
    app.cleanup_ctx.append(_bridge_running)
    app.on_shutdown.append(_close_pages)
    return app


async def _close_pages(app: web.Application) -> None:
    """Stopping: say goodbye to every open page (else the server waits for them)."""
    for ws in list(app[HUB].pages.values()):
        await ws.close(code=WSCloseCode.GOING_AWAY, message=b"hilrec ui is stopping")


async def _bridge_running(app: web.Application) -> AsyncIterator[None]:
    loop = asyncio.get_running_loop()
    hub = app[HUB]

    def deliver(kind: str, payload: tuple[Any, ...]) -> None:  # on a bridge thread
        with contextlib.suppress(RuntimeError):  # the loop is closing: nobody is listening
            loop.call_soon_threadsafe(hub.receive, kind, payload)

    app[BRIDGE].start(deliver)
    yield
    await loop.run_in_executor(None, app[BRIDGE].close)


async def page(request: web.Request) -> web.StreamResponse:
    return web.FileResponse(STATIC_DIR / "index.html", headers={"Cache-Control": "no-store"})


async def state(request: web.Request) -> web.Response:
    return web.json_response(request.app[HUB].snapshot(), dumps=encode)


async def websocket(request: web.Request) -> web.WebSocketResponse:
    ws = web.WebSocketResponse(heartbeat=10.0, max_msg_size=4096)
    await ws.prepare(request)
    hub = request.app[HUB]
    queue: asyncio.Queue[str] = asyncio.Queue(PAGE_QUEUE)
    await ws.send_str(encode(hub.snapshot()))
    hub.pages[queue] = ws

    async def pump() -> None:
        while True:
            await ws.send_str(await queue.get())

    sender = asyncio.create_task(pump())
    try:
        async for message in ws:  # the page says nothing; this notices when it goes
            if message.type == WSMsgType.ERROR:
                break
    finally:
        hub.pages.pop(queue, None)
        sender.cancel()
        with contextlib.suppress(asyncio.CancelledError, ConnectionError):
            await sender
    return ws


async def action(request: web.Request) -> web.Response:
    name = request.match_info["action"]
    if name not in ACTIONS:
        raise web.HTTPNotFound(text=f"no action {name!r} (known: {', '.join(ACTIONS)})\n")
    try:
        body = await request.json()
    except (ValueError, RecursionError):  # RecursionError: a body nested a thousand deep
        raise web.HTTPBadRequest(text="the body is not JSON\n") from None
    if not isinstance(body, dict):
        raise web.HTTPBadRequest(text="the body must be a JSON object\n")
    task = body.get("task")
    if task is not None and not isinstance(task, str):
        raise web.HTTPBadRequest(text="'task' must be a string\n")
    if name in ("start", "rerecord") and not (task or "").strip():
        return web.json_response(
            {
                "action": name,
                "ok": False,
                "steps": [],
                "message": f"{name} needs a task: type what the take is",
            }
        )
    result = await request.app[BRIDGE].command(name, task)
    log.info("%s: %s", name, result["message"])
    return web.json_response(result)


async def replay_png(request: web.Request) -> web.StreamResponse:
    index = int(request.match_info["index"])
    status = request.app[HUB].model.status or {}
    root = Path((status.get("dataset") or {}).get("root") or request.app[BRIDGE].config_root)
    path = await asyncio.get_running_loop().run_in_executor(None, replay_png_path, root, index)
    if path is None:
        raise web.HTTPNotFound(text=f"take {index} has no replay report inside {root}\n")
    return web.FileResponse(path, headers={"Content-Type": "image/png", "Cache-Control": "no-store"})


# --- access ----------------------------------------------------------------------------------

COOKIE: Final[str] = "hilrec_ui_token"
QUERY: Final[str] = "token"
# Paths that take ?token=: the page itself (then a cookie) and the WebSocket.
QUERY_PATHS: Final[frozenset[str]] = frozenset({"/", "/ws"})


def _same(given: str | None, token: str) -> bool:
    return given is not None and hmac.compare_digest(given.encode(), token.encode())


def presented_token(request: web.Request) -> tuple[str | None, str]:
    """The token the request carries and where: ``header``, ``cookie``, ``query`` or ``none``."""
    header = request.headers.get("Authorization", "")
    scheme, _, value = header.partition(" ")
    if scheme.lower() == "bearer" and value:
        return value.strip(), "header"
    if COOKIE in request.cookies:
        return request.cookies[COOKIE], "cookie"
    if request.method == "GET" and request.path in QUERY_PATHS and QUERY in request.query:
        return request.query[QUERY], "query"
    return None, "none"


def host_is_loopback(host: str) -> bool:
    """Whether a ``Host`` header names loopback literally: an IPv4 address in 127.0.0.0/8 (four
    decimal parts, as :mod:`ipaddress` reads them), ``[::1]`` or ``localhost``, each with an
    optional port. A name that only starts like one (``127.evil.com``, ``127.0.0.1.nip.io``) is
    what a DNS-rebound page sends, so it is refused."""
    if host.startswith("["):
        name, close, port = host[1:].partition("]")
        if not close or (port and not port.startswith(":")):
            return False
        port = port[1:]
    else:
        name, _, port = host.partition(":")
        if ":" in port:
            return False
    if port and not (port.isascii() and port.isdigit() and len(port) <= 5):
        return False
    if host.startswith("["):
        try:
            return ipaddress.IPv6Address(name) == ipaddress.IPv6Address("::1")
        except ValueError:
            return False
    if name.lower() == "localhost":
        return True
    try:
        return ipaddress.IPv4Address(name).is_loopback
    except ValueError:
        return False


def _origin_allowed(request: web.Request) -> bool:
    origin = request.headers.get("Origin")
    if origin is None:
        return True  # not a browser (curl, a script): the token is the check
    parts = urlsplit(origin)
    return parts.scheme in ("http", "https") and parts.netloc == request.headers.get("Host")


def guard(token: str, *, loopback_only: bool) -> Middleware:
    """The middleware: Host (when serving loopback), token, Origin and content type."""
    if not token:
        raise ValueError("the page needs a token (hilrec ui makes one at start)")

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        if loopback_only and not host_is_loopback(request.headers.get("Host", "")):
            raise web.HTTPForbidden(text="this page answers to literal loopback host names only\n")
        given, where = presented_token(request)
        if not _same(given, token):
            raise web.HTTPUnauthorized(
                text="401: this page needs its access token (Authorization: Bearer <token>, "
                "or open it once as the URL hilrec ui printed, /?token=<token>)\n",
                headers={"WWW-Authenticate": 'Bearer realm="hilrec ui"'},
            )
        if not _origin_allowed(request):
            raise web.HTTPForbidden(text="requests from another site's page are refused\n")
        if request.method == "POST" and request.content_type != "application/json":
            raise web.HTTPUnsupportedMediaType(text="POST a JSON object (Content-Type: application/json)\n")
        if where == "query" and request.path == "/":
            # First page load with ?token=: keep it in a cookie, drop it from the address bar.
            response = web.Response(status=303, headers={"Location": "/"})
            response.set_cookie(COOKIE, token, httponly=True, samesite="Strict", path="/")
            return response
        return await handler(request)

    return middleware
