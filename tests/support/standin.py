"""A two-arm daemon's wire, stood in for: hilrec's own telemetry publisher and control server on
the ports of a daemon config, publishing ticks of twelve known joint values (left arm first, as
LeRobot's bi_so_follower orders them) and answering ``status``. For the clients of the wire
(``hilrec ui``, ``hilrec display``) while the daemon's two-arm loop is not the one under test."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import zmq

from hilrec.daemon.errors import RequestRefusedError
from hilrec.daemon.wire.protocol import Request
from hilrec.daemon.wire.security import Security, endpoint
from hilrec.daemon.wire.server import ControlServer
from hilrec.daemon.wire.settings import load_settings
from hilrec.daemon.wire.telemetry import Telemetry

STATE = [10.0 * i + 1.0 for i in range(12)]  # left 1..51, right 61..111
ACTION = [v + 2.0 for v in STATE]
TICK_PERIOD_S = 0.04


@contextlib.contextmanager
def two_arm_wire(config: Path) -> Iterator[None]:
    """Serve ``config``'s control and telemetry ports until the block ends."""
    settings = load_settings(config)
    context: zmq.Context[Any] = zmq.Context()
    telemetry = Telemetry(
        context,
        endpoint(settings.zmq.host, settings.zmq.telemetry_port),
        hwm=100,
        preview_hz=0.0,
        preview_width=32,
        jpeg_quality=80,
    )
    telemetry.start()

    def status(request: Request) -> dict[str, Any]:
        if request.cmd != "status":
            raise RequestRefusedError(f"{request.cmd}: not served by this stand-in", "bad_state")
        return {"state": "idle", "mode": "sim", "fps": 25, "uptime_s": 1.0, "dataset": {"episodes": 0}}

    server = ControlServer(context, settings.zmq, Security(context, None), status)
    stop = threading.Event()

    def ticks() -> None:
        slot = 0
        while not stop.wait(TICK_PERIOD_S):  # the stand-in's own pace, 25 Hz
            slot += 1
            start = slot * TICK_PERIOD_S
            timing = {"start": start, "deadline": start, "late_ms": 0.0, "duration_ms": 1.0}
            tick = {"slot": slot, "recording": False, "state": STATE, "action": ACTION, "twin": STATE}
            telemetry.tick({**tick, "leader": ACTION, "timing": timing})

    threads = [threading.Thread(target=server.serve, args=(stop,)), threading.Thread(target=ticks)]
    for thread in threads:
        thread.start()
    try:
        yield
    finally:
        stop.set()
        for thread in threads:
            thread.join(10)
        server.close()
        telemetry.close()
        context.destroy(linger=0)
