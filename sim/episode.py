"""One sim episode: the frame loop shared by recording, replay and re-rendering, and its record.

Every path through the twin takes the same steps in the same order, so a replay reproduces a
recording exactly::

    obs = twin.observe()                  # 1. the state, before anything acts this frame
    pixels = twin.render(camera)          #    (reads the state; never changes it)
    pushes of this frame -> twin.push()   # 2. disturbances, known in advance by frame index
    executed = twin.command(action)       # 3. float32, then ctrl
    twin.step_frame()                     # 4. exactly `substeps` physics steps

Disturbances are random pushes on the cube or an arm link, drawn from the episode's seed before
the episode starts, so they happen at known frames and are recorded beside the dataset.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from hilrec.daemon.errors import ReplayError
from hilrec.sim.scene import (
    ARM_BODIES,
    CUBE_BODY,
    CUBE_GEOM,
    JAW_PADS,
    SUCCESS_CRITERION,
    BinCheck,
    check_in_bin,
)
from hilrec.sim.twin import CubeState, EpisodeStart, Twin

PUSHED_ARM_LINKS = tuple(b for b in ARM_BODIES if b in ("upper_arm", "lower_arm", "wrist", "gripper"))
CUBE_PUSH_NEWTONS = (0.4, 0.9)  # a resting 30 g cube needs ~0.35 N to slide at all
ARM_PUSH_NEWTONS = (1.0, 4.0)


@dataclass(frozen=True, kw_only=True)
class Push:
    """A force (N) and torque (N m) on a body's centre of mass for the whole of one frame."""

    frame: int
    body: str
    force: tuple[float, float, float]
    torque: tuple[float, float, float] = (0.0, 0.0, 0.0)

    def to_dict(self) -> dict[str, Any]:
        return {
            "frame": self.frame,
            "body": self.body,
            "force": list(self.force),
            "torque": list(self.torque),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str) -> Push:
        try:
            return cls(
                frame=int(data["frame"]),
                body=str(data["body"]),
                force=_vector3(data["force"]),
                torque=_vector3(data.get("torque", (0, 0, 0))),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ReplayError(f"{where}: malformed disturbance {dict(data)!r}: {exc}") from exc


def _vector3(values: Iterable[float]) -> tuple[float, float, float]:
    """Three floats from a JSON list; anything else is a ValueError (a malformed disturbance)."""
    x, y, z = (float(v) for v in values)
    return x, y, z


def push_schedule(
    seed: int, num_frames: int, fps: int, rate_hz: float, arm_prefixes: Sequence[str] = ("",)
) -> list[Push]:
    """Pushes at a mean of ``rate_hz`` per second (Poisson), drawn from ``seed`` alone, on the
    cube or a link of any arm (``arm_prefixes``: the arms' name prefixes in the model)."""
    if rate_hz <= 0 or num_frames <= 0:
        return []
    links = [prefix + link for prefix in arm_prefixes for link in PUSHED_ARM_LINKS]
    rng = np.random.default_rng([seed, 0x9054])
    probability = min(1.0, rate_hz / fps)
    pushes = []
    for frame in np.nonzero(rng.random(num_frames) < probability)[0]:
        on_cube = bool(rng.random() < 0.5)
        body = CUBE_BODY if on_cube else str(rng.choice(links))
        low, high = CUBE_PUSH_NEWTONS if on_cube else ARM_PUSH_NEWTONS
        heading = rng.uniform(0, 2 * math.pi)
        # Cube pushes slide it along the table; arm pushes come from any direction.
        elevation = 0.0 if on_cube else rng.uniform(-math.pi / 3, math.pi / 3)
        magnitude = rng.uniform(low, high)
        force = magnitude * np.array(
            [
                math.cos(heading) * math.cos(elevation),
                math.sin(heading) * math.cos(elevation),
                math.sin(elevation),
            ]
        )
        pushes.append(
            Push(frame=int(frame), body=body, force=(float(force[0]), float(force[1]), float(force[2])))
        )
    return pushes


def pushes_by_frame(pushes: Iterable[Push]) -> dict[int, list[Push]]:
    grouped: dict[int, list[Push]] = defaultdict(list)
    for push in pushes:
        grouped[push.frame].append(push)
    return dict(grouped)


def act_and_step(twin: Twin, action: np.ndarray, pushes: Sequence[Push] = ()) -> np.ndarray:
    """Steps 2-4 of a frame (the caller has observed): pushes, command, step. Returns the
    executed float32 command."""
    for push in pushes:
        twin.push(push.body, push.force, push.torque)
    executed = twin.command(action)
    twin.step_frame()
    return executed


class LeaderScript(Protocol):
    """What the frame loop asks of a scripted operator (one arm's ScriptedOperator, or both
    arms' BimanualOperator): plan at reset, then a leader position per frame."""

    def reset(self, start: EpisodeStart | None = None) -> None: ...

    @property
    def num_frames(self) -> int: ...

    @property
    def phase_starts(self) -> dict[str, int]: ...

    @property
    def replans(self) -> list[int]: ...

    def act(self, frame_index: int, observation: np.ndarray | None = None) -> np.ndarray: ...

    def leader_path(self) -> np.ndarray: ...

    def watching(self, frame_index: int) -> bool: ...

    def watch_cube(
        self, frame_index: int, position: np.ndarray, quaternion: np.ndarray, speed: float = 0.0
    ) -> bool: ...


def operator_action(twin: Twin, operator: LeaderScript, frame: int, observation: np.ndarray) -> np.ndarray:
    """The scripted operator's leader position for ``frame``, after it has looked at the cube
    (and re-planned if a push knocked it away before the grasp)."""
    if operator.watching(frame):
        cube = twin.cube_state()
        operator.watch_cube(frame, cube.position, cube.quaternion, cube.speed)
    return operator.act(frame, observation)


class ContactTally:
    """Frames in which each pair of geoms touched, counted after every step."""

    def __init__(self, twin: Twin) -> None:
        self._twin = twin
        names = twin.geom_names
        self._frames: Counter[tuple[int, int]] = Counter()
        cube = names.index(CUBE_GEOM)
        # Each arm's pair of pads: the cube is grasped when it is between both pads of one arm.
        self._pads = [
            {(min(cube, names.index(p + pad)), max(cube, names.index(p + pad))) for pad in JAW_PADS}
            for p in twin.scene.arm_prefixes
        ]
        self.grasp_frames = 0
        self.frames = 0

    def add(self) -> None:
        touching = self._twin.contact_id_pairs()  # a pair counts once per frame
        self._frames.update(touching)
        self.grasp_frames += any(pads <= touching for pads in self._pads)
        self.frames += 1

    def summary(self) -> dict[str, Any]:
        names = self._twin.geom_names
        touched = {"|".join(sorted((names[a], names[b]))): count for (a, b), count in self._frames.items()}
        return {
            "frames": self.frames,
            "frames_cube_between_both_jaw_pads": self.grasp_frames,
            "frames_in_contact": dict(sorted(touched.items())),
        }


@dataclass(frozen=True, kw_only=True)
class Outcome:
    """How an episode ended: the cube's final state and the success criterion on it."""

    cube: CubeState
    check: BinCheck

    @property
    def success(self) -> bool:
        return self.check.success

    def to_dict(self) -> dict[str, Any]:
        return {
            "success": self.success,
            "success_criterion": SUCCESS_CRITERION,
            "success_detail": {
                "inside": self.check.inside,
                "below_rim": self.check.below_rim,
                "resting": self.check.resting,
            },
            "final_cube": self.cube.to_dict(),
        }


def outcome_of(twin: Twin) -> Outcome:
    cube = twin.cube_state()
    return Outcome(cube=cube, check=check_in_bin(cube.position, cube.speed, twin.scene))


def start_fields(
    twin: Twin,
    start: EpisodeStart,
    *,
    seed: int,
    leader: str,
    phases: Mapping[str, int],
    replans: Sequence[int] | None = None,
    push_rate: float = 0.0,
    pushes: Sequence[Push] = (),
) -> dict[str, Any]:
    """The ``"sim"`` fields of an episode sidecar that say how the episode began, which is what
    ``hilrec check --replay`` needs to replay it; the sim recorder and the daemon's sim mode both
    write them through here, so a daemon sim episode replays exactly like a recorded one."""
    fields: dict[str, Any] = {
        "seed": seed,
        "cube": start.cube.to_dict(),
        "arm_units_start": [float(x) for x in start.arm_units],
        "physics": twin.physics_info(),
        "leader": leader,
        "operator_phase_starts": dict(phases),
    }
    if replans is not None:
        fields["operator_replanned_at_frames"] = list(replans)
    fields.update(
        initial_state={
            "array": "initial_state",
            "spec": "mjSTATE_INTEGRATION",
            "size": int(start.state.size),
        },
        push_rate_hz=push_rate,
        disturbances=[p.to_dict() for p in pushes],
    )
    return fields
