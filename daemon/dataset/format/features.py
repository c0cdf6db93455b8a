"""Feature specs and frames: what a dataset may declare, and what a frame must look like.

A feature spec is LeRobot's: ``{"dtype": ..., "shape": [...], "names": ...}``. The writer is
stricter than LeRobot about what it accepts, because a wrong value that is silently cast or
reshaped is a wrong number in the file:

- a numeric value must be a numpy array (or numpy scalar for shape ``[1]``) of exactly the declared
  dtype and shape: a float64 action is refused, not cast (the number in the file must be the
  number executed, so the caller casts before commanding);
- floats must be finite;
- a video frame must be ``(H, W, C)`` uint8 exactly as declared (LeRobot also takes channel-first
  and PIL images; we take one layout);
- the key set is exact, plus a ``task`` string that passes :func:`hilrec.daemon.text.task_problem`
  (the one rule for task strings: one line, valid Unicode, 1..1000 characters; a lone surrogate
  such as ``"\\ud800"`` would be acknowledged here and then fail every later merge); the five
  columns the writer fills itself (timestamp, frame_index, episode_index, index, task_index) are
  refused.

Every refusal is a :class:`FrameError` or :class:`FeatureSpecError` naming the key.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping
from typing import Any, Final

import numpy as np

from hilrec.daemon.errors import FeatureSpecError, FrameError
from hilrec.daemon.text import task_problem

TASK_KEY: Final[str] = "task"

# The columns every LeRobot v3.0 dataset has and the writer fills in, in LeRobot's order.
DEFAULT_FEATURES: Final[dict[str, dict[str, Any]]] = {
    "timestamp": {"dtype": "float32", "shape": [1], "names": None},
    "frame_index": {"dtype": "int64", "shape": [1], "names": None},
    "episode_index": {"dtype": "int64", "shape": [1], "names": None},
    "index": {"dtype": "int64", "shape": [1], "names": None},
    "task_index": {"dtype": "int64", "shape": [1], "names": None},
}
RESERVED_KEYS: Final[frozenset[str]] = frozenset(DEFAULT_FEATURES) | {TASK_KEY}
# LeRobot's tolerance_s: how far a row's timestamp, or a video frame's presentation time, may sit
# from frame_index / fps. The checker judges by it and repair trusts a timestamp within it.
TIMESTAMP_TOLERANCE_S: Final[float] = 1e-4

NUMERIC_DTYPES: Final[frozenset[str]] = frozenset(
    {
        "float16",
        "float32",
        "float64",
        "int8",
        "int16",
        "int32",
        "int64",
        "uint8",
        "uint16",
        "uint32",
        "uint64",
        "bool",
    }
)
VIDEO_DTYPE: Final[str] = "video"
IMAGE_NAMES: Final[list[str]] = ["height", "width", "channels"]
# The encoder writes yuv420p: three colour channels, even sides.
VIDEO_CHANNELS: Final[int] = 3


def is_video(spec: Mapping[str, Any]) -> bool:
    return spec.get("dtype") == VIDEO_DTYPE


def video_keys(features: Mapping[str, Mapping[str, Any]]) -> list[str]:
    return [key for key, spec in features.items() if is_video(spec)]


def data_keys(features: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """Keys that become parquet columns (every non-video feature), in features order."""
    return [key for key, spec in features.items() if not is_video(spec)]


def user_keys(features: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """Keys a frame must carry (everything but the writer-filled defaults)."""
    return [key for key in features if key not in DEFAULT_FEATURES]


def validate_features(features: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Check user features and return the full feature dict: user features, then the defaults.

    The input must not contain the default columns; they are appended in LeRobot's order.
    Shapes come back as lists (JSON form).
    """
    if not isinstance(features, Mapping) or not features:
        raise FeatureSpecError("<features>", "a dataset needs at least one feature")
    full: dict[str, dict[str, Any]] = {}
    for key, spec in features.items():
        full[key] = _validate_spec(key, spec)
    full.update(copy.deepcopy(DEFAULT_FEATURES))
    return full


