"""The daemon's configuration: frozen dataclasses read from one TOML file and checked at start.

``hilrec daemon --config configs/emulated.toml`` builds :class:`DaemonSettings` with
:func:`hilrec.daemon.config.load_toml`; any unknown, missing or invalid key stops the daemon
before it opens a port, with the dotted key in the message. Cross-field rules (a serial leader
needs a port, a non-loopback bind needs CURVE keys, sim cameras only in sim mode...) live in the
``validate`` methods so they are checked at the same edge.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Literal

from hilrec.daemon.config import from_mapping, load_toml, read_toml
from hilrec.daemon.dataset import DEFAULT_SPILL_BYTES_LIMIT, VideoEncoder
from hilrec.daemon.errors import ConfigError
from hilrec.daemon.so101 import ARM_SIDES, BodyMode, Role
from hilrec.daemon.wire.policy_settings import PolicySettings
from hilrec.daemon.wire.security import ZmqSettings, is_loopback
from hilrec.drivers.calibration import DEFAULT_ARM_IDS, default_arm_id

Mode = Literal["sim", "hil", "emulated"]
LeaderSource = Literal["serial", "remote", "scripted"]
EmulatedLeaderMotion = Literal["operator", "wave", "servo"]
CameraSource = Literal["opencv", "video", "sim", "twin"]
DeviceLostPolicy = Literal["save", "discard"]


def _check_faults(section: object) -> None:
    """An emulated arm's ``follower_faults`` / ``leader_faults``, each as ``hilrec emulate --fault``."""
    from hilrec.drivers.emulated.faults import parse_fault

    for key in ("follower_faults", "leader_faults"):
        for i, text in enumerate(getattr(section, key)):
            try:
                parse_fault(text)
            except ConfigError as exc:
                raise ConfigError(f"{key}[{i}]", exc.problem) from None


@dataclass(frozen=True, kw_only=True)
class DatasetSettings:
    root: Path
    video_codec: str = "libsvtav1"
    # Frames the writer thread may lag behind before the loop waits (then the tick is late).
    writer_queue_frames: int = 250
    # How long the loop may wait on a full writer queue before it declares the writer stalled.
    writer_stall_ms: int = 2000
    # Where video is encoded: "process" (workers at SCHED_IDLE, the default for libsvtav1) or
    # "thread" (in the daemon, the default for the others); unset follows the codec.
    video_encoder: VideoEncoder | None = None
    # The on-disk spill a lagging encoder may fill before a new take is refused (bytes).
    spill_bytes_limit: int = DEFAULT_SPILL_BYTES_LIMIT

    def validate(self) -> None:
        if self.writer_queue_frames < 1:
            raise ConfigError("writer_queue_frames", "must be at least 1")
        if self.spill_bytes_limit <= 0:
            raise ConfigError("spill_bytes_limit", "must be a positive number of bytes")
        if self.writer_stall_ms <= 0:
            raise ConfigError("writer_stall_ms", "must be positive")


@dataclass(frozen=True, kw_only=True)
class FollowerSettings:
    port: str = ""  # hil only; emulated mode makes its own
    id: str = DEFAULT_ARM_IDS[Role.FOLLOWER]  # LeRobot's arm id: calibration file <id>.json in its directory
    calibration: Path | None = None  # hil: a file, else LeRobot's directory; emulated: the twin's
    body_mode: BodyMode = BodyMode.DEGREES
    # LeRobot's max_relative_target: per-tick clamp of the goal around the present position.
    max_relative_target: float | None = None
    # Servo status bits that do not fail a read (e.g. 32 = overload, for a gripper squeezing
    # an object); any other error bit is a device fault that ends the episode.
    tolerated_status: int = 0

    def validate(self) -> None:
        if self.max_relative_target is not None and self.max_relative_target <= 0:
            raise ConfigError("max_relative_target", "must be positive when set")
        if not 0 <= self.tolerated_status <= 255:
            raise ConfigError(
                "tolerated_status", f"must be a status byte 0..255, got {self.tolerated_status}"
            )


