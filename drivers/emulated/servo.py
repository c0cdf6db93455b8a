"""One emulated STS3215: its 256-byte control table and what reads and writes of it do.

The servo's mechanics (where the horn is) live in a motion model shared by the whole arm; this
class owns the registers and translates between the two:

- ``Present_Position = (Actual - Homing_Offset) mod 4096`` in single-turn mode (Phase bit 4
  clear); with bit 4 set it is not wrapped and carries a sign at bit 15.
- A Goal_Position is clamped to [Min_Position_Limit, Max_Position_Limit] (unless both are 0,
  the multi-turn setting) and becomes an actual target ``Goal + Homing_Offset`` (mod 4096).
- EEPROM (addresses < 40) is write-protected while Lock is 1; read-only registers ignore writes.
- Writing Goal_Position switches torque on (measured on an STS3215 by feetech-cli).
- Torque_Enable = 128 re-centres: the Homing_Offset is set so the current pose reads 2048.
- Injected fault bits show in the Status register, and overload unloads the torque when
  Unloading_Condition asks for it, as the firmware does.

Positions handed to and from the motion model are "actual" encoder ticks as floats.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hilrec.daemon.so101 import TICKS_PER_TURN
from hilrec.drivers.tables import (
    EEPROM_END,
    PHASE_MULTI_TURN_BIT,
    REGISTER,
    REGISTERS,
    TABLE_SIZE,
    StatusBit,
    decode_value,
    encode_value,
    from_bytes,
    to_bytes,
)

_SET_MIDDLE = 128
_MIDDLE = 2048
_WRITABLE = bytearray(TABLE_SIZE)
for _reg in REGISTERS:
    if _reg.writable:
        for _addr in range(_reg.address, _reg.end):
            _WRITABLE[_addr] = 1
_GOAL = REGISTER["Goal_Position"]
_TORQUE = REGISTER["Torque_Enable"]
_LOCK = REGISTER["Lock"]
_OFFSET = REGISTER["Homing_Offset"]
_MIN = REGISTER["Min_Position_Limit"]
_MAX = REGISTER["Max_Position_Limit"]
_PHASE = REGISTER["Phase"]
_STATUS = REGISTER["Status"]
_UNLOADING = REGISTER["Unloading_Condition"]
_PRESENT = REGISTER["Present_Position"]
_LIVE_START = _PRESENT.address  # Present_Position .. Goal_Position_2 are computed on read
_LIVE_END = REGISTER["Goal_Position_2"].end


@dataclass
class WriteLog:
    """What a client did to this servo, for tests (e.g. "the leader was never sent a goal")."""

    goal_writes: int = 0
    offset_writes: int = 0
    torque_writes: list[int] = field(default_factory=list)
    rejected_eeprom: list[int] = field(default_factory=list)  # addresses dropped by Lock


class EmulatedServo:
    def __init__(self, servo_id: int) -> None:
        self.table = bytearray(TABLE_SIZE)
        for reg in REGISTERS:
            self.table[reg.address : reg.end] = to_bytes(encode_value(reg, reg.default), reg.size)
        self.table[REGISTER["ID"].address] = servo_id
        self.pending: tuple[int, bytes] | None = None  # REG_WRITE, applied on ACTION
        self.fault_bits = 0
        self.log = WriteLog()

    # --- named access (host values) ---------------------------------------------------------

    @property
    def servo_id(self) -> int:
        return self.table[REGISTER["ID"].address]

    def get(self, name: str) -> int:
        reg = REGISTER[name]
        return decode_value(reg, from_bytes(self.table[reg.address : reg.end]))

    def set(self, name: str, value: int) -> None:
        """Set a register directly, bypassing Lock and read-only: the firmware's own writes."""
        reg = REGISTER[name]
        self.table[reg.address : reg.end] = to_bytes(encode_value(reg, value), reg.size)

    @property
    def torque_on(self) -> bool:
        return self.table[_TORQUE.address] != 0

    @property
    def homing_offset(self) -> int:
        return self.get("Homing_Offset")

    @property
    def baud_index(self) -> int:
        return self.table[REGISTER["Baud_Rate"].address]

    @property
    def return_delay_s(self) -> float:
        return self.table[REGISTER["Return_Delay_Time"].address] * 2e-6

    @property
    def replies_to_writes(self) -> bool:
        return self.table[REGISTER["Response_Status_Level"].address] != 0

    @property
    def multi_turn(self) -> bool:
        return bool(self.table[_PHASE.address] & PHASE_MULTI_TURN_BIT)

    # --- position frames --------------------------------------------------------------------

    def present_from_actual(self, actual: float) -> int:
        present = round(actual) - self.homing_offset
        return present if self.multi_turn else present % TICKS_PER_TURN

    def goal_target(self) -> float | None:
        """The actual encoder position the servo drives to, or None when it holds no goal."""
        if not self.torque_on:
            return None
        goal = self.get("Goal_Position")
        low, high = self.get("Min_Position_Limit"), self.get("Max_Position_Limit")
        if low or high:
            goal = min(high, max(low, goal))
        target = goal + self.homing_offset
        return float(target if self.multi_turn else target % TICKS_PER_TURN)

    # --- the wire-facing operations ---------------------------------------------------------

    def read(self, address: int, length: int, actual: float, velocity: float) -> bytes:
        if address < _LIVE_END and address + length > _LIVE_START:
            self._refresh_live(actual, velocity)
        data = bytes(self.table[address : address + length])
        return data + bytes(length - len(data))  # past the table end: zeros, never short

    def write(self, address: int, data: bytes, actual: float) -> None:
        """Apply a WRITE (or an ACTION'd REG_WRITE) byte by byte, as the firmware does."""
        accepted: set[int] = set()
        for offset, byte in enumerate(data):
            addr = address + offset
            if addr >= TABLE_SIZE or not _WRITABLE[addr]:
                continue
            if addr < EEPROM_END and self.table[_LOCK.address]:
                self.log.rejected_eeprom.append(addr)
                continue
            self.table[addr] = byte
            accepted.add(addr)
        if _TORQUE.address in accepted:
            self.log.torque_writes.append(self.table[_TORQUE.address])
            if self.table[_TORQUE.address] == _SET_MIDDLE:
                self.set("Homing_Offset", self._centring_offset(actual))
                self.table[_TORQUE.address] = 1
        if _OFFSET.address in accepted:
            self.log.offset_writes += 1
        if _GOAL.address in accepted:
            self.log.goal_writes += 1
            self.table[_TORQUE.address] = self.table[_TORQUE.address] or 1

    def _centring_offset(self, actual: float) -> int:
        offset = (round(actual) - _MIDDLE) % TICKS_PER_TURN
        # +-2048 does not fit the 11-bit magnitude; that one pose reads 2047 instead.
        return max(-2047, offset - TICKS_PER_TURN) if offset > 2047 else offset

    def apply_faults(self, bits: int) -> None:
        """Raise injected condition bits; overload drops torque if Unloading_Condition says so."""
        self.fault_bits = bits
        if bits & self.table[_UNLOADING.address] & StatusBit.OVERLOAD:
            self.table[_TORQUE.address] = 0

    def _refresh_live(self, actual: float, velocity: float) -> None:
        self.set("Present_Position", self.present_from_actual(actual))
        speed = max(-32767, min(32767, round(velocity)))
        self.set("Present_Velocity", speed)
        target = self.goal_target()
        moving = target is not None and abs(target - actual) > 1.5
        self.table[REGISTER["Moving"].address] = int(moving)
        self.table[_STATUS.address] = self.fault_bits
        if self.fault_bits & StatusBit.VOLTAGE:
            self.set("Present_Voltage", max(0, self.get("Min_Voltage_Limit") - 5))
        if self.fault_bits & StatusBit.OVERLOAD:
            self.set("Present_Load", 1000)
