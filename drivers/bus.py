"""A Feetech STS3215 bus on pyserial and the unmodified scservo_sdk 1.0.0.

The SDK frames packets and computes checksums; this class adds what it lacks (see
``shared/docs/reference/feetech-sts3215.md`` §3 and §6):

- **One owner per port**: the port is opened with ``exclusive=True`` (flock, taken before
  anything touches the port, so a refused second opener cannot flush the owner's input), and
  every transaction runs under this bus's lock; the SDK's ``is_using`` flag is not a lock.
- **No stale replies**: the input buffer is discarded before every transaction. A reply that
  arrived after its timeout would otherwise be taken as the answer to the next read, and every
  later read would stay one behind.
- **No spinning**: the SDK opens the port with ``timeout=0`` and busy-polls; here reads block
  in ``select()`` for at most ``wait_slice_s`` at a time. Timeouts use the monotonic clock.
- **Status bits surfaced**: the SDK's GroupSyncRead throws each servo's ERROR byte away; the
  subclass below keeps it, and every read and write reports error bits as ServoFaultError.
- **TX echo tolerated**: an adapter that echoes what it sends makes the SDK accept our own
  instruction as the reply (for READ, as "angle sensor error" with the address as data). A
  reply identical to what was sent is skipped and the real one awaited.
- **Bounded retries** for timeouts and corrupt packets; errors name the port, servo and register.
"""

from __future__ import annotations

