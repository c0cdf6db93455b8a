"""The real stack (pyserial -> scservo_sdk -> FeetechBus) against an emulated arm on a pty."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest

from hilrec.daemon.errors import (
    BusError,
    BusPacketError,
    BusTimeoutError,
    PortBusyError,
    PortGoneError,
    ServoFaultError,
)
from hilrec.drivers.bus import BusConfig, FeetechBus
from hilrec.drivers.emulated.emulator import EmulatedArm
from hilrec.drivers.emulated.faults import Fault, FaultKind
from hilrec.drivers.tables import StatusBit

IDS = (1, 2, 3, 4, 5, 6)


def test_ping_read_write_and_sign_magnitude(bus: FeetechBus, follower_emu: EmulatedArm) -> None:
    assert bus.ping(4) == 777
    bus.set_torque([2], enabled=False)  # Lock 0: EEPROM writable
    bus.write(2, "Homing_Offset", -1234)
    assert follower_emu.servo(2).table[31:33] == bytes([0xD2, 0x0C])  # 1234 | sign bit 11
    assert bus.read(2, "Homing_Offset") == -1234
    bus.write(2, "P_Coefficient", 16)
    assert bus.read(2, "P_Coefficient") == 16


def test_sync_read_and_sync_write_round_trip(bus: FeetechBus, follower_emu: EmulatedArm) -> None:
    goals = {1: 1500, 2: 1600, 3: 1700, 4: 1800, 5: 1900, 6: 2000}
    handled = follower_emu.packets_handled
    bus.sync_write("Goal_Position", goals)
    assert follower_emu.wait_handled(handled + 1)
    with follower_emu.paused():
        assert {s.servo_id: s.get("Goal_Position") for s in follower_emu.servos} == goals
    reading = bus.sync_read("Goal_Position", IDS)
    assert reading.values == goals and reading.attempts == 1
    assert reading.status == dict.fromkeys(IDS, 0)


def test_the_port_has_one_owner(bus: FeetechBus, follower_emu: EmulatedArm) -> None:
    with pytest.raises(PortBusyError, match=f"port {follower_emu.port}"):
        FeetechBus(BusConfig(port=follower_emu.port)).open()
    assert bus.ping(1) == 777  # the refused opener did not disturb the owner


def test_threads_sharing_a_bus_never_collide(bus: FeetechBus) -> None:
    errors: list[Exception] = []

    def hammer(servo_id: int) -> None:
        try:
            for _ in range(40):
                assert bus.read(servo_id, "ID") == servo_id
        except Exception as exc:  # noqa: BLE001 - collected and asserted below
            errors.append(exc)

    threads = [threading.Thread(target=hammer, args=(sid,)) for sid in (1, 3, 5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []  # the SDK alone gives COMM_PORT_BUSY here (reference notes §3)


def test_missing_port_is_port_gone(tmp_path) -> None:
    with pytest.raises(PortGoneError, match="nowhere"):
        FeetechBus(BusConfig(port=str(tmp_path / "nowhere"))).open()


# --- faults: each one, and the error (or recovery) it produces -------------------------------


def test_dropped_reply_is_retried(bus: FeetechBus, follower_emu: EmulatedArm) -> None:
    follower_emu.inject(Fault(kind="drop", servo_id=3, count=2))
    reading = bus.sync_read("Present_Position", IDS)
    assert reading.attempts == 3 and set(reading.values) == set(IDS)
    assert bus.stats.retries == 2


@pytest.mark.slow
def test_persistent_drop_times_out_naming_servo_and_register(
    bus: FeetechBus, follower_emu: EmulatedArm
) -> None:
    follower_emu.inject(Fault(kind="drop", servo_id=3))
    with pytest.raises(BusTimeoutError) as info:
        bus.sync_read("Present_Position", IDS)
    err = info.value
    assert (err.port, err.servo_id, err.register) == (follower_emu.port, 3, "Present_Position")
    assert "3 attempt(s)" in str(err)
    with pytest.raises(BusTimeoutError, match="servo id 3, register P_Coefficient"):
        bus.read(3, "P_Coefficient")


def test_corrupt_checksum_is_retried_then_reported(bus: FeetechBus, follower_emu: EmulatedArm) -> None:
    bus.ping(2)  # a fresh bus fences first; the fault is meant for the read below
    follower_emu.inject(Fault(kind="corrupt", servo_id=2, count=1))
    assert bus.read(2, "ID") == 2  # second attempt
    assert bus.stats.retries == 1
    follower_emu.clear_faults()
    follower_emu.inject(Fault(kind="corrupt", servo_id=2))
    with pytest.raises(BusPacketError, match="servo id 2, register Present_Position: corrupt"):
        bus.sync_read("Present_Position", IDS)


@pytest.mark.parametrize("flush_input", [True, False])
def test_late_reply_is_never_taken_as_the_next_answer(follower_emu: EmulatedArm, flush_input: bool) -> None:
    config = BusConfig(port=follower_emu.port, flush_input=flush_input)
    with FeetechBus(config) as bus:
        bus.set_torque([1], enabled=False)
        bus.write(1, "P_Coefficient", 11)
        follower_emu.inject(Fault(kind="late", servo_id=1, count=1, delay_ms=60))  # > 34 ms
        assert bus.read(1, "P_Coefficient") == 11  # the late reply answers the retry
        assert follower_emu.faults.wait_fired("late_written")
        # The retry's own reply is still owed. Unmatched, the write would take it as its status
        # and the READ below the write's: the classic one-behind desync (reference notes §3).
        bus.write(1, "P_Coefficient", 22)
        value = bus.read(1, "P_Coefficient")
    assert value == 22
    if bus.stats.retries and not flush_input:  # a retry's answer was owed; the fence skipped it
        assert bus.stats.fences >= 2 and bus.stats.stale_skipped >= 1


def test_a_late_ping_reply_is_not_taken_for_the_model_number(follower_emu: EmulatedArm) -> None:
    """The flaky open's "status packet carries 1 bytes, expected 2" (servo 6, Model_Number),
    made deterministic: PING 6's first reply lands after its retry was answered and after the
    READ of Model_Number was sent, while that READ's own reply is slow. The SDK checks the id
    only, so it took the PING acknowledgement's checksum byte for the model number."""
    config = BusConfig(port=follower_emu.port, reply_timeout_ms=100)
    with FeetechBus(config) as bus:
        bus.ping(1)  # a fresh bus fences first (at servo 1): keep servo 6's replies counted below
        follower_emu.inject(Fault(kind="late", servo_id=6, count=1, delay_ms=150))  # PING, 1st
        follower_emu.inject(Fault(kind="late", servo_id=6, after=1, count=1, delay_ms=200))
        assert bus.ping(6) == 777
        assert bus.read(6, "ID") == 6
    assert follower_emu.faults.fired["late"] == 2


