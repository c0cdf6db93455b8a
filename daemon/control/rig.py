"""What a loop drives: the rig of devices, the mirroring twin, and how a mode builds them.

Every mode builds a :class:`Rig` through a :data:`RigFactory` on the loop thread (sim:
:mod:`hilrec.daemon.control.sim_rig`; hil and emulated: :mod:`hilrec.daemon.control.hardware`);
the remote leader, the same in every mode, is built here.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import zmq

from hilrec.daemon.control.sources import Camera, Follower, Leader, RemoteLeader
from hilrec.daemon.so101 import NUM_JOINTS
from hilrec.daemon.wire.security import Security, endpoint

if TYPE_CHECKING:
    from hilrec.daemon.wire.settings import DaemonSettings
    from hilrec.sim.twin import Twin


class Mirror:
    """A twin that follows the follower's measured joints (hil/emulated mode).

    Its latest full state is kept for other threads (:meth:`snapshot`): emulated mode's ``twin``
    cameras render it on their own threads.
    """

    def __init__(self, twin: Twin) -> None:
        self.twin = twin
        self._started = False
        self._lock = threading.Lock()
        self._state: np.ndarray = twin.get_state()

    def snapshot(self) -> np.ndarray:
        with self._lock:
            return self._state

    def follow(self, measured: np.ndarray) -> np.ndarray:
        """Return the twin's joints *before* following this tick's measurement, then follow it.

        The returned state is what the twin made of the measurements up to the previous tick, so
        its difference to ``measured`` is the divergence, not zero by construction.
        """
        if not self._started:
            self.twin.reset(0, arm_units=measured.tolist())
            self._started = True
        before = np.asarray(self.twin.observe(), dtype=np.float32)
        self.twin.command(measured)
        self.twin.step_frame()
        state = self.twin.get_state()
        with self._lock:
            self._state = state
        return before


class EpisodeHooks(Protocol):
    """Mode-specific work at episode edges (sim: plan the operator, reset the twin from the seed)."""

    def prepare(self, seed: int | None) -> Any:
        """Slow preparation on the control thread (e.g. planning); its result goes to begin()."""
        ...

    def begin(self, prepared: Any) -> tuple[int | None, dict[str, Any], dict[str, np.ndarray]]:
        """Start the episode on the loop thread; return (seed used, sidecar fields, arrays)."""
        ...

    def end(self) -> dict[str, Any]:
        """Close the episode on the rig side; return sidecar fields (e.g. a measured outcome)."""
        ...


class NoHooks:
    def prepare(self, seed: int | None) -> Any:
        return seed

    def begin(self, prepared: Any) -> tuple[int | None, dict[str, Any], dict[str, np.ndarray]]:
        return prepared, {}, {}

    def end(self) -> dict[str, Any]:
        return {}


@dataclass
class Rig:
    """The devices one loop drives."""

    follower: Follower
    leader: Leader
    cameras: dict[str, Camera] = field(default_factory=dict)
    mirror: Mirror | None = None
    # Merged into hilrec/dataset.json: units, calibration, twin physics (what replay needs).
    dataset_fields: dict[str, Any] = field(default_factory=dict)
    # Shown in status: ports, emulator process ids...
    devices: dict[str, Any] = field(default_factory=dict)
    # The joints of the follower (and leader) readings: six per arm.
    joints: int = NUM_JOINTS


RigFactory = Callable[[contextlib.ExitStack], tuple[Rig, EpisodeHooks]]


def remote_leader(settings: DaemonSettings, context: zmq.Context[Any], security: Security) -> RemoteLeader:
    leader = RemoteLeader(
        context,
        endpoint(settings.zmq.host, settings.zmq.leader_port),
        watchdog_s=settings.leader.watchdog_ms / 1000.0,
        max_bytes=settings.zmq.max_leader_bytes,
        configure_socket=security.configure,
    )
    leader.open()
    return leader
