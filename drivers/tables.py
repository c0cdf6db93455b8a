"""The Feetech STS3215 as data: its control table, instructions, status bits and baud rates.

Addresses, sizes and sign bits follow LeRobot's ``STS_SMS_SERIES_CONTROL_TABLE`` and
``STS_SMS_SERIES_ENCODINGS_TABLE`` (checked against the installed lerobot 0.4.4), cross-checked
with Feetech's ``sms_sts.py``. Defaults are the emulator's power-up values: feetech-cli's
measured STS3215 defaults and the juxitech/aifitlab memory tables where they give one, a plausible
value otherwise (hilrec itself never relies on a default: the arms write what they need).
Everything the bus, the arms and the emulator know about the servo is read from here, never
spelled as a number in code.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum, IntFlag
from typing import Final, Literal

Area = Literal["eeprom", "sram"]


@dataclass(frozen=True, kw_only=True)
class Register:
    name: str
    address: int
    size: int
    area: Area
    writable: bool = True
    sign_bit: int | None = None  # sign-magnitude registers: index of the sign bit
    default: int = 0

    @property
    def end(self) -> int:
        return self.address + self.size


def _r(
    name: str,
    address: int,
    size: int,
    area: Area,
    *,
    ro: bool = False,
    sign_bit: int | None = None,
    default: int = 0,
) -> Register:
    return Register(
        name=name, address=address, size=size, area=area, writable=not ro, sign_bit=sign_bit, default=default
    )


MODEL_NUMBER_STS3215: Final[int] = 777
EEPROM_END: Final[int] = 40  # addresses below live in EEPROM and honour Lock
TABLE_SIZE: Final[int] = 256

REGISTERS: Final[tuple[Register, ...]] = (
    # --- EEPROM ---------------------------------------------------------------------------------
    _r("Firmware_Major_Version", 0, 1, "eeprom", ro=True, default=3),
    _r("Firmware_Minor_Version", 1, 1, "eeprom", ro=True, default=10),
    _r("Endianness", 2, 1, "eeprom", ro=True, default=0),  # 0 = little-endian words (STS/SMS)
    _r("Model_Number", 3, 2, "eeprom", ro=True, default=MODEL_NUMBER_STS3215),
    _r("ID", 5, 1, "eeprom", default=1),
    _r("Baud_Rate", 6, 1, "eeprom", default=0),
    # Default disputed (LeRobot's comment says 250 = 500 us; the SMS table says 0); LeRobot and
    # our arms write 0 when configuring, which is what matters on the bus.
    _r("Return_Delay_Time", 7, 1, "eeprom", default=0),
    _r("Response_Status_Level", 8, 1, "eeprom", default=1),
    _r("Min_Position_Limit", 9, 2, "eeprom", default=0),
    _r("Max_Position_Limit", 11, 2, "eeprom", default=4095),
    _r("Max_Temperature_Limit", 13, 1, "eeprom", default=70),
    _r("Max_Voltage_Limit", 14, 1, "eeprom", default=140),
    _r("Min_Voltage_Limit", 15, 1, "eeprom", default=40),
    _r("Max_Torque_Limit", 16, 2, "eeprom", default=1000),
    _r("Phase", 18, 1, "eeprom", default=0x0C),
    _r("Unloading_Condition", 19, 1, "eeprom", default=0x2C),
    _r("LED_Alarm_Condition", 20, 1, "eeprom", default=0x2F),
    _r("P_Coefficient", 21, 1, "eeprom", default=32),
    _r("D_Coefficient", 22, 1, "eeprom", default=32),
    _r("I_Coefficient", 23, 1, "eeprom", default=0),
    _r("Minimum_Startup_Force", 24, 2, "eeprom", default=16),
    _r("CW_Dead_Zone", 26, 1, "eeprom", default=1),
    _r("CCW_Dead_Zone", 27, 1, "eeprom", default=1),
    _r("Protection_Current", 28, 2, "eeprom", default=500),
    _r("Angular_Resolution", 30, 1, "eeprom", default=1),
    _r("Homing_Offset", 31, 2, "eeprom", sign_bit=11, default=0),
    _r("Operating_Mode", 33, 1, "eeprom", default=0),
    _r("Protective_Torque", 34, 1, "eeprom", default=20),
    _r("Protection_Time", 35, 1, "eeprom", default=200),
    _r("Overload_Torque", 36, 1, "eeprom", default=80),
    _r("Velocity_closed_loop_P_proportional_coefficient", 37, 1, "eeprom", default=10),
    _r("Over_Current_Protection_Time", 38, 1, "eeprom", default=200),
    _r("Velocity_closed_loop_I_integral_coefficient", 39, 1, "eeprom", default=200),
    # --- SRAM -----------------------------------------------------------------------------------
    _r("Torque_Enable", 40, 1, "sram", default=0),
    _r("Acceleration", 41, 1, "sram", default=0),
    _r("Goal_Position", 42, 2, "sram", sign_bit=15, default=0),
    _r("Goal_Time", 44, 2, "sram", default=0),
    _r("Goal_Velocity", 46, 2, "sram", sign_bit=15, default=0),
    _r("Torque_Limit", 48, 2, "sram", default=1000),
    _r("Lock", 55, 1, "sram", default=1),
    _r("Present_Position", 56, 2, "sram", ro=True, sign_bit=15),
    _r("Present_Velocity", 58, 2, "sram", ro=True, sign_bit=15),
    _r("Present_Load", 60, 2, "sram", ro=True, sign_bit=10),
    _r("Present_Voltage", 62, 1, "sram", ro=True, default=74),  # 0.1 V: a 7.4 V SO-101 supply
    _r("Present_Temperature", 63, 1, "sram", ro=True, default=30),
    _r("Async_Write_Flag", 64, 1, "sram", ro=True),
    _r("Status", 65, 1, "sram", ro=True),
    _r("Moving", 66, 1, "sram", ro=True),
    _r("Present_Current", 69, 2, "sram", ro=True),
    _r("Goal_Position_2", 71, 2, "sram", ro=True),
    # --- factory --------------------------------------------------------------------------------
    _r("Moving_Velocity_Threshold", 80, 1, "sram", default=50),
    _r("DTs", 81, 1, "sram", default=0),
    _r("Velocity_Unit_factor", 82, 1, "sram", default=0),
    _r("Hts", 83, 1, "sram", default=0),
    _r("Maximum_Velocity_Limit", 84, 1, "sram", default=0),
    _r("Maximum_Acceleration", 85, 1, "sram", default=0),
    _r("Acceleration_Multiplier", 86, 1, "sram", default=0),
)

REGISTER: Final[dict[str, Register]] = {reg.name: reg for reg in REGISTERS}


def register(name: str) -> Register:
    """Look a register up by its LeRobot name; the KeyError lists the known names."""
    try:
        return REGISTER[name]
    except KeyError:
        raise KeyError(f"no STS3215 register named {name!r} (known: {', '.join(REGISTER)})") from None


def register_at(address: int) -> Register | None:
    """The register starting at ``address``, for naming the target of a raw read or write."""
    for reg in REGISTERS:
        if reg.address == address:
            return reg
    return None


def describe_span(address: int, size: int) -> str:
    """A human name for ``size`` bytes at ``address``: 'Present_Position' or 'addr 56+15'."""
    reg = register_at(address)
    if reg is not None and reg.size == size:
        return reg.name
    first = reg.name if reg is not None else f"addr {address}"
    return f"{first} (+{size} bytes)"


class Instruction(IntEnum):
    PING = 0x01
    READ = 0x02
    WRITE = 0x03
    REG_WRITE = 0x04
    ACTION = 0x05
    SYNC_READ = 0x82
    SYNC_WRITE = 0x83


BROADCAST_ID: Final[int] = 0xFE
MAX_SERVO_ID: Final[int] = 0xFD  # status packets with a larger id are rejected by the SDK


class StatusBit(IntFlag):
    """Bits of a status packet's ERROR byte and of the Status register (same layout)."""

    VOLTAGE = 0x01
    ANGLE_SENSOR = 0x02
    OVERHEAT = 0x04
    OVERCURRENT = 0x08
    OVERLOAD = 0x20


