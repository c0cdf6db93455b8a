"""The Feetech (FT-SCS, Dynamixel 1.0 style) packet codec: build, check and stream-parse packets.

Instruction: ``FF FF id len instr params.. chk``; status: ``FF FF id len error data.. chk``;
``len`` counts the parameters plus 2 and ``chk = ~(id + len + instr/error + params) & 0xFF``.

The emulator parses what a client sends with :class:`PacketReader`, which resynchronises the way
a servo's UART state machine does: bytes before a header are skipped, and a packet whose checksum
fails is discarded (a real servo stays silent, so the client times out). Our bus does not need
it: the SDK frames the replies.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Final

from hilrec.drivers.tables import BROADCAST_ID, Instruction

HEADER: Final[bytes] = b"\xff\xff"
MIN_PACKET: Final[int] = 6  # header(2) id len instr/error chk
MAX_LENGTH_FIELD: Final[int] = 250  # the SDK refuses longer packets


def checksum(body: bytes | bytearray) -> int:
    """``~sum(id, len, instr/error, params) & 0xFF``; ``body`` excludes header and checksum."""
    return ~sum(body) & 0xFF


def _frame(servo_id: int, code: int, params: bytes) -> bytes:
    if len(params) + 2 > MAX_LENGTH_FIELD:
        raise ValueError(f"packet for id {servo_id} too long: {len(params)} parameter bytes")
    body = bytes((servo_id, len(params) + 2, code)) + params
    return HEADER + body + bytes((checksum(body),))


def instruction_packet(servo_id: int, instruction: int, params: bytes = b"") -> bytes:
    return _frame(servo_id, int(instruction), bytes(params))


def status_packet(servo_id: int, error: int, data: bytes = b"") -> bytes:
    return _frame(servo_id, error & 0xFF, bytes(data))


@dataclass(frozen=True)
class Packet:
    """A framed packet; ``code`` is the instruction (client -> servo) or error byte (reply)."""

    servo_id: int
    code: int
    params: bytes
    raw: bytes

    @property
    def is_broadcast(self) -> bool:
        return self.servo_id == BROADCAST_ID


# --- builders for the instructions the emulator answers (used by tests of the emulator) --------


def ping(servo_id: int) -> bytes:
    return instruction_packet(servo_id, Instruction.PING)


def read(servo_id: int, address: int, length: int) -> bytes:
    return instruction_packet(servo_id, Instruction.READ, bytes((address, length)))


def write(servo_id: int, address: int, data: bytes) -> bytes:
    return instruction_packet(servo_id, Instruction.WRITE, bytes((address,)) + bytes(data))


def action(servo_id: int = BROADCAST_ID) -> bytes:
    return instruction_packet(servo_id, Instruction.ACTION)


def sync_read(address: int, length: int, servo_ids: list[int]) -> bytes:
    return instruction_packet(BROADCAST_ID, Instruction.SYNC_READ, bytes((address, length, *servo_ids)))


def sync_write(address: int, length: int, data_by_id: dict[int, bytes]) -> bytes:
    params = bytearray((address, length))
    for servo_id, data in data_by_id.items():
        if len(data) != length:
            raise ValueError(f"sync write for id {servo_id}: {len(data)} bytes, expected {length}")
        params.append(servo_id)
        params += data
    return instruction_packet(BROADCAST_ID, Instruction.SYNC_WRITE, bytes(params))


def parse_one(raw: bytes) -> Packet:
    """Parse exactly one complete packet; raises ValueError naming what is wrong."""
    if len(raw) < MIN_PACKET or raw[:2] != HEADER:
        raise ValueError(f"not a packet: {raw.hex(' ')}")
    length = raw[3]
    if len(raw) != length + 4:
        raise ValueError(f"length field {length} does not match {len(raw)} bytes")
    if checksum(raw[2:-1]) != raw[-1]:
        raise ValueError(f"bad checksum 0x{raw[-1]:02x}, expected 0x{checksum(raw[2:-1]):02x}")
    return Packet(raw[2], raw[4], bytes(raw[5:-1]), bytes(raw))


class PacketReader:
    """Incremental parser: feed bytes as they arrive, iterate over the complete packets.

    ``dropped`` counts packets discarded for a bad checksum or an impossible length, so tests can
    assert that corruption was seen rather than silently skipped.
    """

    def __init__(self) -> None:
        self._buf = bytearray()
        self.dropped = 0

    def feed(self, data: bytes) -> Iterator[Packet]:
        self._buf += data
        while True:
            start = self._buf.find(HEADER)
            if start < 0:
                # Keep a trailing 0xFF: it may be the first half of the next header.
                del self._buf[: -1 if self._buf.endswith(b"\xff") else len(self._buf)]
                return
            if start:
                del self._buf[:start]
            if len(self._buf) < 4:
                return
            if self._buf[2] == 0xFF:  # FF FF FF: the header starts one byte later
                del self._buf[0]
                continue
            length = self._buf[3]
            if length < 2 or length > MAX_LENGTH_FIELD:
                self.dropped += 1
                del self._buf[:2]
                continue
            total = length + 4
            if len(self._buf) < total:
                return
            raw = bytes(self._buf[:total])
            if checksum(raw[2:-1]) != raw[-1]:
                self.dropped += 1
                del self._buf[:2]
                continue
            del self._buf[:total]
            yield Packet(raw[2], raw[4], raw[5:-1], raw)

    def clear(self) -> None:
        self._buf.clear()
