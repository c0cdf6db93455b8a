"""Daemon benchmark: an emulated session at 25 Hz with two 640x480 video-file cameras encoding.

``hilrec daemon`` runs as a subprocess in emulated mode (two ``hilrec emulate`` children at 1 Mbps
wire timing, the follower on MuJoCo physics, the leader's hand a smooth wave by default), records
one episode of ``--duration`` seconds (default 120) with both cameras encoded (``--codec``,
default libsvtav1 at LeRobot's settings: ~32 ms of CPU per 640x480 frame on this machine, 1.6
cores for two cameras at 25 Hz, more than a 2-core machine has to spare; libx264 is the
baseline), and is driven only over ZeroMQ. Reported, from the episode's own per-tick record
(hilrec/episodes/*.npz) and from the outside:

- missed deadlines: ticks whose work ran past the next deadline (overruns) plus slots with no
  tick at all (skipped); target 0;
- tick jitter: |tick start - its deadline| (absolute grid), p50/p99/max; target p99 <= 2 ms;
- bus time: the tick's arm reads, from the first one's start until both have returned (the
  episode's ``tick_bus_s``; the leader is read on its own thread while the follower is), and the
  span from the tick's start until the leader's reading is in hand, for runs before it;
- leader read -> follower write latency: from the leader's reading in hand to the follower's
  sync-write returned, p50/p99/max; target p99 <= 5 ms;
- control round trip while recording: ``status`` requests at 10 Hz from a REQ client, send to
  reply, p50/p99/max; target p99 <= 5 ms;
- CPU: the daemon process (all its threads: loop, writer, encoders, cameras, telemetry) and the
  two emulator processes, in % of one core, from /proc over the episode.

- video backlog at the end of the take (seconds of video not encoded yet when stop is sent,
  from the encoder processes' shared-memory counters) and the time from stop until it is drained.

``--cameras N`` records N cameras (default 2). ``--lerobot-streaming`` also feeds the same frames
at 25 Hz to LeRobot 0.4.4's ``StreamingVideoEncoder`` (its queue of 30, LeRobot's settings) and
counts the frames it drops when that queue is full (LeRobot only logs a warning).

``--encoder both`` (the default) runs the session twice, side by side in one run: *before*, the
in-process encoder threads (``HILREC_VIDEO_ENCODER=thread``), and *after*, the encoder worker
processes at SCHED_IDLE fed through shared memory, spilling to disk only while they are behind.

A second table runs LeRobot 0.4.4's pacing (``precise_sleep(1/fps - dt)`` after the work, as its
record loop does) and ours (absolute deadlines) side by side on the same synthetic work, in this
process: achieved rate and drift after ``--pacer-ticks`` ticks.

``--arms 2`` runs the session with one arm pair and with two (``[arms.left]``, ``[arms.right]``:
four emulators, the four buses of a tick read at once) side by side, with the encoder processes,
and adds the per-tick skew between the two arms' readings (followers, leaders) to the table.

``--smoke``: a 2 s episode, one camera, the encoder processes only, 25 pacer ticks.

The machine's load average is printed: on a shared 2-core machine the numbers depend on it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
from _pacing import pacer_comparison
from _takes import stop_take

os.environ.setdefault("MUJOCO_GL", "egl")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

# The /proc walk the tests use to find a daemon's children (tests/support/procs.py).
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from support.procs import children

from hilrec.daemon.dataset.format.sidecar import load_episode_sidecar
from hilrec.daemon.dataset.video import encoder_process
from hilrec.daemon.errors import DaemonUnreachableError
from hilrec.daemon.wire.client import ControlClient

FPS = 25
PERIOD = 1.0 / FPS
H, W = 480, 640
ENCODER_MODULE = encoder_process.__name__
CLK_TCK = os.sysconf("SC_CLK_TCK")
CAMERA_NAMES = ("front", "wrist", "side", "top")


def make_video(path: Path, seconds: int, phase: int) -> Path:
    """A 640x480 30 fps MPEG-4 clip of a moving gradient with mild noise (camera-like content)."""
    import cv2

    rng = np.random.default_rng(phase)
    yy, xx = np.mgrid[0:H, 0:W]
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter.fourcc(*"mp4v"), 30, (W, H))
    for k in range(seconds * 30):
        base = ((xx + 5 * k + phase * 40) % 256 + (yy // 2)) % 256
        img = np.stack([base, (base + 85) % 256, (base + 170) % 256], axis=-1).astype(np.int16)
        img += rng.integers(-6, 7, size=img.shape, dtype=np.int16)
        writer.write(np.clip(img, 0, 255).astype(np.uint8))
    writer.release()
    return path


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def config_text(
    root: Path,
    videos: list[Path],
    ports: list[int],
    priority: int,
    codec: str,
    stall_ms: int,
    leader_motion: str,
    arms: int = 1,
) -> str:
    cameras = "".join(
        f"""
