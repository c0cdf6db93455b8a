"""A verdict on every saved take, from a worker process that can never delay the loop.

Once an episode is saved (durable in the journal) the daemon hands its index to
:class:`VerdictWorker`. The worker is a separate process (``python -m
hilrec.daemon.control.verdict``) at the lowest CPU priority there is: ``SCHED_IDLE`` (granted to
any process on Linux), else ``nice 19``; it runs only on CPU time nothing else wants, so the loop
and its writer never wait for it. On a virtual machine the hypervisor does not know those
priorities, so while it works the worker is also held stopped around each tick (:class:`TickGate`).
It keeps MuJoCo and the checkers imported between takes.

Per episode, in the worker: wait (bounded) until the episode is merged into LeRobot's files
(``meta/info.json`` counts it: the checks read those files, and the daemon merges right after
each save), then judge that episode alone:

- the dataset rules that concern one episode (:mod:`hilrec.daemon.dataset`'s checker, its
  failures for that episode only: rows, timestamps, stats, video frames);
- sim episodes: the bit-exact replay (:func:`hilrec.sim.replay.replay_check`);
- hardware and emulated episodes: the hardware replay check (:mod:`hilrec.daemon.replay.check`:
  consistent, lagging or diverged, with the lag and the worst joint).

The verdict (:class:`hilrec.daemon.dataset.EpisodeVerdict`), a one-sentence summary a
person can act on, and the details go back to the daemon, which publishes an ``episode_verdict``
event and stores them in the episode's sidecar under ``"verdict"`` (through the writer thread).
The protocol between the two processes is one JSON object per line on the worker's stdin/stdout.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Final

from hilrec.daemon.dataset import INFO_PATH, EpisodeVerdict

if TYPE_CHECKING:  # the replay check imports MuJoCo: only in the worker, only when it judges
    from hilrec.daemon.replay.metrics import Stall
    from hilrec.daemon.replay.results import EpisodeResult

log = logging.getLogger(__name__)

MERGE_TIMEOUT_S: Final[float] = 60.0
MERGE_POLL_S: Final[float] = 0.01
GATE_GUARD_S: Final[float] = 0.004  # the worker is stopped this long before each tick deadline
GATE_RESUME_S: Final[float] = 0.010  # and continued this long after it (a tick's work: 2-8 ms)


# --- the judgement (in the worker) ---------------------------------------------------------------

WARN_FLAGGED_FRACTION: Final[float] = 0.01
WARN_FLAGGED_MIN: Final[int] = 2
# Recorder flags that make a take worth a second look (the follower did not do what was asked).
_WARN_FLAGS: Final[dict[str, str]] = {
    "follower_failed": "the follower could not be read",
    "write_failed": "the follower could not be written",
    "leader_failed": "the leader could not be read",
    "leader_stale": "the leader sent nothing",
}


def judge_episode(
    root: Path, episode_index: int, *, mode: str, merge_timeout_s: float = MERGE_TIMEOUT_S
) -> dict[str, Any]:
    """The verdict on one saved episode: ``{episode_index, verdict, summary, details}``."""
    from hilrec.daemon.errors import HilrecError

    started = time.perf_counter()
    waited = wait_merged(root, episode_index, merge_timeout_s)
    if waited is None:
        return not_checked(
            episode_index, f"it was not merged into LeRobot's files within {merge_timeout_s:.0f} s"
        )
    checking = time.perf_counter()
    try:
        verdict, summary, details = _judge(root, episode_index, mode)
    except (HilrecError, OSError, ValueError, KeyError) as exc:
        log.exception("verdict of episode %d", episode_index)
        return not_checked(episode_index, f"{type(exc).__name__}: {exc}")
    details["merge_wait_s"] = round(waited, 3)
    details["check_s"] = round(time.perf_counter() - checking, 3)
    details["worker_s"] = round(time.perf_counter() - started, 3)
    return {"episode_index": episode_index, "verdict": verdict, "summary": summary, "details": details}


def wait_merged(root: Path, episode_index: int, timeout_s: float) -> float | None:
    """Seconds until ``meta/info.json`` counts the episode (merged); None at the timeout.

    The episode is durable in the journal before the daemon asks; the merge into LeRobot's files
    follows at once on the writer's merge thread, and info.json is the last file it replaces."""
    from hilrec.daemon.atomic import read_json

    info_path = root / INFO_PATH
    started = time.monotonic()
    while True:
        info = read_json(info_path, if_missing=None)
        if isinstance(info, dict) and int(info.get("total_episodes", 0)) > episode_index:
            return time.monotonic() - started
        if time.monotonic() - started > timeout_s:
            return None
        time.sleep(MERGE_POLL_S)  # a bounded poll on a file another process replaces


