"""The loop and the session in-process, on devices the test drives tick by tick.

The devices are plain classes that keep what happened to them; everything else is real: the
session, the writer thread, the LeRobot dataset writer, telemetry on an in-process socket. The
loop is stepped by hand (a non-realtime pacer), so every assertion is about a known tick.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zmq

from hilrec.daemon.control.clock import TickPacer
from hilrec.daemon.control.faults import Fault, FaultKind
from hilrec.daemon.control.loop import ControlLoop
from hilrec.daemon.control.recorder import Recorder
from hilrec.daemon.control.rig import Rig
from hilrec.daemon.control.session import Session, SessionState
from hilrec.daemon.control.sources import JointReading, WriteResult
from hilrec.daemon.dataset import FrameFlag
from hilrec.daemon.dataset.format.reader import load_episodes, read_episode
from hilrec.daemon.dataset.writer.dataset_writer import DatasetWriter
from hilrec.daemon.errors import PortGoneError, RequestRefusedError
from hilrec.daemon.so101 import ACTION_KEY, ROBOT_TYPE, STATE_KEY, so101_features
from hilrec.daemon.wire.protocol import CODE_FAULT, new_request
from hilrec.daemon.wire.telemetry import Telemetry

FPS = 25


@dataclass
class FakeFollower:
    """Moves halfway to each goal per tick, so a row's state is visibly the state *before* its
    action; ``gone`` makes reads fail as a vanished port does."""

    description: str = "fake follower"
    position: np.ndarray = field(default_factory=lambda: np.zeros(6, np.float32))
    reads: list[np.ndarray] = field(default_factory=list)
    writes: list[np.ndarray] = field(default_factory=list)
    gone: bool = False
    _goal: np.ndarray | None = None

    def read(self) -> JointReading:
        if self.gone:
            raise PortGoneError("the port vanished", port="/dev/fake")
        self.reads.append(self.position.copy())
        return JointReading(self.position.copy())

    def write(self, goal: np.ndarray) -> WriteResult:
        sent = np.clip(np.asarray(goal, np.float32), -90, 90)  # a stand-in for the real clamp
        self.writes.append(sent)
        self._goal = sent
        return WriteResult(sent, clamped=bool(np.any(sent != goal)))

    def advance(self) -> None:
        if self._goal is not None:
            self.position = (self.position + (self._goal - self.position) / 2).astype(np.float32)

    def close(self) -> None:
        pass


@dataclass
class FakeLeader:
    """Plays ``script`` one command a tick; None in it is a tick without a new command."""

    script: list[np.ndarray | None]
    description: str = "fake leader"
    _next: int = 0

    def read(self, frame_index: int | None, observation: np.ndarray) -> JointReading | None:
        command = self.script[min(self._next, len(self.script) - 1)]
        self._next += 1
        return None if command is None else JointReading(command)

    def status(self) -> dict[str, Any]:
        return {"source": "fake", "state": "live"}

    def close(self) -> None:
        pass


@dataclass
class Bench:
    loop: ControlLoop
    session: Session
    recorder: Recorder
    follower: FakeFollower
    root: Path
    events: list[tuple[str, dict[str, Any]]]

    def request(self, cmd: str, **args: Any) -> dict[str, Any]:
        future = self.session.submit(new_request(cmd, **args))
        self.loop.step()  # applied at the next tick edge
        return future.result(timeout=30)


@dataclass
class CountingCamera:
    """Makes a frame each time it is read, as the twin's renderer does (``on_demand``), and counts
    them; ``on_demand=False`` stands for a camera whose frames come whether read or not."""

    on_demand: bool = True
    name: str = "front"
    height: int = 48
    width: int = 64
    made: int = 0

    def read_latest(self) -> np.ndarray:
        self.made += 1
        return np.full((self.height, self.width, 3), self.made % 256, np.uint8)

    def close(self) -> None:
        pass


@contextlib.contextmanager
def bench(
    tmp_path: Path,
    script: list[np.ndarray | None],
    *,
    camera: CountingCamera | None = None,
    preview_hz: float = 0.0,
) -> Iterator[Bench]:
    root = tmp_path / "ds"
    events: list[tuple[str, dict[str, Any]]] = []
    context = zmq.Context()
    telemetry = Telemetry(
        context,
        f"inproc://telemetry-{id(events)}",
        hwm=10,
        preview_hz=preview_hz,
        preview_width=32,
        jpeg_quality=50,
    )
    telemetry.start()
    cameras = {} if camera is None else {camera.name: camera}
    features = so101_features({name: (c.height, c.width) for name, c in cameras.items()})
    recorder = Recorder(
        lambda: DatasetWriter.create(root, fps=FPS, features=features, robot_type=ROBOT_TYPE),
        queue_frames=64,
        stall_s=5.0,
    )
    recorder.start()

    def publish(name: str, **fields: Any) -> None:
        events.append((name, fields))
        telemetry.event(name, **fields)

    session = Session(
        recorder=recorder,
        period_s=1 / FPS,
        on_device_lost="save",
        context={"root": str(root), "mode": "test"},
        publish_event=publish,
    )
    follower = FakeFollower()
    loop = ControlLoop(
        rig=Rig(follower=follower, leader=FakeLeader(script), cameras=dict(cameras)),
        session=session,
        telemetry=telemetry,
        pacer=TickPacer(1 / FPS, realtime=False),
        max_failed_ticks=3,
        watchdog_faults=False,
    )
    try:
        yield Bench(loop, session, recorder, follower, root, events)
    finally:
        recorder.close(30.0)
        telemetry.close()
        context.destroy(0)


def ramp(n: int) -> list[np.ndarray | None]:
    return [np.full(6, 10.0 * (i + 1), np.float32) for i in range(n)]


def test_a_row_is_the_state_observed_then_the_action_sent(tmp_path: Path) -> None:
    script = ramp(12)
    script[5] = np.full(6, 500.0, np.float32)  # beyond the follower's range: clamped, flagged
    with bench(tmp_path, script) as b:
        b.request("start_episode", task="ramp")
        for _ in range(8):
            b.loop.step()
        stopped = b.request("stop_episode", success=True)
        assert stopped["saving"] is True and stopped["frames"] == 9
        b.recorder.finalize().result(timeout=60)
        # The tick that applied the start is row 0 (it opened at that tick's edge, before the
        # observation); the tick that applied the stop is not a row (it closed at its edge).
        rows = read_episode(b.root, 0)
        reads, writes = b.follower.reads, b.follower.writes
        assert len(rows[STATE_KEY]) == 9
        np.testing.assert_array_equal(rows[STATE_KEY], np.stack(reads[0:9]))
        np.testing.assert_array_equal(rows[ACTION_KEY], np.stack(writes[0:9]))
        # the state of row k+1 follows from the action of row k, never the other way round
        np.testing.assert_array_equal(
            rows[STATE_KEY][1:],
            (rows[STATE_KEY][:-1] + (rows[ACTION_KEY][:-1] - rows[STATE_KEY][:-1]) / 2).astype(np.float32),
        )
        assert float(rows[ACTION_KEY][5].max()) == 90.0  # the clamped goal is what was recorded
        assert load_episodes(b.root)[0]["length"] == 9
        names = [name for name, _ in b.events]
        assert names.index("episode_started") < names.index("episode_stopped") < names.index("episode_saved")


def test_a_camera_that_renders_on_demand_makes_only_the_frames_someone_sees(tmp_path: Path) -> None:
    camera = CountingCamera()
    with bench(tmp_path, ramp(40), camera=camera) as b:
        for _ in range(5):
            b.loop.step()
        assert camera.made == 1  # the first tick builds the renderer; idle ticks make nothing
        b.request("start_episode", task="seen")
        for _ in range(7):
            b.loop.step()
        assert camera.made == 1 + 8  # every frame of the take
        b.request("stop_episode")  # applied at the edge of a tick that is not a row
        made = camera.made
        for _ in range(5):
            b.loop.step()
        assert camera.made == made
        b.recorder.finalize().result(timeout=60)
        assert load_episodes(b.root)[0]["length"] == 8


def test_a_camera_makes_a_frame_for_each_preview_and_a_live_one_is_read_every_tick(tmp_path: Path) -> None:
    rendered = CountingCamera()
    with bench(tmp_path, ramp(10), camera=rendered, preview_hz=50.0) as b:
        for _ in range(4):
            time.sleep(0.03)  # past the 20 ms preview period: each tick has a preview due
            b.loop.step()
        assert rendered.made == 4
    live = CountingCamera(on_demand=False)
    with bench(tmp_path / "live", ramp(10), camera=live) as b:
        for _ in range(4):
            b.loop.step()
        assert live.made == 4  # a camera's own stall check runs on every read, take or not


def test_a_leader_without_a_new_command_holds_the_last_goal_and_marks_the_frame(tmp_path: Path) -> None:
    from hilrec.daemon.dataset.format.sidecar import load_episode_sidecar

    twenty, thirty = np.full(6, 20.0, np.float32), np.full(6, 30.0, np.float32)
    with bench(tmp_path, [twenty, None, None, thirty]) as b:
        b.request("start_episode", task="hold")
        for _ in range(3):
            b.loop.step()
        b.request("stop_episode")
        b.recorder.finalize().result(timeout=60)
        rows = read_episode(b.root, 0)
        np.testing.assert_array_equal(rows[ACTION_KEY], np.stack([twenty, twenty, twenty, thirty]))
        _, arrays = load_episode_sidecar(b.root, 0)
        stale = [i for i, f in enumerate(arrays["frame_flags"]) if int(f) & FrameFlag.LEADER_STALE]
        assert stale == [1, 2]


def test_a_vanished_follower_faults_saves_the_take_refuses_a_start_and_clears_on_recovery(
    tmp_path: Path,
) -> None:
    with bench(tmp_path, ramp(40)) as b:
        b.request("start_episode", task="lost")
        for _ in range(4):
            b.loop.step()
        b.follower.gone = True
        b.loop.step()
        assert b.session.state is SessionState.IDLE  # the fault ended the take
        status = b.session.snapshot()
        assert [f["kind"] for f in status["faults"]] == ["device_lost"]
        assert status["last_episode"]["ended_by"] == "fault:device_lost:follower"
        assert status["last_episode"]["saving"] is True
        with pytest.raises(RequestRefusedError) as refused:
            b.request("start_episode", task="again")
        assert refused.value.code == CODE_FAULT and "follower" in str(refused.value)
        b.follower.gone = False
        b.loop._next_probe["follower"] = 0.0  # the once-a-second probe is due now
        b.loop.step()
        assert "follower" not in b.session.faults and b.session.snapshot()["faults"] == []
        assert ("fault_cleared", {"fault": status["faults"][0]}) in b.events
        b.request("start_episode", task="again")
        assert b.session.state is SessionState.RECORDING


def test_status_hands_out_copies_never_the_live_registry(tmp_path: Path) -> None:
    with bench(tmp_path, ramp(3)) as b:
        b.session.raise_fault(
            Fault(kind=FaultKind.LEADER_TIMEOUT, device="leader", message="quiet", ends_episode=False)
        )
        status = b.session.snapshot()
        status["faults"].clear()
        status["faults"].append({"kind": "forged"})
        again = b.session.snapshot()["faults"]
        assert [f["kind"] for f in again] == ["leader_timeout"]
        # The same kind raised again is the same fault: one event, not a flood.
        b.session.raise_fault(
            Fault(kind=FaultKind.LEADER_TIMEOUT, device="leader", message="still", ends_episode=False)
        )
        assert [name for name, _ in b.events].count("fault") == 1


def test_frame_flags_reach_the_episode_sidecar(tmp_path: Path) -> None:
    from hilrec.daemon.dataset.format.sidecar import load_episode_sidecar

    script = ramp(6)
    script[2] = np.full(6, 900.0, np.float32)
    with bench(tmp_path, script) as b:
        b.request("start_episode", task="flags")
        for _ in range(4):
            b.loop.step()
        b.request("stop_episode")
        b.recorder.finalize().result(timeout=60)
        _, arrays = load_episode_sidecar(b.root, 0)
        flags = arrays["frame_flags"]
        clamped = [i for i, f in enumerate(flags) if int(f) & FrameFlag.CLAMPED]
        assert clamped == [2]


@dataclass
class SilentRemoteLeader:
    """A remote leader whose commands stopped: it answers, with nothing new, and says stale."""

    description: str = "silent leader"

    def read(self, frame_index: int | None, observation: np.ndarray) -> JointReading | None:
        return None

    def status(self) -> dict[str, Any]:
        return {"source": "remote", "state": "stale", "age_ms": 900.0, "watchdog_ms": 200.0}

    def close(self) -> None:
        pass


def test_a_silent_remote_leader_raises_one_fault_not_one_a_tick(tmp_path: Path) -> None:
    with bench(tmp_path, ramp(1)) as b:
        b.loop.rig.leader = SilentRemoteLeader()
        b.loop.watchdog_faults = True
        for _ in range(75):  # three seconds of ticks
            b.loop.step()
        names = [name for name, _ in b.events]
        assert names.count("fault") == 1 and names.count("fault_cleared") == 0
        assert [f["kind"] for f in b.session.snapshot()["faults"]] == ["leader_timeout"]
        b.loop.rig.leader = FakeLeader(ramp(3))
        b.loop.step()
        names = [name for name, _ in b.events]
        assert names.count("fault_cleared") == 1 and b.session.snapshot()["faults"] == []


def test_the_twin_follower_clamps_through_the_same_limits_and_never_raises_past_the_loop() -> None:
    from hilrec.daemon.control.sources import TwinFollower
    from hilrec.daemon.errors import ActionError
    from hilrec.sim.twin import Twin

    with Twin(fps=FPS, cameras=()) as twin:
        twin.reset(0)
        follower = TwinFollower(twin)
        result = follower.write(np.array([720.0, -1000.0, 0.0, 0.0, 0.0, 150.0]))
        assert result.clamped
        assert (result.sent >= twin.limits.low).all() and (result.sent <= twin.limits.high).all()
        assert not follower.write((twin.limits.low + twin.limits.high) / 2).clamped
        with pytest.raises(ActionError, match="non-finite"):
            follower.write(np.array([np.nan, 0, 0, 0, 0, 0]))


# --- a leader on a bus of its own is read while the follower is (issue 23, item 8) -------------

# How long each read waits to see the other one start: a bound, never reached when they overlap.
OVERLAP_WAIT_S = 2.0


class Overlap:
    """The two reads of a tick, each waiting (bounded) until the other has started: they meet
    only when they run at the same time. Kept: per tick, whether each saw the other, and the
    order of the reads' ends and the write."""

    def __init__(self) -> None:
        self.follower_started = threading.Event()
        self.leader_started = threading.Event()
        self.follower_saw: list[bool] = []
        self.leader_saw: list[bool] = []
        self.order: list[str] = []
        self._lock = threading.Lock()

    def note(self, what: str) -> None:
        with self._lock:
            self.order.append(what)


