"""The sim rig: the twin as follower and cameras, the scripted or remote leader (hil and emulated
rigs: :mod:`hilrec.daemon.control.hardware`).

A rig is built *on the loop thread* (:class:`hilrec.daemon.control.runtime.LoopThread`): the twin's GL
context and serial ports then belong to the thread that uses them. Its ``hooks`` do the mode's
work at episode edges:

- sim: ``prepare`` plans the scripted operator on the control thread, from a start made by a
  planning twin (same model, same seed, so the same start the loop's twin will make), because
  planning takes about half a second and must not stall a tick; ``begin`` resets the loop's twin
  from the seed and records the full start state beside the episode; ``end`` measures the outcome.
"""

from __future__ import annotations

import contextlib
import threading
from typing import TYPE_CHECKING, Any

import numpy as np
import zmq

from hilrec.daemon.control.rig import EpisodeHooks, Rig, RigFactory, remote_leader
from hilrec.daemon.control.session import entropy_seed
from hilrec.daemon.control.sources import Camera, Leader, ScriptedLeader, TwinCamera, TwinFollower
from hilrec.daemon.wire.security import Security
from hilrec.daemon.wire.settings import DaemonSettings

if TYPE_CHECKING:
    from hilrec.sim.episode import LeaderScript
    from hilrec.sim.twin import Twin


class SimHooks:
    def __init__(self, twin: Twin, scripted: ScriptedLeader | None, fps: int) -> None:
        self._twin = twin
        self._scripted = scripted
        self._fps = fps
        self._planning_twin: Twin | None = None
        self._planning_lock = threading.Lock()

    def prepare(self, seed: int | None) -> tuple[int, LeaderScript | None]:
        seed = entropy_seed() if seed is None else seed
        if self._scripted is None:
            return seed, None
        from hilrec.sim.bimanual_operator import make_operator
        from hilrec.sim.twin import Twin

        with self._planning_lock:
            if self._planning_twin is None:
                self._planning_twin = Twin(fps=self._fps, cameras=(), scene=self._twin.scene)
            start = self._planning_twin.reset(seed)
        # One arm's operator, or both arms' in the two-arm scene ([arms.left], [arms.right]).
        operator = make_operator(seed, fps=self._fps, scene=self._twin.scene, units=self._twin.units)
        operator.reset(start)
        return seed, operator

    def begin(self, prepared: tuple[int, Any]) -> tuple[int | None, dict[str, Any], dict[str, np.ndarray]]:
        seed, operator = prepared
        start = self._twin.reset(seed)
        if self._scripted is not None and operator is not None:
            self._scripted.begin_with(operator)
        from hilrec.sim.episode import start_fields

        fields = {
            "sim": start_fields(
                self._twin,
                start,
                seed=seed,
                leader="scripted" if self._scripted is not None else "remote",
                phases=operator.phase_starts if operator is not None else {},
            )
        }
        return seed, fields, {"initial_state": np.asarray(start.state, dtype=np.float64)}

    def end(self) -> dict[str, Any]:
        from hilrec.sim.episode import outcome_of

        if self._scripted is not None:
            self._scripted.end_episode()
        return outcome_of(self._twin).to_dict()


def sim_rig_factory(settings: DaemonSettings, context: zmq.Context[Any], security: Security) -> RigFactory:
    def build(stack: contextlib.ExitStack) -> tuple[Rig, EpisodeHooks]:
        from hilrec.sim.bimanual_scene import BimanualSceneConfig
        from hilrec.sim.scene import SceneConfig
        from hilrec.sim.twin import Twin

        names = tuple(settings.cameras)
        sizes = {(cam.height, cam.width) for cam in settings.cameras.values()}
        size = sizes.pop() if sizes else (480, 640)
        # [twin] timestep, or (0) the one hilrec.sim.twin.timestep_for chooses for fps.
        kind = SceneConfig if settings.arm_count == 1 else BimanualSceneConfig
        scene = kind(timestep=settings.twin.given_timestep)
        twin = stack.enter_context(Twin(fps=settings.fps, cameras=names, image_size=size, scene=scene))
        follower = TwinFollower(twin)
        cameras: dict[str, Camera] = {name: TwinCamera(twin, name, size[0], size[1]) for name in names}
        scripted: ScriptedLeader | None = None
        leader: Leader
        if settings.leader.source == "scripted":
            scripted = ScriptedLeader()
            leader = scripted
        else:
            leader = remote_leader(settings, context, security)
            stack.callback(leader.close)
        from hilrec.sim.operator import OperatorConfig
        from hilrec.sim.provenance import dataset_provenance

        provenance = dataset_provenance(
            scene=twin.scene,
            physics=twin.physics_info(),
            operator_config=OperatorConfig() if scripted is not None else None,
            cameras=dict.fromkeys(names, size),
            render_quality="fast",
            push_rate=0.0,
        )
        rig = Rig(
            follower=follower,
            leader=leader,
            cameras=cameras,
            dataset_fields={**provenance, "twin": twin.physics_info()},
            joints=len(twin.joint_names),
        )
        return rig, SimHooks(twin, scripted, settings.fps)

    return build
