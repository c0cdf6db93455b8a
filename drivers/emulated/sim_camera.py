"""A camera of the MuJoCo twin that behaves like a real one: rendered in the background at its
frame rate, newest frame only, stall detection as for an OpenCV device."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from hilrec.daemon.errors import CameraError, CameraStalledError
from hilrec.drivers.camera import LatestFrame, NewestFrameSource

if TYPE_CHECKING:  # MuJoCo is imported only when a camera is made
    from hilrec.drivers.emulated.emulator import EmulatedArm
    from hilrec.sim.twin import Twin


class SimCamera(NewestFrameSource):
    """A camera of the MuJoCo twin, rendered in the background at ``fps`` like a real one.

    ``snapshot()`` returns the simulator state to draw (e.g. under the emulator's lock); the
    frame is rendered on ``renderer``, a twin of its own, so rendering never holds up the
    physics or the bus. ``EmulatedArm``'s twin: ``SimCamera.of_emulator(arm, "front")``.
    """

    def __init__(
        self,
        *,
        name: str,
        snapshot: Callable[[], np.ndarray],
        renderer: Twin,
        fps: float = 25.0,
        stall_timeout_s: float = 2.0,
    ) -> None:
        self.name = name
        self.height, self.width = renderer.image_size
        self.fps = fps
        self._snapshot = snapshot
        self._renderer = renderer
        self._latest = LatestFrame(name, stall_timeout_s)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @classmethod
    def of_emulator(
        cls,
        arm: EmulatedArm,
        name: str,
        *,
        image_size: tuple[int, int] = (480, 640),
        fps: float = 25.0,
        stall_timeout_s: float = 2.0,
    ) -> SimCamera:
        from hilrec.sim.twin import Twin

        twin: Twin | None = getattr(arm.motion, "twin", None)  # only a TwinMotion has one
        if twin is None:
            raise CameraError(
                f"camera '{name}': the emulated {arm.config.role} has no twin (motion {arm.config.motion!r})"
            )

        def snapshot() -> np.ndarray:
            with arm.lock:
                return twin.get_state()

        renderer = Twin(fps=twin.fps, cameras=(name,), image_size=image_size, scene=twin.scene)
        return cls(name=name, snapshot=snapshot, renderer=renderer, fps=fps, stall_timeout_s=stall_timeout_s)

    def open(self, timeout_s: float = 30.0) -> None:
        """Start rendering; returns once the first frame is there (a GL context is bound to
        the thread that made it, so every render, the first included, runs on ours)."""
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name=f"simcam-{self.name}", daemon=True)
        self._thread.start()
        try:
            self._latest.wait_newer(0, timeout_s)
        except CameraStalledError as exc:
            self.close()
            raise CameraError(f"camera '{self.name}': the twin could not be rendered: {exc}") from exc

    def _render_once(self) -> None:
        state = self._snapshot()
        captured_at = time.monotonic()  # the moment the scene was as drawn
        self._renderer.set_state(state)
        self._latest.publish(self._renderer.render(self.name), captured_at)

    def _loop(self) -> None:
        period = 1.0 / self.fps
        next_due = time.monotonic()
        while not self._stop.wait(max(0.0, next_due - time.monotonic())):
            next_due = max(next_due + period, time.monotonic())
            try:
                self._render_once()
            except Exception as exc:  # noqa: BLE001 - reported through read_latest()
                self._latest.fail(f"render failed: {exc}")
                return

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        self._renderer.close()

    def __enter__(self) -> SimCamera:
        self.open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
