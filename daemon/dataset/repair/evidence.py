"""info.json's fixed fields, checked against what the rows and the videos say.

The data files' columns (the schema most of them share), the rows' timestamps (the fps) and the
videos' probes (shape, codec, rate) are the evidence; info.json, or its best other copy (the
journal's, a merge's old version, an earlier damaged one), is corrected by it field by field,
each fix reported. With no readable copy at all, the fixed fields are rebuilt from the evidence
alone, with the SO-101 names and LeRobot's defaults where the files cannot say.
"""

from __future__ import annotations

import copy
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from hilrec.daemon.atomic import read_json
from hilrec.daemon.dataset.format.features import (
    DEFAULT_FEATURES,
    TIMESTAMP_TOLERANCE_S,
    is_video,
    video_keys,
)
from hilrec.daemon.dataset.format.layout import (
    DEFAULT_CHUNK_SIZE,
    DEFAULT_DATA_FILE_SIZE_IN_MB,
    DEFAULT_VIDEO_FILE_SIZE_IN_MB,
    empty_info,
)
from hilrec.daemon.dataset.format.paths import (
    CODEBASE_VERSION,
    DATA_PATH,
    INFO_PATH,
    VIDEO_PATH,
    VIDEOS_DIR,
    data_files,
)
from hilrec.daemon.dataset.format.reader import column_to_numpy, load_info, read_parquet, read_parquet_schema
from hilrec.daemon.dataset.format.sidecar import sidecar_dir
from hilrec.daemon.dataset.repair.report import RepairReport
from hilrec.daemon.dataset.store import journal
from hilrec.daemon.dataset.video.codec import LeRobotInfo, VideoProbe, probe_video, video_info
from hilrec.daemon.errors import CorruptDatasetError
from hilrec.daemon.so101 import (
    ACTION_KEY,
    NUM_JOINTS,
    ROBOT_TYPE,
    STATE_KEY,
    camera_feature,
    position_feature,
)


@dataclass
class _Evidence:
    """What the files say about the dataset's fixed fields, whatever info.json says."""

    columns: list[tuple[str, str, list[int]]] | None = None  # (key, dtype, shape), file order
    rows_fps: int | None = None
    videos: dict[str, VideoProbe] = field(default_factory=dict)  # key -> the common probe
    video_fps: dict[str, int] = field(default_factory=dict)

    def fps(self) -> tuple[int | None, str]:
        rates = set(self.video_fps.values())
        if self.rows_fps is not None and (not rates or rates == {self.rows_fps}):
            return self.rows_fps, "the rows' timestamps" + (" and the videos" if rates else "")
        if self.rows_fps is None and len(rates) == 1:
            return rates.pop(), "the videos"
        return None, ""


def fixed_info(root: Path, report: RepairReport) -> dict[str, Any] | None:
    """info.json's fixed fields (totals as on disk), corrected by the evidence; None if unknown."""
    base: dict[str, Any] | None = None
    source = INFO_PATH
    try:
        base = load_info(root)
        unreadable = "" if _usable(base) else "no usable fps or features"
    except CorruptDatasetError as exc:
        unreadable = exc.problem
    if unreadable:
        base = None
        for candidate, name in _info_copies(root):
            base, source = candidate, name
            break
    evidence = _gather_evidence(root, base)
    if base is None:
        info = _info_from_evidence(evidence)
        if info is None:
            report.unrepaired.append(
                f"{INFO_PATH} is unreadable ({unreadable}) and no data file or video says what it held"
            )
            return None
        report.actions.append(
            f"{INFO_PATH} unreadable ({unreadable}): its fixed fields rebuilt from the data: features "
            f"from the data files' columns and the videos, fps {info['fps']} from {evidence.fps()[1]}; "
            "names of action/observation.state and robot_type as hilrec records them (SO-101); "
            "chunks_size and file size limits: the defaults"
        )
        return info
    if source != INFO_PATH:
        report.actions.append(f"{INFO_PATH} unreadable ({unreadable}): its fixed fields taken from {source}")
    return _reconcile(base, evidence, report)


