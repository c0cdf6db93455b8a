"""The daemon process: sockets, dataset writer, loop thread and control server, started and
stopped in one explicit order.

Start: bind the control and telemetry sockets (a busy port fails before anything is written),
open or create the dataset on the writer thread, build the rig on the loop thread, then serve
control requests on the main thread.

Stop (``shutdown`` request, SIGINT or SIGTERM): stop the loop at a tick edge; the loop thread
saves the open episode and closes its devices; the dataset is finalized (waiting for pending
saves); the writer, telemetry and sockets close. SIGKILL skips all this and loses only the open
episode: saved ones are durable the moment ``save_episode`` returns (the writer's guarantee).
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import zmq

from hilrec.daemon import procs
from hilrec.daemon.control.clock import TickPacer
from hilrec.daemon.control.collect_note import CollectNotes
from hilrec.daemon.control.loop import ControlLoop
from hilrec.daemon.control.priority import set_thread_priority
from hilrec.daemon.control.recorder import Recorder
from hilrec.daemon.control.rig import Rig, RigFactory
from hilrec.daemon.control.session import Session
from hilrec.daemon.control.verdict import VerdictWorker
from hilrec.daemon.errors import ConfigError, DatasetStateError, HilrecError, RequestRefusedError
from hilrec.daemon.policy.record import ControlSource
from hilrec.daemon.so101 import robot_type
from hilrec.daemon.wire.display_child import DisplayChild, no_screen, settings_argv
from hilrec.daemon.wire.protocol import CODE_BAD_STATE, CODE_FAULT, CODE_TIMEOUT, PROTOCOL_VERSION, Request
from hilrec.daemon.wire.root import check_root, daemon_features
from hilrec.daemon.wire.security import Security, endpoint
from hilrec.daemon.wire.server import ControlServer
from hilrec.daemon.wire.settings import DaemonSettings, RerunViewer
from hilrec.daemon.wire.telemetry import Telemetry

log = logging.getLogger(__name__)

LOOP_STOP_TIMEOUT_S = 10.0
FINALIZE_TIMEOUT_S = 600.0
VERDICT_DRAIN_S = 30.0  # at shutdown, how long the last takes' verdicts may still take


# The rollout's switch requests, and who has the arm after each.
SWITCHES = {"takeover": ControlSource.HUMAN, "handback": ControlSource.POLICY}


class LoopThread:
    """Builds the rig and runs the loop on one thread; closes the open episode and the devices
    on that same thread when stopped."""

    def __init__(
        self,
        factory: RigFactory,
        make_loop: Callable[[Rig], ControlLoop],
        session: Session,
        *,
        realtime_priority: int = 0,
    ) -> None:
        self._factory = factory
        self._realtime_priority = realtime_priority
        self.priority = "normal"
        self._make_loop = make_loop
        self._session = session
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self.loop: ControlLoop | None = None
        self.rig: Rig | None = None
        self.stop_reason = "shutdown"
        self._thread = threading.Thread(target=self._run, name="hilrec-loop", daemon=True)

    def start(self, timeout_s: float = 60.0) -> None:
        self._thread.start()
        if not self._ready.wait(timeout_s):
            raise HilrecError(f"the rig was not ready within {timeout_s:.0f} s")
        if self._error is not None:
            raise self._error

    def stop(self, reason: str, timeout_s: float) -> bool:
        self.stop_reason = reason
        self._stop.set()
        self._thread.join(timeout_s)
        return not self._thread.is_alive()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and (self.loop is None or self.loop.crashed is None)

    def _run(self) -> None:
        with contextlib.ExitStack() as stack:
            try:
                rig, hooks = self._factory(stack)
                self._session.hooks = hooks
                self.rig = rig
                self.loop = self._make_loop(rig)
            except BaseException as exc:  # noqa: BLE001 - handed to start(), raised on the main thread
                self._error = exc
                self._ready.set()
                return
            # After the build: threads and processes the rig started keep normal priority.
            self.priority = set_thread_priority(self._realtime_priority, "the loop thread")
            self._ready.set()
            try:
                self.loop.run(self._stop)
            finally:
                self._session.apply_pending()
                self._session.close_open_episode(self.stop_reason)


class Daemon:
    def __init__(
        self,
        settings: DaemonSettings,
        rig_factory_for: Callable[..., RigFactory] | None = None,
        *,
        resume: bool = False,
        verdicts: bool = True,
        verdict_gate: bool = True,
        display: bool = True,
    ) -> None:
        self.settings = settings
        self.display = display
        self.resume = resume
        self.verdicts = verdicts
        self.verdict_gate = verdict_gate
        self.verdict_worker: VerdictWorker | None = None
        self.server: ControlServer | None = None
        self.collect_notes = CollectNotes()
        self._rig_factory_for = rig_factory_for or default_rig_factory
        self._stop = threading.Event()
        self._stop_reason = "shutdown"
        self.started_wall = time.time()
        self.control_priority = "normal"

    # --- the process -------------------------------------------------------------------------

    def run(self) -> int:
        s = self.settings
        # Before any port or device: a root that may not be recorded into stops the daemon here.
        check_root(Path(s.dataset.root), resume=self.resume, fps=s.fps, features=self.features())
        with contextlib.ExitStack() as stack:
            context: zmq.Context[Any] = zmq.Context()
            if s.loop.control_priority > 0:
                # libzmq's I/O thread moves every message of the three sockets; a request should
                # not wait for it behind the encoders (EPERM is ignored by libzmq).
                context.set(zmq.THREAD_SCHED_POLICY, os.SCHED_FIFO)
                context.set(zmq.THREAD_PRIORITY, s.loop.control_priority)
            # destroy, not term: a socket left open by a stuck thread must not hang the exit.
            stack.callback(context.destroy, 0)
            security = Security(context, s.zmq.curve)
            stack.callback(security.close)
            server = ControlServer(context, s.zmq, security, self._handle)
            self.server = server
            stack.callback(server.close)
            self.telemetry = Telemetry(
                context,
                endpoint(s.zmq.host, s.zmq.telemetry_port),
                hwm=s.zmq.telemetry_hwm,
                preview_hz=s.telemetry.preview_hz,
                preview_width=s.telemetry.preview_width,
                jpeg_quality=s.telemetry.jpeg_quality,
                configure_socket=security.configure,
            )
            self.telemetry.start()
            stack.callback(self.telemetry.close)
            # After the telemetry socket, before the rig: the display sees the first ticks. Its
            # stop runs after the loop's, writer's and verdicts' (LIFO), so it hears their end.
            self._start_display(stack)
            self.recorder = Recorder(
                self._open_sink,
                queue_frames=s.dataset.writer_queue_frames,
                stall_s=s.dataset.writer_stall_ms / 1000.0,
            )
            self.session = Session(
                recorder=self.recorder,
                period_s=s.period_s,
                on_device_lost=s.faults.on_device_lost,
                context=self._episode_context(),
                publish_event=self.telemetry.event,
                on_saved=self._on_saved,
            )
            # The video backlog rides on every tick's telemetry (the publisher reads it, not the loop).
            self.telemetry.tick_fields = self.session.tick_fields
            factory = self._rig_factory_for(s, context, security)
            if s.policy.spec:
                from hilrec.daemon.control.rollout import rollout_factory

                factory = rollout_factory(factory, s.policy)
            sys.setswitchinterval(s.loop.switch_interval_ms / 1000.0)
            self.loop_thread = LoopThread(
                factory, self._make_loop, self.session, realtime_priority=s.loop.realtime_priority
            )
            # Devices first: a rig that cannot start leaves no dataset behind. Nothing is handed
            # to the writer before start_episode, which needs the control server (below).
            # A policy loads in its own process while the rig starts, and may take its own time.
            self.loop_thread.start(60.0 + (s.policy.load_timeout_s if s.policy.spec else 0.0))
            stack.callback(self.loop_thread.stop, "startup failed", LOOP_STOP_TIMEOUT_S)
            self.recorder.start()
            stack.callback(self.recorder.close, 30.0)
            if self.verdicts:
                # Its thread starts from this one while it is still at normal priority, and
                # starts the worker process at the first take; the process inherits that priority
                # and lowers its own (SCHED_IDLE) at once. Closed before the writer (LIFO).
                gated = self.verdict_gate and (s.sim.realtime if s.mode == "sim" else True)
                self.verdict_worker = VerdictWorker(
                    root=Path(s.dataset.root),
                    mode=s.mode,
                    on_verdict=self._on_verdict,
                    tick_grid=self._tick_grid if gated else None,  # a free-running loop has no grid
                )
                self.verdict_worker.start()
                stack.callback(self.verdict_worker.close)
            if self.loop_thread.rig is not None and self.loop_thread.rig.dataset_fields:
                self.recorder.update_dataset_sidecar(self.loop_thread.rig.dataset_fields).result(timeout=30)
            self._install_signals()
            log.info(
                "hilrec daemon (%s mode) serving control on %s, telemetry on %s, dataset %s",
                s.mode,
                endpoint(s.zmq.host, s.zmq.control_port),
                endpoint(s.zmq.host, s.zmq.telemetry_port),
                s.dataset.root,
            )
            self.telemetry.event("daemon_started", mode=s.mode, root=str(s.dataset.root))
            # Last, so that no thread this one starts inherits the policy.
            self.control_priority = set_thread_priority(s.loop.control_priority, "the control server")
            server.serve(self._stop)
            exit_code = self._shut_down()
        return exit_code

    def _start_display(self, stack: contextlib.ExitStack) -> None:
        s = self.settings
        argv = settings_argv(endpoint("127.0.0.1", s.zmq.telemetry_port), s.display)
        if argv is None:
            return
        if not self.display:
            log.info("[display]: off (--no-display)")
            return
        # Refused at start, like a bad key: a display that cannot work would fail only in its log.
        if importlib.util.find_spec("rerun") is None:
            raise ConfigError(
                "display.rerun", "needs rerun-sdk, which is not installed: pip install 'hilrec[rerun]'"
            )
        if s.display.rerun is RerunViewer.SPAWN and (problem := no_screen()) is not None:
            raise ConfigError("display.rerun", f'"spawn" opens a window and {problem}; use "rrd" or "serve"')
        child = DisplayChild(argv, output=lambda line: log.info("display: %s", line)).start()
        if child.process is None:
            log.error("[display]: %s; the daemon goes on without it", child.problem)
            return
        log.info("[display]: started hilrec display (pid %s, rerun %s)", child.process.pid, s.display.rerun)

        def stop() -> None:
            problem = child.stop()
            if problem is not None:
                log.error("[display]: %s", problem)

        stack.callback(stop)

    def _shut_down(self) -> int:
        log.info("shutting down (%s)", self._stop_reason)
        if not self.loop_thread.stop(self._stop_reason, LOOP_STOP_TIMEOUT_S):
            log.error(
                "the loop did not stop within %.0f s; closing the episode from the main thread",
                LOOP_STOP_TIMEOUT_S,
            )
            self.session.close_open_episode(self._stop_reason)
        finalized = self.session.finalize(FINALIZE_TIMEOUT_S)
        if self.verdict_worker is not None and not self.verdict_worker.drain(VERDICT_DRAIN_S):
            log.warning(
                "%d episode(s) still without a verdict after %.0f s; stopping the verdict worker",
                self.verdict_worker.pending,
                VERDICT_DRAIN_S,
            )
        self.telemetry.event("daemon_stopped", reason=self._stop_reason, finalized=finalized)
        return 0 if finalized else 1

    def _install_signals(self) -> None:
        def note(signum: int) -> None:
            self._stop_reason = f"signal:{signal.Signals(signum).name}"

        # Under collect, SIGTERM is the death signal, sent once per exiting thread of collect.
        procs.stop_on_signals(self._stop, note=note)

    def _make_loop(self, rig: Rig) -> ControlLoop:
        s = self.settings
        realtime = s.sim.realtime if s.mode == "sim" else True
        return ControlLoop(
            rig=rig,
            session=self.session,
            telemetry=self.telemetry,
            pacer=TickPacer(s.period_s, realtime=realtime, spin_s=s.loop.spin_us / 1e6),
            max_failed_ticks=s.faults.max_failed_ticks,
            watchdog_faults=s.leader.source == "remote",
        )

    # --- the dataset ---------------------------------------------------------------------------

    def features(self) -> dict[str, Any]:
        return daemon_features(self.settings)

    def _open_sink(self) -> Any:
        from hilrec.daemon.dataset import DatasetWriter, update_dataset_sidecar

        s = self.settings
        root = Path(s.dataset.root)
        features = self.features()
        encoding: dict[str, Any] = {
            "video_encoder": s.dataset.video_encoder.value if s.dataset.video_encoder else None,
            "spill_bytes_limit": s.dataset.spill_bytes_limit,
        }
        # Checked again here, on the writer thread that opens it: the root may have changed since.
        if check_root(root, resume=self.resume, fps=s.fps, features=features):
            sink = DatasetWriter.open(root, video_codec=s.dataset.video_codec, **encoding)
        else:
            sink = DatasetWriter.create(
                root,
                fps=s.fps,
                features=features,
                robot_type=robot_type(s.arm_count),
                video_codec=s.dataset.video_codec,
                **encoding,
            )
        update_dataset_sidecar(root, {"daemon": self._dataset_provenance()})
        return sink

    # --- verdicts ------------------------------------------------------------------------------

    def _tick_grid(self) -> tuple[float, float] | None:
        """(the last tick's deadline, the period), monotonic: when the loop will want a CPU."""
        loop_thread = getattr(self, "loop_thread", None)
        loop = loop_thread.loop if loop_thread is not None else None
        timing = (loop.last_tick.get("timing") if loop is not None else None) or {}
        deadline = timing.get("deadline")
        return None if deadline is None or loop is None else (float(deadline), loop.period_s)

    def _on_saved(self, episode_index: int, _frames: int, ended_at: float) -> None:
        if self.verdict_worker is not None:
            self.verdict_worker.submit(episode_index, ended_at)

    def _on_verdict(self, verdict: dict[str, Any]) -> None:
        """On the hilrec-verdict thread: store the verdict beside the episode, then publish it."""
        index = int(verdict["episode_index"])
        details = dict(verdict.get("details") or {})
        details["take_end_to_verdict_s"] = verdict.get("take_end_to_verdict_s")
        fields = {
            "episode_index": index,
            "verdict": verdict["verdict"],
            "summary": verdict["summary"],
            "details": details,
        }
        stored = {k: v for k, v in fields.items() if k != "episode_index"}
        try:
            self.recorder.update_episode_sidecar(
                index, {"verdict": {**stored, "unix_s": time.time()}}
            ).result(timeout=30.0)
        except (HilrecError, OSError, TimeoutError) as exc:
            log.error("the verdict of episode %d is not stored in its sidecar: %s", index, exc)
        # Published once stored: whoever hears it can read it beside the episode.
        self.telemetry.event("episode_verdict", **fields)

    def _dataset_provenance(self) -> dict[str, Any]:
        s = self.settings
        config = dataclasses.asdict(s)
        config.get("zmq", {}).pop("curve", None)  # key paths are nobody's business in a dataset
        return {
            "mode": s.mode,
            "fps": s.fps,
            "protocol_version": PROTOCOL_VERSION,
            "config": _jsonable(config),
            "started_unix_s": self.started_wall,
        }

    def _episode_context(self) -> dict[str, Any]:
        s = self.settings
        return {
            "root": str(s.dataset.root),
            "mode": s.mode,
            "fps": s.fps,
            "leader_source": s.leader.source,
            "cameras": sorted(s.cameras),
        }

    # --- control requests (main thread) --------------------------------------------------------

    def _handle(self, request: Request) -> dict[str, Any]:
        if request.cmd == "status":
            return self.status()
        if request.cmd == "session_note":
            return self.collect_notes.note(request.args)
        if request.cmd == "shutdown":
            self._stop_reason = "shutdown"
            self._stop.set()
            return {"shutting_down": True, "episode_open": self.session.recording}
        if not self.loop_thread.alive:
            raise RequestRefusedError(
                f"the control loop is not running ({self._loop_problem()}); "
                "only status and shutdown are served",
                CODE_FAULT,
            )
        future = self._switch(request.cmd) if request.cmd in SWITCHES else self.session.submit(request)
        timeout = self.settings.zmq.apply_timeout_ms / 1000.0
        try:
            reply = future.result(timeout=timeout)
        except TimeoutError:
            if future.cancel():
                raise RequestRefusedError(
                    f"the loop did not take {request.cmd!r} within {timeout * 1000:.0f} ms; nothing was done",
                    CODE_TIMEOUT,
                ) from None
            reply = future.result(timeout=timeout)  # it started just now: it will finish
        except RequestRefusedError:
            raise
        except DatasetStateError as exc:
            raise RequestRefusedError(str(exc), CODE_FAULT) from None
        if request.cmd == "start_episode" and self.verdict_worker is not None:
            self.verdict_worker.prepare()  # its imports run during the take, at idle priority
        return reply

    def _switch(self, cmd: str) -> Future[dict[str, Any]]:
        """``takeover`` / ``handback``: queued for the rollout's next tick edge."""
        from hilrec.daemon.control.rollout import RolloutLeader

        leader = self.loop_thread.rig.leader if self.loop_thread.rig is not None else None
        if not isinstance(leader, RolloutLeader):
            raise RequestRefusedError(
                f"{cmd}: no policy drives here ([policy] spec is empty)", CODE_BAD_STATE
            )
        return leader.request(SWITCHES[cmd])

    def _loop_problem(self) -> str:
        loop = self.loop_thread.loop
        return loop.crashed if loop is not None and loop.crashed else "stopped"

    def status(self) -> dict[str, Any]:
        s = self.settings
        out = self.session.snapshot()
        loop = self.loop_thread.loop
        rig = self.loop_thread.rig
        out.update(
            {
                "protocol_version": PROTOCOL_VERSION,
                "mode": s.mode,
                "fps": s.fps,
                "uptime_s": time.time() - self.started_wall,
                "loop": {
                    **loop.stats(),
                    "priority": self.loop_thread.priority,
                    "control_priority": self.control_priority,
                }
                if loop is not None
                else None,
                "leader": rig.leader.status() if rig is not None else None,
                "follower": rig.follower.description if rig is not None else None,
                "cameras": sorted(s.cameras),
                "devices": rig.devices if rig is not None else {},
                "telemetry": {"sent": self.telemetry.sent, "dropped": self.telemetry.dropped},
                "control": {"requests": self.server.requests, "refused": self.server.refused}
                if self.server is not None
                else None,
                "verdicts": self.verdict_worker.status() if self.verdict_worker is not None else None,
                "collect": self.collect_notes.status(),
            }
        )
        return out


def default_rig_factory(
    settings: DaemonSettings, context: zmq.Context[Any], security: Security
) -> RigFactory:
    if settings.mode == "sim":
        from hilrec.daemon.control.sim_rig import sim_rig_factory

        return sim_rig_factory(settings, context, security)
    from hilrec.daemon.control.hardware import hardware_rig_factory

    return hardware_rig_factory(settings, context, security)


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    return value
