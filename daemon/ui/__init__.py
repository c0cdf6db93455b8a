"""``hilrec ui``: a local web page for a running daemon, a client of its ZeroMQ sockets only.

``bridge`` talks to the daemon (control REQ, telemetry SUB) on threads of its own, ``model``
folds what arrives into what the page shows, ``takes`` reads the saved takes' files beside the
dataset, ``server`` serves the page, its WebSocket and its buttons with aiohttp, and ``cmd_ui``
is the sub-command. The page itself is plain HTML, CSS and JavaScript in ``static/``.
"""
