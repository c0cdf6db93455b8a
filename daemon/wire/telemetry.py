"""The telemetry publisher: a thread that owns the PUB socket, so the loop only appends to a deque.

ZeroMQ sockets are not thread-safe, and JSON encoding and JPEG compression do not belong on the
25 Hz loop. The loop calls :meth:`Telemetry.tick` (a dict), :meth:`Telemetry.preview` (camera
frames, at most ``preview_hz``) and anyone calls :meth:`Telemetry.event`; this thread encodes and
sends them with ``NOBLOCK``. A slow subscriber costs its own messages (PUB drops at the high-water
mark); if this thread itself falls behind, the oldest tick messages are dropped and counted in
``dropped`` (shown in status), never the recording.
"""

from __future__ import annotations

import collections
import logging
import math
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import cv2
import numpy as np
import zmq

from hilrec.daemon.errors import ConfigError
from hilrec.daemon.wire.protocol import TOPIC_EVENT, TOPIC_PREVIEW, TOPIC_TICK, telemetry_header
from hilrec.daemon.wire.security import bind

log = logging.getLogger(__name__)

_MAX_BACKLOG = 256


class Telemetry:
    def __init__(
        self,
        context: zmq.Context[Any],
        endpoint: str,
        *,
        hwm: int,
        preview_hz: float,
        preview_width: int,
        jpeg_quality: int,
        configure_socket: Callable[[zmq.Socket[Any]], None] | None = None,
    ) -> None:
        self._context = context
        self._endpoint = endpoint
        self._hwm = hwm
        self._preview_period = 1.0 / preview_hz if preview_hz > 0 else math.inf
        self._preview_width = preview_width
        self._jpeg_quality = jpeg_quality
        self._configure = configure_socket
        self._backlog: collections.deque[tuple[bytes, Any]] = collections.deque()
        self._cond = threading.Condition()
        self._stop = False
        self._next_preview = 0.0
        self._seq = {TOPIC_TICK: 0, TOPIC_PREVIEW: 0, TOPIC_EVENT: 0}
        self.dropped = 0
        self.sent = 0
        # Fields added to every tick when it is sent, read on this publisher's thread (not the
        # loop's): the video backlog, which the loop has no business measuring.
        self.tick_fields: Callable[[], Mapping[str, Any]] | None = None
        self._thread = threading.Thread(target=self._run, name="hilrec-telemetry", daemon=True)
        self._bound = threading.Event()
        self._bind_error: BaseException | None = None

    def start(self, timeout_s: float = 5.0) -> None:
        self._thread.start()
        if not self._bound.wait(timeout_s):
            raise TimeoutError(f"telemetry socket on {self._endpoint} did not bind in {timeout_s} s")
        if self._bind_error is not None:
            raise self._bind_error

    def close(self, timeout_s: float = 2.0) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify()
        self._thread.join(timeout_s)

    # --- producers (any thread; cheap) ---------------------------------------------------------

    def tick(self, message: Mapping[str, Any]) -> None:
        self._push(TOPIC_TICK, message)

    def wants_preview(self, now: float) -> bool:
        return now >= self._next_preview

    def preview(self, now: float, frame_index: int | None, images: Mapping[str, np.ndarray]) -> None:
        self._next_preview = now + self._preview_period
        if images:
            self._push(TOPIC_PREVIEW, {"frame_index": frame_index, "images": dict(images)})

    def event(self, name: str, **fields: Any) -> None:
        self._push(TOPIC_EVENT, {"event": name, "t_wall": time.time(), **fields})

    def _push(self, topic: bytes, payload: Any) -> None:
        with self._cond:
            if len(self._backlog) >= _MAX_BACKLOG:
                self._backlog.popleft()
                self.dropped += 1
            self._backlog.append((topic, payload))
            self._cond.notify()

    # --- the publisher thread ---------------------------------------------------------------

    def _run(self) -> None:
        try:
            sock = self._context.socket(zmq.PUB)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.SNDHWM, self._hwm)
            if self._configure is not None:
                self._configure(sock)
            bind(sock, self._endpoint, "zmq.telemetry_port")
        except ConfigError as exc:
            self._bind_error = exc
            self._bound.set()
            return
        self._bound.set()
        try:
            while True:
                with self._cond:
                    while not self._backlog and not self._stop:
                        self._cond.wait(0.5)
                    if self._stop and not self._backlog:
                        return
                    topic, payload = self._backlog.popleft()
                self._send(sock, topic, payload)
        finally:
            sock.close(linger=200)  # let the last events (daemon_stopped) reach subscribers

    def _send(self, sock: zmq.Socket[Any], topic: bytes, payload: Any) -> None:
        seq = self._seq[topic]
        self._seq[topic] = seq + 1
        try:
            if topic == TOPIC_PREVIEW:
                frames = self._encode_preview(seq, payload)
            elif topic == TOPIC_TICK and self.tick_fields is not None:
                frames = [topic, telemetry_header(topic, seq, **payload, **self._extra_tick_fields())]
            else:
                frames = [topic, telemetry_header(topic, seq, **payload)]
        except (ValueError, TypeError) as exc:  # a non-finite or odd value: count it, keep serving
            self.dropped += 1
            log.warning("telemetry %s message %d not encodable: %s", topic.decode(), seq, exc)
            return
        try:
            sock.send_multipart(frames, zmq.NOBLOCK)
            self.sent += 1
        except zmq.Again:
            self.dropped += 1

    def _extra_tick_fields(self) -> Mapping[str, Any]:
        assert self.tick_fields is not None
        try:
            return self.tick_fields()
        except Exception:  # a tick goes out without its extras rather than not at all
            log.exception("telemetry: the extra tick fields could not be read")
            return {}

    def _encode_preview(self, seq: int, payload: Mapping[str, Any]) -> list[bytes]:
        cameras: list[dict[str, Any]] = []
        blobs: list[bytes] = []
        for name, frame in payload["images"].items():
            height, width = frame.shape[:2]
            image = frame
            if width > self._preview_width:
                scale = self._preview_width / width
                image = cv2.resize(
                    frame, (self._preview_width, max(1, round(height * scale))), interpolation=cv2.INTER_AREA
                )
            ok, jpeg = cv2.imencode(
                ".jpg", cv2.cvtColor(image, cv2.COLOR_RGB2BGR), [cv2.IMWRITE_JPEG_QUALITY, self._jpeg_quality]
            )
            if not ok:
                continue
            cameras.append(
                {
                    "name": name,
                    "height": int(image.shape[0]),
                    "width": int(image.shape[1]),
                    "source_height": int(height),
                    "source_width": int(width),
                    "encoding": "jpeg",
                    "bytes": int(jpeg.size),
                }
            )
            blobs.append(jpeg.tobytes())
        header = telemetry_header(TOPIC_PREVIEW, seq, frame_index=payload["frame_index"], cameras=cameras)
        return [TOPIC_PREVIEW, header, *blobs]