def _usable(info: Mapping[str, Any]) -> bool:
    fps = info.get("fps")
    return (
        isinstance(fps, int)
        and not isinstance(fps, bool)
        and fps > 0
        and isinstance(info.get("features"), dict)
    )


def _info_copies(root: Path) -> Iterable[tuple[dict[str, Any], str]]:
    """Other copies of info.json: the journal's, a merge's old version, earlier damaged ones."""
    copy_ = journal.load_info_copy(root)
    if copy_ is not None and _usable(copy_):
        yield copy_, f"{journal.JOURNAL_DIR}/{journal.INFO_COPY}"
    paths = [journal.old_path(root / INFO_PATH)]
    paths += sorted(sidecar_dir(root).glob("damaged-*/meta/info.json"), reverse=True)
    paths += sorted(sidecar_dir(root).glob("damaged-*/replaced/meta/info.json"), reverse=True)
    for path in paths:
        try:
            info = read_json(path, what="info.json copy", if_missing=None)
        except CorruptDatasetError:
            continue
        if isinstance(info, dict) and _usable(info):
            yield info, path.relative_to(root).as_posix()


def _gather_evidence(root: Path, base: Mapping[str, Any] | None) -> _Evidence:
    evidence = _Evidence()
    parquets = [journal.episode_dir(root, i) / journal.EPISODE_DATA for i in journal.committed_dirs(root)]
    parquets += data_files(root)
    schemas: Counter[tuple[tuple[str, str, tuple[int, ...]], ...]] = Counter()
    for path in parquets:
        try:
            columns = _schema_columns(read_parquet_schema(path))
        except CorruptDatasetError:
            continue
        if columns:
            schemas[columns] += 1
    if schemas:
        best = schemas.most_common(1)[0][0]
        evidence.columns = [(k, d, list(s)) for k, d, s in best]
    for path in parquets:
        rate = _rows_fps(path)
        if rate is not None:
            evidence.rows_fps = rate
            break
    keys: dict[str, None] = dict.fromkeys(video_keys(base["features"]) if base else [])
    if (root / VIDEOS_DIR).is_dir():
        keys.update(dict.fromkeys(sorted(p.name for p in (root / VIDEOS_DIR).iterdir() if p.is_dir())))
    for index in journal.committed_dirs(root):
        keys.update(dict.fromkeys(sorted(p.stem for p in journal.episode_dir(root, index).glob("*.mp4"))))
    for key in keys:
        files = sorted((root / VIDEOS_DIR / key).glob("chunk-*/file-*.mp4"))
        files += [
            journal.episode_dir(root, i) / journal.video_file_name(key) for i in journal.committed_dirs(root)
        ]
        probes: list[VideoProbe] = []
        for path in files:
            if path.exists():
                try:
                    probes.append(probe_video(path))
                except CorruptDatasetError:
                    continue
        if not probes:
            continue
        shapes = Counter((p.height, p.width, int(p.fps) if p.fps else 0) for p in probes)
        height, width, rate = shapes.most_common(1)[0][0]
        evidence.videos[key] = next(p for p in probes if (p.height, p.width) == (height, width))
        if rate:
            evidence.video_fps[key] = rate
    return evidence


def _schema_columns(schema: pa.Schema) -> tuple[tuple[str, str, tuple[int, ...]], ...]:
    out = []
    for f in schema:
        shape: list[int] = []
        leaf = f.type
        while pa.types.is_fixed_size_list(leaf):
            shape.append(leaf.list_size)
            leaf = leaf.value_type
        try:
            dtype = np.dtype(leaf.to_pandas_dtype()).name
        except (NotImplementedError, TypeError):
            return ()
        out.append((f.name, dtype, tuple(shape or [1])))
    return tuple(out)


