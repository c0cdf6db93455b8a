"""The daemon and the video backlog: a take ended at the spill's bound, the refusal, the backlog shown.

A real sim daemon with the encoder processes, a two-frame ring and a spill bound of a few dozen
frames, driven over ZeroMQ. The encoder processes are frozen (SIGSTOP) so the backlog builds
whatever the machine's speed: the take must end at the bound with a ``spill_full`` fault and be
saved with every frame the writer took, the next start must be refused naming the bound, the loop
must keep running, and once the encoders are thawed the backlog drains, the fault clears and
recording goes on.
"""

from __future__ import annotations

import io
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from _daemon import Daemon, check_passes, sim_config
from rich.console import Console
from support.procs import children

from hilrec.daemon.collect.monitor import Monitor
from hilrec.daemon.collect.panel import Panel, backlog_line
from hilrec.daemon.dataset.format.reader import load_episodes, read_episode
from hilrec.daemon.dataset.format.sidecar import load_episode_sidecar
from hilrec.daemon.dataset.video import encoder_process
from hilrec.daemon.dataset.video.encoder_process import RING_ENV
from hilrec.daemon.wire.protocol import PROTOCOL_VERSION

# Real daemons, processes or kill loops: the slow tier (make test runs it; make test-fast does not).
pytestmark = pytest.mark.slow

H, W = 48, 64
FRAME_BYTES = H * W * 3
LIMIT_FRAMES = 24
ENCODER_MODULE = encoder_process.__name__


def encoder_pids(parent: int) -> list[int]:
    """The daemon's encoder worker processes."""
    return [child.pid for child in children(parent, ENCODER_MODULE)]


@pytest.fixture
def daemon(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    # The encoder and the bound come from the config's [dataset]; only the ring's size (a test
    # knob that makes the encoder fall behind at once) comes from the environment.
    monkeypatch.setenv(RING_ENV, str(2 * FRAME_BYTES))
    dataset = f'video_encoder = "process"\nspill_bytes_limit = {LIMIT_FRAMES * FRAME_BYTES}'
    started = Daemon(tmp_path, sim_config(tmp_path / "ds", size=(H, W), dataset_extra=dataset))
    yield started.start()
    started.close()


def test_a_take_ends_at_the_spill_bound_is_saved_and_the_next_waits_for_the_encoder(
    tmp_path: Path, daemon: Daemon
) -> None:
    assert daemon.process is not None
    telemetry = daemon.telemetry()
    daemon.call("start_episode", task="pick the cube", seed=1)
    daemon.wait_frames(5)
    workers = encoder_pids(daemon.process.pid)
    assert workers, "no encoder process found"
    for pid in workers:
        os.kill(pid, signal.SIGSTOP)
    try:
        status = daemon.wait_status(
            lambda s: any(f["kind"] == "spill_full" for f in s["faults"]) and s["state"] == "idle",
            timeout_s=60,
            what="the take ended by a spill_full fault",
        )
        fault = next(f for f in status["faults"] if f["kind"] == "spill_full")
        assert fault["device"] == "writer" and "spill_bytes_limit" in fault["message"]
        assert status["last_episode"]["ended_by"] == "fault:spill_full:writer"
        assert status["dataset"]["video_backlog_s"] > 0
        # Ended at the bound, not before it: the next frame would not have fitted (the spill's
        # bytes are its blocks on disk, as the writer counts them against the bound).
        assert status["dataset"]["spill_bytes"] + FRAME_BYTES > LIMIT_FRAMES * FRAME_BYTES
        refused = daemon.request("start_episode", task="again")
        assert not refused["ok"] and refused["code"] == "fault"
        assert "spill_bytes_limit" in refused["error"]
        ticks = daemon.call("status")["loop"]["ticks"]
        assert daemon.wait_status(lambda s: s["loop"]["ticks"] > ticks + 10, what="the loop ticking on")
        backlog = _tick_with_backlog(telemetry)
        assert backlog["v"] == PROTOCOL_VERSION
        shown = _panel_text(daemon, status)
        assert "video backlog" in shown and "spilled" in shown, shown
    finally:
        for pid in workers:
            os.kill(pid, signal.SIGCONT)
    daemon.wait_status(
        lambda s: (
            s["dataset"]["saving"] == 0
            and s["dataset"]["video_backlog_s"] == 0
            and s["dataset"]["spill_bytes"] == 0
        ),
        timeout_s=120,
        what="the backlog drained",
    )
    started = daemon.call("start_episode", task="place the cube", seed=2)
    assert started["episode_index"] == 1
    assert not any(f["kind"] == "spill_full" for f in daemon.call("status")["faults"])
    daemon.wait_frames(10)
    daemon.call("stop_episode", success=True)
    daemon.wait_saved(2)
    assert daemon.shutdown() == 0
    telemetry.close()

    root = tmp_path / "ds"
    check_passes(root)
    episodes = load_episodes(root)
    first = episodes[0]
    sidecar, arrays = load_episode_sidecar(root, 0)
    assert sidecar is not None and sidecar["ended_at_spill_bound"] is True
    assert sidecar["frames"] == first["length"] <= sidecar["ticks_recorded"]
    assert any(f["kind"] == "spill_full" for f in sidecar["faults"])
    per_frame = {k: v for k, v in arrays.items() if k.startswith("tick_") or k in ("frame_flags", "leader")}
    assert len(per_frame) >= 9 and all(len(v) == first["length"] for v in per_frame.values())
    # Two in the ring, the rest spilled up to the bound (whose blocks a file system may round
    # up by a frame or two), and whatever the encoder took before it was stopped.
    assert first["length"] >= LIMIT_FRAMES - 2
    assert len(read_episode(root, 0)["frame_index"]) == first["length"]
    assert episodes[1]["length"] >= 10


def _panel_text(daemon: Daemon, status: dict[str, Any]) -> str:
    """What ``hilrec collect``'s panel shows now, from its own telemetry monitor."""
    monitor = Monitor(f"tcp://127.0.0.1:{daemon.telemetry_port}").start()
    try:
        deadline = time.monotonic() + 30
        while monitor.snapshot().loop.video_backlog_s in (None, 0.0):
            assert time.monotonic() < deadline, "the monitor saw no backlog"
            time.sleep(0.05)
        console = Console(file=io.StringIO(), width=200, force_terminal=False)
        panel = Panel(monitor, console=console)
        panel.state.status = daemon.call("status")
        console.print(panel.render())
        text = console.file.getvalue()  # type: ignore[attr-defined]
        line = backlog_line(monitor.snapshot())
        assert line is not None and "video backlog" in line
        return str(text)
    finally:
        monitor.close()


def _tick_with_backlog(telemetry: Any) -> dict[str, Any]:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        message = telemetry.receive(500)
        if message is None:
            continue
        topic, header, _ = message
        # Ticks from before the encoders froze may still be queued: look for the backlog.
        if topic == "tick" and header.get("video_backlog_s", 0) > 0:
            return header
    raise AssertionError("no tick carried a video backlog")