def episode_data_problems(root: Path, episode_index: int) -> tuple[list[str], list[str]]:
    """The checker's errors and warnings that concern this episode (rows, timestamps, stats,
    video), each as the checker words it."""
    import dataclasses

    from hilrec.daemon.dataset import (
        Findings,
        Severity,
        checks_data,
        checks_rows,
        checks_stats,
        checks_video,
        classified,
    )

    findings = Findings(root)
    contents = checks_data.load_contents(root, findings)
    if contents is None:
        return [f.format() for f in findings.failures] or ["the dataset cannot be read"], []
    # Row checks are cheap for the whole dataset; only this episode's failures count (another
    # episode merged while this was read shows as a mismatch of *its* rows, or of the totals).
    checks_rows.check_rows(contents, findings)
    if episode_index not in contents.episodes:
        return [f"episode {episode_index} has no metadata row in meta/episodes"], []
    if episode_index in contents.rows:
        one = dataclasses.replace(
            contents,
            episodes={episode_index: contents.episodes[episode_index]},
            rows={episode_index: contents.rows[episode_index]},
        )
        checks_stats.check_episode_stats(one, findings)
        checks_video.check_videos(one, findings, decode=True)
    mine = [classified(f) for f in findings.failures if f.episode == episode_index]
    errors = [f.format() for f in mine if f.severity is Severity.ERROR]
    return errors, [f.format() for f in mine if f.severity is not Severity.ERROR]


def _judge(root: Path, index: int, mode: str) -> tuple[EpisodeVerdict, str, dict[str, Any]]:
    from hilrec.daemon.dataset import load_episode_sidecar

    problems, harmless = episode_data_problems(root, index)
    meta, _ = load_episode_sidecar(root, index)
    notes = _recorder_notes(meta or {})
    replay = _sim_replay(root, index) if mode == "sim" else _hardware_replay(root, index)
    details: dict[str, Any] = {
        "data_problems": problems,
        "data_warnings": harmless,  # true but harmless (the checker's WARNING rules): shown, not judged
        "recorder_notes": notes,
        "replay": replay,
    }
    frames = replay.get("frames") or (meta or {}).get("frames")
    if problems:
        return (
            EpisodeVerdict.BAD,
            f"episode {index} breaks a dataset rule ({problems[0]}): press ← to record it again",
            details,
        )
    if replay["verdict"] == EpisodeVerdict.BAD:
        why = f" ({notes[0]})" if notes else ""
        return EpisodeVerdict.BAD, f"{replay['summary']}{why}: press ← to record it again", details
    if replay["verdict"] == EpisodeVerdict.WARNING:
        return EpisodeVerdict.WARNING, f"{replay['summary']}: keep it, or press ← to record it again", details
    if notes:
        return (
            EpisodeVerdict.WARNING,
            f"{notes[0]}: look at it, keep it or press ← to record it again",
            details,
        )
    if replay["verdict"] == EpisodeVerdict.NOT_CHECKED:
        return (
            EpisodeVerdict.NOT_CHECKED,
            f"episode {index} passes the dataset checks, but {replay['summary']}",
            details,
        )
    return (
        EpisodeVerdict.SOUND,
        f"episode {index} is sound: {frames} frames, {replay['summary']}; keep it",
        details,
    )


