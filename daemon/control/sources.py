"""What the loop needs from a follower, a leader and a camera, and the sources that are not hardware.

The loop (:mod:`hilrec.daemon.control.loop`) sees only these small protocols, so the same tick runs on the
MuJoCo twin (sim mode), on serial arms (hil), or on emulated arms. Hardware adapters live in
:mod:`hilrec.daemon.control.hardware`; this module holds the protocols plus the sources that need no
serial port: the twin as a follower, the scripted operator and the remote (ZeroMQ) leader, and
cameras that render the twin.

Units everywhere are LeRobot's (degrees for body joints, 0..100 for the gripper), float32 (6,).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import zmq

from hilrec.daemon.errors import ActionError, FrameError, ProtocolError
from hilrec.daemon.so101 import NUM_JOINTS
from hilrec.daemon.wire.protocol import parse_leader
from hilrec.daemon.wire.security import bind

if TYPE_CHECKING:
    from hilrec.sim.episode import LeaderScript
    from hilrec.sim.twin import Twin


@dataclass(frozen=True, slots=True)
class JointReading:
    """Six joint positions and how many bus retries it took to get them."""

    values: np.ndarray  # float32 (6,)
    retries: int = 0
    # A policy's marks on this tick (FrameFlag bits) and the dataset features it adds to the
    # frame (``intervention``); a leader arm has neither.
    flags: int = 0
    features: Mapping[str, np.ndarray] | None = None


@dataclass(frozen=True, slots=True)
class WriteResult:
    """What was actually sent to the actuators (float32, after any clamp)."""

    sent: np.ndarray
    clamped: bool = False


class Follower(Protocol):
    description: str

    def read(self) -> JointReading:
        """Measured joints. Raises a retryable BusError after the driver's retries, PortGoneError..."""
        ...

    def write(self, goal: np.ndarray) -> WriteResult:
        """Cast to float32 first, clamp if configured, send; return what was sent."""
        ...

    def advance(self) -> None:
        """Let the commanded step happen (the twin steps physics; hardware moves by itself)."""
        ...

    def close(self) -> None: ...


class Leader(Protocol):
    """``concurrent`` (optional, default False): the leader reads a bus of its own and needs
    no observation, so the loop reads it on a second thread while it reads the follower."""

    description: str

    def read(self, frame_index: int | None, observation: np.ndarray) -> JointReading | None:
        """The operator's command, or None when there is no live one (the follower holds)."""
        ...

    def status(self) -> dict[str, Any]: ...

    def close(self) -> None: ...


class Camera(Protocol):
    name: str
    height: int
    width: int

    def read_latest(self) -> np.ndarray:
        """The newest frame, uint8 (H, W, 3) RGB, never blocking; CameraStalledError if too old."""
        ...

    def close(self) -> None: ...


# --- the twin as the follower (sim mode) ------------------------------------------------------


class TwinFollower:
    """Sim mode: the MuJoCo twin is the follower. Observe, command (float32), then step."""

    def __init__(self, twin: Twin) -> None:
        self.twin = twin
        self.description = f"MuJoCo twin ({twin.fps} fps, {twin.substeps} substeps)"

    def read(self) -> JointReading:
        return JointReading(np.asarray(self.twin.observe(), dtype=np.float32))

    def write(self, goal: np.ndarray) -> WriteResult:
        # The twin clamps through the same GoalLimits as a real follower; a goal it refuses is
        # an ActionError, which the loop answers by holding, never by stopping.
        try:
            sent = self.twin.command(goal)
        except FrameError as exc:
            raise ActionError(f"{self.description}: {exc}") from None
        with np.errstate(over="ignore", invalid="ignore"):
            asked = np.asarray(goal).astype(np.float32)
        return WriteResult(sent, clamped=bool(np.any(sent != asked)))

    def advance(self) -> None:
        self.twin.step_frame()

    def close(self) -> None:
        close = getattr(self.twin, "close", None)
        if callable(close):
            close()


class TwinCamera:
    """Sim mode: a camera of the twin, rendered at observation time (before the command)."""

    # Rendered when read: the loop skips the read of a frame nobody will see.
    on_demand = True

    def __init__(self, twin: Twin, name: str, height: int, width: int) -> None:
        self.twin = twin
        self.name = name
        self.height = height
        self.width = width

    def read_latest(self) -> np.ndarray:
        return self.twin.render(self.name)

    def close(self) -> None:
        pass


