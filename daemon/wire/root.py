"""The dataset root a daemon may record into: new (missing or empty), or resumed on purpose.

One rule for the daemon and for its clients: ``hilrec collect`` checks it before it starts
emulators and the daemon, so a refused root is said in one line at once, not after the start-up.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hilrec.daemon.dataset import holds_nothing
from hilrec.daemon.errors import ConfigError
from hilrec.daemon.policy.record import INTERVENTION_KEY, intervention_feature
from hilrec.daemon.so101 import STATE_KEY, arms_of, robot_type, so101_features
from hilrec.daemon.wire.settings import DaemonSettings


def daemon_features(settings: DaemonSettings) -> dict[str, Any]:
    """The features of the dataset a daemon of these settings records (with a policy, LeRobot
    0.6.1's ``intervention`` column too)."""
    cameras = {name: (cam.height, cam.width) for name, cam in settings.cameras.items()}
    features = so101_features(cameras, arms=settings.arm_count)
    if settings.policy.spec:
        features[INTERVENTION_KEY] = intervention_feature()
    return features


def check_settings_root(settings: DaemonSettings, *, resume: bool) -> bool:
    """:func:`check_root` of the settings' ``dataset.root``."""
    return check_root(
        Path(settings.dataset.root), resume=resume, fps=settings.fps, features=daemon_features(settings)
    )


def check_root(root: Path, *, resume: bool, fps: int, features: dict[str, Any]) -> bool:
    """True when ``root`` holds a dataset to resume, False when it is new (missing or empty).

    An existing, non-empty root is refused without ``resume``; with it, it must be a dataset of
    the same features, fps and robot type (the error names what differs)."""
    if holds_nothing(root):  # missing, empty, or only a leftover lock file
        return False
    if not resume:
        raise ConfigError(
            "dataset.root",
            f"{root} already exists and is not empty; pass --resume to add episodes to the "
            "dataset in it, or choose a new root",
        )
    from hilrec.sim.recorder import resume_mismatch

    arms = arms_of(features[STATE_KEY]["names"]) or 1
    problems = resume_mismatch(root, fps=fps, features=features, robot_type=robot_type(arms))
    if problems:
        raise ConfigError("dataset.root", f"cannot resume {root}: " + "; ".join(problems))
    return True
