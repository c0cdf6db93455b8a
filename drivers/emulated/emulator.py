"""An emulated SO-101 arm: six STS3215 servos answering on a real pseudo-terminal.

Any Feetech client opens the pty's device path (or the symlink) exactly like a USB adapter's
``/dev/ttyACM0``: pyserial, the unmodified scservo_sdk, our bus, LeRobot's FeetechMotorsBus.
A background thread reads the master side, frames instruction packets, answers PING, READ,
WRITE, REG_WRITE, ACTION, SYNC_READ and SYNC_WRITE (unicast and broadcast), and writes status
packets back: optionally at the wire speed of the servos' Baud_Rate register (10 bits a byte
plus Return_Delay_Time), optionally with injected faults (:mod:`hilrec.drivers.emulated.faults`).

``new_servos`` models an arm being put together (``hilrec setup-motors``): six servos as they
leave the factory, every one at id 1 and 1 Mbps with no offsets, on a controller board that has
only one of them connected at a time (:meth:`EmulatedArm.connect_next`, in LeRobot's order, the
gripper first; then the whole chain). A servo then also hears only packets sent at its own baud
rate: the pty's line speed, as the client set it, must match its Baud_Rate register.

Usage (the daemon's ``emulated`` mode and the tests)::

    with EmulatedArm(EmulatorConfig(role="follower")) as port:
        bus = FeetechBus(port) ...

The emulator keeps its own slave fd open: otherwise the master reports EIO (and select() says
"readable" forever) whenever a client closes the port.
"""

from __future__ import annotations

import array
import ctypes
import fcntl
import heapq
import logging
import os
import pty
import select
import termios
import threading
import time
import tty
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from hilrec.daemon.errors import DeviceError
from hilrec.daemon.so101 import JOINT_NAMES, MOTOR_IDS, Role
from hilrec.drivers.calibration import ArmCalibration, load_calibration
from hilrec.drivers.emulated.faults import Fault, FaultPlan
from hilrec.drivers.emulated.hand import Hand, HandScript
from hilrec.drivers.emulated.motion import (
    ArmMotion,
    MechanicalFrame,
    OperatorPath,
    ServoMotion,
    SweepPath,
    TwinMotion,
    wave_path,
)
from hilrec.drivers.emulated.packets import Packet, PacketReader, status_packet
from hilrec.drivers.emulated.servo import EmulatedServo
from hilrec.drivers.tables import (
    BAUD_RATES,
    BITS_PER_BYTE_ON_WIRE,
    BROADCAST_ID,
    Instruction,
)

log = logging.getLogger(__name__)

MotionKind = Literal["auto", "twin", "operator", "servo", "wave", "sweep"]
_PR_SET_TIMERSLACK = 29
# While the bus is idle, the motion is stepped once this much is due, not at every physics step:
# each wake-up and advance has a fixed cost (the goals, the units, the observation) that a 5 ms
# step paid every time, 8 % of a core for a follower nobody talked to. A packet still steps the
# motion up to its own arrival first, so this only sets how much catching up a request may find.
IDLE_STEP_BATCH_S = 0.02


@dataclass(frozen=True, kw_only=True)
class EmulatorConfig:
    role: Role
    link: Path | None = None  # also reachable at this path (a symlink to the pty)
    wire_timing: bool = False
    faults: tuple[Fault, ...] = ()
    # The arm's mechanics: whose calibration makes its readings the twin's units. Default:
    # hilrec.sim.units.emulated_calibration().
    calibration: Path | None = None
    # auto: follower = the MuJoCo twin, leader = the scripted operator's hand.
    motion: MotionKind = "auto"
    seed: int = 0
    # True: EEPROM as it left the factory (no offsets, full limits), for calibrating from
    # scratch; False: as left by a calibration with ``calibration``. The ids are 1..6 either way.
    factory_fresh: bool = False
    # True: six new servos, all at id 1 (factory EEPROM), connected one at a time in LeRobot's
    # setup order (``connect_next``), each hearing only its own baud rate: for setup-motors.
    new_servos: bool = False
    # When the scripted hand holds a leader, and who wins against its torque
    # (hilrec.drivers.emulated.hand): grip (always), rest, push:after_s=S.
    hand: HandScript = field(default_factory=HandScript)