def _recorder_notes(meta: dict[str, Any]) -> list[str]:
    notes = []
    ended_by = str(meta.get("ended_by") or "")
    if ended_by.startswith("fault:"):
        _, kind, device = [*ended_by.split(":", 2), "", ""][:3]
        notes.append(f"the take was ended by a fault ({kind} on {device})")
    counts = (meta.get("frame_flags") or {}).get("counts") or {}
    frames = int(meta.get("frames") or 0)
    for flag, what in _WARN_FLAGS.items():
        # A read that failed after its retries repeats the last good value for that frame: a few
        # are harmless; more than WARN_FLAGGED_FRACTION of the take are worth a look.
        if counts.get(flag, 0) > max(WARN_FLAGGED_MIN, WARN_FLAGGED_FRACTION * frames):
            notes.append(f"{what} on {counts[flag]} of {frames} frames")
    return notes


def _sim_replay(root: Path, index: int) -> dict[str, Any]:
    from hilrec.sim.replay import FAILED, NOT_REPLAYABLE, replay_check

    report = replay_check(root, episodes=[index], undisturbed=False)
    if not report.episodes:
        return {
            "kind": "sim",
            "verdict": EpisodeVerdict.NOT_CHECKED,
            "summary": f"it cannot be replayed: {report.error}",
        }
    episode = report.episodes[0]
    out: dict[str, Any] = {"kind": "sim", "status": episode.status, "frames": episode.frames}
    if episode.status == NOT_REPLAYABLE:
        return {
            **out,
            "verdict": EpisodeVerdict.NOT_CHECKED,
            "summary": f"it cannot be replayed: {episode.reason}",
        }
    if episode.status == FAILED:
        out["max_error_per_joint"] = episode.max_error_per_joint
        out["first_mismatch_frame"] = episode.first_mismatch_frame
        out["outcome"] = dict(episode.outcome)
        if episode.max_error_per_joint and episode.max_error:
            joint = max(episode.max_error_per_joint, key=lambda j: episode.max_error_per_joint[j])
            at = _seconds(episode.first_mismatch_frame, _fps(root))
            summary = (
                f"{joint} differs from the bit-exact replay from {at:.1f} s "
                f"(max error {episode.max_error_per_joint[joint]:.3g})"
            )
        else:
            summary = f"the replay's outcome differs ({episode.outcome.get('difference')})"
        return {**out, "verdict": EpisodeVerdict.BAD, "summary": summary}
    return {**out, "verdict": EpisodeVerdict.SOUND, "summary": "it replays bit for bit"}


