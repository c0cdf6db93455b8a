"""Verdict benchmark: take end -> verdict time, and the loop's tick jitter with and without the worker.

Two emulated daemons, one after the other in this run (``--rounds`` of them, alternating who
goes first),
on the config of ``configs/emulated.toml`` (two emulated arms at 1 Mbps wire timing, one
320x240 twin camera encoded with ``--codec``), free ports, a fresh root each: the first with the
verdict worker (the default), the second started with ``--no-verdicts``. Each records ``--takes``
takes of ``--take-s`` seconds with a ``--reset-s`` reset after each, driven over ZeroMQ as
``hilrec collect`` drives it. Reported, medians over the takes:

- take end -> verdict: from the ``stop_episode`` reply to the ``episode_verdict`` event arriving
  here (what the operator waits for), and the worker's own share (merge wait, checks);
- tick lateness (tick start - its deadline, from the ``tick`` telemetry of every tick) p99 and max
  in the window after each take's end (``--window-s``, the reset period, when the worker runs),
  and p99 during the takes (from each episode's own tick record beside the dataset);
- late ticks (> 2 ms) in those windows;
- in the session with the worker, the same daemon under the same load: lateness p99 while the
  worker runs (take end to verdict) and after it has answered (to the end of the reset).

The load average is printed before and after: on the shared 2-core machine the numbers move with
it. Target: a verdict in under 2 s for a 60 s take, and no more jitter with the worker than without.
"""

from __future__ import annotations

import argparse
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
from _takes import stop_take

os.environ.setdefault("MUJOCO_GL", "egl")
os.environ.setdefault("PYOPENGL_PLATFORM", "egl")

from hilrec.daemon.dataset.format.sidecar import load_episode_sidecar
from hilrec.daemon.errors import DaemonUnreachableError
from hilrec.daemon.wire.client import ControlClient, TelemetryClient
from hilrec.daemon.wire.protocol import TOPIC_EVENT, TOPIC_TICK

FPS = 25


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def config_text(root: Path, ports: list[int], codec: str) -> str:
    return f"""
mode = "emulated"
fps = {FPS}
[dataset]
root = "{root}"
video_codec = "{codec}"
[zmq]
host = "127.0.0.1"
control_port = {ports[0]}
telemetry_port = {ports[1]}
leader_port = {ports[2]}
apply_timeout_ms = 10000
[leader]
source = "serial"
[loop]
realtime_priority = 10
control_priority = 5
[telemetry]
preview_hz = 0.0
[emulated]
leader_motion = "operator"
wire_timing = true
[cameras.front]
source = "twin"
width = 320
height = 240
fps = 25
stall_ms = 1000
"""