def describe_status(bits: int) -> str:
    """'overload, voltage' for 0x21; unknown bits are shown in hex rather than dropped."""
    names = [name.lower().replace("_", " ") for name, flag in StatusBit.__members__.items() if bits & flag]
    unknown = bits & ~sum(StatusBit)
    if unknown:
        names.append(f"unknown bits 0x{unknown:02x}")
    return ", ".join(names) if names else "none"


class OperatingMode(IntEnum):
    POSITION = 0
    VELOCITY = 1
    PWM = 2
    STEP = 3


PHASE_MULTI_TURN_BIT: Final[int] = 0x10  # Phase bit 4: angle feedback over several turns

# Baud_Rate register index -> bits/s. Feetech's own table (sms_sts.py, the memory tables);
# LeRobot lists 5..7 as 57600/38400/19200, which feetech-cli reports as wrong. Only index 0
# (1 Mbps, the factory setting and what every SO-101 uses) matters to hilrec.
BAUD_RATES: Final[dict[int, int]] = {
    0: 1_000_000,
    1: 500_000,
    2: 250_000,
    3: 128_000,
    4: 115_200,
    5: 76_800,
    6: 57_600,
    7: 38_400,
}
BITS_PER_BYTE_ON_WIRE: Final[int] = 10  # 8N1
RETURN_DELAY_UNIT_S: Final[float] = 2e-6


# --- sign-magnitude encoding (Homing_Offset bit 11, positions and velocities bit 15) -----------


def encode_sign_magnitude(value: int, sign_bit: int) -> int:
    magnitude = abs(value)
    if magnitude > (1 << sign_bit) - 1:
        raise ValueError(f"magnitude {magnitude} exceeds {(1 << sign_bit) - 1} (sign at bit {sign_bit})")
    return ((1 << sign_bit) if value < 0 else 0) | magnitude


def decode_sign_magnitude(raw: int, sign_bit: int) -> int:
    magnitude = raw & ((1 << sign_bit) - 1)
    return -magnitude if raw & (1 << sign_bit) else magnitude


def encode_value(reg: Register, value: int) -> int:
    """A register's host value -> its unsigned wire value (sign-magnitude where the table says)."""
    raw = encode_sign_magnitude(value, reg.sign_bit) if reg.sign_bit is not None else value
    if not 0 <= raw < 1 << (8 * reg.size):
        raise ValueError(f"{reg.name}: {value} does not fit in {reg.size} byte(s)")
    return raw


def decode_value(reg: Register, raw: int) -> int:
    return decode_sign_magnitude(raw, reg.sign_bit) if reg.sign_bit is not None else raw


def to_bytes(value: int, size: int) -> bytes:
    """Little-endian, as STS/SMS servos (protocol_end 0) expect."""
    return int(value).to_bytes(size, "little")


def from_bytes(data: bytes | bytearray | list[int]) -> int:
    return int.from_bytes(bytes(data), "little")
