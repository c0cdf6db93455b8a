"""scservo_sdk 1.0.0's port and sync read, made safe for :class:`hilrec.drivers.bus.FeetechBus`.

:class:`ExclusivePort` is the SDK's ``PortHandler`` opening the port exclusively (a flock taken
before pyserial configures or flushes anything), waiting in ``select()`` instead of spinning, with
its own reply timeout and the monotonic clock. :class:`StatusSyncRead` is ``GroupSyncRead``
keeping each servo's ERROR byte and taking every reply through the bus's matching receive.
"""

from __future__ import annotations

import errno
import termios
import time
from collections.abc import Callable

import scservo_sdk as scs
import serial

_ERROR, _PARAM0 = scs.PKT_ERROR, scs.PKT_PARAMETER0


class ExclusivePort(scs.PortHandler):
    """The SDK's PortHandler, opening the port exclusively and waiting without spinning."""

    is_open: bool  # set by the SDK's __init__; declared for the type checker

    def __init__(self, port_name: str, *, wait_slice_s: float, reply_timeout_ms: float | None) -> None:
        super().__init__(port_name)
        self._wait_slice_s = wait_slice_s
        self._reply_timeout_ms = reply_timeout_ms

    def setupPort(self, cflag_baud: int) -> bool:
        if self.is_open:
            self.closePort()
        # exclusive=True takes the flock before pyserial configures or flushes anything.
        self.ser = serial.Serial(
            port=self.port_name,
            baudrate=self.baudrate,
            bytesize=serial.EIGHTBITS,
            timeout=self._wait_slice_s,
            exclusive=True,
        )
        self.is_open = True
        self.ser.reset_input_buffer()
        self.tx_time_per_byte = (1000.0 / self.baudrate) * 10.0
        return True

    def setPacketTimeout(self, packet_length: int) -> None:
        if self._reply_timeout_ms is None:
            super().setPacketTimeout(packet_length)
            return
        self.packet_start_time = self.getCurrentTime()
        self.packet_timeout = self.tx_time_per_byte * packet_length + self._reply_timeout_ms

    def getCurrentTime(self) -> float:
        return time.monotonic() * 1000.0  # the SDK uses time.time(): wall clock steps


def open_problem(exc: serial.SerialException) -> str:
    """Why a port did not open, and what to do about it."""
    cause = exc.__context__
    code = getattr(exc, "errno", None) or (cause.args[0] if isinstance(cause, termios.error) else None)
    find = "hilrec find-port names the arm's port"
    if code == errno.ENOTTY or "Inappropriate ioctl" in str(exc):
        return (
            "not a serial port (a USB serial adapter is /dev/ttyACM* or /dev/ttyUSB* on Linux, "
            f"/dev/tty.usbmodem* on macOS); {find}"
        )
    if code == errno.ENOENT:
        return f"no such port: is the arm's USB cable plugged in? {find}"
    if code in (errno.EACCES, errno.EPERM):
        return (
            "permission denied: add your user to the group that owns the port "
            "(e.g. `sudo usermod -aG dialout $USER`, then log in again)"
        )
    return f"cannot open: {exc}; {find}"


Receive = Callable[[ExclusivePort, int, int], tuple[list[int], int]]


class StatusSyncRead(scs.GroupSyncRead):
    """GroupSyncRead that keeps every servo's ERROR byte, remembers which servo failed, and takes
    each reply through the bus's matching ``receive`` (id and length)."""

    def __init__(
        self, port: ExclusivePort, packets: scs.PacketHandler, address: int, length: int, receive: Receive
    ) -> None:
        super().__init__(port, packets, address, length)
        self._receive = receive
        self.status: dict[int, int] = {}
        self.failed_id: int | None = None

    def rxPacket(self) -> int:
        self.last_result = False
        self.status = {}
        self.failed_id = None
        if not self.data_dict:
            return scs.COMM_NOT_AVAILABLE
        for servo_id in self.data_dict:
            rx, result = self._receive(self.port, servo_id, self.data_length + 2)
            if result != scs.COMM_SUCCESS:
                self.failed_id = servo_id
                return result
            self.data_dict[servo_id] = rx[_PARAM0 : _PARAM0 + self.data_length]
            self.status[servo_id] = rx[_ERROR]
        self.last_result = True
        return scs.COMM_SUCCESS