class Listener:
    """Every tick's lateness and every verdict event, timestamped on arrival (monotonic)."""

    def __init__(self, endpoint: str) -> None:
        self.client = TelemetryClient(endpoint, topics=(TOPIC_TICK, TOPIC_EVENT))
        self.ticks: list[tuple[float, float]] = []  # (tick start, late ms)
        self.verdicts: dict[int, tuple[float, dict[str, Any]]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            message = self.client.receive(100)
            if message is None:
                continue
            topic, header, _ = message
            with self._lock:
                if topic == "tick":
                    timing = header["timing"]
                    self.ticks.append((float(timing["start"]), float(timing["late_ms"])))
                elif header.get("event") == "episode_verdict":
                    self.verdicts[int(header["episode_index"])] = (time.monotonic(), header)

    def verdict(self, index: int, timeout_s: float) -> tuple[float, dict[str, Any]] | None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self._lock:
                if index in self.verdicts:
                    return self.verdicts[index]
            time.sleep(0.005)  # this process only listens; a short poll costs the daemon nothing
        return None

    def lateness(self, start: float, end: float) -> np.ndarray:
        with self._lock:
            return np.array([late for t, late in self.ticks if start <= t < end], dtype=np.float64)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.client.close()


KINDS = {"gated": [], "ungated": ["--no-verdict-gate"], "without": ["--no-verdicts"]}


def run_session(
    work: Path, *, kind: str, takes: int, take_s: float, reset_s: float, window_s: float, codec: str
) -> dict[str, Any]:
    name = kind
    verdicts = kind != "without"
    work.mkdir(parents=True, exist_ok=True)
    root = work / f"ds-{name}"
    ports = free_ports(3)
    config = work / f"daemon-{name}.toml"
    config.write_text(config_text(root, ports, codec))
    log = work / f"daemon-{name}.log"
    argv = [sys.executable, "-m", "hilrec.daemon.cli", "daemon", "--config", str(config), *KINDS[kind]]
    with log.open("wb") as out:
        process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
    client = ControlClient(f"tcp://127.0.0.1:{ports[0]}", timeout_ms=1000, retries=1)
    listener = Listener(f"tcp://127.0.0.1:{ports[1]}")
    rows = []
    try:
        deadline = time.monotonic() + 120
        while True:
            if process.poll() is not None:
                raise SystemExit(f"daemon exited:\n{log.read_text()[-3000:]}")
            try:
                client.request("status")
                break
            except DaemonUnreachableError:
                if time.monotonic() > deadline:
                    raise SystemExit(f"daemon not serving:\n{log.read_text()[-3000:]}") from None
        client.timeout_ms, client.retries = 5000, 3
        time.sleep(2.0)  # let the rig settle before the first take (both sessions alike)
        for take in range(takes):
            started = client.call("start_episode", task="bench")
            time.sleep(take_s)  # the take: the daemon records on its own
            end = stop_take(client)
            stopped = time.monotonic()
            ended_by = end.ended_by
            if not end.saved:
                print(f"  {name}: take {take} was ended by {ended_by} and not saved; skipped")
                continue
            verdict = listener.verdict(started["episode_index"], take_s + 60) if verdicts else None
            rest = stopped + max(reset_s, window_s) - time.monotonic()
            if rest > 0:
                time.sleep(rest)  # the reset period: teleoperation goes on, nothing recorded
            window = listener.lateness(stopped, stopped + window_s)
            row: dict[str, Any] = {
                "take": started["episode_index"],
                "ended_by": ended_by,
                "window_p99_ms": float(np.percentile(window, 99)) if window.size else float("nan"),
                "window_max_ms": float(window.max()) if window.size else float("nan"),
                "window_late": int((window > 2.0).sum()),
                "window_ticks": int(window.size),
            }
            if verdict is not None:
                arrived, header = verdict
                # The same daemon, same load: while the worker ran, and after it had answered.
                busy = listener.lateness(stopped, arrived)
                idle = listener.lateness(arrived + 0.5, stopped + max(reset_s, window_s))
                row.update(
                    busy_p99_ms_verdict=float(np.percentile(busy, 99)) if busy.size else None,
                    idle_p99_ms_verdict=float(np.percentile(idle, 99)) if idle.size else None,
                )
                details = header.get("details") or {}
                row.update(
                    end_to_verdict_s=arrived - stopped,
                    worker_s_verdict=details.get("worker_s"),
                    merge_wait_s=details.get("merge_wait_s"),
                    verdict=header.get("verdict"),
                )
            rows.append(row)
        client.call("shutdown")
        process.wait(180)
    finally:
        listener.close()
        client.close()
        if process.poll() is None:
            process.kill()
            process.wait(30)
    for row in rows:  # lateness during the takes, from each episode's own record
        _, arrays = load_episode_sidecar(root, row["take"])
        late = (arrays["tick_start"] - arrays["tick_deadline"]) * 1e3
        row["take_p99_ms"] = float(np.percentile(late, 99))
        row["frames"] = int(late.size)
    return {"name": name, "rows": rows, "log": str(log)}


def _loads(values: tuple[float, float, float]) -> str:
    return " ".join(f"{x:.2f}" for x in values)


def median(rows: list[dict[str, Any]], key: str) -> float:
    values = [r[key] for r in rows if r.get(key) is not None]
    return float(np.median(values)) if values else float("nan")


def gate_hold_share(periods: int) -> tuple[int, int, int]:
    """(samples stopped, samples, holds) of the tick gate on a busy loop, sampled mid-hold.

    The worker's tick gate stops it (SIGSTOP) from a guard before each deadline to a resume
    after it. This samples the busy process's state in the middle of each hold for ``periods``
    periods of 40 ms: the share found stopped is how well the gate keeps the worker off the
    tick on this machine (a loaded machine wakes the gate, or this sampler, late).
    """
    from hilrec.daemon.control.verdict import GATE_GUARD_S, GATE_RESUME_S, TickGate

    def state(pid: int) -> str:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0]

    period = 1.0 / FPS
    origin = time.monotonic()
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        gate = TickGate(busy.pid, lambda: (origin, period))
        gate.start()
        states = []
        for _ in range(periods):
            now = time.monotonic()
            next_deadline = origin + (int((now - origin) / period) + 1) * period
            time.sleep(max(0.0, next_deadline + (GATE_RESUME_S - GATE_GUARD_S) / 2 - time.monotonic()))
            states.append(state(busy.pid))
        held = gate.stop()
    finally:
        busy.kill()
        busy.wait(10)
    return states.count("T"), len(states), held


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--takes", type=int, default=3)
    parser.add_argument("--take-s", type=float, default=60.0)
    parser.add_argument("--reset-s", type=float, default=10.0)
    parser.add_argument("--window-s", type=float, default=5.0, help="jitter window after each take's end")
    parser.add_argument("--codec", default="libsvtav1", help="as configs/emulated.toml")
    parser.add_argument(
        "--kinds",
        default="gated,ungated,without",
        help="daemons to compare: gated (the default worker), ungated (--no-verdict-gate), without "
        "(--no-verdicts); comma-separated, run in this order (reversed every other round)",
    )
    parser.add_argument("--rounds", type=int, default=1, help="sessions per daemon kind, alternating")
    parser.add_argument("--keep", type=Path, default=None, help="keep the work directory here")
    parser.add_argument("--gate-periods", type=int, default=250, help="tick periods the gate is sampled")
    parser.add_argument(
        "--smoke", action="store_true", help="smallest run: one 2 s take, the default worker only"
    )
    args = parser.parse_args(argv)
    if args.smoke:
        args.takes, args.take_s, args.reset_s, args.window_s = 1, 2.0, 2.0, 1.0
        args.kinds, args.rounds, args.gate_periods = "gated", 1, 10

    work = Path(tempfile.mkdtemp(prefix="bench-verdict-")) if args.keep is None else args.keep
    work.mkdir(parents=True, exist_ok=True)
    load_before = os.getloadavg()
    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    rows: dict[str, list[dict[str, Any]]] = {k: [] for k in kinds}
    try:
        for round_ in range(args.rounds):
            # Rounds alternate the order, so a load that comes and goes hits every kind alike.
            for kind in kinds if round_ % 2 == 0 else kinds[::-1]:
                result = run_session(
                    work / f"round-{round_}",
                    kind=kind,
                    takes=args.takes,
                    take_s=args.take_s,
                    reset_s=args.reset_s,
                    window_s=args.window_s,
                    codec=args.codec,
                )
                rows[kind].extend(result["rows"])
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)
    load_after = os.getloadavg()

    print(
        f"verdict benchmark: {args.rounds} round(s) of {args.takes} takes x {args.take_s:.0f} s per "
        f"daemon, reset {args.reset_s:.0f} s, emulated, one 320x240 camera ({args.codec}); load average "
        f"before {_loads(load_before)}, after {_loads(load_after)}"
    )
    for kind in kinds:
        for row in rows[kind]:
            print(
                f"  {kind}: take {row['take']} ({row['frames']} frames, ended by {row['ended_by']}): "
                f"{row.get('verdict', '-')} after {row.get('end_to_verdict_s', float('nan')):.2f} s, "
                f"lateness p99 {row['window_p99_ms']:.3f} ms in the {args.window_s:.0f} s after its end"
            )

    def cell(kind: str, key: str, digits: int = 3) -> str:
        return "-" if kind == "without" and "verdict" in key else f"{median(rows[kind], key):.{digits}f}"

    table = [
        ("median over takes", *kinds),
        ("take end -> verdict (s)", *(cell(k, "end_to_verdict_s", 2) for k in kinds)),
        ("  the worker's own time (s)", *(cell(k, "worker_s_verdict", 2) for k in kinds)),
        (
            f"tick lateness p99, {args.window_s:.0f} s after take end (ms)",
            *(cell(k, "window_p99_ms") for k in kinds),
        ),
        ("  max (ms)", *(cell(k, "window_max_ms") for k in kinds)),
        ("  late ticks (> 2 ms)", *(cell(k, "window_late", 0) for k in kinds)),
        ("  same daemon, while the worker runs (ms)", *(cell(k, "busy_p99_ms_verdict") for k in kinds)),
        ("  same daemon, after it answered (ms)", *(cell(k, "idle_p99_ms_verdict") for k in kinds)),
        ("tick lateness p99 during takes (ms)", *(cell(k, "take_p99_ms") for k in kinds)),
    ]
    widths = [max(len(r[i]) for r in table) for i in range(len(table[0]))]
    for line in table:
        print("  " + "  ".join(text.ljust(w) for text, w in zip(line, widths, strict=True)))
    stopped, samples, held = gate_hold_share(args.gate_periods)
    print(
        f"tick gate on a busy loop: stopped in {stopped} of {samples} mid-hold samples "
        f"({stopped / samples:.0%}), {held} holds; load average {_loads(os.getloadavg())}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
