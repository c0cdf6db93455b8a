"""Drive the MuJoCo twin with a recorded action column, starting from the first recorded state.

The twin is built without cameras and with its cube parked out of the arm's reach (a hardware
log says nothing about where objects were, so nothing in the twin may touch the arm that the log
cannot account for). Its frame is the dataset's: ``1 / fps`` seconds of whole physics steps.

Starting state. A position servo under gravity rests below its goal. Placing the twin at the
first recorded state with that state as goal would start it sagging; instead the goal is
corrected until the twin *rests* at the recorded state (a few resets, each settling the arm), as
the real follower did, holding its previous goal, when the first row was read.

The loop is the recorder's, so row ``t + 1`` of the replay is what row ``t``'s action produced::

    replayed[0] = twin.observe()                 # at rest at recorded[0]
    for t in range(n - 1):
        twin.command(action[t]); twin.step_frame(); replayed[t + 1] = twin.observe()
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np

from hilrec.daemon.errors import HilrecError, ReplayError
from hilrec.daemon.so101 import NUM_JOINTS

if TYPE_CHECKING:  # the twin imports MuJoCo: only ReplayEngine.create pays for it
    from hilrec.sim.twin import Twin

# Where the cube is parked: on the table's far corner, ~0.65 m from the base, beyond the arm's reach.
PARKED_CUBE_XY = (0.55, 0.35)


def timestep_for(fps: int, sidecar: Mapping[str, Any] | None) -> tuple[float, str]:
    """The physics step to replay at, and where it comes from.

    A hilrec recording states its timestep; it is used as is (a frame rate it does not divide is
    then refused by the twin). Another recorder's dataset states none, so the twin's own rule
    picks it (:func:`hilrec.sim.twin.timestep_for`: 5 ms where it divides the frame, else the
    largest step below it that does, e.g. 30 fps -> 7 steps of 4.76 ms), as a live twin would.
    """
    if sidecar:
        sim = sidecar.get("sim")
        # A sim recording keeps it in "sim"."physics" (hilrec.sim), the daemon's rigs in "twin",
        # other recorders in "physics".
        holders = (
            sidecar.get("physics"),
            sim.get("physics") if isinstance(sim, Mapping) else None,
            sidecar.get("twin"),
        )
        for holder in holders:
            if isinstance(holder, Mapping) and isinstance(holder.get("timestep"), (int, float)):
                return float(holder["timestep"]), "dataset metadata"
    if fps <= 0:
        raise ReplayError(f"the dataset's fps is {fps}; it must be a positive integer")
    from hilrec.sim.twin import substeps_for
    from hilrec.sim.twin import timestep_for as twin_timestep_for

    timestep = twin_timestep_for(fps)
    return timestep, f"chosen for {fps} fps ({substeps_for(fps, timestep)} steps per frame)"


class ReplayEngine:
    """One twin, reused episode after episode. Lifecycle: create -> replay... -> close."""

    def __init__(self, twin: Twin, *, timestep_source: str, settle_iterations: int = 3) -> None:
        self._twin = twin
        self._timestep_source = timestep_source
        self._settle_iterations = settle_iterations

    @classmethod
    def create(
        cls, fps: int, sidecar: Mapping[str, Any] | None, *, settle_iterations: int = 3
    ) -> ReplayEngine:
        from hilrec.sim.scene import SceneConfig
        from hilrec.sim.twin import Twin

        timestep, source = timestep_for(fps, sidecar)
        base = SceneConfig()
        scene = replace(
            base,
            timestep=timestep,
            cube_x_range=(PARKED_CUBE_XY[0],) * 2,
            cube_y_range=(PARKED_CUBE_XY[1],) * 2,
            cube_yaw_range=(0.0, 0.0),
        )
        twin = Twin(fps=fps, cameras=(), scene=scene)
        return cls(twin, timestep_source=source, settle_iterations=settle_iterations)

    def close(self) -> None:
        self._twin.close()

    def __enter__(self) -> ReplayEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def describe(self) -> dict[str, Any]:
        info = dict(self._twin.physics_info())
        info["timestep_source"] = self._timestep_source
        info["scene"] = "no cameras; cube parked out of reach"
        return info

    def limits(self) -> np.ndarray:
        """``(6, 2)`` low/high of each joint's range in twin units (commands beyond are clamped)."""
        low, high = self._twin.units.units_limits()
        return np.stack([low, high], axis=1).astype(np.float64)

    def start_at(self, state: np.ndarray) -> np.ndarray:
        """Bring the twin to rest at ``state`` (twin units); returns where it came to rest."""
        target = np.asarray(state, dtype=np.float64)
        goal = target.copy()
        low, high = self._twin.units.units_limits()
        rest = target
        for _ in range(max(1, self._settle_iterations)):
            start = np.clip(goal, low, high).astype(np.float32)
            # Twin.reset takes any array (np.asarray); its hint says Sequence[float] (sim/twin.py).
            self._twin.reset(0, arm_units=start)  # type: ignore[arg-type]
            rest = self._twin.observe().astype(np.float64)
            goal = goal + (target - rest)
        return rest

    def replay(
        self, first_state: np.ndarray, actions: np.ndarray, frames_between: np.ndarray | None = None
    ) -> np.ndarray:
        """The twin's ``(n, 6)`` float64 states, driven by ``actions`` from ``first_state``.

        ``frames_between[t]`` (default 1) is how many frames of the dataset's rate passed between
        rows ``t`` and ``t + 1`` as recorded: a recorder that missed tick slots held the last
        command meanwhile, and so does the replay.
        """
        actions = np.asarray(actions, dtype=np.float32)
        n = actions.shape[0]
        if actions.ndim != 2 or actions.shape[1] != NUM_JOINTS:
            raise ReplayError(f"the action column has shape {actions.shape}, expected (n, {NUM_JOINTS})")
        steps = (
            np.ones(max(n - 1, 0), dtype=np.int64)
            if frames_between is None
            else (np.asarray(frames_between, dtype=np.int64))
        )
        if steps.shape != (max(n - 1, 0),) or np.any(steps < 1):
            raise ReplayError(f"frames between rows must be {n - 1} counts >= 1, got {steps!r}")
        out = np.empty((n, NUM_JOINTS), dtype=np.float64)
        twin = self._twin
        frame = 0
        try:
            self.start_at(first_state)
            out[0] = twin.observe()
            for frame in range(n - 1):
                twin.command(actions[frame])
                for _ in range(int(steps[frame])):
                    twin.step_frame()
                out[frame + 1] = twin.observe()
        except HilrecError as exc:  # a SimError (the physics blew up) or a refused command
            raise ReplayError(f"the twin could not replay frame {frame}: {exc}") from exc
        return out