def _rows_fps(path: Path) -> int | None:
    try:
        table = read_parquet(path, columns=["timestamp", "frame_index"])
        ts = column_to_numpy(table.column("timestamp"))
        frames = column_to_numpy(table.column("frame_index"))
    except (CorruptDatasetError, KeyError, pa.ArrowException):
        return None
    steps = np.flatnonzero(frames == 1)
    if not len(steps) or not ts[steps[0]] > 0:
        return None
    rate = round(1.0 / float(ts[steps[0]]))
    ok = np.abs(ts.astype(np.float64) - frames / rate) <= TIMESTAMP_TOLERANCE_S
    return rate if rate > 0 and bool(ok.all()) else None


def _info_from_evidence(evidence: _Evidence) -> dict[str, Any] | None:
    rate, _ = evidence.fps()
    if evidence.columns is None or rate is None:
        return None
    features: dict[str, dict[str, Any]] = {}
    for key, dtype, shape in evidence.columns:
        if key not in DEFAULT_FEATURES:
            features[key] = _data_spec(key, dtype, shape, None)
    for key, probe in evidence.videos.items():
        features[key] = {**camera_feature(probe.height, probe.width), "info": video_info(probe)}
    features.update(copy.deepcopy(DEFAULT_FEATURES))
    so101 = all(features.get(k, {}).get("names") for k in (ACTION_KEY, STATE_KEY))
    return empty_info(fps=rate, features=features, robot_type=ROBOT_TYPE if so101 else None)


def _data_spec(key: str, dtype: str, shape: list[int], old: Any) -> dict[str, Any]:
    """The spec of a data column; its names from the old spec, else (a feature rebuilt from the
    data alone) the SO-101 joint names hilrec records action and observation.state with."""
    if isinstance(old, Mapping):
        names = old.get("names")
    elif key in (ACTION_KEY, STATE_KEY) and shape == [NUM_JOINTS] and dtype == "float32":
        names = position_feature()["names"]
    else:
        names = None
    if key in DEFAULT_FEATURES:
        return copy.deepcopy(DEFAULT_FEATURES[key])
    spec: dict[str, Any] = {"dtype": dtype, "shape": list(shape), "names": names}
    if isinstance(old, Mapping) and "info" in old:
        spec["info"] = old["info"]
    return spec


