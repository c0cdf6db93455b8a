"""One episode's record beside the dataset: per-tick timing, frame flags, divergence, faults.

The dataset holds only what an arm measures (``observation.state``, images) and what was sent
(``action``). Everything else about an episode goes to its sidecar
(``hilrec/episodes/episode-NNNNNN.{json,npz}``) through ``save_episode(sidecar=..., arrays=...)``:

- arrays (npz): the tick timestamps (:data:`hilrec.daemon.control.clock.TIMING_ARRAYS`, monotonic
  seconds), ``frame_flags`` (uint32, :class:`hilrec.daemon.dataset.FrameFlag` bits),
  ``leader`` (the leader's reading before any clamp, float32 (n, 6) per arm, NaN where there was
  no live command and the follower held), in hil/emulated mode ``twin_state`` (the mirroring
  twin's joints at each tick, float32 (n, 6) per arm), and with two arms on two buses the
  :data:`hilrec.daemon.control.clock.SKEW_ARRAYS` (how far apart the arms' readings were taken);
- JSON: task, seed, success, how the episode ended, wall-clock start, a timing summary, flag
  counts, faults seen, and the divergence summary between commanded, measured and twin state.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from hilrec.daemon.control.clock import SKEW_ARRAYS, TIMING_ARRAYS, TickTimes, timing_summary
from hilrec.daemon.dataset import FrameFlag
from hilrec.daemon.so101 import NUM_JOINTS, joint_names
from hilrec.daemon.wire.protocol import PROTOCOL_VERSION


class EpisodeBuffer:
    """Rows of one episode, appended by the loop thread once per recorded tick."""

    def __init__(
        self,
        *,
        index: int,
        task: str,
        seed: int | None,
        period_s: float,
        context: Mapping[str, Any],
        start_fields: Mapping[str, Any],
        start_arrays: Mapping[str, np.ndarray],
    ) -> None:
        self.index = index
        self.task = task
        self.seed = seed
        self.period_s = period_s
        self.context = dict(context)
        self.start_fields = dict(start_fields)
        self.start_arrays = dict(start_arrays)
        self.started_wall = time.time()
        self.started_mono = time.monotonic()
        self.frames = 0
        self._timing: dict[str, list[float]] = {name: [] for name in TIMING_ARRAYS}
        self._skews: dict[str, list[float]] = {name: [] for name in SKEW_ARRAYS}
        self._joints = NUM_JOINTS  # of the rows appended: 12 for two arms
        self._flags: list[int] = []
        self._measured: list[np.ndarray] = []
        self._commanded: list[np.ndarray] = []
        self._twin: list[np.ndarray] = []
        self._leader: list[np.ndarray] = []
        self._faults: list[dict[str, Any]] = []
        self._flag_union = 0

    def append(
        self,
        tick: TickTimes,
        flags: int,
        measured: np.ndarray,
        commanded: np.ndarray,
        twin: np.ndarray | None,
        leader: np.ndarray | None = None,
    ) -> None:
        t = self._timing
        t["tick_slot"].append(tick.slot)
        t["tick_deadline"].append(tick.deadline)
        t["tick_start"].append(tick.start)
        t["tick_observed"].append(tick.observed)
        t["tick_leader_read"].append(tick.leader_read)
        t["tick_written"].append(tick.written)
        t["tick_end"].append(tick.end)
        t["tick_skipped"].append(tick.skipped)
        t["tick_bus_s"].append(tick.bus_s)
        self._skews["tick_follower_skew_s"].append(tick.follower_skew_s)
        self._skews["tick_leader_skew_s"].append(tick.leader_skew_s)
        self._joints = len(measured)
        self._flags.append(flags)
        self._flag_union |= flags
        self._measured.append(measured)
        self._commanded.append(commanded)
        if twin is not None:
            self._twin.append(twin)
        self._leader.append(leader if leader is not None else np.full(self._joints, np.nan, np.float32))
        self.frames += 1

    def note_fault(self, fault: Mapping[str, Any]) -> None:
        self._faults.append({**fault, "frame_index": self.frames})

    def summary(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "task": self.task,
            "seed": self.seed,
            "frames": self.frames,
            "elapsed_s": time.monotonic() - self.started_mono,
            "flags": [f.name.lower() for f in FrameFlag if f.name and self._flag_union & f],
        }

    def arrays(self) -> dict[str, np.ndarray]:
        out: dict[str, np.ndarray] = {}
        for name, values in self._timing.items():
            dtype = np.int64 if name in ("tick_slot", "tick_skipped") else np.float64
            out[name] = np.asarray(values, dtype=dtype)
        for name, values in self._skews.items():  # two arms on two buses: their read skew
            if any(math.isfinite(v) for v in values):
                out[name] = np.asarray(values, dtype=np.float64)
        out["frame_flags"] = np.asarray(self._flags, dtype=np.uint32)
        if self._leader:
            out["leader"] = np.stack(self._leader).astype(np.float32)
        if self._twin and len(self._twin) == self.frames:
            out["twin_state"] = np.stack(self._twin).astype(np.float32)
        out.update(self.start_arrays)
        return out

    def finish(
        self, *, success: bool | None, ended_by: str, outcome: Mapping[str, Any]
    ) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        """The sidecar JSON fields and arrays for ``save_episode``."""
        arrays = self.arrays()
        flags = arrays["frame_flags"]
        sidecar: dict[str, Any] = {
            "recorder": "hilrec.daemon",
            "protocol_version": PROTOCOL_VERSION,
            **{k: v for k, v in self.context.items() if k != "root"},
            "task": self.task,
            "seed": self.seed,
            "success": success,
            "ended_by": ended_by,
            "started_wall": self.started_wall,
            "frames": self.frames,
            "timing": _finite(timing_summary(arrays, self.period_s)),
            "timing_clock": "time.monotonic seconds; frame k's dataset timestamp is k/fps, its real "
            "start is tick_start[k] (late ticks are recorded, not dilated); tick_bus_s is a duration: "
            "the seconds tick k spent on the arms' bus reads; two arms: tick_follower_skew_s and "
            "tick_leader_skew_s are durations too, how far apart the two arms' readings were taken",
            "frame_flags": {
                "bits": {f.name.lower(): int(f.value) for f in FrameFlag if f.name},
                "counts": {
                    f.name.lower(): int(np.count_nonzero(flags & int(f.value)))
                    for f in FrameFlag
                    if f.name and np.any(flags & int(f.value))
                },
            },
            "faults": list(self._faults),
            "divergence": self.divergence(),
            **self.start_fields,
        }
        for key, value in outcome.items():
            if key == "success" and success is not None:
                sidecar["success_reported"] = success  # the operator's word stays beside the measured one
                sidecar["success"] = value
                continue
            sidecar[key] = value
        return sidecar, arrays

    def divergence(self) -> dict[str, Any]:
        """Per-joint max and RMS differences, LeRobot units (degrees; gripper 0..100).

        ``tracking``: the command sent at tick k against the joints measured at tick k+1.
        ``twin_vs_measured``: the mirroring twin against the measured joints at the same tick.
        ``twin_vs_commanded``: the twin at tick k+1 against the command sent at tick k.
        """
        result: dict[str, Any] = {
            "units": "degrees (body joints), 0..100 (gripper)",
            "joints": list(joint_names(self._joints // NUM_JOINTS)),
        }
        if self.frames < 2:
            return result
        measured = np.stack(self._measured).astype(np.float64)
        commanded = np.stack(self._commanded).astype(np.float64)
        result["tracking"] = _stats(commanded[:-1] - measured[1:])
        if self._twin and len(self._twin) == self.frames:
            twin = np.stack(self._twin).astype(np.float64)
            result["twin_vs_measured"] = _stats(twin - measured)
            result["twin_vs_commanded"] = _stats(twin[1:] - commanded[:-1])
        return result


def _stats(diff: np.ndarray) -> dict[str, list[float]]:
    return {
        "max_abs": [float(x) for x in np.abs(diff).max(axis=0)],
        "rms": [float(x) for x in np.sqrt((diff**2).mean(axis=0))],
    }


def _finite(values: Mapping[str, Any]) -> dict[str, Any]:
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in values.items()}