def test_a_reply_later_than_every_retry_is_waited_for(follower_emu: EmulatedArm) -> None:
    with FeetechBus(BusConfig(port=follower_emu.port, patience_ms=3000)) as bus:
        bus.ping(1)
        follower_emu.inject(Fault(kind="late", servo_id=1, count=1, delay_ms=600))  # > 3 x 34 ms
        assert bus.read(1, "ID") == 1  # the SDK's three attempts alone time out
        # The two retries' answers follow the late one: skipped, not taken for this read.
        assert bus.read(1, "Homing_Offset") == follower_emu.servo(1).get("Homing_Offset")


def test_tx_echo_is_skipped(bus: FeetechBus, follower_emu: EmulatedArm) -> None:
    follower_emu.inject(Fault(kind="echo"))
    assert bus.read(5, "Present_Position") == 2047  # not the echoed [56, 2] as "angle error"
    assert bus.ping(6) == 777
    bus.sync_write("Goal_Position", dict.fromkeys(IDS, 2047))
    assert bus.sync_read("Present_Position", IDS).values == dict.fromkeys(IDS, 2047)
    assert bus.stats.echoes_skipped >= 3


@pytest.mark.parametrize(("kind", "bit"), [("overload", StatusBit.OVERLOAD), ("voltage", StatusBit.VOLTAGE)])
def test_error_bits_surface_as_servo_faults(
    bus: FeetechBus, follower_emu: EmulatedArm, kind: FaultKind, bit: int
) -> None:
    follower_emu.inject(Fault(kind=kind, servo_id=6))
    with pytest.raises(
        ServoFaultError, match=f"servo id 6, register Present_Position: servo reports {kind}"
    ) as info:
        bus.sync_read("Present_Position", IDS)
    assert info.value.error_bits == bit
    assert info.value.reading.values[1] == 2047  # type: ignore[attr-defined]  # set by sync_read
    assert bus.read_status(6) == bit  # the Status register agrees
    reading = bus.sync_read("Present_Position", IDS, check_status=False)
    assert reading.faulted == {6: bit}
    if kind == "overload":  # the firmware unloads an overloaded servo
        assert bus.read(6, "Torque_Enable", check_status=False) == 0


