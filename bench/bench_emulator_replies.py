"""How punctually ``hilrec emulate`` answers LeRobot's client, with and without load (issue 22, item 14).

LeRobot's Feetech bus is the unmodified scservo_sdk: ``GroupSyncRead`` of Present_Position over
a ``PortHandler`` whose packet timeout LeRobot patches (``patch_setPacketTimeout``), one attempt
per read in its SO classes. The SDK's own timeout for a status packet is 34 ms (2 x its 16 ms
latency timer + 2 ms); a reply later than that is a "There is no status packet!" for a client on
the SDK's timing. This probe is that client: it sync-reads the six servos of an emulated
follower started as a user starts it (``hilrec emulate follower``, its own process, the serving
thread at SCHED_FIFO 1 when allowed) and sync-writes the positions back as goals, at ``--hz``,
``--reads`` times, with ``--load`` busy processes beside it (nice 0, SCHED_OTHER, like a
training run or a compile), and reports the reply-latency distribution and the misses.

A miss is what the SDK itself reports: no complete status packet in the port's buffer when it
looked after its timeout (``--timeout-ms``, default the SDK's own 34 ms; LeRobot's patch allows
50). A late client finds a reply that has arrived meanwhile, so the wall time of a read (also
reported) overstates the emulator's part on a loaded machine.

For every read slower than ``--slow-ms`` it also says where the time went. The serving thread's
``/proc/<pid>/task/<tid>/schedstat`` read before and after gives its time on CPU and its time
runnable but waiting for a CPU (something of a higher class held it: a real-time thread above
FIFO 1, or one at FIFO 1 that got there first). A watcher thread samples, every millisecond of
a slow read, what the serving thread is blocked in (``/proc/.../wchan``): ``futex`` is a lock or
the GIL (another thread of the emulator holds it), ``poll``/``select`` is waiting for the request
(still in the pty: its flip-buffer work runs on an unbound kernel worker at SCHED_OTHER). The
client's own wait for a CPU is given too.

Found (2 shared cores, kernel 6.18, load average 15-34 from other work, 3000 reads a run): the
serving thread at SCHED_FIFO 1 never waited for a CPU (0.0 ms in every slow read) and was never
blocked on a lock or the GIL (no futex sample), so neither another process's real-time threads
nor the emulator's locks delay it. The misses, 1-2 in 3000 (0.03-0.07 %), had no status packet
at all in the client's buffer: the request or the reply was still in the pty's flip buffer,
whose work runs on an unbound kernel worker at SCHED_OTHER (the serving thread sampled in
``select`` with no request, or in ``__flush_work`` waiting for that worker). With the client at
SCHED_FIFO 1 too, the slow reads the client's own scheduling caused went (p99 41 -> 0.42 ms,
reads over 34 ms 44 -> 1) but a miss remained, with the serving thread 86 % in ``__flush_work``:
the pty's kernel worker, which neither the emulator nor the client can raise.

Usage: python bench/bench_emulator_replies.py [--reads 2000] [--load 0,4] [--hz 60] [--smoke]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

SDK_TIMEOUT_MS = 34.0  # scservo_sdk: LATENCY_TIMER (16 ms) x 2 + 2 ms
PRESENT_POSITION, GOAL_POSITION, POSITION_BYTES = 56, 42, 2
IDS = (1, 2, 3, 4, 5, 6)
_POLICIES = {os.SCHED_OTHER: "SCHED_OTHER", os.SCHED_FIFO: "SCHED_FIFO", os.SCHED_RR: "SCHED_RR"}


@dataclass
class Run:
    load: int
    latencies_ms: list[float] = field(default_factory=list)
    failed: int = 0
    # per slow read: (latency ms, serving thread on CPU ms, waiting for a CPU ms, client waiting ms)
    slow: list[tuple[float, float, float, float]] = field(default_factory=list)
    blocked_in: dict[str, int] = field(default_factory=dict)  # wchan samples during slow reads
    # per unanswered read: how many of the six status packets had arrived whole (0: none)
    answered_before_miss: list[int] = field(default_factory=list)
    serving: str = ""
    loadavg: float = 0.0

    def summary(self) -> str:
        lat = np.array(self.latencies_ms) if self.latencies_ms else np.zeros(1)
        total = len(self.latencies_ms) + self.failed
        waiting = sum(1 for t, _, w, _ in self.slow if w >= 0.5 * t)
        busy = sum(1 for t, c, w, _ in self.slow if c >= 0.5 * t and w < 0.5 * t)
        asleep = len(self.slow) - waiting - busy
        samples = sum(self.blocked_in.values()) or 1
        where = ", ".join(
            f"{name} {count / samples:.0%}"
            for name, count in sorted(self.blocked_in.items(), key=lambda kv: -kv[1])
        )
        return (
            f"load {self.load} (load average {self.loadavg:.1f}), serving thread {self.serving}: "
            f"{total} reads, p50 {np.percentile(lat, 50):.2f} ms, p99 {np.percentile(lat, 99):.2f} ms, "
            f"p99.9 {np.percentile(lat, 99.9):.2f} ms, max {lat.max():.1f} ms; "
            f"wall > {SDK_TIMEOUT_MS:g} ms: {int(np.sum(lat > SDK_TIMEOUT_MS))}; "
            f"unanswered within the timeout: {self.failed} ({self.failed / max(total, 1):.3%}, "
            f"status packets already whole at the miss: {self.answered_before_miss}); "
            f"slow reads: {len(self.slow)} (serving thread waiting for a CPU {waiting}, "
            f"on CPU {busy}, asleep {asleep}); serving thread during slow reads: {where or 'no samples'}"
        )


def start_emulator(workdir: Path) -> tuple[subprocess.Popen[str], str]:
    process = subprocess.Popen(
        [sys.executable, "-m", "hilrec.daemon.cli", "emulate", "follower"],
        stdout=subprocess.PIPE,
        text=True,
        cwd=workdir,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert process.stdout is not None  # stdout=PIPE
    port = process.stdout.readline().strip()
    if not port.startswith("/dev/"):
        process.kill()
        raise SystemExit(f"the emulated follower did not start: {port!r}")
    return process, port


def serving_thread(pid: int) -> int:
    """The emulator's thread that answers the bus: the real-time one (Python 3.11 names no OS
    thread), else the busiest thread but the main one once the bus has been used."""
    tasks = [int(t.name) for t in Path(f"/proc/{pid}/task").iterdir() if int(t.name) != pid]
    for tid in tasks:
        if os.sched_getscheduler(tid) == os.SCHED_FIFO:
            return tid
    if not tasks:
        raise SystemExit(f"emulator {pid} has no serving thread")
    return max(tasks, key=lambda tid: schedstat(pid, tid)[0])


def schedstat(pid: int, tid: int) -> tuple[float, float]:
    """(ms on CPU, ms runnable but waiting) of one thread, since it started."""
    on_cpu, waiting, _ = Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()
    return int(on_cpu) / 1e6, int(waiting) / 1e6


def start_load(count: int) -> list[subprocess.Popen[bytes]]:
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]


def blocked_in(pid: int, tid: int) -> str:
    """What the thread is doing now: running, or the kernel function it sleeps in."""
    state = Path(f"/proc/{pid}/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    if state == "R":
        return "running or runnable"
    wchan = Path(f"/proc/{pid}/task/{tid}/wchan").read_text().strip() or "?"
    if "futex" in wchan:
        return "futex (a lock or the GIL)"
    if "poll" in wchan or "select" in wchan:
        return "select (no request yet)"
    return wchan


class Watcher:
    """Samples the serving thread's state every millisecond while a read is slow."""

    def __init__(self, pid: int, tid: int, run: Run, slow_ms: float) -> None:
        import threading

        self._pid, self._tid, self._run, self._slow = pid, tid, run, slow_ms / 1e3
        self.started: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while not self._stop.wait(0.001):
            started = self.started
            if started is not None and time.perf_counter() - started > self._slow:
                what = blocked_in(self._pid, self._tid)
                self._run.blocked_in[what] = self._run.blocked_in.get(what, 0) + 1

    def close(self) -> None:
        self._stop.set()
        self._thread.join()


