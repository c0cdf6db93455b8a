"""The one exception tree of hilrec.

Every error hilrec raises on purpose derives from :class:`HilrecError`, so a caller can catch
"anything hilrec refused" in one place and still act on the specific subclass: retry a
:class:`BusTimeoutError`, save the episode on a :class:`PortGoneError`, show the key of a
:class:`ConfigError` to the person who wrote the TOML.

Messages always name *what* (key, servo id, register, file, episode) and *where* (path, port).
"""

from __future__ import annotations


class HilrecError(Exception):
    """Root of every error hilrec raises deliberately."""


# --- configuration -----------------------------------------------------------------------------


class ConfigError(HilrecError, ValueError):
    """A configuration value is missing, unknown or invalid. ``key`` is the dotted TOML path."""

    def __init__(self, key: str, problem: str, *, source: str | None = None) -> None:
        self.key = key
        self.problem = problem
        self.source = source
        where = f" in {source}" if source else ""
        super().__init__(f"config key '{key}'{where}: {problem}")


class FlagError(ConfigError):
    """A command-line flag's value is invalid; ``key`` is the flag (``--episodes``), not a TOML key."""

    def __init__(self, flag: str, problem: str) -> None:
        super().__init__(flag, problem)
        Exception.__init__(self, f"flag {flag}: {problem}")


# --- dataset -----------------------------------------------------------------------------------


class DatasetError(HilrecError):
    """Something about a dataset on disk or a write to it is wrong."""


class FrameError(DatasetError, ValueError):
    """A frame handed to a writer was refused. ``key`` names the offending feature."""

    def __init__(self, key: str, problem: str) -> None:
        self.key = key
        self.problem = problem
        super().__init__(f"frame key '{key}': {problem}")


class FeatureSpecError(DatasetError, ValueError):
    """A declared feature is malformed, reserved, or not measurable on a real arm."""

    def __init__(self, key: str, problem: str) -> None:
        self.key = key
        self.problem = problem
        super().__init__(f"feature '{key}': {problem}")


class DatasetStateError(DatasetError):
    """The call does not fit the writer's lifecycle (e.g. finalize with an episode open)."""


class DatasetLockedError(DatasetStateError):
    """Another process is writing this dataset root (names its pid and command)."""


class TakeEndedError(DatasetStateError):
    """A frame the writer refuses because the take cannot go on: the frames before it are whole,
    and ``save_episode`` keeps them (the daemon ends the take there and saves it)."""


class SpillFullError(TakeEndedError):
    """The video spill (raw frames waiting for the encoder) reached its disk bound
    (``spill_bytes_limit``): no frame is dropped, the take cannot go on, no new take may start
    until the encoder catches up (``DatasetWriter.video_backlog_s``)."""


class EncoderBehindError(SpillFullError):
    """An in-process (thread) encoder's queue of frames waiting for it reached its memory bound:
    that mode's spill. No frame is dropped; the take ends at this frame and is saved."""


class DiskFullError(TakeEndedError):
    """The root's disk is (nearly) full during a take: the take ends at this frame and its
    frames so far fit in the room the writer held back for its save."""


class CorruptDatasetError(DatasetError):
    """A file of a dataset cannot be read (e.g. a parquet file with no footer)."""

    def __init__(self, path: str, problem: str) -> None:
        self.path = path
        self.problem = problem
        super().__init__(f"{path}: {problem}")


class VideoEncodingError(DatasetError):
    """The video encoder failed or could not keep every frame."""


# --- devices -----------------------------------------------------------------------------------


class DeviceError(HilrecError):
    """A hardware (or emulated hardware) device failed."""


class BusError(DeviceError):
    """A Feetech bus transaction failed. Names the port, the servo id and the register."""

    def __init__(
        self,
        problem: str,
        *,
        port: str,
        servo_id: int | None = None,
        register: str | None = None,
    ) -> None:
        self.problem = problem
        self.port = port
        self.servo_id = servo_id
        self.register = register
        parts = [f"port {port}"]
        if servo_id is not None:
            parts.append(f"servo id {servo_id}")
        if register is not None:
            parts.append(f"register {register}")
        super().__init__(f"{', '.join(parts)}: {problem}")


class BusTimeoutError(BusError):
    """No (complete) status packet arrived in time. Retryable."""


class BusPacketError(BusError):
    """A status packet arrived corrupt (checksum, length, wrong id). Retryable."""


class ServoFaultError(BusError):
    """A servo reported error bits (overload, voltage, temperature...). Not retryable."""

    def __init__(
        self, problem: str, *, port: str, servo_id: int | None, register: str | None, error_bits: int
    ) -> None:
        self.error_bits = error_bits
        super().__init__(problem, port=port, servo_id=servo_id, register=register)


class PortGoneError(BusError):
    """The serial port disappeared or cannot be opened."""


class PortBusyError(BusError):
    """Another owner holds the port."""


class CalibrationError(DeviceError, ValueError):
    """A calibration file is missing, malformed, or does not match the motors."""


class ActionError(DeviceError, ValueError):
    """An action handed to an arm is malformed (shape, non-finite values)."""


class CameraError(DeviceError):
    """A camera could not be opened or read."""


class CameraStalledError(CameraError):
    """No new frame arrived within the timeout: the camera is frozen or gone."""


# --- simulation --------------------------------------------------------------------------------


class SimError(HilrecError):
    """The MuJoCo twin refused a request or reached an invalid state."""


class FrameRateError(SimError, ValueError):
    """The requested fps is not a whole number of physics substeps."""


# --- wire protocol and replay ------------------------------------------------------------------


class ProtocolError(HilrecError, ValueError):
    """A ZeroMQ message is malformed, unknown, oversized or of the wrong version."""


class UnknownCommandError(ProtocolError):
    """A control request's ``cmd`` is not one this protocol version knows."""


class OversizedMessageError(ProtocolError):
    """A message is larger than the configured limit."""


class VersionMismatchError(ProtocolError):
    """A message carries a protocol version this daemon does not speak."""


class RequestRefusedError(HilrecError):
    """A well-formed control request the daemon cannot do now; ``code`` goes in the error reply."""

    def __init__(self, message: str, code: str) -> None:
        self.code = code
        super().__init__(message)


class DaemonUnreachableError(HilrecError):
    """No reply from the daemon within the client's timeout and retries."""


class WriterStalledError(DatasetStateError):
    """The dataset writer thread took no frame for its stall timeout: its queue stayed full."""


class ReplayError(HilrecError):
    """An episode cannot be replayed (missing start state, units or calibration)."""


# --- fan-out -----------------------------------------------------------------------------------


class FanoutError(HilrecError):
    """Per-episode tasks cannot be handed out: Ray missing or unreachable, a bad worker count."""


# --- policies ----------------------------------------------------------------------------------


class PolicyError(HilrecError):
    """A policy cannot drive: its process died, or it could not be loaded or asked."""
