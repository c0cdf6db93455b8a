"""A Feetech STS3215 bus on pyserial and the unmodified scservo_sdk 1.0.0.

The SDK frames packets and computes checksums; this class adds what it lacks (the registers
it reads and writes are :mod:`hilrec.drivers.tables`):

- **One owner per port**: the port is opened with ``exclusive=True`` (flock, taken before
  anything touches the port, so a refused second opener cannot flush the owner's input), and
  every transaction runs under this bus's lock; the SDK's ``is_using`` flag is not a lock.
- **No stale replies**: the input buffer is discarded before every transaction. A reply that
  arrived after its timeout would otherwise be taken as the answer to the next read, and every
  later read would stay one behind. A flush only discards what has already arrived, though: a
  late reply can land after it (a loaded machine holds tty bytes for hundreds of ms in the
  kernel's flip-buffer worker, then delivers a retried request's answers all at once). So a reply
  is accepted only if its id *and* length fit the request (the SDK checks the id alone, and took
  a late PING acknowledgement for a READ's data), and after any reply went missing the next
  transaction first sends a *fence*: a READ whose reply length nothing else uses. Replies leave
  a serial line in order, so everything before the fence's reply answers an earlier request and
  is skipped, including late replies that look exactly like the one awaited.
- **No spinning**: the SDK opens the port with ``timeout=0`` and busy-polls; here reads block
  in ``select()`` for at most ``wait_slice_s`` at a time. Timeouts use the monotonic clock.
- **Status bits surfaced**: the SDK's GroupSyncRead throws each servo's ERROR byte away; the
  subclass below keeps it, and every read and write reports error bits as ServoFaultError.
- **TX echo tolerated**: an adapter that echoes what it sends makes the SDK accept our own
  instruction as the reply (for READ, as "angle sensor error" with the address as data). A
  reply identical to what was sent is skipped and the real one awaited.
- **Bounded retries** for timeouts and corrupt packets, within one transaction and without a
  flush in between (a late answer to an earlier attempt answers the same question); errors name
  the port, servo and register.
"""

from __future__ import annotations

import contextlib
import logging
import termios
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field

import scservo_sdk as scs
import serial

from hilrec.daemon.errors import (
    BusError,
    BusPacketError,
    BusTimeoutError,
    PortBusyError,
    PortGoneError,
    ServoFaultError,
)
from hilrec.drivers.sdk_port import ExclusivePort, StatusSyncRead, open_problem
from hilrec.drivers.tables import (
    BROADCAST_ID,
    Instruction,
    Register,
    decode_value,
    describe_span,
    describe_status,
    encode_value,
    from_bytes,
    register,
    to_bytes,
)

log = logging.getLogger(__name__)

_ID, _LENGTH, _ERROR, _PARAM0 = scs.PKT_ID, scs.PKT_LENGTH, scs.PKT_ERROR, scs.PKT_PARAMETER0
_ACK_LENGTH = 2  # LENGTH of a status packet without data: ERROR + checksum
# A fence reads from address 0 (firmware version, model: readable on every STS3215) a length no
# register read uses; it rotates, so a new fence never waits for an older one's reply.
_FENCE_ADDRESS = 0
_FENCE_LENGTHS = (3, 4, 5, 6, 7)


@dataclass(frozen=True, kw_only=True)
class BusConfig:
    port: str
    baudrate: int = 1_000_000
    retries: int = 2  # extra attempts after a timeout or corrupt reply (LeRobot's SO arms use 2)
    # Fixed part of the reply timeout on top of the wire time; None keeps the SDK's own
    # (2 x 16 ms latency timer + 2 ms: about 34 ms at 1 Mbps).
    reply_timeout_ms: float | None = None
    wait_slice_s: float = 0.001  # a waiting read sleeps in select() this long at most; 0 = spin
    # A ping, read or write (set-up: opening, configuring, calibrating) whose attempts all timed
    # out keeps listening, without resending, until this long after its first send: a loaded
    # host can hold tty bytes for 100-700 ms (measured on a busy 2-core machine), and failing an
    # arm's open over that helps nobody. Sync reads (the loop's per-tick read) stay bounded by
    # ``retries`` and the reply timeout.
    patience_ms: float = 1000.0
    flush_input: bool = True  # False only to measure what the stale-reply guard costs