[cameras.{name}]
source = "video"
path = "{video}"
width = {W}
height = {H}
loop = true
stall_ms = {stall_ms}
"""
        for name, video in zip(CAMERA_NAMES, videos, strict=False)
    )
    arm_tables = "[arms.left]\n[arms.right]\n" if arms == 2 else ""  # four emulated arms
    return f"""
mode = "emulated"
fps = {FPS}
[dataset]
root = "{root}"
video_codec = "{codec}"
[zmq]
control_port = {ports[0]}
telemetry_port = {ports[1]}
leader_port = {ports[2]}
[leader]
source = "serial"
[loop]
realtime_priority = {priority}
control_priority = {max(priority - 5, 0)}
[telemetry]
preview_hz = 2.0
[emulated]
leader_motion = "{leader_motion}"
wire_timing = true
{cameras}
{arm_tables}
"""


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime + stime


def three(values: np.ndarray) -> str:
    """p50 / p99 / max, ms."""
    return f"{pct(values, 50):.3f} / {pct(values, 99):.3f} / {values.max():.3f}"


def pct(values: np.ndarray, q: float) -> float:
    return float(np.percentile(values, q)) if len(values) else float("nan")


def encoder_counters(daemon_pid: int) -> list[Path]:
    """The shared-memory segments of the daemon's encoder processes (named on their command line)."""
    return [
        Path("/dev/shm") / [arg for arg in child.argv if arg][-1].decode()
        for child in children(daemon_pid, ENCODER_MODULE)
    ]


def encoder_pids_of(daemon_pid: int) -> list[int]:
    return [child.pid for child in children(daemon_pid, ENCODER_MODULE)]


def frames_encoded(segments: list[Path]) -> list[int]:
    out = []
    for path in segments:
        try:
            with open(path, "rb") as f:
                out.append(int(np.frombuffer(f.read(16), dtype=np.int64)[1]))
        except OSError:
            out.append(-1)
    return out


