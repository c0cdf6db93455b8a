"""The emulator as any Feetech client sees it: the raw SDK, LeRobot's bus, the CLI."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import scservo_sdk as scs
from lerobot.motors import Motor, MotorCalibration, MotorNormMode
from lerobot.motors.feetech import FeetechMotorsBus
from support import wait_until

from hilrec.daemon.so101 import MOTORS
from hilrec.drivers.emulated import packets
from hilrec.drivers.emulated.emulator import EmulatedArm
from hilrec.drivers.emulated.faults import Fault
from hilrec.drivers.tables import REGISTER

# The SDK waits about 34 ms for a reply (2 x its LATENCY_TIMER of 16 ms + 2 ms); the emulator
# answers from a thread of this process, which a loaded machine can hold up longer. A reply that
# came late stayed in the buffer and was read as the next request's (seen in a clean-clone run:
# a Present_Position read with no data, then P_Coefficient read as 251). These tests are about
# what the servos answer, not how soon: each transaction waits this long, as LeRobot gives its
# port handler a timeout of its own (patch_setPacketTimeout).
SDK_REPLY_TIMEOUT_MS = 500.0


@pytest.fixture
def sdk(follower_emu: EmulatedArm):
    port = scs.PortHandler(follower_emu.port)
    port.setPacketTimeout = lambda packet_length: port.setPacketTimeoutMillis(SDK_REPLY_TIMEOUT_MS)
    assert port.openPort()
    yield port, scs.PacketHandler(0)
    port.closePort()


def test_a_reply_the_host_holds_up_is_still_read_as_its_own(sdk, follower_emu: EmulatedArm) -> None:
    """The fixture's patience: a reply 100 ms late (a loaded machine) answers its own request,
    and the next request gets its own reply, not the late one."""
    port, ph = sdk
    follower_emu.faults.add(Fault(kind="late", delay_ms=100.0, count=1))
    assert ph.ping(port, 1)[:2] == (777, scs.COMM_SUCCESS)
    assert ph.read1ByteTxRx(port, 1, REGISTER["ID"].address)[:2] == (1, scs.COMM_SUCCESS)


def test_packet_reader_resynchronises_and_drops_bad_checksums() -> None:
    good = packets.read(3, 56, 2)
    bad = bytearray(packets.ping(1))
    bad[-1] ^= 0x01
    reader = packets.PacketReader()
    got = list(reader.feed(b"\x00\x13\xff" + bytes(bad) + good[:4]))
    assert got == [] and reader.dropped == 1
    (packet,) = reader.feed(good[4:])
    assert (packet.servo_id, packet.code, packet.params) == (3, 0x02, bytes([56, 2]))
    assert packets.parse_one(packets.status_packet(3, 0x20, b"\x01\x02")).code == 0x20


def test_identity_and_control_table(sdk) -> None:
    port, ph = sdk
    assert ph.ping(port, 3)[:2] == (777, scs.COMM_SUCCESS)
    for servo_id in range(1, 7):
        assert ph.read1ByteTxRx(port, servo_id, REGISTER["ID"].address)[0] == servo_id
    assert ph.ping(port, 7)[1] == scs.COMM_RX_TIMEOUT  # nobody at id 7
    assert ph.read2ByteTxRx(port, 1, REGISTER["Max_Position_Limit"].address)[0] == 3299


def test_homing_offset_applies_mod_4096(sdk, follower_emu: EmulatedArm) -> None:
    port, ph = sdk
    ph.write1ByteTxRx(port, 1, REGISTER["Torque_Enable"].address, 0)  # else it moves: the goal
    ph.write1ByteTxRx(port, 1, REGISTER["Lock"].address, 0)  # is relative to the offset
    for offset, expected in ((0, 2048), (2047, 1), (-2000, (2048 + 2000) % 4096), (-1, 2049)):
        raw = scs.SCS_TOSCS(offset, 11)
        assert ph.write2ByteTxRx(port, 1, REGISTER["Homing_Offset"].address, raw)[0] == 0
        assert ph.read2ByteTxRx(port, 1, REGISTER["Present_Position"].address)[0] == expected


def test_lock_protects_eeprom_but_not_sram(sdk, follower_emu: EmulatedArm) -> None:
    port, ph = sdk
    ph.write1ByteTxRx(port, 2, REGISTER["Lock"].address, 1)
    ph.write1ByteTxRx(port, 2, REGISTER["P_Coefficient"].address, 99)
    assert ph.read1ByteTxRx(port, 2, REGISTER["P_Coefficient"].address)[0] == 32
    ph.write1ByteTxRx(port, 2, REGISTER["Acceleration"].address, 99)
    assert ph.read1ByteTxRx(port, 2, REGISTER["Acceleration"].address)[0] == 99
    assert follower_emu.servo(2).log.rejected_eeprom == [REGISTER["P_Coefficient"].address]


def test_goal_is_clamped_to_the_position_limits(sdk, follower_emu: EmulatedArm) -> None:
    port, ph = sdk
    ph.write2ByteTxRx(port, 1, REGISTER["Goal_Position"].address, 4000)  # max limit is 3299
    with follower_emu.paused():
        assert follower_emu.servo(1).goal_target() == 3299 + 1  # + homing offset 1


def test_reg_write_waits_for_action(sdk, follower_emu: EmulatedArm) -> None:
    port, ph = sdk
    address = REGISTER["Goal_Time"].address
    ph.regWriteTxRx(port, 4, address, 2, [0x34, 0x12])
    assert ph.read2ByteTxRx(port, 4, address)[0] == 0
    handled = follower_emu.packets_handled
    ph.action(port, scs.BROADCAST_ID)
    assert follower_emu.wait_handled(handled + 1)
    assert ph.read2ByteTxRx(port, 4, address)[0] == 0x1234


def test_phase_bit_4_gives_unwrapped_signed_positions(sdk) -> None:
    port, ph = sdk
    ph.write1ByteTxRx(port, 3, REGISTER["Torque_Enable"].address, 0)
    ph.write1ByteTxRx(port, 3, REGISTER["Lock"].address, 0)
    ph.write2ByteTxRx(port, 3, REGISTER["Homing_Offset"].address, scs.SCS_TOSCS(2047, 11))
    ph.write1ByteTxRx(port, 3, REGISTER["Phase"].address, 0x0C | 0x10)
    raw, _, _ = ph.read2ByteTxRx(port, 3, REGISTER["Present_Position"].address)
    assert scs.SCS_TOHOST(raw, 15) == 2048 - 2047
    ph.write2ByteTxRx(port, 3, REGISTER["Homing_Offset"].address, scs.SCS_TOSCS(-2047, 11))
    raw, _, _ = ph.read2ByteTxRx(port, 3, REGISTER["Present_Position"].address)
    assert scs.SCS_TOHOST(raw, 15) == 2048 + 2047  # would wrap to 3999 - 4096 single-turn


def test_id_change_is_acknowledged_under_the_old_id(sdk, follower_emu: EmulatedArm) -> None:
    port, ph = sdk
    ph.write1ByteTxRx(port, 6, REGISTER["Lock"].address, 0)
    rx, result, _ = ph.txRxPacket(port, [0, 0, 6, 4, scs.INST_WRITE, REGISTER["ID"].address, 9, 0])
    assert result == scs.COMM_SUCCESS and rx[scs.PKT_ID] == 6
    assert ph.ping(port, 9)[:2] == (777, scs.COMM_SUCCESS)


def test_lerobots_own_bus_uses_the_emulator_as_an_arm(follower_emu: EmulatedArm) -> None:
    calibration = {
        name: MotorCalibration(
            id=cal.id,
            drive_mode=cal.drive_mode,
            homing_offset=cal.homing_offset,
            range_min=cal.range_min,
            range_max=cal.range_max,
        )
        for name, cal in follower_emu.frame.calibration.items()
    }
    motors = {name: Motor(mid, "sts3215", MotorNormMode(mode)) for name, (mid, mode) in MOTORS.items()}
    bus = FeetechMotorsBus(port=follower_emu.port, motors=motors, calibration=calibration)
    bus.connect()  # handshake: pings every id, checks model numbers and firmware versions
    try:
        assert bus.is_calibrated
        bus.configure_motors()
        present = bus.sync_read("Present_Position", num_retry=2)
        # wrist_roll's range is 0..4095 (LeRobot's full turn): its middle is half a tick above 2047
        wrist_roll = (2047 - (0 + 4095) / 2) * 360 / 4095
        assert present == {**dict.fromkeys(MOTORS, 0.0), "wrist_roll": wrist_roll, "gripper": 50.0}
        bus.enable_torque()
        bus.sync_write("Goal_Position", {"shoulder_pan": 45.0, "gripper": 80.0})
        for _ in range(2000):
            present = bus.sync_read("Present_Position", num_retry=2)
            if abs(present["shoulder_pan"] - 45.0) < 0.1 and abs(present["gripper"] - 80.0) < 0.1:
                break
        assert present["shoulder_pan"] == pytest.approx(45.0, abs=0.1)
        assert present["gripper"] == pytest.approx(80.0, abs=0.1)
    finally:
        bus.disconnect()  # disables torque (and unlocks) like on a real arm
    with follower_emu.paused():
        assert [s.torque_on for s in follower_emu.servos] == [False] * 6


@pytest.mark.slow
def test_hilrec_emulate_command_prints_the_port_and_links_it(tmp_path: Path) -> None:
    link = tmp_path / "ttyFOLLOWER"
    calibration = tmp_path / "follower.json"
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "hilrec.daemon.cli",
            "emulate",
            "follower",
            "--motion",
            "servo",
            "--link",
            str(link),
            "--write-calibration",
            str(calibration),
        ],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        assert process.stdout is not None
        device = process.stdout.readline().strip()
        assert device.startswith("/dev/pts/")
        assert os.readlink(link) == device
        port = scs.PortHandler(str(link))
        assert port.openPort()
        # It answers; that one reply may miss the SDK's patience on a loaded machine is timing.
        ping = scs.PacketHandler(0).ping
        wait_until(lambda: ping(port, 1)[:2] == (777, scs.COMM_SUCCESS), 30, what="an answer to a ping")
        port.closePort()
        assert calibration.is_file()
    finally:
        process.terminate()
        assert process.wait(timeout=10) == 0
    assert not link.exists()  # the link goes with the emulator


def test_wire_timing_takes_the_bytes_time_at_the_servos_baud(emulate) -> None:
    import time

    from hilrec.drivers.bus import BusConfig, FeetechBus

    emu = emulate("follower", wire_timing=True)
    with FeetechBus(BusConfig(port=emu.port)) as bus:

        def sync_read_s() -> float:
            best = float("inf")
            for _ in range(20):
                start = time.perf_counter()
                bus.sync_read("Present_Position", range(1, 7))
                best = min(best, time.perf_counter() - start)
            return best

        assert sync_read_s() >= (14 + 6 * 8) * 10e-6  # 62 bytes at 10 us each, 1 Mbps
        for servo_id in range(1, 7):
            bus.set_torque([servo_id], enabled=False)
            bus.write(servo_id, "Return_Delay_Time", 250)  # 500 us per servo before replying
        assert sync_read_s() >= (14 + 6 * 8) * 10e-6 + 6 * 500e-6


def test_fault_specs_are_parsed_or_refused_naming_the_key() -> None:
    from hilrec.daemon.errors import ConfigError
    from hilrec.drivers.emulated.faults import Fault, parse_fault

    assert parse_fault("drop:id=3,count=2") == Fault(kind="drop", servo_id=3, count=2)
    assert parse_fault("vanish:after_s=5").after_s == 5.0
    with pytest.raises(ConfigError, match="unknown fault 'explode'"):
        parse_fault("explode")
    with pytest.raises(ConfigError, match=r"--fault drop:id=x.*id must be a int"):
        parse_fault("drop:id=x")
    with pytest.raises(ConfigError, match="'missing' needs the id"):
        parse_fault("missing")