def _reconcile(base: Mapping[str, Any], evidence: _Evidence, report: RepairReport) -> dict[str, Any]:
    info = copy.deepcopy(dict(base))
    fixes: list[str] = []
    rate, source = evidence.fps()
    if rate is not None and info.get("fps") != rate:
        fixes.append(f"fps {info.get('fps')!r} -> {rate} (what {source} say)")
        info["fps"] = rate
    old: dict[str, Any] = dict(info["features"])
    features: dict[str, Any] = {}
    if evidence.columns is not None:
        declared_data = [k for k, s in old.items() if not (isinstance(s, dict) and is_video(s))]
        seen = {k for k, _, _ in evidence.columns}
        unmatched_old = [k for k in declared_data if k not in seen]
        unmatched_new = [c for c in evidence.columns if c[0] not in old]
        renames = (
            dict(zip(unmatched_old, unmatched_new, strict=False))
            if len(unmatched_old) == len(unmatched_new)
            else {}
        )
        by_key = {c[0]: c for c in evidence.columns}
        for key, spec in old.items():
            if isinstance(spec, dict) and is_video(spec):
                features[key] = spec
            elif key in by_key:
                _, dtype, shape = by_key[key]
                fixed = _data_spec(key, dtype, shape, spec)
                if (
                    not isinstance(spec, dict)
                    or spec.get("dtype") != dtype
                    or list(spec.get("shape") or []) != shape
                ):
                    fixes.append(
                        f"features.{key}: {_spec_text(spec)} -> {dtype} {shape} (the data files' column)"
                    )
                features[key] = fixed
            elif key in renames:
                new_key, dtype, shape = renames[key]
                fixes.append(f"feature {key!r} -> {new_key!r} (the data files' column)")
                features[new_key] = _data_spec(new_key, dtype, shape, spec)
            else:
                fixes.append(f"features.{key} dropped: no data file has that column")
        for key, dtype, shape in evidence.columns:
            if key not in features:
                fixes.append(f"features.{key} added: {dtype} {shape} (a column of the data files)")
                features[key] = _data_spec(key, dtype, shape, None)
    else:
        features = old
    declared_videos = [k for k, s in features.items() if isinstance(s, dict) and is_video(s)]
    missing = [k for k in declared_videos if k not in evidence.videos]
    extra = [k for k in evidence.videos if k not in features]
    renamed = dict(zip(missing, extra, strict=True)) if len(missing) == len(extra) else {}
    result: dict[str, Any] = {}
    for declared, spec in features.items():
        name: str = renamed.get(declared, declared)
        if name != declared:
            fixes.append(f"video feature {declared!r} -> {name!r} (the folder under videos/)")
        probe = evidence.videos.get(name)
        fixed = spec
        if probe is not None and isinstance(spec, dict) and is_video(spec):
            fixed = _fixed_video_spec(name, spec, probe, fixes)
        result[name] = fixed
    for key in extra:
        if key not in result:
            fixes.append(
                f"features.{key} added: video {evidence.videos[key].height}x{evidence.videos[key].width}"
            )
            result[key] = {**camera_feature(evidence.videos[key].height, evidence.videos[key].width)}
    defaults = {k: result.pop(k) for k in list(result) if k in DEFAULT_FEATURES}
    for key, spec in DEFAULT_FEATURES.items():
        if defaults.get(key) != spec:
            fixes.append(f"features.{key} reset to LeRobot's default")
        result[key] = copy.deepcopy(spec)
    info["features"] = result
    for name, want in (("codebase_version", CODEBASE_VERSION), ("data_path", DATA_PATH)):
        if info.get(name) != want:
            fixes.append(f"{name} {info.get(name)!r} -> {want!r}")
            info[name] = want
    want_video = VIDEO_PATH if video_keys(result) else None
    if info.get("video_path") != want_video:
        fixes.append(f"video_path {info.get('video_path')!r} -> {want_video!r}")
        info["video_path"] = want_video
    for name, default, kind in (
        ("chunks_size", DEFAULT_CHUNK_SIZE, int),
        ("data_files_size_in_mb", DEFAULT_DATA_FILE_SIZE_IN_MB, (int, float)),
        ("video_files_size_in_mb", DEFAULT_VIDEO_FILE_SIZE_IN_MB, (int, float)),
    ):
        value = info.get(name)
        if isinstance(value, bool) or not isinstance(value, kind) or value <= 0:
            fixes.append(f"{name} {value!r} -> {default} (the default)")
            info[name] = default
    if fixes:
        report.actions.append(f"{INFO_PATH}: " + "; ".join(fixes))
    return info


def _spec_text(spec: Any) -> str:
    return f"{spec.get('dtype')} {spec.get('shape')}" if isinstance(spec, dict) else repr(spec)


def _fixed_video_spec(key: str, spec: dict[str, Any], probe: VideoProbe, fixes: list[str]) -> dict[str, Any]:
    spec = copy.deepcopy(spec)
    shape = [probe.height, probe.width, 3]
    if list(spec.get("shape") or []) != shape:
        fixes.append(f"features.{key}.shape {spec.get('shape')} -> {shape} (the videos)")
        spec["shape"] = shape
    stored = spec.get("info")
    # A dataset re-spelled for another LeRobot (``hilrec edit for-lerobot``) keeps its spelling.
    want = video_info(probe, LeRobotInfo.of(stored) or LeRobotInfo.V0_4)
    if stored:
        names = ("video.height", "video.width", "video.fps", "video.codec")
        if not isinstance(stored, dict) or any(stored.get(n) != want[n] for n in names):
            fixes.append(f"features.{key}.info set from the videos")
            spec["info"] = want
    return spec
