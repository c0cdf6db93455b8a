"""Keep FFmpeg's log messages out of Python, wherever hilrec opens a video.

torchvision (which LeRobot imports) turns on PyAV's Python log callback at import. From then on
FFmpeg's decoder and encoder threads call into Python to log, and tearing a threaded codec down
while the calling thread holds the GIL deadlocks: a decode that stops early, or an encoder
closing, hangs the process for good. hilrec does not read FFmpeg's logs, so every open goes
through :func:`open_av`, which switches the callback off first (a cheap, idempotent call).
"""

from __future__ import annotations

from typing import Any

import av
import av.logging


def quiet() -> None:
    """FFmpeg's messages stay in C (PyAV's default before anything turned logging on)."""
    if av.logging.get_level() is not None:
        av.logging.set_level(None)


def open_av(*args: Any, **kwargs: Any) -> Any:
    """``av.open`` after :func:`quiet`."""
    quiet()
    return av.open(*args, **kwargs)