@dataclass
class _Outgoing:
    due: float
    seq: int
    data: bytes = field(compare=False)
    late: bool = field(default=False, compare=False)

    def __lt__(self, other: _Outgoing) -> bool:
        return (self.due, self.seq) < (other.due, other.seq)


class EmulatedArm:
    """Six emulated STS3215 (ids 1..6) on a pty; ``start()``/``stop()`` or a context manager."""

    def __init__(
        self,
        config: EmulatorConfig,
        *,
        motion: ArmMotion | None = None,
        frame: MechanicalFrame | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        # The time the arm's motion runs on (monotonic seconds); replies and wire timing always
        # use the real monotonic clock. Tests inject a clock they set by hand.
        self.clock = clock
        self.frame = frame or _frame_for(config)
        self.servos = [EmulatedServo(1 if config.new_servos else servo_id) for servo_id in MOTOR_IDS]
        if not (config.factory_fresh or config.new_servos):
            self._preload_calibration(self.frame.calibration)
        # Which servos the controller board reaches (indices into ``servos``): all of them,
        # unless the arm is being put together servo by servo.
        self.connected: frozenset[int] = frozenset(range(len(self.servos)))
        self._setup_step = 0
        if config.new_servos:
            self.connected = frozenset({SETUP_ORDER[0]})
        self._line_speed: int | None = None  # the pty's baud rate as of the last read (new_servos)
        self.faults = FaultPlan(config.faults, seed=config.seed)
        self.sweep: SweepPath | None = None
        self.motion = motion or self._build_motion()
        self.lock = threading.RLock()  # held while a packet is handled; tests hold it to inspect
        self.vanished = threading.Event()
        self.packets_handled = 0
        self._handled = threading.Condition(self.lock)
        self._reader = PacketReader()
        self._outgoing: list[_Outgoing] = []
        self._seq = 0
        self._line_free = 0.0
        self._last_due = 0.0
        self._master = self._slave = -1
        self._wake_r = self._wake_w = -1
        self._thread: threading.Thread | None = None
        self._running = False
        self._started_at = 0.0
        self.device_path = ""

    # --- lifecycle --------------------------------------------------------------------------

    @property
    def port(self) -> str:
        """What a client opens: the link if one was asked for, else the pty's device path."""
        return str(self.config.link) if self.config.link else self.device_path

    def start(self) -> str:
        if self._thread is not None:
            raise DeviceError(f"emulated {self.config.role} already started on {self.port}")
        self._master, self._slave = pty.openpty()
        tty.setraw(self._slave)
        os.set_blocking(self._master, False)
        self.device_path = os.ttyname(self._slave)
        self._wake_r, self._wake_w = os.pipe()
        if self.config.link is not None:
            _replace_symlink(self.config.link, self.device_path)
        self._running = True
        self._started_at = time.monotonic()
        self._power_up()
        self._thread = threading.Thread(target=self._serve, name=f"emulated-{self.config.role}", daemon=True)
        self._thread.start()
        log.info("emulated %s on %s", self.config.role, self.port)
        return self.port

    def stop(self) -> None:
        """Stop serving and close the pty (clients then see the port gone). Idempotent."""
        if self._thread is None and self._master < 0 and self._wake_w < 0:
            return
        self._running = False
        if self._wake_w >= 0:
            os.write(self._wake_w, b"x")
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        self._close_pty()
        for fd in (self._wake_r, self._wake_w):
            if fd >= 0:
                os.close(fd)
        self._wake_r = self._wake_w = -1
        self.motion.close()

    def __enter__(self) -> str:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def inject(self, fault: Fault) -> None:
        self.faults.add(fault)

    def clear_faults(self) -> None:
        self.faults.clear()
        with self.lock:
            for servo in self.servos:
                servo.apply_faults(0)

    def servo(self, servo_id: int) -> EmulatedServo:
        for servo in self.servos:
            if servo.servo_id == servo_id:
                return servo
        raise KeyError(f"no emulated servo with id {servo_id}")

    def wait_handled(self, count: int, timeout: float = 5.0) -> bool:
        """Block until ``count`` packets have been handled (a sync write gets no reply to wait
        for; tests wait on this instead of sleeping)."""
        with self._handled:
            return self._handled.wait_for(lambda: self.packets_handled >= count, timeout)

    def connect_next(self) -> str:
        """The person plugs the board into the next servo only (LeRobot's setup order: gripper
        first, shoulder_pan last); after the last one, the whole chain. Returns what is now
        connected: a joint name, or "all"."""
        with self.lock:
            self._setup_step += 1
            if self._setup_step < len(SETUP_ORDER):
                index = SETUP_ORDER[self._setup_step]
                self.connected = frozenset({index})
                return JOINT_NAMES[index]
            self.connected = frozenset(range(len(self.servos)))
            return "all"

    def connect_all(self) -> None:
        with self.lock:
            self._setup_step = len(SETUP_ORDER)
            self.connected = frozenset(range(len(self.servos)))

    @contextmanager
    def paused(self) -> Iterator[None]:
        """Hold the emulator still (no packet handled) while a test inspects or edits it."""
        with self.lock:
            yield

    # --- set-up -----------------------------------------------------------------------------

    def _preload_calibration(self, calibration: ArmCalibration) -> None:
        for servo, cal in zip(self.servos, calibration.values(), strict=True):
            servo.set("Homing_Offset", cal.homing_offset)
            servo.set("Min_Position_Limit", cal.range_min)
            servo.set("Max_Position_Limit", cal.range_max)

    def _build_motion(self) -> ArmMotion:
        kind = self.config.motion
        if kind == "auto":
            kind = "twin" if self.config.role == "follower" else "operator"
        middle = self.frame.middle()
        if kind == "twin":
            return TwinMotion(self.frame, seed=self.config.seed)
        if kind == "servo":
            return ServoMotion(middle)
        if kind == "wave":
            return ServoMotion(middle, hand=Hand(wave_path(self.frame), self.config.hand))
        if kind == "sweep":
            self.sweep = SweepPath(
                self.frame, ready=lambda: all(s.log.offset_writes >= 2 for s in self.servos)
            )
            return ServoMotion(middle, hand=self.sweep)
        operator = OperatorPath(self.frame, seed=self.config.seed)
        return ServoMotion(operator(0.0), hand=Hand(operator, self.config.hand))

    def _power_up(self) -> None:
        """Servos power up holding where they stand, torque on (as reported for the STS3215)."""
        self.motion.advance(self.clock(), [None] * len(self.servos))
        for servo, actual in zip(self.servos, self.motion.actual(), strict=True):
            servo.set("Goal_Position", servo.present_from_actual(float(actual)))
            servo.set("Torque_Enable", 1)

    def _advance(self) -> None:
        """The motion up to now, under the goals and torque limits in force until now."""
        limit = getattr(self.motion, "limit_torque", None)
        if limit is not None:
            limit([servo.get("Torque_Limit") for servo in self.servos])
        self.motion.advance(self.clock(), [servo.goal_target() for servo in self.servos])

    # --- the serving thread -----------------------------------------------------------------

    def _serve(self) -> None:
        if self.config.wire_timing:
            _tighten_timer_slack()
        try:
            while self._running:
                self._flush_due(time.monotonic())
                if self._check_vanish():
                    return
                timeout = self._next_wakeup()
                readable, _, _ = select.select([self._master, self._wake_r], [], [], timeout)
                if not readable:
                    self._idle_advance()
                if self._master in readable:
                    try:
                        data = os.read(self._master, 4096)
                    except BlockingIOError:
                        continue
                    except OSError:
                        return
                    now = time.monotonic()
                    if self.config.new_servos:
                        self._line_speed = _line_speed(self._slave)
                    for packet in self._reader.feed(data):
                        self._handle(packet, now)
        except Exception:  # a bug here must be loud, not a silently dead servo chain
            log.exception("emulated %s crashed", self.config.role)
            raise

    def _motion_due(self) -> float | None:
        return getattr(self.motion, "next_due", lambda: None)()

    def _idle_advance(self) -> None:
        """While the bus is idle, keep the motion up with the clock (in batches of
        :data:`IDLE_STEP_BATCH_S`): a request then finds at most a few steps to catch up, which
        it does before any packet is handled."""
        due = self._motion_due()
        if due is not None and due <= self.clock():
            with self.lock:
                self._advance()

    def _next_wakeup(self) -> float:
        now = time.monotonic()
        waits = [0.2]
        if self._outgoing:
            waits.append(self._outgoing[0].due - now)
        motion_due = self._motion_due()
        if motion_due is not None:
            waits.append(motion_due + IDLE_STEP_BATCH_S - self.clock())
        vanish_at = self.faults.next_vanish_time()
        if vanish_at is not None:
            waits.append(self._started_at + vanish_at - now)
        return max(0.0, min(waits))

    def _check_vanish(self) -> bool:
        if not self.faults.vanish_due(time.monotonic() - self._started_at):
            return False
        log.info("emulated %s: port %s vanishes (injected)", self.config.role, self.port)
        self._close_pty()
        self.vanished.set()
        self.faults.record("vanish")
        return True

    def _close_pty(self) -> None:
        for fd in (self._master, self._slave):
            if fd >= 0:
                os.close(fd)
        self._master = self._slave = -1
        link = self.config.link
        if link is not None and link.is_symlink() and os.readlink(link) == self.device_path:
            link.unlink()

    def _schedule(self, due: float, data: bytes, *, late: bool = False) -> None:
        # One wire: nothing overtakes a late reply (the host receives the line's bytes in order).
        self._last_due = max(due, self._last_due)
        self._seq += 1
        heapq.heappush(self._outgoing, _Outgoing(self._last_due, self._seq, data, late))

    def _flush_due(self, now: float) -> None:
        while self._outgoing and self._outgoing[0].due <= now:
            item = heapq.heappop(self._outgoing)
            try:
                os.write(self._master, item.data)
            except BlockingIOError:
                log.warning("emulated %s: client not reading, reply dropped", self.config.role)
            if item.late:
                self.faults.record("late_written")

    # --- packets ----------------------------------------------------------------------------

    def _byte_time(self) -> float:
        return BITS_PER_BYTE_ON_WIRE / BAUD_RATES.get(self.servos[0].baud_index, 1_000_000)

    def _handle(self, packet: Packet, now: float) -> None:
        with self.lock:
            self.packets_handled += 1
            self.faults.packet_received()
            if self.faults.vanish_due(now - self._started_at):
                return  # the cable is pulled as this packet arrives: the loop closes the pty
            timing = self.config.wire_timing
            rx_done = now + len(packet.raw) * self._byte_time() if timing else now
            self._line_free = max(self._line_free, rx_done)
            if self.faults.echo():
                self._schedule(rx_done, packet.raw)
            # Physics up to this instant under the goals in force until now, before the packet
            # reads a Present_* register or writes a goal: a goal acts from the current substep.
            self._advance()
            for servo in self.servos:
                servo.apply_faults(self.faults.condition_bits(servo.servo_id))
            for servo, reply_id, data in self._execute(packet):
                self._reply(servo, reply_id, data, now)
            self._flush_due(time.monotonic())
            self._handled.notify_all()

    def _present(self) -> list[EmulatedServo]:
        """The servos that hear this packet: connected, not faulted away, at the line's speed."""
        speed = self._line_speed
        return [
            s
            for i, s in enumerate(self.servos)
            if i in self.connected
            and not self.faults.is_missing(s.servo_id)
            and (speed is None or BAUD_RATES.get(s.baud_index) == speed)
        ]

    def _addressed(self, servo_id: int) -> list[EmulatedServo]:
        present = self._present()
        if servo_id == BROADCAST_ID:
            return present
        return [s for s in present if s.servo_id == servo_id]

    def _execute(self, packet: Packet) -> list[tuple[EmulatedServo, int, bytes]]:
        """Apply the instruction; return (servo, id, data) for every status packet it causes.

        The id is the one the servo had when addressed: a servo told to change its id
        acknowledges under the old one (what LeRobot's setup_motor expects)."""
        code, params, broadcast = packet.code, packet.params, packet.is_broadcast
        actual = self.motion.actual()
        velocity = self.motion.velocity()
        index = {id(s): i for i, s in enumerate(self.servos)}  # by object: new servos share id 1

        def state(servo: EmulatedServo) -> tuple[float, float]:
            i = index[id(servo)]
            return float(actual[i]), float(velocity[i])

        if code == Instruction.PING:
            return [(s, s.servo_id, b"") for s in self._addressed(packet.servo_id)]
        if code == Instruction.READ and len(params) == 2 and not broadcast:
            return [
                (s, s.servo_id, s.read(params[0], params[1], *state(s)))
                for s in self._addressed(packet.servo_id)
            ]
        if code in (Instruction.WRITE, Instruction.REG_WRITE) and params:
            replies = []
            for servo in self._addressed(packet.servo_id):
                addressed_as = servo.servo_id
                if code == Instruction.WRITE:
                    servo.write(params[0], params[1:], state(servo)[0])
                else:
                    servo.pending = (params[0], params[1:])
                if not broadcast and servo.replies_to_writes:
                    replies.append((servo, addressed_as, b""))
            return replies
        if code == Instruction.ACTION:
            replies = []
            for servo in self._addressed(packet.servo_id):
                addressed_as = servo.servo_id
                if servo.pending is not None:
                    servo.write(*servo.pending, state(servo)[0])
                    servo.pending = None
                if not broadcast and servo.replies_to_writes:
                    replies.append((servo, addressed_as, b""))
            return replies
        if code == Instruction.SYNC_READ and len(params) >= 2 and broadcast:
            address, length = params[0], params[1]
            by_id = {s.servo_id: s for s in self._present()}
            return [
                (by_id[i], i, by_id[i].read(address, length, *state(by_id[i])))
                for i in params[2:]
                if i in by_id
            ]
        if code == Instruction.SYNC_WRITE and len(params) >= 2 and broadcast:
            address, length = params[0], params[1]
            by_id = {s.servo_id: s for s in self._present()}
            body = params[2:]
            for start in range(0, len(body) - length, length + 1):
                target = by_id.get(body[start])
                if target is not None:
                    target.write(address, body[start + 1 : start + 1 + length], state(target)[0])
            return []
        log.debug(
            "emulated %s ignored instruction 0x%02x from %s", self.config.role, code, packet.raw.hex(" ")
        )
        return []

    def _reply(self, servo: EmulatedServo, reply_id: int, data: bytes, now: float) -> None:
        raw = status_packet(reply_id, servo.fault_bits, data)
        fate, delay = self.faults.reply_fate(reply_id)
        if fate == "drop":
            return
        if fate == "corrupt":
            raw = raw[:-1] + bytes(((raw[-1] + 1) & 0xFF,))
        if self.config.wire_timing:
            start = self._line_free + servo.return_delay_s
            self._line_free = start + len(raw) * self._byte_time()
            due = self._line_free
        else:
            due = now
        self._schedule(due + delay, raw, late=fate == "late")


# LeRobot's setup_motors order: ``reversed(bus.motors)``, the gripper first.
SETUP_ORDER: tuple[int, ...] = tuple(reversed(range(len(MOTOR_IDS))))
_TCGETS2 = 0x802C542A  # Linux (x86, arm): struct termios2 with c_ispeed / c_ospeed
_SPEEDS = {getattr(termios, f"B{rate}"): rate for rate in BAUD_RATES.values() if hasattr(termios, f"B{rate}")}


def _line_speed(fd: int) -> int | None:
    """The baud rate the client set on the pty (shared by both ends), None if unknown."""
    try:
        speed = termios.tcgetattr(fd)[5]
    except termios.error:
        return None
    if speed in _SPEEDS:
        return _SPEEDS[speed]
    try:  # a rate without a B constant (128000, 76800): pyserial set it through BOTHER
        buf = array.array("I", [0] * 11)
        fcntl.ioctl(fd, _TCGETS2, buf)
        return int(buf[10]) or None
    except OSError:
        return None


def _frame_for(config: EmulatorConfig) -> MechanicalFrame:
    frame = MechanicalFrame.from_sim()
    if config.calibration is None:
        return frame
    return frame.with_calibration(load_calibration(config.calibration))


def _replace_symlink(link: Path, target: str) -> None:
    if link.exists() and not link.is_symlink():
        raise DeviceError(f"--link {link}: exists and is not a symlink; refusing to replace it")
    link.parent.mkdir(parents=True, exist_ok=True)
    tmp = link.with_name(f".{link.name}.{os.getpid()}.tmp")
    if tmp.is_symlink():
        tmp.unlink()
    os.symlink(target, tmp)
    os.replace(tmp, link)


def _tighten_timer_slack() -> None:
    """Sleep to within microseconds, not Linux's default 50 us slack, when timing the wire."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_TIMERSLACK, 1, 0, 0, 0)
    except (OSError, AttributeError):
        log.debug("could not tighten the timer slack; wire timing may run a little late")