import logging
import termios
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass

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
from hilrec.drivers.tables import (
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

_ID, _LENGTH, _INSTRUCTION, _PARAM0 = scs.PKT_ID, scs.PKT_LENGTH, scs.PKT_INSTRUCTION, scs.PKT_PARAMETER0


@dataclass(frozen=True, kw_only=True)
class BusConfig:
    port: str
    baudrate: int = 1_000_000
    retries: int = 2  # extra attempts after a timeout or corrupt reply (LeRobot's SO arms use 2)
    # Fixed part of the reply timeout on top of the wire time; None keeps the SDK's own
    # (2 x 16 ms latency timer + 2 ms: about 34 ms at 1 Mbps).
    reply_timeout_ms: float | None = None
    wait_slice_s: float = 0.001  # a waiting read sleeps in select() this long at most; 0 = spin
    flush_input: bool = True  # False only to measure what the stale-reply guard costs


@dataclass
class BusStats:
    transactions: int = 0
    retries: int = 0
    echoes_skipped: int = 0


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


class _ExclusivePort(scs.PortHandler):
    """The SDK's PortHandler, opening the port exclusively and waiting without spinning."""

    def __init__(self, port_name: str, *, wait_slice_s: float,
                 reply_timeout_ms: float | None) -> None:
        super().__init__(port_name)
        self._wait_slice_s = wait_slice_s
        self._reply_timeout_ms = reply_timeout_ms

    def setupPort(self, cflag_baud: int) -> bool:  # noqa: N802 (SDK name)
        if self.is_open:
            self.closePort()
        # exclusive=True takes the flock before pyserial configures or flushes anything.
        self.ser = serial.Serial(port=self.port_name, baudrate=self.baudrate,
                                 bytesize=serial.EIGHTBITS, timeout=self._wait_slice_s,
                                 exclusive=True)
        self.is_open = True
        self.ser.reset_input_buffer()
        self.tx_time_per_byte = (1000.0 / self.baudrate) * 10.0
        return True

    def setPacketTimeout(self, packet_length: int) -> None:  # noqa: N802 (SDK name)
        if self._reply_timeout_ms is None:
            super().setPacketTimeout(packet_length)
            return
        self.packet_start_time = self.getCurrentTime()
        self.packet_timeout = self.tx_time_per_byte * packet_length + self._reply_timeout_ms

    def getCurrentTime(self) -> float:  # noqa: N802 (SDK name)
        return time.monotonic() * 1000.0  # the SDK uses time.time(): wall clock steps


class _StatusSyncRead(scs.GroupSyncRead):
    """GroupSyncRead that keeps every servo's ERROR byte and remembers which servo failed."""

    def rxPacket(self) -> int:  # noqa: N802 (SDK name)
        self.last_result = False
        self.status: dict[int, int] = {}
        self.failed_id: int | None = None
        if not self.data_dict:
            return scs.COMM_NOT_AVAILABLE
        for servo_id in self.data_dict:
            data, result, error = self.ph.readRx(self.port, servo_id, self.data_length)
            if result == scs.COMM_SUCCESS and len(data) != self.data_length:
                result = scs.COMM_RX_CORRUPT
            if result != scs.COMM_SUCCESS:
                self.failed_id = servo_id
                return result
            self.data_dict[servo_id] = data
            self.status[servo_id] = error
        self.last_result = True
        return scs.COMM_SUCCESS


class FeetechBus:
    """One serial port with a chain of STS3215 servos; open() ... close(), or ``with``."""

    def __init__(self, config: BusConfig) -> None:
        self.config = config
        self.stats = BusStats()
        self._lock = threading.Lock()
        self._port: _ExclusivePort | None = None
        self._packets = scs.PacketHandler(0)  # protocol_end 0: STS/SMS, little-endian words
        self._sync_readers: dict[tuple[int, int, tuple[int, ...]], _StatusSyncRead] = {}

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
        port = _ExclusivePort(self.port_name, wait_slice_s=self.config.wait_slice_s,
                              reply_timeout_ms=self.config.reply_timeout_ms)
        port.baudrate = self.config.baudrate
        try:
            if not port.openPort():
                raise BusError(f"baud rate {self.config.baudrate} is not supported by the SDK",
                               port=self.port_name)
        except serial.SerialException as exc:
            if "exclusively lock" in str(exc):
                raise PortBusyError("another process or bus already owns this port",
                                    port=self.port_name) from exc
            raise PortGoneError(f"cannot open: {exc}", port=self.port_name) from exc
        self._port = port
        self._sync_readers.clear()

    def close(self) -> None:
        port, self._port = self._port, None
        if port is not None and port.ser is not None:
            try:
                port.closePort()
            except (OSError, serial.SerialException):
                pass  # a vanished port is closed all the same

    def __enter__(self) -> FeetechBus:
        self.open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- transactions -----------------------------------------------------------------------

    @contextmanager
    def _transaction(self, servo_id: int | None, what: str) -> Iterator[_ExclusivePort]:
        """Own the port for one exchange: lock, discard stale input, map I/O errors."""
        port = self._port
        if port is None:
            raise BusError("bus is not open", port=self.port_name, servo_id=servo_id,
                           register=what)
        with self._lock:
            try:
                if self.config.flush_input:
                    port.ser.reset_input_buffer()
                port.is_using = False  # an earlier exception may have left it set
                self.stats.transactions += 1
                yield port
            except (serial.SerialException, OSError, termios.error) as exc:
                raise PortGoneError(f"serial I/O failed ({exc}); the adapter is gone or was "
                                    f"unplugged", port=self.port_name, servo_id=servo_id,
                                    register=what) from exc

    def _exchange(self, port: _ExclusivePort, tx: list[int]) -> tuple[list[int], int, int]:
        rx, result, error = self._packets.txRxPacket(port, tx)
        while result == scs.COMM_SUCCESS and rx == tx:  # our own instruction, echoed back
            self.stats.echoes_skipped += 1
            rx, result = self._packets.rxPacket(port)
            while result == scs.COMM_SUCCESS and rx[_ID] != tx[_ID]:
                rx, result = self._packets.rxPacket(port)
            error = rx[4] if result == scs.COMM_SUCCESS else 0
        return rx, result, error

    def _unicast(self, servo_id: int, instruction: int, params: list[int],
                 what: str) -> tuple[list[int], int]:
        """Send one instruction to one servo and return (reply, error byte), with retries."""
        result = scs.COMM_SUCCESS
        for attempt in range(self.config.retries + 1):
            tx = [0, 0, servo_id, len(params) + 2, instruction, *params, 0]
            with self._transaction(servo_id, what) as port:
                rx, result, error = self._exchange(port, tx)
            if result == scs.COMM_SUCCESS:
                return rx, error
            if attempt < self.config.retries:
                self.stats.retries += 1
                log.debug("port %s id %d %s: %s, retrying", self.port_name, servo_id, what,
                          self._packets.getTxRxResult(result))
        raise self._comm_error(result, servo_id, what, self.config.retries + 1)

    def _comm_error(self, result: int, servo_id: int | None, what: str,
                    attempts: int) -> BusError:
        text = f"{self._packets.getTxRxResult(result).split('] ')[-1]} ({attempts} attempt(s))"
        if result == scs.COMM_RX_TIMEOUT:
            return BusTimeoutError(f"no status packet: {text}", port=self.port_name,
                                   servo_id=servo_id, register=what)
        if result == scs.COMM_RX_CORRUPT:
            return BusPacketError(f"corrupt status packet: {text}", port=self.port_name,
                                  servo_id=servo_id, register=what)
        if result == scs.COMM_PORT_BUSY:
            return PortBusyError(text, port=self.port_name, servo_id=servo_id, register=what)
        return BusError(text, port=self.port_name, servo_id=servo_id, register=what)

    def _check_status(self, servo_id: int, what: str, error: int) -> None:
        if error:
            raise ServoFaultError(f"servo reports {describe_status(error)} (status 0x{error:02x})",
                                  port=self.port_name, servo_id=servo_id, register=what,
                                  error_bits=error)

    # --- single-servo operations ------------------------------------------------------------

    def ping(self, servo_id: int) -> int:
        """Ping a servo and return its model number (777 for an STS3215)."""
        _, error = self._unicast(servo_id, Instruction.PING, [], "PING")
        self._check_status(servo_id, "PING", error)
        return self.read(servo_id, "Model_Number")

    def read_span(self, servo_id: int, address: int, length: int, *,
                  check_status: bool = True) -> tuple[bytes, int]:
        """Read ``length`` bytes from ``address``; returns (data, status byte)."""
        what = describe_span(address, length)
        rx, error = self._unicast(servo_id, Instruction.READ, [address, length], what)
        data = bytes(rx[_PARAM0:_PARAM0 + length])
        if len(data) != length:
            raise BusPacketError(f"status packet carries {len(data)} bytes, expected {length}",
                                 port=self.port_name, servo_id=servo_id, register=what)
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
        _, error = self._unicast(servo_id, Instruction.WRITE, [reg.address, *data], reg.name)
        self._check_status(servo_id, reg.name, error)

    def _encode(self, reg: Register, value: int, servo_id: int | None) -> list[int]:
        if not reg.writable:
            raise BusError("register is read-only", port=self.port_name, servo_id=servo_id,
                           register=reg.name)
        try:
            return list(to_bytes(encode_value(reg, int(value)), reg.size))
        except ValueError as exc:
            raise BusError(f"value {value} cannot be written: {exc}", port=self.port_name,
                           servo_id=servo_id, register=reg.name) from None

    def read_status(self, servo_id: int) -> int:
        """The Status register (error bits as in a status packet), without raising on them."""
        return self.read(servo_id, "Status", check_status=False)

    def set_torque(self, servo_ids: Iterable[int], enabled: bool) -> None:
        """Torque on also locks the EEPROM, torque off unlocks it (as LeRobot does)."""
        for servo_id in servo_ids:
            self.write(servo_id, "Torque_Enable", int(enabled))
            self.write(servo_id, "Lock", int(enabled))

    # --- group operations -------------------------------------------------------------------

    def sync_read(self, name: str, servo_ids: Iterable[int], *,
                  check_status: bool = True) -> SyncReading:
        """One SYNC_READ of register ``name`` from every servo, retried on timeout/corruption.

        Raises ServoFaultError (after reading everything) if a servo reports error bits, unless
        ``check_status`` is False; the reading is attached to the error as ``.reading``.
        """
        reg = register(name)
        ids = tuple(servo_ids)
        key = (reg.address, reg.size, ids)
        reader = self._sync_readers.get(key)
        if reader is None:
            reader = _StatusSyncRead(self._port, self._packets, reg.address, reg.size)
            for servo_id in ids:
                reader.addParam(servo_id)
            self._sync_readers[key] = reader
        result, attempts = scs.COMM_SUCCESS, 0
        for attempts in range(1, self.config.retries + 2):
            with self._transaction(None, reg.name):
                result = reader.txRxPacket()
            if result == scs.COMM_SUCCESS:
                break
            if attempts <= self.config.retries:
                self.stats.retries += 1
        if result != scs.COMM_SUCCESS:
            raise self._comm_error(result, getattr(reader, "failed_id", None), reg.name, attempts)
        values = {sid: decode_value(reg, from_bytes(reader.data_dict[sid])) for sid in ids}
        reading = SyncReading(reg.name, values, dict(reader.status), attempts)
        if check_status and reading.faulted:
            first, bits = next(iter(reading.faulted.items()))
            others = ", ".join(f"id {sid}: {describe_status(b)}"
                               for sid, b in reading.faulted.items())
            error = ServoFaultError(f"servo reports {describe_status(bits)} ({others})",
                                    port=self.port_name, servo_id=first, register=reg.name,
                                    error_bits=bits)
            error.reading = reading  # type: ignore[attr-defined]
            raise error
        return reading

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