@dataclass
class BusStats:
    transactions: int = 0
    retries: int = 0
    echoes_skipped: int = 0
    stale_skipped: int = 0  # status packets that answered another request
    fences: int = 0
    late_replies: int = 0  # answers taken while waiting out patience_ms


@dataclass
class BroadcastReplies:
    """What a broadcast PING heard: each intact acknowledgement's status byte, by servo id."""

    status: dict[int, int] = field(default_factory=dict)
    answers: int = 0  # intact acknowledgements, several per id if servos share one
    garbled: int = 0  # corrupt or cut-off packets (several servos answering at once)

    @property
    def ids(self) -> list[int]:
        return sorted(self.status)


@dataclass(frozen=True)
class SyncReading:
    """One sync read: decoded values and each servo's status (ERROR) byte."""

    register: str
    values: dict[int, int]
    status: dict[int, int]
    attempts: int = 1

    @property
    def faulted(self) -> dict[int, int]:
        return {sid: bits for sid, bits in self.status.items() if bits}


class FeetechBus:
    """One serial port with a chain of STS3215 servos; open() ... close(), or ``with``."""

    def __init__(self, config: BusConfig) -> None:
        self.config = config
        self.stats = BusStats()
        self._lock = threading.Lock()
        self._port: ExclusivePort | None = None
        self._packets = scs.PacketHandler(0)  # protocol_end 0: STS/SMS, little-endian words
        self._sync_readers: dict[tuple[int, int, tuple[int, ...]], StatusSyncRead] = {}
        # A reply may still be on its way (an attempt failed): fence before the next exchange.
        self._unsettled = False
        self._fence: tuple[int, int] | None = None  # (id, LENGTH) of the fence reply awaited
        self._fence_turn = 0

    @property
    def port_name(self) -> str:
        return self.config.port

    @property
    def is_open(self) -> bool:
        return self._port is not None and self._port.is_open

    # --- lifecycle --------------------------------------------------------------------------

    def open(self) -> None:
        if self.is_open:
            raise BusError("already open", port=self.port_name)
        port = ExclusivePort(
            self.port_name,
            wait_slice_s=self.config.wait_slice_s,
            reply_timeout_ms=self.config.reply_timeout_ms,
        )
        port.baudrate = self.config.baudrate
        try:
            if not port.openPort():
                raise BusError(
                    f"baud rate {self.config.baudrate} is not supported by the SDK", port=self.port_name
                )
        except serial.SerialException as exc:
            if "exclusively lock" in str(exc):
                raise PortBusyError(
                    "another process or bus already owns this port (a running daemon, "
                    "calibrate or LeRobot script?)",
                    port=self.port_name,
                ) from exc
            raise PortGoneError(open_problem(exc), port=self.port_name) from exc
        self._port = port
        self._sync_readers.clear()
        # The port's previous owner may have left a request unanswered: its reply can still land.
        self._unsettled, self._fence = True, None

    def close(self) -> None:
        port, self._port = self._port, None
        if port is not None and port.ser is not None:
            # A vanished port is closed all the same.
            with contextlib.suppress(OSError, serial.SerialException):
                port.closePort()

    def __enter__(self) -> FeetechBus:
        self.open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- transactions -----------------------------------------------------------------------

    @contextlib.contextmanager
    def _transaction(self, servo_id: int | None, what: str) -> Iterator[ExclusivePort]:
        """Own the port for one exchange: lock, discard stale input, map I/O errors."""
        port = self._port
        if port is None:
            raise BusError("bus is not open", port=self.port_name, servo_id=servo_id, register=what)
        with self._lock:
            try:
                if self.config.flush_input:
                    port.ser.reset_input_buffer()
                port.is_using = False  # an earlier exception may have left it set
                self.stats.transactions += 1
                yield port
            except (serial.SerialException, OSError, termios.error) as exc:
                raise PortGoneError(
                    f"serial I/O failed ({exc}); the adapter is gone or was unplugged",
                    port=self.port_name,
                    servo_id=servo_id,
                    register=what,
                ) from exc

    def _send(self, port: ExclusivePort, tx: list[int], reply_bytes: int) -> int:
        """Transmit ``tx`` (the SDK fills header and checksum in) and start the reply timeout."""
        result = self._packets.txPacket(port, tx)
        if result == scs.COMM_SUCCESS:
            port.setPacketTimeout(reply_bytes)
        return result

    def _receive(
        self, port: ExclusivePort, servo_id: int, length: int, tx: list[int] | None = None
    ) -> tuple[list[int], int]:
        """The first status packet from ``servo_id`` whose LENGTH is ``length``, before the
        reply timeout. Everything else answers another request and is skipped: ``tx`` echoed
        back, a late reply of another shape, and, while a fence is pending, all up to its reply.
        """
        while True:
            rx, result = self._packets.rxPacket(port)
            if (
                result == scs.COMM_RX_CORRUPT
                and self._fence is not None
                and len(rx) > _LENGTH
                and (rx[_ID], rx[_LENGTH]) == self._fence
            ):
                self._fence = None  # the fence's reply arrived garbled: the line is in order
                continue
            if result != scs.COMM_SUCCESS:
                return rx, result
            if rx == tx:
                self.stats.echoes_skipped += 1
                continue
            shape = (rx[_ID], rx[_LENGTH])
            if self._fence is not None:
                if shape != self._fence:
                    self.stats.stale_skipped += 1
                    continue
                self._fence = None
                if shape == (servo_id, length):
                    return rx, result  # the fence itself was awaited
                continue
            if shape == (servo_id, length):
                return rx, result
            self.stats.stale_skipped += 1

    def _settle(self, port: ExclusivePort, servo_id: int, length: int) -> None:
        """If a reply went missing, fence: READ from ``servo_id`` a length neither the coming
        reply (``length``) nor a pending fence has, and skip everything up to its reply. A fence
        that times out stays pending until the next settle replaces it with a fence of another
        length (its late reply, if it ever comes, is then skipped as stale)."""
        if not self._unsettled and self._fence is None:
            return
        taken = {length, self._fence[1] if self._fence else 0}
        for _ in _FENCE_LENGTHS:
            self._fence_turn = (self._fence_turn + 1) % len(_FENCE_LENGTHS)
            size = _FENCE_LENGTHS[self._fence_turn]
            if size + 2 not in taken:
                break
        tx = [0, 0, servo_id, 4, Instruction.READ, _FENCE_ADDRESS, size, 0]
        if self._send(port, tx, size + 6) != scs.COMM_SUCCESS:
            return
        self.stats.fences += 1
        self._unsettled, self._fence = False, (servo_id, size + 2)
        self._receive(port, servo_id, size + 2, tx)

    def _unicast(
        self,
        servo_id: int,
        instruction: int,
        params: list[int],
        what: str,
        reply_length: int,
        *,
        quick: bool = False,
    ) -> tuple[list[int], int]:
        """Send one instruction to one servo and return (reply, error byte), with retries.

        ``reply_length`` is the LENGTH field of the status packet that answers it. ``quick``:
        one attempt, no patience."""
        reply_bytes = reply_length + 4
        result = scs.COMM_SUCCESS
        retries = 0 if quick else self.config.retries
        patience_ms = 0.0 if quick else self.config.patience_ms
        with self._transaction(servo_id, what) as port:
            self._settle(port, servo_id, reply_length)
            first_sent = time.monotonic()
            for attempt in range(retries + 1):
                if attempt:
                    # Fence again before a retry: the line is in order once a new fence answers,
                    # and a fence whose own reply was lost no longer makes every retry wait
                    # for it (drop 5% + corrupt 2% failed 0.8% of writes that way, not 0.03%).
                    self._settle(port, servo_id, reply_length)
                tx = [0, 0, servo_id, len(params) + 2, instruction, *params, 0]
                result = self._send(port, tx, reply_bytes)
                if result == scs.COMM_SUCCESS:
                    rx, result = self._receive(port, servo_id, reply_length, tx)
                if result == scs.COMM_SUCCESS:
                    return rx, rx[_ERROR]
                self._unsettled = True
                if attempt < retries:
                    self.stats.retries += 1
                    log.debug(
                        "port %s id %d %s: %s, retrying",
                        self.port_name,
                        servo_id,
                        what,
                        self._packets.getTxRxResult(result),
                    )
            left_ms = patience_ms - (time.monotonic() - first_sent) * 1000.0
            if result == scs.COMM_RX_TIMEOUT and left_ms > 0:
                port.setPacketTimeoutMillis(left_ms)
                rx, result = self._receive(port, servo_id, reply_length, tx)
                if result == scs.COMM_SUCCESS:
                    self.stats.late_replies += 1
                    return rx, rx[_ERROR]
        raise self._comm_error(result, servo_id, what, retries + 1)

    def _comm_error(self, result: int, servo_id: int | None, what: str, attempts: int) -> BusError:
        text = f"{self._packets.getTxRxResult(result).split('] ')[-1]} ({attempts} attempt(s))"
        if result == scs.COMM_RX_TIMEOUT:
            return BusTimeoutError(
                f"no status packet: {text}", port=self.port_name, servo_id=servo_id, register=what
            )
        if result == scs.COMM_RX_CORRUPT:
            return BusPacketError(
                f"corrupt status packet: {text}", port=self.port_name, servo_id=servo_id, register=what
            )
        if result == scs.COMM_PORT_BUSY:
            return PortBusyError(text, port=self.port_name, servo_id=servo_id, register=what)
        return BusError(text, port=self.port_name, servo_id=servo_id, register=what)

    def _check_status(self, servo_id: int, what: str, error: int) -> None:
        if error:
            raise ServoFaultError(
                f"servo reports {describe_status(error)} (status 0x{error:02x})",
                port=self.port_name,
                servo_id=servo_id,
                register=what,
                error_bits=error,
            )

    # --- single-servo operations ------------------------------------------------------------

    def ping(self, servo_id: int, *, quick: bool = False) -> int:
        """Ping a servo and return its model number (777 for an STS3215).

        ``quick``: one attempt and no patience (a probe of whether anything answers at all)."""
        _, error = self._unicast(servo_id, Instruction.PING, [], "PING", _ACK_LENGTH, quick=quick)
        self._check_status(servo_id, "PING", error)
        return self.read(servo_id, "Model_Number")

    def broadcast_ping(self, window_ms: float) -> BroadcastReplies:
        """PING every servo at once (id 0xFE) and gather the acknowledgements that arrive within
        ``window_ms``: ``{id: status byte}``. Meaningful with one servo on the bus (several
        answer at the same instant and their replies collide, counted as ``garbled``); LeRobot's
        ``_find_single_motor`` uses it the same way. Nothing is retried."""
        replies = BroadcastReplies()
        tx = [0, 0, BROADCAST_ID, 2, Instruction.PING, 0]
        with self._transaction(None, "PING (broadcast)") as port:
            result = self._packets.txPacket(port, tx)
            if result != scs.COMM_SUCCESS:
                raise self._comm_error(result, None, "PING (broadcast)", 1)
            deadline = time.monotonic() + window_ms / 1000.0
            while (left_s := deadline - time.monotonic()) > 0:
                port.setPacketTimeoutMillis(left_s * 1000.0)
                rx, result = self._packets.rxPacket(port)
                if result == scs.COMM_SUCCESS:
                    if rx[: len(tx)] == tx:
                        self.stats.echoes_skipped += 1
                    elif rx[_LENGTH] == _ACK_LENGTH:
                        replies.status[rx[_ID]] = rx[_ERROR]
                        replies.answers += 1
                    else:
                        self.stats.stale_skipped += 1  # a late answer to an earlier request
                elif rx:
                    replies.garbled += 1
            # A reply may still land after the window: fence before the next exchange.
            self._unsettled = True
        return replies

    def read_span(
        self, servo_id: int, address: int, length: int, *, check_status: bool = True
    ) -> tuple[bytes, int]:
        """Read ``length`` bytes from ``address``; returns (data, status byte)."""
        what = describe_span(address, length)
        rx, error = self._unicast(servo_id, Instruction.READ, [address, length], what, length + 2)
        data = bytes(rx[_PARAM0 : _PARAM0 + length])
        if len(data) != length:
            raise BusPacketError(
                f"status packet carries {len(data)} bytes, expected {length}",
                port=self.port_name,
                servo_id=servo_id,
                register=what,
            )
        if check_status:
            self._check_status(servo_id, what, error)
        return data, error

    def read(self, servo_id: int, name: str, *, check_status: bool = True) -> int:
        reg = register(name)
        data, _ = self.read_span(servo_id, reg.address, reg.size, check_status=check_status)
        return decode_value(reg, from_bytes(data))

    def write(self, servo_id: int, name: str, value: int) -> None:
        """Write a register and wait for the servo's acknowledgement (Response_Status_Level 1)."""
        reg = register(name)
        data = self._encode(reg, value, servo_id)
        _, error = self._unicast(servo_id, Instruction.WRITE, [reg.address, *data], reg.name, _ACK_LENGTH)
        self._check_status(servo_id, reg.name, error)

    def _encode(self, reg: Register, value: int, servo_id: int | None) -> list[int]:
        if not reg.writable:
            raise BusError("register is read-only", port=self.port_name, servo_id=servo_id, register=reg.name)
        try:
            return list(to_bytes(encode_value(reg, int(value)), reg.size))
        except ValueError as exc:
            raise BusError(
                f"value {value} cannot be written: {exc}",
                port=self.port_name,
                servo_id=servo_id,
                register=reg.name,
            ) from None

    def read_status(self, servo_id: int) -> int:
        """The Status register (error bits as in a status packet), without raising on them."""
        return self.read(servo_id, "Status", check_status=False)

    def set_torque(self, servo_ids: Iterable[int], enabled: bool) -> None:
        """Torque on also locks the EEPROM, torque off unlocks it (as LeRobot does)."""
        for servo_id in servo_ids:
            self.write(servo_id, "Torque_Enable", int(enabled))
            self.write(servo_id, "Lock", int(enabled))

    # --- group operations -------------------------------------------------------------------

    def sync_read(self, name: str, servo_ids: Iterable[int], *, check_status: bool = True) -> SyncReading:
        """One SYNC_READ of register ``name`` from every servo, retried on timeout/corruption.

        Raises ServoFaultError (after reading everything) if a servo reports error bits, unless
        ``check_status`` is False; the reading is attached to the error as ``.reading``.
        """
        reg = register(name)
        ids = tuple(servo_ids)
        result, attempts = scs.COMM_SUCCESS, 0
        with self._transaction(None, reg.name) as port:
            reader = self._sync_reader(port, reg, ids)
            if ids:
                self._settle(port, ids[0], reg.size + 2)
            for attempts in range(1, self.config.retries + 2):
                if attempts > 1 and ids:
                    self._settle(port, ids[0], reg.size + 2)  # as in _unicast: a lost fence is replaced
                result = reader.txRxPacket()
                if result == scs.COMM_SUCCESS:
                    break
                self._unsettled = True
                if attempts <= self.config.retries:
                    self.stats.retries += 1
        if result != scs.COMM_SUCCESS:
            raise self._comm_error(result, reader.failed_id, reg.name, attempts)
        values = {sid: decode_value(reg, from_bytes(reader.data_dict[sid])) for sid in ids}
        reading = SyncReading(reg.name, values, dict(reader.status), attempts)
        if check_status and reading.faulted:
            first, bits = next(iter(reading.faulted.items()))
            others = ", ".join(f"id {sid}: {describe_status(b)}" for sid, b in reading.faulted.items())
            error = ServoFaultError(
                f"servo reports {describe_status(bits)} ({others})",
                port=self.port_name,
                servo_id=first,
                register=reg.name,
                error_bits=bits,
            )
            error.reading = reading  # type: ignore[attr-defined]  # errors.py cannot name SyncReading
            raise error
        return reading

    def _sync_reader(self, port: ExclusivePort, reg: Register, ids: tuple[int, ...]) -> StatusSyncRead:
        """The SDK's group reader for these servos and this register, made once per open."""
        key = (reg.address, reg.size, ids)
        reader = self._sync_readers.get(key)
        if reader is None:
            reader = StatusSyncRead(port, self._packets, reg.address, reg.size, self._receive)
            for servo_id in ids:
                reader.addParam(servo_id)
            self._sync_readers[key] = reader
        return reader

    def sync_write(self, name: str, values: Mapping[int, int]) -> None:
        """One SYNC_WRITE of register ``name``; servos do not answer it, so nothing is retried."""
        reg = register(name)
        writer = scs.GroupSyncWrite(self._port, self._packets, reg.address, reg.size)
        for servo_id, value in values.items():
            writer.addParam(servo_id, self._encode(reg, value, servo_id))
        with self._transaction(None, reg.name):
            result = writer.txPacket()
        if result != scs.COMM_SUCCESS:
            raise self._comm_error(result, None, reg.name, 1)