def _validate_spec(key: Any, spec: Any) -> dict[str, Any]:
    if not isinstance(key, str) or not key:
        raise FeatureSpecError(str(key), "feature names must be non-empty strings")
    if key in RESERVED_KEYS:
        raise FeatureSpecError(key, "is reserved: the writer fills it in itself")
    if "/" in key:
        raise FeatureSpecError(key, "feature names must not contain '/' (LeRobot flattens on it)")
    if not isinstance(spec, Mapping):
        raise FeatureSpecError(key, f"spec must be a mapping, got {type(spec).__name__}")
    unknown = set(spec) - {"dtype", "shape", "names", "info"}
    if unknown:
        raise FeatureSpecError(key, f"unknown spec fields {sorted(unknown)}")
    dtype = spec.get("dtype")
    shape = spec.get("shape")
    if (
        not isinstance(shape, (list, tuple))
        or not shape
        or not all(isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in shape)
    ):
        raise FeatureSpecError(key, f"shape must be a non-empty list of positive ints, got {shape!r}")
    names = spec.get("names")
    out: dict[str, Any] = {"dtype": dtype, "shape": list(shape), "names": copy.deepcopy(names)}
    if dtype == VIDEO_DTYPE:
        _validate_video_spec(key, list(shape), names)
        if spec.get("info"):
            # Replaced by the probed stream info once the first episode's video exists.
            out["info"] = copy.deepcopy(spec["info"])
    elif dtype == "image":
        raise FeatureSpecError(
            key,
            "dtype 'image' (PNG in parquet) is not written by the native writer; declare cameras as 'video'",
        )
    elif dtype in NUMERIC_DTYPES:
        if len(shape) != 1:
            raise FeatureSpecError(key, f"numeric features are vectors: shape [n], got {list(shape)}")
        if names is not None:
            flat = _flat_names(names)
            if len(flat) != shape[0] or not all(isinstance(n, str) for n in flat):
                raise FeatureSpecError(key, f"names must be {shape[0]} strings, got {names!r}")
        if "info" in spec:
            out["info"] = copy.deepcopy(spec["info"])
    else:
        raise FeatureSpecError(key, f"dtype {dtype!r} is not one of {sorted(NUMERIC_DTYPES | {VIDEO_DTYPE})}")
    return out


def _validate_video_spec(key: str, shape: list[int], names: Any) -> None:
    if len(shape) != 3:
        raise FeatureSpecError(key, f"video shape must be [height, width, channels], got {shape}")
    height, width, channels = shape
    if channels != VIDEO_CHANNELS:
        raise FeatureSpecError(key, f"video needs {VIDEO_CHANNELS} channels, got {channels}")
    if height % 2 or width % 2:
        raise FeatureSpecError(key, f"yuv420p video needs even height and width, got {height}x{width}")
    if names is not None and list(names) != IMAGE_NAMES:
        raise FeatureSpecError(key, f"video names must be {IMAGE_NAMES}, got {names!r}")


def _flat_names(names: Any) -> list[Any]:
    # LeRobot sometimes nests names as {"motors": [...]}; accept the single-list form of that.
    if isinstance(names, Mapping) and len(names) == 1:
        return list(next(iter(names.values())))
    return list(names)