@dataclass(frozen=True, kw_only=True)
class LeaderSettings:
    source: LeaderSource
    port: str = ""  # serial source in hil mode
    id: str = DEFAULT_ARM_IDS[Role.LEADER]
    calibration: Path | None = None
    # Remote source: no command for this long -> the follower holds position and a fault shows.
    watchdog_ms: int = 500

    def validate(self) -> None:
        if self.watchdog_ms <= 0:
            raise ConfigError("watchdog_ms", "must be positive")


@dataclass(frozen=True, kw_only=True)
class ArmSettings:
    """``[arms.left]`` / ``[arms.right]``: one arm pair of a two-arm bench (LeRobot's
    ``bi_so_follower`` / ``bi_so_leader``). What both pairs share (body_mode, the leader's
    source, tolerated_status) stays in ``[follower]`` and ``[leader]``."""

    follower_port: str = ""  # hil only (hilrec find-port); emulated mode makes its own
    leader_port: str = ""
    # LeRobot's arm ids: calibration files <id>.json in its directory (hilrec calibrate).
    follower_id: str = ""
    leader_id: str = ""
    follower_calibration: Path | None = None  # hil: a file instead of LeRobot's directory
    leader_calibration: Path | None = None
    # LeRobot's max_relative_target for this arm's follower (each SOFollower has its own).
    max_relative_target: float | None = None
    # Emulated mode: faults of this arm's emulated follower / leader (`hilrec emulate --fault`).
    follower_faults: tuple[str, ...] = ()
    leader_faults: tuple[str, ...] = ()

    def validate(self) -> None:
        if self.max_relative_target is not None and self.max_relative_target <= 0:
            raise ConfigError("max_relative_target", "must be positive when set")
        _check_faults(self)

    def arm_id(self, side: str, role: Role | str) -> str:
        """The calibration id: the one given, else the one ``hilrec calibrate ROLE --arm SIDE``
        writes (LeRobot's ``<id>_<side>``, e.g. ``so101_follower_left``)."""
        role = Role(role)
        given = self.follower_id if role is Role.FOLLOWER else self.leader_id
        return given or default_arm_id(role, side)


@dataclass(frozen=True, kw_only=True)
class CameraSettings:
    """One camera. Sources: ``opencv`` (a device), ``video`` (a file played at its own rate),
    ``sim`` (rendered from the twin at observation time; sim mode), ``twin`` (emulated mode: the
    mirroring twin rendered by a background thread at ``fps``, like a real camera)."""

    source: CameraSource
    width: int = 640
    height: int = 480
    fps: int = 30
    device: str | int = ""  # opencv: /dev/videoN, or an index (0 or "0", LeRobot's style)
    fourcc: str = ""  # opencv: e.g. "MJPG" (USB cameras reach 30 fps at 640x480 only in MJPG)
    path: Path | None = None  # video: a file
    loop: bool = True  # video: start over at the end (false: the camera stalls when it ends)
    # No new frame for this long: the camera counts as stalled.
    stall_ms: int = 500

    def validate(self) -> None:
        if self.width <= 0 or self.height <= 0:
            raise ConfigError("width", f"frame size must be positive, got {self.width}x{self.height}")
        if self.fps <= 0:
            raise ConfigError("fps", "must be positive")
        if self.stall_ms <= 0:
            raise ConfigError("stall_ms", "must be positive")
        if self.source == "opencv" and (
            self.device == "" or (isinstance(self.device, int) and self.device < 0)
        ):
            raise ConfigError("device", "an opencv camera needs a device: /dev/video0 or an index such as 0")
        if self.source == "video" and self.path is None:
            raise ConfigError("path", "a video camera needs a file path")


@dataclass(frozen=True, kw_only=True)
class FaultSettings:
    # What happens to the open episode when a port disappears or a camera stalls.
    on_device_lost: DeviceLostPolicy = "save"
    # Extra attempts the bus makes after a timeout or a corrupt reply (LeRobot's SO arms: 2).
    bus_retries: int = 2
    # Reply timeout on top of the wire time (ms); 0 keeps the SDK's (~34 ms at 1 Mbps), which
    # a 40 ms tick cannot afford twice.
    bus_reply_timeout_ms: float = 10.0
    # Consecutive ticks whose bus transaction failed (after the retries) before the device
    # counts as lost; single failures only mark the frame.
    max_failed_ticks: int = 5

    def validate(self) -> None:
        if not 0 <= self.bus_retries <= 10:
            raise ConfigError("bus_retries", f"must be in 0..10, got {self.bus_retries}")
        if self.bus_reply_timeout_ms < 0:
            raise ConfigError("bus_reply_timeout_ms", "must be >= 0")
        if self.max_failed_ticks < 1:
            raise ConfigError("max_failed_ticks", "must be at least 1")