def probe(
    port: str,
    pid: int,
    tid: int,
    run: Run,
    *,
    reads: int,
    hz: float,
    slow_ms: float,
    timeout_ms: float,
    client_fifo: bool,
) -> None:
    import threading

    import scservo_sdk as scs

    handler = scs.PortHandler(port)
    if not handler.openPort() or not handler.setBaudRate(1_000_000):
        raise SystemExit(f"cannot open {port}")
    packets = scs.PacketHandler(0)
    reader = scs.GroupSyncRead(handler, packets, PRESENT_POSITION, POSITION_BYTES)
    writer = scs.GroupSyncWrite(handler, packets, GOAL_POSITION, POSITION_BYTES)
    for servo_id in IDS:
        reader.addParam(servo_id)

    def fixed_timeout(_packet_length: int) -> None:
        handler.setPacketTimeoutMillis(timeout_ms)

    handler.setPacketTimeout = fixed_timeout
    write_port = handler.writePort
    written = [0.0]

    def timed_write(packet: list[int]) -> int:
        count = int(write_port(packet))
        written[0] = time.perf_counter()  # the SDK's timer starts here too
        return count

    handler.writePort = timed_write
    if client_fifo:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
    me = threading.get_native_id()
    watcher = Watcher(pid, tid, run, slow_ms)
    period = 1.0 / hz
    due = time.perf_counter()
    try:
        for i in range(reads + 20):  # the first 20: warm-up, not counted
            # The latency is the SDK's: from the request written to the reply read.
            due += period
            cpu0, wait0 = schedstat(pid, tid)
            _, mine0 = schedstat(os.getpid(), me)
            for servo_id in IDS:
                reader.data_dict[servo_id] = []
            start = time.perf_counter()
            watcher.started = start
            result = reader.txRxPacket()
            watcher.started = None
            latency = (time.perf_counter() - written[0]) * 1e3
            cpu1, wait1 = schedstat(pid, tid)
            _, mine1 = schedstat(os.getpid(), me)
            if i < 20:
                continue
            entry = (latency, cpu1 - cpu0, wait1 - wait0, mine1 - mine0)
            if result != scs.COMM_SUCCESS:
                run.failed += 1
                run.answered_before_miss.append(sum(1 for i in IDS if reader.data_dict[i]))
                run.slow.append(entry)
                continue
            run.latencies_ms.append(latency)
            if latency > slow_ms:
                run.slow.append(entry)
            writer.clearParam()
            for servo_id in IDS:
                value = reader.getData(servo_id, PRESENT_POSITION, POSITION_BYTES)
                writer.addParam(servo_id, [value & 0xFF, (value >> 8) & 0xFF])
            writer.txPacket()
            time.sleep(max(0.0, due - time.perf_counter()))
    finally:
        watcher.close()
        handler.closePort()