@pytest.mark.slow
def test_missing_servo_fails_the_sync_read_naming_it(bus: FeetechBus, follower_emu: EmulatedArm) -> None:
    follower_emu.inject(Fault(kind="missing", servo_id=4))
    with pytest.raises(BusTimeoutError, match="servo id 4"):
        bus.sync_read("Present_Position", IDS)
    with pytest.raises(BusTimeoutError, match="servo id 4, register PING"):
        bus.ping(4)
    assert bus.sync_read("Present_Position", (1, 2, 3)).attempts == 1


def test_vanishing_port_is_port_gone(bus: FeetechBus, follower_emu: EmulatedArm) -> None:
    bus.sync_read("Present_Position", IDS)
    follower_emu.inject(Fault(kind="vanish", after=follower_emu.faults.packets_seen + 1))
    with pytest.raises((PortGoneError, BusTimeoutError)):
        bus.sync_read("Present_Position", IDS)  # the cable is pulled as this packet arrives
    assert follower_emu.vanished.wait(2)
    with pytest.raises(PortGoneError, match=f"port {follower_emu.port}"):
        bus.sync_read("Present_Position", IDS)


def test_waiting_for_a_reply_does_not_spin(follower_emu: EmulatedArm) -> None:
    follower_emu.inject(Fault(kind="drop", servo_id=1))
    config = BusConfig(port=follower_emu.port, retries=0, reply_timeout_ms=150, patience_ms=300)
    with FeetechBus(config) as bus:
        bus.ping(2)
        wall, cpu = time.perf_counter(), time.thread_time()
        with pytest.raises(BusTimeoutError):
            bus.read(1, "Present_Position")
        wall, cpu = time.perf_counter() - wall, time.thread_time() - cpu
    assert wall >= 0.3  # the reply timeout, then patience
    assert cpu < 0.3 * wall, f"{cpu * 1e3:.1f} ms of CPU in {wall * 1e3:.1f} ms of waiting"


@pytest.mark.slow
def test_a_lost_fence_reply_does_not_doom_the_retries(emulate: Callable[..., EmulatedArm]) -> None:
    """drop 5% + corrupt 2%: a fence whose own reply is lost used to make every retry of the
    transaction wait for it (0.8% of writes failed, not ~0.03%); a retry now fences anew."""
    from hilrec.drivers.emulated.faults import parse_fault

    arm = emulate("follower", faults=(parse_fault("drop:p=0.05"), parse_fault("corrupt:p=0.02")))
    failed = 0
    with FeetechBus(BusConfig(port=arm.port)) as bus:
        for i in range(1200):
            try:
                bus.write(1 + i % 6, "P_Coefficient", 16)
            except BusError:
                failed += 1
        assert bus.stats.retries > 20  # the faults really fired
    assert failed <= 2, f"{failed} of 1200 writes failed after retries"