def _hardware_replay(root: Path, index: int) -> dict[str, Any]:
    from hilrec.daemon.replay.check import replay_dataset
    from hilrec.daemon.replay.results import ReplayVerdict
    from hilrec.daemon.replay.settings import DEFAULT_CONFIG_PATH, load_replay_settings

    check = replay_dataset(
        root, settings=load_replay_settings(None), settings_source=str(DEFAULT_CONFIG_PATH), episodes=[index]
    )
    result = check.results[0]
    out: dict[str, Any] = {
        "kind": "hardware",
        "status": result.verdict.value,
        "frames": result.frames,
        "reason": result.reason,
        "notes": list(result.notes),
    }
    if result.verdict is ReplayVerdict.NOT_REPLAYABLE:
        return {
            **out,
            "verdict": EpisodeVerdict.NOT_CHECKED,
            "summary": f"the twin cannot replay it: {result.reason}",
        }
    lag = result.lag.frames if result.lag is not None else None
    worst = result.worst_joint()
    out["lag_frames"] = None if lag is None else round(float(lag), 3)
    out["lag_ms"] = None if lag is None else round(float(result.ms(lag) or 0.0), 1)
    if worst is not None:
        out["worst_joint"] = {
            "name": worst.name,
            "rms": round(worst.judged_rms_error, 3),
            "max": round(worst.judged_max_error, 3),
        }
    if result.divergence_joint is not None:
        out["divergence"] = {
            "joint": result.divergence_joint,
            "onset_frame": result.divergence_onset,
            "onset_s": _seconds(result.divergence_onset, result.fps),
        }
    if result.verdict is ReplayVerdict.DIVERGED:
        stalled = any(j.stalls for j in result.joints)
        if result.divergence_joint is None and not stalled:
            # Errors over the RMS limits with no departure and no stall: the follower tracked the
            # twin loosely (e.g. a short take that started mid-motion, from the twin at rest).
            return {
                **out,
                "verdict": EpisodeVerdict.WARNING,
                "summary": f"the follower tracks the twin loosely ({result.reason})",
            }
        return {**out, "verdict": EpisodeVerdict.BAD, "summary": _divergence_summary(result)}
    if result.verdict is ReplayVerdict.LAGGING:
        ms = out["lag_ms"]
        return {
            **out,
            "verdict": EpisodeVerdict.WARNING,
            "summary": f"the follower is {abs(ms or 0):.0f} ms {'behind' if (lag or 0) > 0 else 'ahead of'} "
            f"the twin ({lag or 0:+.2f} frames)",
        }
    worst_text = f"; worst joint {worst.name}, rms {worst.judged_rms_error:.2f}" if worst is not None else ""
    return {
        **out,
        "verdict": EpisodeVerdict.SOUND,
        "summary": f"consistent with the twin (lag {lag or 0:+.2f} frames{worst_text})",
    }


def _divergence_summary(result: EpisodeResult) -> str:
    joint = result.divergence_joint
    if joint is None:
        worst = result.worst_joint()
        name = worst.name if worst is not None else "a joint"
        return f"{name} is off the twin ({result.reason})"
    stalls: list[Stall] = next((j.stalls for j in result.joints if j.name == joint), [])
    if stalls:
        return f"{joint} stalled from {_seconds(stalls[0].start, result.fps):.1f} s"
    return f"{joint} diverged from the twin from {_seconds(result.divergence_onset, result.fps):.1f} s"


def _seconds(frame: int | None, fps: int) -> float:
    return 0.0 if frame is None or not fps else frame / fps


def _fps(root: Path) -> int:
    from hilrec.daemon.atomic import read_json

    return int((read_json(root / INFO_PATH, if_missing=None) or {}).get("fps") or 0)


# --- priority (in the worker) ----------------------------------------------------------------------


def lower_priority() -> str:
    """Put this process at the bottom of the CPU queue; say what was granted."""
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except (OSError, AttributeError) as exc:
        try:
            os.nice(19 - os.nice(0))
        except OSError as nice_exc:
            return f"normal (SCHED_IDLE refused: {exc}; nice refused: {nice_exc})"
        return f"nice 19 (SCHED_IDLE refused: {exc})"
    return "SCHED_IDLE"


# --- the worker process -------------------------------------------------------------------------------


def serve(requests: IO[str], replies: IO[str]) -> int:
    """The worker's body: a ``ready`` line, then one reply line per request line until EOF."""
    _die_with_parent()
    priority = lower_priority()
    _preload()
    _send(replies, {"type": "ready", "priority": priority, "pid": os.getpid()})
    for line in requests:
        if not line.strip():
            continue
        request = json.loads(line)
        index = int(request["episode_index"])
        try:
            reply = judge_episode(Path(request["root"]), index, mode=str(request["mode"]))
        except Exception as exc:
            log.exception("verdict of episode %d", index)
            reply = not_checked(index, f"the check failed: {type(exc).__name__}: {exc}")
        _send(replies, {"type": "verdict", **reply})
    return 0