@dataclass(frozen=True, kw_only=True)
class TelemetrySettings:
    preview_hz: float = 2.0  # 0 turns previews off
    preview_width: int = 320
    jpeg_quality: int = 70

    def validate(self) -> None:
        if self.preview_hz < 0:
            raise ConfigError("preview_hz", "must be 0 (off) or positive")
        if self.preview_width < 16:
            raise ConfigError("preview_width", "must be at least 16")
        if not 1 <= self.jpeg_quality <= 100:
            raise ConfigError("jpeg_quality", "must be in 1..100")


@dataclass(frozen=True, kw_only=True)
class LoopSettings:
    # SCHED_FIFO priority of the loop thread (1..99); 0 keeps the normal scheduler. Needs
    # CAP_SYS_NICE (or root); refused -> a warning in the log and in status, and the loop runs
    # at normal priority.
    realtime_priority: int = 0
    # SCHED_FIFO priority of the control server thread (keep it below the loop's); 0: normal.
    # A request then waits for the CPU no longer than for the GIL.
    control_priority: int = 0
    # Python's GIL switch interval: how long another thread may keep the GIL once the loop
    # wants it. The default 5 ms would be the loop's jitter floor.
    switch_interval_ms: float = 0.5
    # Sleep until this close to a deadline, then spin (time.sleep overshoots ~0.1 ms).
    spin_us: int = 500

    def validate(self) -> None:
        if not 0 <= self.realtime_priority <= 99:
            raise ConfigError("realtime_priority", f"must be in 0..99, got {self.realtime_priority}")
        if not 0 <= self.control_priority <= 99:
            raise ConfigError("control_priority", f"must be in 0..99, got {self.control_priority}")
        if not 0.05 <= self.switch_interval_ms <= 10:
            raise ConfigError("switch_interval_ms", f"must be in 0.05..10, got {self.switch_interval_ms}")
        if not 0 <= self.spin_us <= 5000:
            raise ConfigError("spin_us", f"must be in 0..5000, got {self.spin_us}")


@dataclass(frozen=True, kw_only=True)
class TwinSettings:
    # hil/emulated: a MuJoCo twin follows the follower's measured joints and the divergence is
    # published and summarised per episode. It steps whole physics steps of `timestep` per
    # frame; false drops the mirror (and the constraint an explicit timestep puts on fps).
    mirror: bool = True
    # Physics step (s) of every twin the daemon makes: sim mode's, the mirror, the emulated
    # follower's. 0 = chosen for fps (hilrec.sim.twin.timestep_for): 5 ms where it divides the
    # frame (25 fps: 8 steps), else the largest step below it that does (30 fps: 7 of 1/210 s).
    # Any other value is used as given, and an fps it does not divide into whole steps is refused.
    timestep: float = 0.0

    @property
    def given_timestep(self) -> float | None:
        """The timestep as given, or None when it is left to the twin (0)."""
        return self.timestep or None

    def validate(self) -> None:
        if self.timestep != 0.0 and not 0.0005 <= self.timestep <= 0.02:
            raise ConfigError(
                "timestep", f"must be 0 (chosen for fps) or in 0.0005..0.02 s, got {self.timestep}"
            )


@dataclass(frozen=True, kw_only=True)
class SimSettings:
    # False: sim mode ticks as fast as it can (timing is still recorded, so nothing claims 25 Hz).
    realtime: bool = True