# --- leaders that are not a serial arm ----------------------------------------------------------


class ScriptedLeader:
    """The scripted operator as the leader: acts only inside an episode, holds between them."""

    def __init__(self) -> None:
        self._operator: LeaderScript | None = None
        self.description = "scripted operator"

    def begin_with(self, operator: LeaderScript) -> None:
        """Play ``operator`` (a planned scripted operator, one arm's or two) from frame 0 of the
        new episode."""
        self._operator = operator

    def end_episode(self) -> None:
        self._operator = None

    def read(self, frame_index: int | None, observation: np.ndarray) -> JointReading | None:
        if self._operator is None or frame_index is None:
            return None
        return JointReading(np.asarray(self._operator.act(frame_index, observation), dtype=np.float32))

    def status(self) -> dict[str, Any]:
        return {"source": "scripted", "state": "live" if self._operator is not None else "idle"}

    def close(self) -> None:
        self._operator = None


class RemoteLeader:
    """Commands from a ZeroMQ PUSH peer on a PULL socket that keeps only the latest message.

    The socket is owned by the loop thread (it is created and read there). A command older than
    ``watchdog_s`` (``time.monotonic``) is not live: :meth:`read` returns None, the loop holds the
    follower, and :meth:`status` reports ``stale`` so the daemon can raise the fault.
    """

    def __init__(
        self,
        context: zmq.Context[Any],
        endpoint: str,
        *,
        watchdog_s: float,
        max_bytes: int,
        configure_socket: Any = None,
    ) -> None:
        self._context = context
        self._endpoint = endpoint
        self._watchdog_s = watchdog_s
        self._max_bytes = max_bytes
        self._configure = configure_socket
        self._socket: zmq.Socket[Any] | None = None
        self._latest: np.ndarray | None = None
        self._latest_at: float | None = None
        self._latest_seq = -1
        self._lock = threading.Lock()
        self.received = 0
        self.rejected = 0
        self.last_error: str | None = None
        self.description = f"remote leader (PULL {endpoint})"

    def open(self) -> None:
        sock = self._context.socket(zmq.PULL)
        sock.setsockopt(zmq.LINGER, 0)
        # CONFLATE keeps one message (the newest); it requires single-frame messages, which the
        # protocol specifies. MAXMSGSIZE is a transport cap far above the protocol limit.
        sock.setsockopt(zmq.CONFLATE, 1)
        sock.setsockopt(zmq.MAXMSGSIZE, self._max_bytes * 4)
        if self._configure is not None:
            self._configure(sock)
        bind(sock, self._endpoint, "zmq.leader_port")
        self._socket = sock

    def read(self, frame_index: int | None, observation: np.ndarray) -> JointReading | None:
        self._drain()
        with self._lock:
            if self._latest is None or self._latest_at is None:
                return None
            if time.monotonic() - self._latest_at > self._watchdog_s:
                return None
            return JointReading(self._latest)

    def _drain(self) -> None:
        sock = self._socket
        if sock is None:
            return
        while True:
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            try:
                command = parse_leader(frames, max_bytes=self._max_bytes)
            except ProtocolError as exc:
                self._reject(str(exc))
                continue
            except Exception as exc:  # noqa: BLE001 - no message, however made, may stop the loop
                self._reject(f"leader command could not be read: {type(exc).__name__}: {exc}")
                continue
            if command.action.shape != (NUM_JOINTS,):
                self._reject(f"leader command has {command.action.size} targets, not {NUM_JOINTS}")
                continue
            with self._lock:
                self._latest = command.action
                self._latest_at = time.monotonic()
                self._latest_seq = command.seq
                self.received += 1

    def _reject(self, why: str) -> None:
        with self._lock:
            self.rejected += 1
            self.last_error = why

    def status(self) -> dict[str, Any]:
        with self._lock:
            if self._latest_at is None:
                state, age_ms = "waiting", None
            else:
                age_ms = (time.monotonic() - self._latest_at) * 1e3
                state = "live" if age_ms <= self._watchdog_s * 1e3 else "stale"
            return {
                "source": "remote",
                "state": state,
                "age_ms": age_ms,
                "seq": self._latest_seq,
                "received": self.received,
                "rejected": self.rejected,
                "last_error": self.last_error,
                "watchdog_ms": self._watchdog_s * 1e3,
            }

    def close(self) -> None:
        if self._socket is not None:
            self._socket.close(linger=0)
            self._socket = None