def _die_with_parent() -> None:
    """SIGKILL this worker when the daemon dies, even while a tick gate holds it stopped."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG
    if os.getppid() == 1:  # the daemon died before that took effect
        sys.exit(0)


def _preload() -> None:
    """Import what a verdict needs now, not while the first take waits for its verdict."""
    import importlib

    from hilrec.daemon.dataset import check_dataset

    del check_dataset
    for name in ("hilrec.daemon.replay.check", "hilrec.sim.replay"):
        importlib.import_module(name)


def _send(out: IO[str], message: dict[str, Any]) -> None:
    out.write(json.dumps(message, allow_nan=False, default=str) + "\n")
    out.flush()


def main() -> int:
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s verdict: %(message)s")
    # The replies get the original stdout; anything a library prints goes to stderr (the log).
    replies = os.fdopen(os.dup(sys.stdout.fileno()), "w", encoding="utf-8")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    return serve(sys.stdin, replies)


# --- the daemon side ---------------------------------------------------------------------------------


class TickGate:
    """Lets the worker process run only between the loop's ticks, whatever it is doing.

    SCHED_IDLE keeps the worker off a CPU the loop wants *inside* this machine; it does not stop a
    hypervisor from running the worker's virtual CPU while the loop's waits for a physical one
    (measured: ticks 20 ms late while the worker ran, on the shared 2-core VM). So while a
    verdict is being made, the worker is sent SIGSTOP :data:`GATE_GUARD_S` before each tick's
    deadline and SIGCONT :data:`GATE_RESUME_S` after it, when the tick's work is done: it keeps
    about two thirds of each period. A gate thread that wakes late only lets the worker run a
    little into a tick, as it would without the gate; the worker always ends continued.
    """

    def __init__(self, pid: int, grid: Callable[[], tuple[float, float] | None]) -> None:
        self._pid = pid
        self._grid = grid
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="hilrec-verdict-gate", daemon=True)
        self.ticks = 0

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> int:
        """End the gating, the worker continued; how many ticks it was held off."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(2.0)
        self._signal(signal.SIGCONT)
        return self.ticks

    def _run(self) -> None:
        while not self._stop.is_set():
            grid = self._grid()
            if grid is None:  # no tick yet: nothing to keep clear
                self._stop.wait(0.05)
                continue
            deadline, period = grid
            now = time.monotonic()
            ahead = deadline + math.ceil((now + GATE_GUARD_S - deadline) / period) * period
            if self._stop.wait(max(0.0, ahead - GATE_GUARD_S - time.monotonic())):
                return
            self._signal(signal.SIGSTOP)
            self.ticks += 1
            self._stop.wait(max(0.0, ahead + GATE_RESUME_S - time.monotonic()))
            self._signal(signal.SIGCONT)

    def _signal(self, signum: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(self._pid, signum)


class VerdictWorker:
    """Starts the worker process, feeds it saved episodes in order, hands back its verdicts.

    ``on_verdict(verdict)`` runs on the ``hilrec-verdict`` thread with the verdict's dict
    (``episode_index``, ``verdict``, ``summary``, ``details``, ``take_end_to_verdict_s``).
    """

    def __init__(
        self,
        *,
        root: Path,
        mode: str,
        on_verdict: Callable[[dict[str, Any]], None],
        command: list[str] | None = None,
        tick_grid: Callable[[], tuple[float, float] | None] | None = None,
    ) -> None:
        self.root = Path(root)
        self.mode = mode
        self._on_verdict = on_verdict
        # (a tick deadline, the period) of the loop, monotonic: with it the worker runs only
        # between ticks (TickGate); without it, whenever the CPU scheduler lets it.
        self._tick_grid = tick_grid
        self.gated_ticks = 0
        self._command = command or [sys.executable, "-m", "hilrec.daemon.control.verdict"]
        self._queue: queue.Queue[tuple[int, float] | None] = queue.Queue()
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._pending = 0
        self.done = 0
        self.last: dict[str, Any] | None = None
        self.priority = "not started"
        self.error: str | None = None
        self._process: subprocess.Popen[str] | None = None
        self._thread = threading.Thread(target=self._run, name="hilrec-verdict", daemon=True)

    def start(self) -> None:
        """Start the process (call from a thread at normal priority: the child inherits it)."""
        self._process = subprocess.Popen(
            self._command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=None,  # the daemon's own stderr: its log
            text=True,
            bufsize=1,
        )
        self._thread.start()

    def submit(self, episode_index: int, ended_at: float | None = None) -> None:
        """Judge ``episode_index`` (saved); ``ended_at``: when its take ended (monotonic)."""
        with self._lock:
            self._pending += 1
        self._queue.put((episode_index, time.monotonic() if ended_at is None else ended_at))

    @property
    def pending(self) -> int:
        with self._lock:
            return self._pending

    def drain(self, timeout_s: float) -> bool:
        """Wait until every submitted episode has its verdict; False at the timeout."""
        deadline = time.monotonic() + timeout_s
        with self._idle:
            while self._pending:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._idle.wait(remaining)
        return True

    def close(self) -> None:
        """Stop the worker (what is still pending gets no verdict)."""
        self._queue.put(None)
        process = self._process
        if process is not None:
            with contextlib.suppress(OSError):
                os.kill(process.pid, signal.SIGCONT)  # in case a gate left it stopped
            if process.stdin is not None:
                with contextlib.suppress(OSError):
                    process.stdin.close()
            try:
                process.wait(5.0)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(5.0)
        if self._thread.is_alive():
            self._thread.join(5.0)

    def status(self) -> dict[str, Any]:
        with self._lock:
            return {
                "priority": self.priority,
                "gated": self._tick_grid is not None,
                "gated_ticks": self.gated_ticks,
                "pending": self._pending,
                "done": self.done,
                "last": self.last,
                "error": self.error,
            }

    # --- the hilrec-verdict thread ---------------------------------------------------------------

    def _run(self) -> None:
        process = self._process
        assert process is not None and process.stdout is not None and process.stdin is not None
        ready = self._read(process.stdout)
        if ready is None or ready.get("type") != "ready":
            self._fail(f"the verdict worker did not start (exit status {process.poll()})")
        else:
            self.priority = str(ready.get("priority"))
            log.info("verdict worker pid %s at %s", ready.get("pid"), self.priority)
        while (item := self._queue.get()) is not None:
            index, ended_at = item
            reply = None
            if self.error is None:
                gate = TickGate(process.pid, self._tick_grid) if self._tick_grid is not None else None
                try:
                    _send(process.stdin, {"root": str(self.root), "episode_index": index, "mode": self.mode})
                    if gate is not None:
                        gate.start()
                    reply = self._read(process.stdout)
                except OSError as exc:
                    self._fail(f"the verdict worker is gone ({exc})")
                finally:
                    if gate is not None:
                        self.gated_ticks += gate.stop()
                if reply is None and self.error is None:
                    self._fail(f"the verdict worker stopped (exit status {process.poll()})")
            if reply is None:
                reply = not_checked(index, f"the verdict worker is not running: {self.error}")
            reply.pop("type", None)
            reply["take_end_to_verdict_s"] = round(time.monotonic() - ended_at, 3)
            try:
                self._on_verdict(reply)
            except Exception:
                log.exception("handing over the verdict of episode %d failed", index)
            with self._idle:
                self._pending -= 1
                self.done += 1
                self.last = {k: reply[k] for k in ("episode_index", "verdict", "summary")}
                self._idle.notify_all()

    def _read(self, stream: IO[str]) -> dict[str, Any] | None:
        line = stream.readline()
        if not line:
            return None
        try:
            message = json.loads(line)
        except ValueError:
            log.error("verdict worker said %r", line[:200])
            return None
        return message if isinstance(message, dict) else None

    def _fail(self, message: str) -> None:
        log.error("%s; episodes get no verdict", message)
        self.error = message


def not_checked(episode_index: int, why: str) -> dict[str, Any]:
    return {
        "episode_index": episode_index,
        "verdict": EpisodeVerdict.NOT_CHECKED,
        "summary": f"episode {episode_index} was not checked: {why}",
        "details": {"error": why},
    }


if __name__ == "__main__":
    sys.exit(main())
