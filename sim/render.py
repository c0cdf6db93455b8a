"""Offscreen camera images of the twin (MUJOCO_GL=egl; Mesa's llvmpipe on this CPU).

Pixels come from a render variant of the scene (:func:`hilrec.sim.scene.compile_scene` with
``visual="fast"`` or ``"full"``) that shares the physics model's joint layout: the physics
``qpos`` is copied in, kinematics recomputed, and the frame drawn. The physics data is only read,
so rendering can never change a trajectory, and a recording without cameras never creates a GL
context at all.

Shadows, reflections and the skybox are off: on a CPU rasteriser each costs a full extra pass,
and a dataset camera gains nothing from them.

llvmpipe rasterises on one thread here (``LP_NUM_THREADS=1`` unless the environment says
otherwise; Mesa reads it when the first GL display opens). Its threaded rasteriser hands every
frame to worker threads and waits for them: with the CPU shared (the video encoder, the writer,
anyone else) a 640x480 frame went from 24 ms to 185 ms at load 10, for no less CPU per frame.
"""

from __future__ import annotations

import os

import mujoco
import numpy as np

from hilrec.daemon.errors import SimError
from hilrec.sim.scene import SceneConfig, Visual, compile_scene

_OFF_FLAGS = (
    mujoco.mjtRndFlag.mjRND_SHADOW,
    mujoco.mjtRndFlag.mjRND_REFLECTION,
    mujoco.mjtRndFlag.mjRND_SKYBOX,
)


class SceneRenderer:
    """Draws camera images of a physics qpos; owns its GL contexts until :meth:`close`."""

    def __init__(self, scene: SceneConfig, *, nq: int, quality: Visual = "fast") -> None:
        if quality == "none":
            raise SimError("a renderer needs visual='fast' or 'full'; 'none' has no arm to draw")
        os.environ.setdefault("LP_NUM_THREADS", "1")
        self._model = compile_scene(scene, quality)
        if self._model.nq != nq:
            raise SimError(f"render model ({quality}) has nq={self._model.nq}, physics has {nq}")
        self._data = mujoco.MjData(self._model)
        self._renderers: dict[tuple[int, int], mujoco.Renderer] = {}
        self.quality = quality
        self.camera_names: tuple[str, ...] = tuple(
            self._model.camera(i).name for i in range(self._model.ncam)
        )

    def check_camera(self, camera: str) -> None:
        if camera not in self.camera_names:
            raise SimError(f"no camera '{camera}' in the scene (cameras: {', '.join(self.camera_names)})")

    def check_size(self, size: tuple[int, int]) -> None:
        height, width = size
        limit = (self._model.vis.global_.offheight, self._model.vis.global_.offwidth)
        if not (0 < height <= limit[0] and 0 < width <= limit[1]):
            raise SimError(f"image size {height}x{width} is outside 1x1..{limit[0]}x{limit[1]}")

    def render(self, qpos: np.ndarray, camera: str, size: tuple[int, int]) -> np.ndarray:
        """A fresh uint8 (H, W, 3) image of ``camera`` at joint positions ``qpos``."""
        self.check_camera(camera)
        renderer = self._renderer(size)
        self._data.qpos[:] = qpos
        mujoco.mj_kinematics(self._model, self._data)
        mujoco.mj_camlight(self._model, self._data)
        renderer.update_scene(self._data, camera=camera)
        for flag in _OFF_FLAGS:
            renderer.scene.flags[flag] = 0
        return renderer.render()  # Renderer.render allocates a new array per call

    def _renderer(self, size: tuple[int, int]) -> mujoco.Renderer:
        renderer = self._renderers.get(size)
        if renderer is None:
            self.check_size(size)
            try:
                renderer = mujoco.Renderer(self._model, height=size[0], width=size[1])
            except Exception as exc:  # mujoco raises plain RuntimeError/FatalError for GL setup
                raise SimError(
                    f"cannot create an offscreen renderer ({size[0]}x{size[1]}): "
                    f"{exc}; is MUJOCO_GL=egl set and Mesa's EGL installed?"
                ) from exc
            self._renderers[size] = renderer
        return renderer

    def close(self) -> None:
        for renderer in self._renderers.values():
            renderer.close()
        self._renderers.clear()