def run_session(
    duration: float,
    priority: int,
    codec: str,
    stall_ms: int,
    leader_motion: str,
    client_priority: int,
    workdir: Path,
    encoder: str = "process",
    cameras: int = 2,
    arms: int = 1,
) -> dict[str, Any]:
    videos = [make_video(workdir / f"cam{i}.mp4", 10, i) for i in range(cameras)]
    root = workdir / "dataset"
    ports = free_ports(3)
    config = workdir / "bench.toml"
    config.write_text(config_text(root, videos, ports, priority, codec, stall_ms, leader_motion, arms))
    log = (workdir / "daemon.log").open("wb")
    process = subprocess.Popen(
        [sys.executable, "-m", "hilrec.daemon.cli", "daemon", "--config", str(config)],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=dict(os.environ, HILREC_VIDEO_ENCODER=encoder),
    )
    import zmq

    client_context = zmq.Context()
    if client_priority > 0:  # the client's own libzmq I/O thread, like the daemon's
        client_context.set(zmq.THREAD_SCHED_POLICY, os.SCHED_FIFO)
        client_context.set(zmq.THREAD_PRIORITY, client_priority)
    client = ControlClient(f"tcp://127.0.0.1:{ports[0]}", timeout_ms=1000, retries=1, context=client_context)
    result: dict[str, Any] = {}
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                client.request("status")
                break
            except DaemonUnreachableError:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(
                        f"daemon did not start:\n{(workdir / 'daemon.log').read_text()}"
                    ) from None
        status = client.request("status")
        emulators = [d["emulator_pid"] for d in status["devices"].values() if "emulator_pid" in d]
        result["priority"] = status["loop"]["priority"]
        result["load_before"] = os.getloadavg()
        client.timeout_ms, client.retries = 5000, 2
        result["client_priority"] = "normal"
        if client_priority > 0:
            # The measuring client is the instrument: its own wake-up delay on a busy machine is
            # not the daemon's round trip.
            try:
                os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(client_priority))
                result["client_priority"] = f"SCHED_FIFO {client_priority}"
            except OSError as exc:
                result["client_priority"] = f"normal ({exc.strerror})"
        cpu0 = {pid: cpu_seconds(pid) for pid in [process.pid, *emulators]}
        encoder_pids = encoder_pids_of(process.pid)
        cpu0.update({pid: cpu_seconds(pid) for pid in encoder_pids})
        t0 = time.monotonic()
        started = client.request("start_episode", task="benchmark: pick the cube", seed=0)
        if not started["ok"]:
            raise SystemExit(f"start_episode refused: {started['error']}")
        rtts: list[float] = []
        queue_max = 0
        while time.monotonic() - t0 < duration:
            sent = time.perf_counter()
            reply = client.request("status")
            rtts.append((time.perf_counter() - sent) * 1e3)
            queue_max = max(queue_max, reply["dataset"]["writer_queue"])
            time.sleep(0.1)  # the client's request rate (10 Hz), not a wait on a result
        segments = encoder_counters(process.pid)
        stop_sent = time.monotonic()
        end = stop_take(client)
        encoded_at_stop = frames_encoded(segments)
        elapsed = time.monotonic() - t0
        # A take the daemon ended itself (the in-process encoders behind a loaded machine:
        # spill_full) is this run's result, and the table says so.
        frames, ended_by = end.frames, end.ended_by
        cpu1 = {pid: cpu_seconds(pid) for pid in cpu0}
        while True:
            status = client.request("status")
            if status["dataset"]["saving"] == 0:
                break
            time.sleep(0.05)
        result["save_s"] = time.monotonic() - stop_sent
        if segments:
            result["backlog_s"] = max(frames - n for n in encoded_at_stop) / FPS
            drain_deadline = time.monotonic() + 1800
            while min(frames_encoded(segments)) < frames and time.monotonic() < drain_deadline:
                time.sleep(0.2)  # the encoder's progress, read from its counter
            result["drain_s"] = time.monotonic() - stop_sent
            result["encoders"] = len(segments)
        else:
            result["backlog_s"] = None  # in-process: the queue is drained before the save returns
            result["drain_s"] = result["save_s"]
            result["encoders"] = 0
        result["load_after"] = os.getloadavg()
        if client_priority > 0:
            os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
        client.request("shutdown")
        process.wait(120)
        result.update(
            frames=frames,
            ended_by=ended_by,
            rtt=np.array(rtts),
            queue_max=queue_max,
            cpu_daemon=(cpu1[process.pid] - cpu0[process.pid]) / elapsed * 100,
            cpu_emulators=sum(cpu1[p] - cpu0[p] for p in emulators) / elapsed * 100,
            cpu_encoders=sum(cpu1[p] - cpu0[p] for p in encoder_pids) / elapsed * 100,
            faults=status["faults"],
            last=status["last_episode"],
        )
    finally:
        client.close()
        client_context.term()
        if process.poll() is None:
            process.kill()
            process.wait(10)
        log.close()
    meta, arrays = load_episode_sidecar(root, 0)
    if meta is None:
        raise SystemExit(f"no episode saved: {result}\n{(workdir / 'daemon.log').read_text()}")
    result["meta"], result["arrays"] = meta, arrays
    check = subprocess.run(
        [sys.executable, "-m", "hilrec.daemon.cli", "check", str(root)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,  # its verdict is the return code, reported below
    )
    result["check"] = "passed" if check.returncode == 0 else "FAILED\n" + check.stdout
    return result


def lerobot_streaming(duration: float, codec: str, cameras: int, workdir: Path) -> dict[str, Any]:
    """LeRobot 0.4.4's StreamingVideoEncoder fed the same camera frames at 25 Hz, as its record
    loop feeds it (one ``feed_frame`` per camera per tick, absolute deadlines here): the frames it
    drops when its queue is full, and the frames its mp4s hold."""
    import av
    from lerobot.datasets.video_utils import StreamingVideoEncoder

    clips = []
    for i in range(cameras):
        path = make_video(workdir / f"lerobot-cam{i}.mp4", 10, i)
        with av.open(str(path)) as container:
            clips.append([f.to_ndarray(format="rgb24") for f in container.decode(video=0)])
    keys = [f"observation.images.{name}" for name in CAMERA_NAMES[:cameras]]
    vcodec = {"libx264": "h264", "libx265": "hevc"}.get(codec, codec)  # LeRobot's names
    preset = 12 if codec == "libsvtav1" else None
    encoder = StreamingVideoEncoder(fps=FPS, vcodec=vcodec, pix_fmt="yuv420p", g=2, crf=30, preset=preset)
    encoder.start_episode(keys, workdir)
    ticks = round(duration * FPS)
    pacer_start = time.monotonic()
    late = []
    for k in range(ticks):
        deadline = pacer_start + k * PERIOD
        delay = deadline - time.monotonic()
        if delay > 0:
            time.sleep(delay)  # the tick's deadline
        late.append(max(0.0, time.monotonic() - deadline) * 1e3)
        for key, clip in zip(keys, clips, strict=True):
            encoder.feed_frame(key, clip[k % len(clip)])
    dropped = dict(encoder._dropped_frames)  # LeRobot only logs them: its private count
    results = encoder.finish_episode()
    frames = {}
    for key, (path, _stats) in results.items():
        with av.open(str(path)) as container:
            frames[key] = sum(1 for packet in container.demux(video=0) if packet.size)
    return {
        "fed": ticks,
        "dropped": sum(dropped.values()),
        "frames": frames,
        "late_p99_ms": pct(np.array(late), 99),
    }


NAMES = {"thread": "before (in-process encoder)", "process": "after (encoder processes)"}
NAMES.update(arms1="one arm", arms2="two arms")
MEASURES = [
    ("take ended by", "ended_by", "stop"),
    ("missed deadlines (overruns + skipped)", "missed", "0"),
    ("tick jitter p50 / p99 / max, ms", "jitter", "p99 <= 2"),
    ("leader read -> follower write p99, ms", "latency", "p99 <= 5"),
    ("control round trip p50 / p99 / max, ms", "rtt", "p99 <= 5"),
    ("tick work p99, ms", "work", "< 40"),
    ("bus time (arm reads) p50 / p99 / max, ms", "bus", "reported"),
    ("two arms' read skew, followers / leaders p50 / p99, ms", "skew", "reported"),
    ("tick start -> leader read p50 / p99 / max, ms", "reads", "reported"),
    ("ticks with a bus retry (follower / leader)", "retried", "reported"),
    ("CPU daemon (+ encoder processes), % of one core", "cpu", "reported"),
    ("video backlog at end of take, s", "backlog", "reported"),
    ("stop -> saved (durable), s", "save", "reported"),
    ("stop -> backlog drained, s", "drain", "reported"),
]


def skew_cell(arrays: dict[str, np.ndarray]) -> str:
    """The two arms' read skews (hilrec.daemon.control.arm_pair), p50 / p99 in ms; one arm: none."""
    skews = [arrays.get(n, np.array([])) * 1e3 for n in ("tick_follower_skew_s", "tick_leader_skew_s")]
    finite = [s[np.isfinite(s)] for s in skews]
    return " ; ".join(f"{pct(s, 50):.3f} / {pct(s, 99):.3f}" if len(s) else "-" for s in finite)


def summarize(r: dict[str, Any]) -> dict[str, Any]:
    arrays = r["arrays"]
    start, deadline = arrays["tick_start"], arrays["tick_deadline"]
    jitter = np.abs(start - deadline) * 1e3
    latency = (arrays["tick_written"] - arrays["tick_leader_read"]) * 1e3
    overruns = int(np.count_nonzero(arrays["tick_end"] > deadline + PERIOD))
    skipped = int(arrays["tick_skipped"].sum())
    work = (arrays["tick_end"] - start) * 1e3
    # Both arms read: until the leader's reading is in hand (the same span before and after the
    # concurrent reads, for runs recorded without tick_bus_s).
    reads = (arrays["tick_leader_read"] - start) * 1e3
    bus = arrays["tick_bus_s"] * 1e3 if "tick_bus_s" in arrays else None
    counts = r["meta"]["frame_flags"]["counts"]
    rtt = r["rtt"]
    backlog = r["backlog_s"]
    return {
        "priority": r["priority"],
        "load_before": r["load_before"],
        "load_after": r["load_after"],
        "frames": r["frames"],
        "ended_by": r["ended_by"],
        "check": r["check"],
        "flags": json.dumps(r["meta"]["frame_flags"]["counts"]),
        "queue_max": r["queue_max"],
        "faults": r["faults"],
        "missed": f"{overruns + skipped} ({overruns} + {skipped}) of {len(start)}",
        "jitter": f"{pct(jitter, 50):.3f} / {pct(jitter, 99):.3f} / {jitter.max():.3f}",
        "latency": f"{pct(latency, 99):.3f}",
        "rtt": f"{pct(rtt, 50):.3f} / {pct(rtt, 99):.3f} / {rtt.max():.3f} (n={len(rtt)})",
        "work": f"{pct(work, 99):.3f}",
        "bus": "not recorded"
        if bus is None
        else f"{pct(bus, 50):.3f} / {pct(bus, 99):.3f} / {bus.max():.3f}",
        "reads": f"{pct(reads, 50):.3f} / {pct(reads, 99):.3f} / {reads.max():.3f}",
        "skew": skew_cell(arrays),
        "retried": f"{counts.get('follower_retried', 0)} / {counts.get('leader_retried', 0)}",
        "cpu": f"{r['cpu_daemon']:.1f} (+ {r['cpu_encoders']:.1f})",
        "backlog": "in RAM queue" if backlog is None else f"{backlog:.1f}",
        "save": f"{r['save_s']:.2f}",
        "drain": f"{r['drain_s']:.2f}",
    }


def main(argv: list[str] | None = None) -> int:
    global FPS, PERIOD  # one rate for the whole run, read by every helper here
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=120.0, help="episode length in seconds")
    parser.add_argument("--fps", type=int, choices=(25, 30), default=25, help="the loop's rate")
    parser.add_argument(
        "--priority",
        type=int,
        default=10,
        help="SCHED_FIFO priority of the loop thread (0 = normal scheduling)",
    )
    parser.add_argument(
        "--leader-motion",
        default="wave",
        choices=("wave", "operator"),
        help="the emulated leader's hand: a smooth wave, or the scripted operator "
        "(which re-plans inside the emulator's serving thread at every "
        "episode boundary, leaving the leader silent for ~0.5 s every 20 s)",
    )
    parser.add_argument(
        "--client-priority",
        type=int,
        default=3,
        help="SCHED_FIFO priority of the measuring control client (0 = normal)",
    )
    parser.add_argument(
        "--codec",
        default="libsvtav1",
        choices=("libx264", "libsvtav1", "libx265"),
        help="video codec (libsvtav1, LeRobot's default, needs ~32 ms of CPU per "
        "640x480 frame here: 1.6 cores for two cameras at 25 Hz)",
    )
    parser.add_argument(
        "--stall-ms",
        type=int,
        default=500,
        help="camera stall limit (LeRobot's read_latest max age is 500 ms)",
    )
    parser.add_argument(
        "--encoder",
        default="both",
        choices=("both", "thread", "process"),
        help="before (in-process encoder threads), after (encoder processes + spill), or both",
    )
    parser.add_argument(
        "--cameras", type=int, default=2, choices=(1, 2, 3, 4), help="640x480 video-file cameras"
    )
    parser.add_argument(
        "--lerobot-streaming",
        action="store_true",
        help="also feed the same frames to LeRobot 0.4.4's StreamingVideoEncoder at 25 Hz and "
        "count the frames it drops",
    )
    parser.add_argument(
        "--arms", type=int, default=1, choices=(1, 2), help="2: one arm pair and two, side by side"
    )
    parser.add_argument("--pacer-ticks", type=int, default=500, help="ticks per pacer in the side-by-side")
    parser.add_argument("--keep", type=Path, default=None, help="keep the work directory here")
    parser.add_argument(
        "--smoke", action="store_true", help="a 2 s episode, one camera, encoder processes, 25 pacer ticks"
    )
    args = parser.parse_args(argv)
    if args.smoke:
        args.duration, args.cameras, args.encoder, args.pacer_ticks = 2.0, 1, "process", 25
    FPS, PERIOD = args.fps, 1.0 / args.fps

    encoders = ["thread", "process"] if args.encoder == "both" else [args.encoder]
    sessions = [(e, e, 1) for e in encoders]
    if args.arms == 2:
        encoder = "process" if args.encoder == "both" else args.encoder
        sessions = [("arms1", encoder, 1), ("arms2", encoder, 2)]
    workdir = Path(tempfile.mkdtemp(prefix="bench-daemon-"))
    try:
        rows: dict[str, dict[str, Any]] = {}
        for key, encoder, arms in sessions:
            session_dir = workdir / key
            session_dir.mkdir()
            r = run_session(
                args.duration,
                args.priority,
                args.codec,
                args.stall_ms,
                args.leader_motion,
                args.client_priority,
                session_dir,
                encoder,
                args.cameras,
                arms,
            )
            rows[key] = summarize(r)
        print(
            f"# bench_daemon: emulated session, {args.duration:.0f} s episode at {FPS} Hz, "
            f"{args.cameras} {W}x{H} video-file cameras encoded ({args.codec}, LeRobot's settings), "
            "1 Mbps wire timing"
        )
        for encoder, row in rows.items():
            print(
                f"{NAMES[encoder]}: loop priority {row['priority']}; load average before "
                f"{row['load_before'][0]:.2f}, after {row['load_after'][0]:.2f} ({os.cpu_count()} CPUs); "
                f"frames {row['frames']}; hilrec check: {row['check']}; frame flags {row['flags']}; "
                f"writer queue max {row['queue_max']}; faults: {row['faults'] or 'none'}"
            )
        print()
        header = " | ".join(NAMES[e] for e in rows)
        print(f"| measure | {header} | target |")
        print("|---|" + "---:|" * len(rows) + "---|")
        for label, key, target in MEASURES:
            cells = " | ".join(row[key] for row in rows.values())
            print(f"| {label} | {cells} | {target} |")
        if args.lerobot_streaming:
            streaming_dir = workdir / "lerobot"
            streaming_dir.mkdir()
            load = os.getloadavg()[0]
            got = lerobot_streaming(args.duration, args.codec, args.cameras, streaming_dir)
            print()
            print(
                f"## LeRobot 0.4.4 StreamingVideoEncoder, same frames ({args.cameras} cameras, "
                f"{args.codec}, queue 30), load {load:.2f} -> {os.getloadavg()[0]:.2f}"
            )
            print(
                f"fed {got['fed']} ticks x {args.cameras} cameras; dropped {got['dropped']} frames; "
                f"frames in its mp4s {got['frames']}; feeder lateness p99 {got['late_p99_ms']:.2f} ms"
            )
        if args.pacer_ticks > 0:
            print()
            print(f"## pacing side by side ({args.pacer_ticks} ticks at {FPS} Hz, 2-6 ms of work per tick)")
            print("| pacer | rate, Hz | drift after the run, ms | |interval - period| p99, ms |")
            print("|---|---:|---:|---:|")
            for name, stats in pacer_comparison(args.pacer_ticks, PERIOD).items():
                print(
                    f"| {name} | {stats['rate_hz']:.3f} | {stats['drift_ms']:.1f} | "
                    f"{stats['interval_p99_ms']:.3f} |"
                )
    finally:
        if args.keep is not None:
            shutil.copytree(workdir, args.keep, dirs_exist_ok=True)
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    threading.current_thread().name = "bench"
    sys.exit(main())