@dataclass
class WaitingFollower(FakeFollower):
    overlap: Overlap = field(default_factory=Overlap)

    def read(self) -> JointReading:
        self.overlap.follower_started.set()
        self.overlap.follower_saw.append(self.overlap.leader_started.wait(OVERLAP_WAIT_S))
        self.overlap.note("follower read")
        return super().read()

    def write(self, goal: np.ndarray) -> WriteResult:
        self.overlap.note("write")
        self.overlap.follower_started.clear()
        self.overlap.leader_started.clear()
        return super().write(goal)


@dataclass
class WaitingLeader:
    """A serial leader (``concurrent``) as slow as the follower lets it be."""

    overlap: Overlap
    description: str = "waiting leader"
    concurrent: bool = True
    threads: set[str] = field(default_factory=set)

    def read(self, frame_index: int | None, observation: np.ndarray) -> JointReading | None:
        self.threads.add(threading.current_thread().name)
        self.overlap.leader_started.set()
        self.overlap.leader_saw.append(self.overlap.follower_started.wait(OVERLAP_WAIT_S))
        self.overlap.note("leader read")
        return JointReading(np.full(6, 5.0, np.float32), retries=1)

    def status(self) -> dict[str, Any]:
        return {"source": "serial", "state": "live"}

    def close(self) -> None:
        pass