@dataclass(frozen=True, kw_only=True)
class EmulatedSettings:
    """Emulated mode: two emulated arms (``hilrec emulate`` child processes) on pseudo-terminals."""

    leader_motion: EmulatedLeaderMotion = "operator"  # the scripted operator's hand, or a wave
    wire_timing: bool = True  # answer at the servos' 1 Mbps wire speed
    seed: int = 0
    # Faults to inject, in `hilrec emulate --fault` syntax, e.g. "drop:p=0.02", "vanish:after_s=5".
    follower_faults: tuple[str, ...] = ()
    leader_faults: tuple[str, ...] = ()
    # The scripted hand on the leader (`hilrec emulate --hand`): grip (always holds it), rest
    # (holds it only while its torque is off), push:after_s=S (also pushes S s after torque on).
    leader_hand: str = "grip"
    start_timeout_s: float = 30.0

    def validate(self) -> None:
        _check_faults(self)
        if self.start_timeout_s <= 0:
            raise ConfigError("start_timeout_s", "must be positive")
        from hilrec.drivers.emulated.hand import HandScript

        try:
            HandScript.parse(self.leader_hand)
        except ConfigError as exc:
            raise ConfigError("leader_hand", exc.problem) from None


@dataclass(frozen=True, kw_only=True)
class UiSettings:
    """``hilrec ui``: the web page at the daemon. Beyond loopback every request needs the token."""

    host: str = "127.0.0.1"
    port: int = 8765
    token: str = ""  # sent as "Authorization: Bearer <token>" or ?token=<token>

    def validate(self) -> None:
        if not 1 <= self.port <= 65535:
            raise ConfigError("port", f"must be a TCP port in 1..65535, got {self.port}")
        if not is_loopback(self.host) and len(self.token) < 16:
            raise ConfigError(
                "token",
                f"serving the page on host {self.host!r} reaches beyond loopback and requires an "
                "access token of at least 16 characters ([ui] token)",
            )


class RerunViewer(StrEnum):
    """Where ``hilrec display`` sends the live view (its ``--rrd``, ``--spawn`` or ``--serve``)."""

    RRD = "rrd"  # an .rrd file, complete once the display child is stopped
    SPAWN = "spawn"  # rerun's native viewer, on this machine's screen
    SERVE = "serve"  # rerun's web viewer on 127.0.0.1


@dataclass(frozen=True, kw_only=True)
class DisplaySettings:
    """A ``hilrec display`` child beside the daemon, logging its telemetry to rerun; off unless
    ``rerun`` is set. ``hilrec collect --display`` replaces it for the daemon collect starts."""

    rerun: RerunViewer | None = None
    rrd: Path | None = None  # rerun = "rrd": the file (a relative path is from the daemon's cwd)
    web_port: int = 9090  # rerun = "serve": the web viewer's HTTP port

    def validate(self) -> None:
        if self.rerun is RerunViewer.RRD:
            if self.rrd is None:
                raise ConfigError("rrd", 'rerun = "rrd" needs the file to write: rrd = "live.rrd"')
            if self.rrd.is_dir():
                raise ConfigError("rrd", f"{self.rrd} is a folder; name the .rrd file to write")
        elif self.rrd is not None:
            raise ConfigError("rrd", f'a file is written only with rerun = "rrd", not {self._viewer}')
        if not 1 <= self.web_port <= 65535:
            raise ConfigError("web_port", f"must be a TCP port in 1..65535, got {self.web_port}")

    @property
    def _viewer(self) -> str:
        return "no rerun" if self.rerun is None else f'rerun = "{self.rerun}"'