class FrameValidator:
    """Checks frames against a feature dict (as returned by :func:`validate_features`)."""

    def __init__(self, features: Mapping[str, Mapping[str, Any]]) -> None:
        self.features = features
        self.expected = user_keys(features)
        self._expected_set = set(self.expected)
        self._specs: dict[str, tuple[str, tuple[int, ...], np.dtype | None]] = {}
        for key in self.expected:
            spec = features[key]
            np_dtype = None if is_video(spec) else np.dtype(spec["dtype"])
            self._specs[key] = (spec["dtype"], tuple(spec["shape"]), np_dtype)
        self._frame_keys = frozenset(self.expected) | {TASK_KEY}
        self._last_task: str | None = None
        # (key, dtype or None for video, shape, finiteness checked on a list of a few floats)
        self._plain = [
            (
                key,
                np_dtype or np.dtype(np.uint8),
                shape,
                np_dtype is not None and np_dtype.kind == "f" and math.prod(shape) <= 32,
            )
            for key, (_, shape, np_dtype) in self._specs.items()
        ]

    def validate(self, frame: Mapping[str, Any]) -> tuple[dict[str, np.ndarray], str]:
        """Return (values by key, task). Values are the caller's arrays, not copies."""
        accepted = self._accept_plain(frame)
        if accepted is not None:
            return accepted
        if not isinstance(frame, Mapping):
            raise FrameError("<frame>", f"a frame must be a mapping, got {type(frame).__name__}")
        keys = set(frame)
        for key in sorted(keys & (RESERVED_KEYS - {TASK_KEY})):
            raise FrameError(key, "is reserved: the writer computes it (timestamp = frame_index / fps)")
        if TASK_KEY not in keys:
            raise FrameError(TASK_KEY, "missing: every frame names its task")
        task = frame[TASK_KEY]
        problem = task_problem(task)
        if problem is not None:
            shown = f" (got {_shown(task)})" if isinstance(task, str) else ""
            raise FrameError(TASK_KEY, problem + shown)
        extra = keys - self._expected_set - {TASK_KEY}
        if extra:
            raise FrameError(sorted(extra)[0], f"is not a declared feature (declared: {self.expected})")
        missing = [key for key in self.expected if key not in keys]
        if missing:
            raise FrameError(missing[0], "missing from the frame")
        values: dict[str, np.ndarray] = {}
        for key in self.expected:
            values[key] = self._check_value(key, frame[key])
        return values, task

    def _accept_plain(self, frame: Any) -> tuple[dict[str, np.ndarray], str] | None:
        """The common case, checked in a few microseconds: a dict with exactly the declared keys
        and task, every value an array of exactly the declared dtype and shape, floats finite.
        None means "not plainly valid": :meth:`validate` then checks it the long way, and finds
        either what is wrong or an accepted variant (a numpy scalar, a 0-d array for [1])."""
        if type(frame) is not dict or frame.keys() != self._frame_keys:
            return None
        task = frame[TASK_KEY]
        if task is not self._last_task:
            # The same string again (equal, not identical) was checked already.
            if type(task) is not str or (task != self._last_task and task_problem(task) is not None):
                return None
            self._last_task = task
        values = {}
        for key, np_dtype, shape, small_float in self._plain:
            value = frame[key]
            if type(value) is not np.ndarray or value.dtype is not np_dtype or value.shape != shape:
                return None
            if small_float:
                if not all(map(math.isfinite, value.tolist())):
                    return None
            elif np_dtype.kind == "f" and not np.isfinite(value).all():
                return None
            values[key] = value
        return values, task

    def _check_value(self, key: str, value: Any) -> np.ndarray:
        dtype_name, shape, np_dtype = self._specs[key]
        if np_dtype is None:
            return _check_image(key, value, shape)
        if isinstance(value, np.generic) and shape == (1,):
            value = np.asarray(value).reshape(1)
        if not isinstance(value, np.ndarray):
            raise FrameError(
                key, f"must be a numpy array of {dtype_name} {list(shape)}, got {type(value).__name__}"
            )
        if value.dtype != np_dtype:
            raise FrameError(
                key,
                f"dtype is {value.dtype}, declared {dtype_name} (cast it before "
                f"use, so the stored number is the one used)",
            )
        if value.shape != shape:
            if shape == (1,) and value.shape == ():
                value = value.reshape(1)
            else:
                raise FrameError(key, f"shape is {list(value.shape)}, declared {list(shape)}")
        if np_dtype.kind == "f" and not np.isfinite(value).all():
            bad = np.flatnonzero(~np.isfinite(value.ravel()))
            raise FrameError(key, f"has non-finite values at flat positions {bad.tolist()[:8]}")
        return value


def _shown(value: Any) -> str:
    """``value`` for an error message: repr (escapes surrogates and controls), at most 80 chars."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _check_image(key: str, value: Any, shape: tuple[int, ...]) -> np.ndarray:
    if not isinstance(value, np.ndarray):
        raise FrameError(
            key, f"must be a uint8 numpy array (H, W, C) = {list(shape)}, got {type(value).__name__}"
        )
    if value.dtype != np.uint8:
        raise FrameError(key, f"image dtype is {value.dtype}, must be uint8")
    if value.shape != shape:
        raise FrameError(key, f"image shape is {list(value.shape)}, declared (H, W, C) = {list(shape)}")
    return value
