"""Which features a sim recording may declare: only what a real SO-101 can measure.

A real SO-101 follower reports six Present_Position values and whatever its cameras see. The
twin knows far more (cube pose, contacts, velocities, torques), and every bit of it belongs in
the episode sidecar, not under ``observation.``: a policy trained on a column the real arm cannot
produce cannot run on the real arm.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hilrec.daemon.errors import FeatureSpecError
from hilrec.daemon.policy.record import INTERVENTION_KEY
from hilrec.daemon.so101 import (
    ACTION_KEY,
    IMAGE_PREFIX,
    STATE_KEY,
    arms_of,
    position_names,
    so101_features,
)

OBSERVATION_PREFIX = "observation."
_WHY = (
    "a real SO-101 measures only its six joint positions (observation.state) and its camera "
    "images (observation.images.<camera>); put simulator-only quantities such as object "
    "poses, contacts or velocities in the episode sidecar instead"
)


def check_measurable(features: Mapping[str, Mapping[str, Any]], *, arms: int = 1) -> None:
    """Raise FeatureSpecError for a declared feature ``arms`` real arms could not produce."""
    for key, spec in features.items():
        if key == ACTION_KEY:
            _check_positions(key, spec, arms)
            continue
        if key == INTERVENTION_KEY:
            # Allowed by name: whether a person had the arm is known on the bench as it happens
            # (the takeover key, the leader), not an oracle of the simulator; LeRobot 0.6.1's
            # rollouts write it, so training code reads it unchanged.
            if spec.get("dtype") != "bool" or list(spec.get("shape", [])) != [1]:
                raise FeatureSpecError(
                    key,
                    f"is bool [1] as LeRobot writes it, got dtype {spec.get('dtype')!r} "
                    f"shape {spec.get('shape')}",
                )
            continue
        if not key.startswith(OBSERVATION_PREFIX):
            continue
        if key == STATE_KEY:
            _check_positions(key, spec, arms)
        elif key.startswith(IMAGE_PREFIX) and len(key) > len(IMAGE_PREFIX):
            shape = list(spec.get("shape", []))
            if spec.get("dtype") not in ("video", "image") or len(shape) != 3 or shape[2] != 3:
                raise FeatureSpecError(
                    key,
                    f"a camera feature is an RGB image/video [H, W, 3], "
                    f"got dtype {spec.get('dtype')!r} shape {shape}",
                )
        else:
            raise FeatureSpecError(key, f"not measurable on a real SO-101: {_WHY}")


def _check_positions(key: str, spec: Mapping[str, Any], arms: int) -> None:
    names = list(spec.get("names") or [])
    want = position_names(arms)
    if spec.get("dtype") != "float32" or list(spec.get("shape", [])) != [len(want)] or names != want:
        columns = "SO-101" if arms == 1 else f"bi_so_follower ({arms} arms)"
        found = arms_of(names)
        hint = f"; those are the columns of {found} arm(s)" if found not in (None, arms) else ""
        raise FeatureSpecError(
            key,
            f"must be float32 [{len(want)}] named {want} "
            f"(LeRobot's {columns} columns), got dtype {spec.get('dtype')!r} "
            f"shape {spec.get('shape')} names {names}{hint}",
        )


def sim_features(
    cameras: Mapping[str, tuple[int, int]],
    extra: Mapping[str, Mapping[str, Any]] | None = None,
    *,
    arms: int = 1,
) -> dict[str, dict[str, Any]]:
    """The features of a sim recording: LeRobot's SO-101 columns (``arms=2``: its
    bi_so_follower's), one video per camera, and any ``extra`` features a caller declares,
    provided real arms could produce them."""
    features = so101_features(cameras, arms=arms)
    for key, spec in (extra or {}).items():
        if key in features:
            raise FeatureSpecError(key, "already declared by the SO-101 features")
        features[key] = dict(spec)
    check_measurable(features, arms=arms)
    return features