def test_a_serial_leader_is_read_while_the_follower_is_and_both_before_the_write(tmp_path: Path) -> None:
    overlap = Overlap()
    with bench(tmp_path, ramp(1)) as b:
        follower = WaitingFollower(overlap=overlap)
        leader = WaitingLeader(overlap)
        b.loop.rig.follower, b.loop.rig.leader = follower, leader
        ticks = 6
        for _ in range(ticks):
            b.loop.step()
        # Every tick: both reads, each while the other was running.
        assert len(follower.reads) == ticks and len(follower.writes) == ticks
        assert overlap.follower_saw == [True] * ticks, overlap.follower_saw
        assert overlap.leader_saw == [True] * ticks, overlap.leader_saw
        # Observe, then command: the write comes after both reads of its tick.
        for k in range(ticks):
            tick = overlap.order[3 * k : 3 * k + 3]
            assert sorted(tick[:2]) == ["follower read", "leader read"] and tick[2] == "write", overlap.order
        # One reading thread for all the ticks, not one per tick; the leader's retry is flagged.
        assert len(leader.threads) == 1 and threading.current_thread().name not in leader.threads
        assert b.loop.last_tick["action"] is not None
        assert all(np.array_equal(w, np.full(6, 5.0, np.float32)) for w in follower.writes)
        b.loop.close()
        assert not any(t.name in leader.threads for t in threading.enumerate())