@dataclass(frozen=True, kw_only=True)
class DaemonSettings:
    mode: Mode
    fps: int = 25
    dataset: DatasetSettings
    zmq: ZmqSettings = field(default_factory=ZmqSettings)
    follower: FollowerSettings = field(default_factory=FollowerSettings)
    leader: LeaderSettings
    # Empty: one arm pair ([follower], [leader]); else both [arms.left] and [arms.right].
    arms: dict[str, ArmSettings] = field(default_factory=dict)
    cameras: dict[str, CameraSettings] = field(default_factory=dict)
    faults: FaultSettings = field(default_factory=FaultSettings)
    telemetry: TelemetrySettings = field(default_factory=TelemetrySettings)
    loop: LoopSettings = field(default_factory=LoopSettings)
    twin: TwinSettings = field(default_factory=TwinSettings)
    sim: SimSettings = field(default_factory=SimSettings)
    emulated: EmulatedSettings = field(default_factory=EmulatedSettings)
    ui: UiSettings = field(default_factory=UiSettings)
    display: DisplaySettings = field(default_factory=DisplaySettings)
    policy: PolicySettings = field(default_factory=PolicySettings)

    @property
    def period_s(self) -> float:
        return 1.0 / self.fps

    @property
    def arm_count(self) -> int:
        """How many arm pairs the bench has: 1, or 2 with ``[arms.left]`` and ``[arms.right]``."""
        return len(self.arms) or 1

    def arm_pairs(self) -> list[tuple[str, ArmSettings]]:
        """The two arm pairs, left first (LeRobot's column order); empty for one arm."""
        return [(side, self.arms[side]) for side in ARM_SIDES if side in self.arms]

    def validate(self) -> None:
        if not 1 <= self.fps <= 1000:
            raise ConfigError("fps", f"must be in 1..1000, got {self.fps}")
        if self.arms:
            self._check_arms()
        if self.mode != "hil" or self.twin.mirror:
            self._check_twin_rate()
        for name, cam in self.cameras.items():
            key = f"cameras.{name}.source"
            if not name.isidentifier():
                raise ConfigError(f"cameras.{name}", "camera names must be identifiers")
            if (cam.source == "sim") != (self.mode == "sim"):
                raise ConfigError(
                    key,
                    f"source {cam.source!r} cannot be used in {self.mode} mode "
                    "(sim cameras render the twin and exist only in sim mode)",
                )
            if cam.source == "twin" and self.mode != "emulated":
                raise ConfigError(
                    key,
                    "a 'twin' camera films the emulated world; in hil mode it "
                    "would record a rendering as a measurement",
                )
        if self.mode == "sim" and len({(c.height, c.width) for c in self.cameras.values()}) > 1:
            raise ConfigError(
                f"cameras.{next(iter(self.cameras))}.height",
                "sim cameras render one twin and must share one frame size",
            )
        if self.arms:
            pass  # each arm's ports and calibrations: _check_arms
        elif self.mode == "hil":
            if not self.follower.port:
                raise ConfigError("follower.port", "hil mode needs the follower's serial port")
            if self.leader.source == "serial" and not self.leader.port:
                raise ConfigError("leader.port", "a serial leader needs its serial port")
        else:
            if self.mode == "emulated" and self.follower.calibration is not None:
                raise ConfigError(
                    "follower.calibration",
                    "emulated mode uses the emulated arm's calibration; remove the key",
                )
            if self.follower.port:
                raise ConfigError(
                    "follower.port", f"{self.mode} mode makes its own follower; remove the port"
                )
            if self.leader.port:
                raise ConfigError("leader.port", f"{self.mode} mode makes its own leader; remove the port")
        if self.mode == "sim" and self.leader.source == "serial":
            raise ConfigError("leader.source", "sim mode takes a 'scripted' or 'remote' leader")
        if self.mode != "sim" and self.leader.source == "scripted":
            raise ConfigError(
                "leader.source",
                f"{self.mode} mode takes a 'serial' or 'remote' leader "
                "(emulated mode's serial leader is moved by the "
                "scripted operator: emulated.leader_motion)",
            )
        if self.mode != "sim" and not self.sim.realtime:
            raise ConfigError("sim.realtime", "only sim mode may run faster than real time")
        if self.display.rerun is not None and self.zmq.curve is not None:
            raise ConfigError(
                "display.rerun",
                "the daemon's sockets use CURVE ([zmq.curve]); run `hilrec display --config FILE "
                "--client-key KEY` beside it instead of a [display] child",
            )

    def _check_arms(self) -> None:
        """Two arm pairs: both sides, every port where the mode needs one, none shared, and
        nothing of one arm left in [follower] / [leader]."""
        unknown = sorted(set(self.arms) - set(ARM_SIDES))
        if unknown:
            sides = " or ".join(ARM_SIDES)
            raise ConfigError(f"arms.{unknown[0]}", f"an arm is {sides}, as LeRobot names them")
        missing = [side for side in ARM_SIDES if side not in self.arms]
        if missing:
            raise ConfigError(f"arms.{missing[0]}", "a two-arm bench needs both [arms.left] and [arms.right]")
        for key in ("port", "calibration", "max_relative_target"):
            if getattr(self.follower, key) not in ("", None):
                raise ConfigError(f"follower.{key}", "with [arms.*] each arm has its own; move it there")
        if self.follower.id != FollowerSettings().id:
            raise ConfigError("follower.id", "with [arms.*] each arm has its own follower_id")
        for key in ("port", "calibration"):
            if getattr(self.leader, key) not in ("", None):
                raise ConfigError(f"leader.{key}", "with [arms.*] each arm has its own; move it there")
        if self.leader.id != LeaderSettings(source=self.leader.source).id:
            raise ConfigError("leader.id", "with [arms.*] each arm has its own leader_id")
        wanted = "scripted" if self.mode == "sim" else "serial"  # a remote leader sends six goals
        if self.leader.source != wanted:
            raise ConfigError("leader.source", f"two arms in {self.mode} mode take a {wanted!r} leader")
        if self.policy.spec:
            raise ConfigError("policy.spec", "a policy drives one arm; two-arm rollouts are not supported")
        ports: dict[str, str] = {}
        for side, arm in self.arm_pairs():
            for role in ("follower", "leader"):
                key = f"arms.{side}.{role}_port"
                port = getattr(arm, f"{role}_port")
                if self.mode == "hil" and not port:
                    raise ConfigError(key, f"hil mode needs the {side} {role}'s serial port")
                if self.mode != "hil" and port:
                    raise ConfigError(key, f"{self.mode} mode makes its own {side} {role}; remove the port")
                if self.mode == "emulated" and getattr(arm, f"{role}_calibration") is not None:
                    raise ConfigError(
                        f"arms.{side}.{role}_calibration",
                        "emulated mode uses the emulated arm's calibration; remove the key",
                    )
                if port in ports:
                    raise ConfigError(key, f"{port} is arms.{ports[port]} too: each arm needs its own bus")
                if port:
                    ports[port] = f"{side}.{role}_port"
            if self.mode != "emulated" and (arm.follower_faults or arm.leader_faults):
                key = "follower_faults" if arm.follower_faults else "leader_faults"
                raise ConfigError(f"arms.{side}.{key}", "faults are injected into emulated arms only")
        if self.emulated.follower_faults or self.emulated.leader_faults:
            key = "follower_faults" if self.emulated.follower_faults else "leader_faults"
            raise ConfigError(f"emulated.{key}", "with [arms.*] each arm's faults go in its own section")

    def _check_twin_rate(self) -> None:
        """The twins step whole physics steps per frame (emulated mode's follower, one step at a
        time, needs a step rate that is a whole number of frames too)."""
        from hilrec.daemon.errors import FrameRateError
        from hilrec.sim.twin import timestep_for

        try:
            timestep_for(self.fps, self.twin.given_timestep)
        except FrameRateError as exc:
            if self.twin.given_timestep is not None:
                mirror = " (or twin.mirror = false to record without the twin)" if self.mode == "hil" else ""
                raise ConfigError(
                    "twin.timestep",
                    f"{exc}; set twin.timestep = 0 to have one chosen for fps {self.fps}{mirror}",
                ) from None
            why = (
                "the twin needs whole steps"
                if self.mode == "sim"
                else "the mirroring twin needs whole steps (set twin.mirror = false to record without it)"
            )
            raise ConfigError("fps", f"{exc}; {why}") from None


def load_settings(path: str | Path, *, root: Path | None = None) -> DaemonSettings:
    """Read and check a daemon config; ``root`` overrides ``dataset.root`` (``--root``)."""
    if root is None:
        return load_toml(DaemonSettings, path)
    # --root stands in for dataset.root before the checks, so a config may leave it out.
    data = read_toml(path)
    dataset = data.get("dataset", {})
    if not isinstance(dataset, dict):
        raise ConfigError("dataset", f"expected a table, got {type(dataset).__name__}", source=str(path))
    data["dataset"] = {**dataset, "root": str(root)}
    return from_mapping(DaemonSettings, data, source=str(path))