def measure(load: int, *, reads: int, hz: float, slow_ms: float, timeout_ms: float, client_fifo: bool) -> Run:
    run = Run(load=load)
    hogs: list[subprocess.Popen[bytes]] = []
    with tempfile.TemporaryDirectory(prefix="bench-emulator-") as work:
        emulator, port = start_emulator(Path(work))
        try:
            tid = serving_thread(emulator.pid)
            policy = os.sched_getscheduler(tid)
            priority = os.sched_getparam(tid).sched_priority
            run.serving = f"{_POLICIES.get(policy, str(policy))} {priority}"
            hogs = start_load(load)
            run.loadavg = os.getloadavg()[0]
            probe(
                port,
                emulator.pid,
                tid,
                run,
                reads=reads,
                hz=hz,
                slow_ms=slow_ms,
                timeout_ms=timeout_ms,
                client_fifo=client_fifo,
            )
            run.loadavg = max(run.loadavg, os.getloadavg()[0])
        finally:
            for hog in hogs:
                hog.kill()
                hog.wait()
            emulator.terminate()
            emulator.wait(timeout=10)
    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reads", type=int, default=2000)
    parser.add_argument("--load", default="0,4", help="busy processes beside the probe, per run")
    parser.add_argument("--hz", type=float, default=60.0, help="reads per second (teleoperate: 60)")
    parser.add_argument("--slow-ms", type=float, default=10.0, help="explain reads slower than this")
    parser.add_argument("--timeout-ms", type=float, default=SDK_TIMEOUT_MS, help="the client's reply timeout")
    parser.add_argument(
        "--client-fifo",
        action="store_true",
        help="run the client at SCHED_FIFO 1 too (chrt -f 1 for LeRobot)",
    )
    parser.add_argument("--smoke", action="store_true", help="30 reads, one run with one busy process")
    args = parser.parse_args()
    if args.smoke:
        args.reads, args.load = 30, "1"
    print(
        f"{os.cpu_count()} CPUs, kernel {os.uname().release}, {args.reads} reads at {args.hz:g} Hz per run, "
        f"timeout {args.timeout_ms:g} ms, client {'SCHED_FIFO 1' if args.client_fifo else 'SCHED_OTHER'}"
    )
    for load in (int(x) for x in args.load.split(",")):
        run = measure(
            load,
            reads=args.reads,
            hz=args.hz,
            slow_ms=args.slow_ms,
            timeout_ms=args.timeout_ms,
            client_fifo=args.client_fifo,
        )
        print(run.summary(), flush=True)
        for latency, cpu, wait, mine in sorted(run.slow, reverse=True)[:6]:
            print(
                f"    {latency:7.1f} ms: serving thread on CPU {cpu:6.1f} ms, waiting for a CPU "
                f"{wait:6.1f} ms; the client waiting for a CPU {mine:6.1f} ms"
            )


if __name__ == "__main__":
    main()
