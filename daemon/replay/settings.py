"""Thresholds of the hardware replay check, as a frozen config loaded from ``configs/replay.toml``.

The numbers decide what "consistent", "lagging" and "diverged" mean, so they live in a file a
person can read and override (``hilrec replay --config FILE``) rather than in the code. The
defaults below equal ``configs/replay.toml`` (a test holds them together); that file says where
each number comes from.

Units: body-joint errors are in degrees, gripper errors in its 0..100 range, times in seconds,
shifts in frames of the dataset's fps.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from hilrec.daemon.config import load_toml
from hilrec.daemon.errors import ConfigError

DEFAULT_CONFIG_PATH = Path(__file__).resolve().parents[2] / "configs" / "replay.toml"


@dataclass(frozen=True, kw_only=True)
class EngineSettings:
    """How the twin is started before the first action is applied."""

    settle_iterations: int = 3  # goal corrections until the twin rests at the first recorded state
    min_frames: int = 25  # shorter episodes carry too little motion to judge

    def validate(self) -> None:
        if not 1 <= self.settle_iterations <= 20:
            raise ConfigError("settle_iterations", f"must be in 1..20, got {self.settle_iterations}")
        if self.min_frames < 3:
            raise ConfigError("min_frames", f"must be >= 3, got {self.min_frames}")


@dataclass(frozen=True, kw_only=True)
class LagSettings:
    """The search for the frame shift that best aligns recorded and replayed states."""

    min_shift_frames: int = -5  # negative: the recording runs ahead of the twin (impossible causally)
    max_shift_frames: int = 10
    tolerance_frames: float = 0.5  # |lag| above this is reported as lagging
    min_motion_deg: float = 5.0  # below this peak-to-peak motion a joint cannot show a lag
    max_correlation_frames: int = 15  # action -> state response search window

    def validate(self) -> None:
        if self.min_shift_frames > 0 or self.max_shift_frames < 0:
            raise ConfigError(
                "min_shift_frames",
                f"the shift range must contain 0 (got [{self.min_shift_frames}, {self.max_shift_frames}])",
            )
        if self.max_shift_frames - self.min_shift_frames < 2:
            raise ConfigError("max_shift_frames", "the shift range needs at least 3 shifts")
        if not 0.0 < self.tolerance_frames < 1.0:
            raise ConfigError(
                "tolerance_frames",
                f"must be in (0, 1) so a one-frame lag is caught, got {self.tolerance_frames}",
            )
        if self.min_motion_deg <= 0.0:
            raise ConfigError("min_motion_deg", f"must be positive, got {self.min_motion_deg}")
        if self.max_correlation_frames < 1:
            raise ConfigError("max_correlation_frames", "must be >= 1")


@dataclass(frozen=True, kw_only=True)
class ErrorLimits:
    """Recorded vs replayed position error allowed for one kind of joint (after lag alignment)."""

    rms: float
    max: float  # sustained for at least ``min_duration_s`` (shorter blips are reported, not judged)
    floor: float  # the error of a joint that tracks: a divergence is dated from its departure

    def validate(self) -> None:
        if not 0.0 < self.floor <= self.rms <= self.max:
            raise ConfigError(
                "rms", f"need 0 < floor <= rms <= max, got floor={self.floor}, rms={self.rms}, max={self.max}"
            )


@dataclass(frozen=True, kw_only=True)
class ConsistencySettings:
    body: ErrorLimits = field(default_factory=lambda: ErrorLimits(rms=2.0, max=6.0, floor=0.25))
    gripper: ErrorLimits = field(default_factory=lambda: ErrorLimits(rms=6.0, max=20.0, floor=1.0))
    min_duration_s: float = 0.2  # an excursion shorter than this is a blip (bus glitch), not divergence
    # A row may match the replay up to this many frames either side of the episode's lag when its
    # error is judged: a reading taken just before (or after) the follower's update is a timing
    # matter, which the lag reports, not a divergence. 0 judges the aligned error strictly.
    timing_slack_frames: int = 1

    def validate(self) -> None:
        if self.min_duration_s < 0.0:
            raise ConfigError("min_duration_s", f"must be >= 0, got {self.min_duration_s}")
        if not 0 <= self.timing_slack_frames <= 3:
            raise ConfigError("timing_slack_frames", f"must be in 0..3, got {self.timing_slack_frames}")


@dataclass(frozen=True, kw_only=True)
class StallSettings:
    """A servo that stops responding: its reading freezes while the command keeps moving."""

    still_deg: float = 0.1  # frame-to-frame change below this counts as not moving
    min_duration_s: float = 0.4
    min_command_motion_deg: float = 5.0  # ...while the command moved at least this much

    def validate(self) -> None:
        if self.still_deg <= 0.0 or self.min_duration_s <= 0.0 or self.min_command_motion_deg <= 0.0:
            raise ConfigError("still_deg", "stall thresholds must all be positive")


@dataclass(frozen=True, kw_only=True)
class GripperSettings:
    """Grasp detection: commanded more closed than achieved while the jaw has stopped."""

    grasp_gap: float = 8.0  # 0..100 units between command and reading that mean "blocked"
    still: float = 0.5  # frame-to-frame change below this counts as stopped

    def validate(self) -> None:
        if self.grasp_gap <= 0.0 or self.still <= 0.0:
            raise ConfigError("grasp_gap", "gripper thresholds must be positive")


@dataclass(frozen=True, kw_only=True)
class SaturationSettings:
    """Commands at or beyond the joint range (the twin clamps them, a servo does too)."""

    limit_margin_deg: float = 0.5
    gripper_margin: float = 0.5
    leader_tolerance: float = 0.01  # recorded action vs leader reading, when the leader was recorded

    def validate(self) -> None:
        if min(self.limit_margin_deg, self.gripper_margin, self.leader_tolerance) < 0.0:
            raise ConfigError("limit_margin_deg", "saturation margins must be >= 0")


@dataclass(frozen=True, kw_only=True)
class ApproachSettings:
    """A take that starts with the follower away from the leader: it swings over, then tracks.

    Those first frames are the follower's own dynamics on a large move (a real servo's speed
    limit, not the twin's), not tracking, so they are reported and not judged. The approach is
    recognised only from a start at least ``min_gap_deg`` off the leader on some body joint, while
    the gap keeps closing (it never widens by more than ``settled_gap_deg`` over its smallest so
    far), and only when it closes to ``settled_gap_deg`` within ``max_s``; otherwise the whole take
    is judged, as before.
    """

    min_gap_deg: float = 10.0
    settled_gap_deg: float = 5.0
    max_s: float = 3.0

    def validate(self) -> None:
        if not 0.0 < self.settled_gap_deg < self.min_gap_deg:
            raise ConfigError(
                "settled_gap_deg",
                f"need 0 < settled_gap_deg < min_gap_deg, got {self.settled_gap_deg} and {self.min_gap_deg}",
            )
        if not 0.0 <= self.max_s <= 10.0:
            raise ConfigError("max_s", f"must be in 0..10 (0 judges every take whole), got {self.max_s}")


@dataclass(frozen=True, kw_only=True)
class ReplaySettings:
    engine: EngineSettings = field(default_factory=EngineSettings)
    lag: LagSettings = field(default_factory=LagSettings)
    consistency: ConsistencySettings = field(default_factory=ConsistencySettings)
    stall: StallSettings = field(default_factory=StallSettings)
    gripper: GripperSettings = field(default_factory=GripperSettings)
    saturation: SaturationSettings = field(default_factory=SaturationSettings)
    approach: ApproachSettings = field(default_factory=ApproachSettings)


def load_replay_settings(path: str | Path | None = None) -> ReplaySettings:
    """The settings in ``path``; the shipped ``configs/replay.toml`` when None (defaults if absent)."""
    if path is None:
        if not DEFAULT_CONFIG_PATH.exists():  # an installed wheel without the repo's configs/
            return ReplaySettings()
        path = DEFAULT_CONFIG_PATH
    return load_toml(ReplaySettings, path)
