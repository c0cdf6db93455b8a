"""One recorded episode into rerun: video frames, state and action per joint, the sidecar's tick
timing and frame flags, and for a hardware dataset the twin's replay beside the recording.

Entity paths (all under the recording's root):

- ``camera/<name>``: the decoded frames of each video feature ``observation.images.<name>``;
- ``state/<joint>``, ``action/<joint>``: the dataset's columns, LeRobot units; a two-arm
  dataset's (LeRobot's bi_so_follower) grouped per arm, ``state/left/<joint>``,
  ``state/right/<joint>``, with a layout showing the two arms' plots side by side;
- ``timing/late_ms`` (tick start minus its deadline), ``timing/skipped`` (whole slots missed
  before the tick), from the episode's ``tick_*`` arrays (daemon recordings only);
- ``flags/bits`` (the ``frame_flags`` uint32 as a scalar) and ``flags/text`` (the flag names, on
  the frames that have any);
- hardware datasets: ``replay/recorded/<joint>`` and ``replay/replayed/<joint>`` (twin units,
  radians and the gripper's), ``replay/verdict`` (text, once).

Timelines: ``frame`` (the frame index) and ``time`` (the recorded time: the tick's real start
since the episode's first, else the dataset timestamp).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from hilrec.daemon.dataset import flag_names, load_dataset_sidecar, load_episode_sidecar, reader
from hilrec.daemon.errors import DatasetError
from hilrec.daemon.so101 import ACTION_KEY, ARM_SIDES, IMAGE_PREFIX, JOINT_NAMES, STATE_KEY, arm_groups

log = logging.getLogger(__name__)

HARDWARE_MODES = frozenset({"hil", "emulated"})


@dataclass
class ViewSummary:
    """What was logged: entity path -> number of frames logged to it."""

    episode_index: int
    frames: int
    entities: dict[str, int] = field(default_factory=dict)
    replay_verdict: str | None = None


def joint_names(info: dict[str, Any], key: str) -> list[str]:
    names = info["features"].get(key, {}).get("names")
    if isinstance(names, dict):  # LeRobot 2.x style {"motors": [...]}
        names = next(iter(names.values()), None)
    if not isinstance(names, list):
        shape = info["features"].get(key, {}).get("shape", [0])
        names = [f"{i}" for i in range(int(shape[0]))]
    return [str(n).removesuffix(".pos") for n in names]


def series_paths(prefix: str, names: list[str]) -> list[str]:
    """Entity paths of a joint vector's values: ``prefix/<joint>`` for one arm, and for two
    arms grouped per arm, ``prefix/left/<joint>`` (the ``left_`` of LeRobot's column dropped)."""
    groups = arm_groups(len(names))
    if groups is None or groups[0][0] is None:
        return [f"{prefix}/{name}" for name in names]
    return [
        f"{prefix}/{side}/{name.removeprefix(f'{side}_')}" for side, where in groups for name in names[where]
    ]


def send_arm_layout(rr: Any, recording: Any, sides: list[str], cameras: list[str]) -> None:
    """Two arms: a layout with one joint plot per arm, side by side (state and action, named
    left / right), the cameras below and the timing last; one arm keeps rerun's own layout."""
    import rerun.blueprint as rrb

    arms = [
        rrb.TimeSeriesView(
            name=f"{side} arm", origin="/", contents=[f"/state/{side}/**", f"/action/{side}/**"]
        )
        for side in sides
    ]
    rows: list[Any] = [rrb.Horizontal(*arms)]
    if cameras:
        rows.append(rrb.Horizontal(*(rrb.Spatial2DView(name=c, origin=f"/camera/{c}") for c in cameras)))
    rows.append(
        rrb.TimeSeriesView(
            name="timing, flags, replay", origin="/", contents=["/timing/**", "/flags/**", "/replay/**"]
        )
    )
    rr.send_blueprint(rrb.Blueprint(rrb.Vertical(*rows), collapse_panels=False), recording=recording)


def is_hardware_dataset(root: Path) -> bool:
    """Recorded by the daemon in hil or emulated mode (its provenance in ``hilrec/dataset.json``)."""
    sidecar = load_dataset_sidecar(root) or {}
    daemon = sidecar.get("daemon")
    mode = daemon.get("mode") if isinstance(daemon, dict) else sidecar.get("mode")
    return str(mode) in HARDWARE_MODES


def log_episode(
    rr: Any, recording: Any, root: Path, episode_index: int, *, replay: bool = True
) -> ViewSummary:
    root = Path(root)
    info = reader.load_info(root)
    features = info["features"]
    fps = float(info["fps"])
    numeric = [k for k in (STATE_KEY, ACTION_KEY, "timestamp") if k in features]
    columns = reader.read_episode(root, episode_index, columns=numeric)
    n = int(reader.episode_row(root, episode_index)["length"])
    frames = np.arange(n, dtype=np.int64)
    _, arrays = load_episode_sidecar(root, episode_index)
    start = arrays.get("tick_start")
    if start is not None and start.shape == (n,) and n:
        seconds = np.asarray(start, dtype=np.float64) - float(start[0])
    elif "timestamp" in columns:
        seconds = np.asarray(columns["timestamp"], dtype=np.float64).reshape(n)
    else:
        seconds = frames / fps
    summary = ViewSummary(episode_index=episode_index, frames=n)

    def send(path: str, values: np.ndarray, rows: np.ndarray | None = None) -> None:
        picked = frames if rows is None else frames[rows]
        if picked.size == 0:
            return
        rr.send_columns(
            path,
            indexes=[
                rr.TimeColumn("frame", sequence=picked),
                rr.TimeColumn("time", duration=seconds[picked]),
            ],
            columns=rr.Scalars.columns(scalars=np.asarray(values, dtype=np.float64)),
            recording=recording,
        )
        summary.entities[path] = int(picked.size)

    sides: list[str] = []
    for key, prefix in ((STATE_KEY, "state"), (ACTION_KEY, "action")):
        if key not in columns:
            continue
        values = np.asarray(columns[key], dtype=np.float64).reshape(n, -1)
        names = joint_names(info, key)[: values.shape[1]]
        groups = arm_groups(len(names))
        if groups is not None and groups[0][0] is not None:
            sides = list(ARM_SIDES)
        for j, path in enumerate(series_paths(prefix, names)):
            send(path, values[:, j])
    if sides:
        cameras = [k.removeprefix(IMAGE_PREFIX) for k, f in features.items() if f.get("dtype") == "video"]
        send_arm_layout(rr, recording, sides, cameras)

    deadline = arrays.get("tick_deadline")
    if start is not None and deadline is not None and start.shape == deadline.shape == (n,):
        send("timing/late_ms", (np.asarray(start, np.float64) - np.asarray(deadline, np.float64)) * 1000.0)
    skipped = arrays.get("tick_skipped")
    if skipped is not None and skipped.shape == (n,):
        send("timing/skipped", skipped.astype(np.float64))
    flags = arrays.get("frame_flags")
    if flags is not None and flags.shape == (n,):
        send("flags/bits", flags.astype(np.float64))
        flagged = np.flatnonzero(flags)
        for row in flagged:
            _at(rr, recording, int(row), float(seconds[row]))
            rr.log(
                "flags/text",
                rr.TextLog(", ".join(flag_names(int(flags[row]))), level="WARN"),
                recording=recording,
            )
        if flagged.size:
            summary.entities["flags/text"] = int(flagged.size)

    for key, feature in features.items():
        if feature.get("dtype") != "video":
            continue
        path = "camera/" + key.removeprefix(IMAGE_PREFIX)
        images = reader.read_episode_frames(root, episode_index, key)
        for i, image in enumerate(images):
            _at(rr, recording, i, float(seconds[i]))
            rr.log(path, rr.Image(image), recording=recording)
        summary.entities[path] = len(images)

    if replay and is_hardware_dataset(root):
        _log_replay(rr, recording, root, episode_index, summary, send)
    rr.reset_time(recording=recording)
    return summary


def _at(rr: Any, recording: Any, frame: int, seconds: float) -> None:
    rr.set_time("frame", sequence=frame, recording=recording)
    rr.set_time("time", duration=seconds, recording=recording)


def _log_replay(rr: Any, recording: Any, root: Path, index: int, summary: ViewSummary, send: Any) -> None:
    from hilrec.daemon.replay.check import replay_dataset
    from hilrec.daemon.replay.settings import DEFAULT_CONFIG_PATH, load_replay_settings

    check = replay_dataset(
        root, settings=load_replay_settings(None), settings_source=str(DEFAULT_CONFIG_PATH), episodes=[index]
    )
    result = check.results[0]
    summary.replay_verdict = result.verdict.value
    _at(rr, recording, 0, 0.0)
    text = f"replay check: {result.verdict.value}" + (f" ({result.reason})" if result.reason else "")
    rr.log("replay/verdict", rr.TextLog(text), recording=recording)
    summary.entities["replay/verdict"] = 1
    traj = result.trajectories
    if traj is None:
        log.warning("episode %d: no replayed trajectory (%s)", index, result.reason)
        return
    m = min(summary.frames, traj.recorded.shape[0], traj.replayed.shape[0])
    rows = np.arange(m)
    width = int(traj.recorded.shape[1]) if traj.recorded.ndim == 2 else len(JOINT_NAMES)
    groups = arm_groups(width) or ((None, slice(0, len(JOINT_NAMES))),)
    names = [f"{side}_{j}" if side else j for side, _ in groups for j in JOINT_NAMES]
    for kind in ("recorded", "replayed"):
        values = getattr(traj, kind)
        for j, path in enumerate(series_paths(f"replay/{kind}", names)):
            send(path, values[:m, j], rows)


def episode_choice(root: Path, episode: int | None) -> int:
    episodes = [int(e["episode_index"]) for e in reader.load_episodes(root)]
    if not episodes:
        raise DatasetError(f"{root}: the dataset has no episodes")
    if episode is None:
        return episodes[0]
    if episode not in episodes:
        raise DatasetError(
            f"{root}: no episode {episode} (it has {len(episodes)}: {episodes[0]}..{episodes[-1]})"
        )
    return episode
