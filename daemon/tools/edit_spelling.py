"""Which LeRobot's spelling a dataset's video ``info`` follows, and ``hilrec edit for-lerobot``.

LeRobot merges (``aggregate_datasets``) only datasets whose features agree, ``info`` included:
0.4.4 compares the whole feature, 0.6.1 all of it but the encoder settings
(``VIDEO_ENCODER_INFO_KEYS``: ``video.g``, ``video.crf``, ...). They spell the depth flag
differently (:class:`~hilrec.daemon.dataset.video.codec.LeRobotInfo`): 0.4.4 ``video.is_depth_map``,
0.6.1 ``is_depth_map``. So a dataset merges with the datasets of one LeRobot or the other, never
both, and the user, who merges hilrec's recordings with datasets of the LeRobot they use, picks:
hilrec writes 0.4.4's spelling (the LeRobot it is built against), ``hilrec edit for-lerobot ROOT
--version 0.6`` re-spells a dataset for 0.6 (and back), and ``hilrec edit merge`` reads both,
writing its result in the first input's spelling or the one ``--lerobot`` names.

Re-spelling for 0.4 also drops 0.6.1's encoder keys: 0.4.4 writes none, and compares all keys.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

from hilrec.daemon.dataset import LeRobotInfo
from hilrec.daemon.tools.edit_run import Options, hook_of, run_edit
from hilrec.daemon.tools.edit_source import EditReport, Pick, Source
from hilrec.daemon.tools.edit_write import write_dataset

# LeRobot 0.6.1's lerobot.configs.video.VIDEO_ENCODER_INFO_KEYS: ignored by its merge.
ENCODER_INFO_KEYS: Final[frozenset[str]] = frozenset(
    f"video.{name}" for name in ("g", "crf", "preset", "fast_decode", "extra_options", "video_backend")
)
DEPTH_KEYS: Final[frozenset[str]] = frozenset(s.depth_key for s in LeRobotInfo)


def respelled_info(info: Mapping[str, Any], spelling: LeRobotInfo) -> dict[str, Any]:
    """``info`` with its depth flag under ``spelling``'s key, where that LeRobot writes it."""
    depth = any(bool(info.get(k)) for k in DEPTH_KEYS)
    kept = {
        k: v
        for k, v in info.items()
        if k not in DEPTH_KEYS and not (spelling == LeRobotInfo.V0_4 and k in ENCODER_INFO_KEYS)
    }
    if spelling == LeRobotInfo.V0_6:
        return {**kept, spelling.depth_key: depth}
    out: dict[str, Any] = {}
    for key, value in kept.items():
        out[key] = value
        if key == "video.pix_fmt":
            out[spelling.depth_key] = depth
    out.setdefault(spelling.depth_key, depth)
    return out


def respelled_features(features: Mapping[str, Any], spelling: LeRobotInfo) -> dict[str, Any]:
    out = copy.deepcopy(dict(features))
    for spec in out.values():
        if spec.get("dtype") == "video" and isinstance(spec.get("info"), dict):
            spec["info"] = respelled_info(spec["info"], spelling)
    return out


def spelling_of(features: Mapping[str, Any]) -> LeRobotInfo | None:
    """The spelling of the first video feature that has a depth flag, None where none has."""
    for spec in features.values():
        if spec.get("dtype") == "video":
            found = LeRobotInfo.of(spec.get("info"))
            if found is not None:
                return found
    return None


def merge_view(spec: Mapping[str, Any]) -> dict[str, Any]:
    """What of a feature must agree for a merge: all but the depth flag's spelling and the
    encoder settings (as LeRobot 0.6.1's ``features_equal_for_merge``)."""
    out = dict(spec)
    info = out.get("info")
    if spec.get("dtype") == "video" and isinstance(info, dict):
        out["info"] = {
            k: v for k, v in respelled_info(info, LeRobotInfo.V0_6).items() if k not in ENCODER_INFO_KEYS
        }
    return out


def merged_features(
    sources: Sequence[Mapping[str, Any]], spelling: LeRobotInfo | None = None
) -> dict[str, Any]:
    """The result's features: the first input's, each encoder setting kept where every input
    agrees and emptied otherwise (as LeRobot 0.6.1's merge does), in ``spelling`` (default: the
    first input's)."""
    first = copy.deepcopy(dict(sources[0]))
    for key, spec in first.items():
        info = spec.get("info")
        if spec.get("dtype") != "video" or not isinstance(info, dict):
            continue
        others = [dict(s[key].get("info") or {}) for s in sources[1:]]
        for name in ENCODER_INFO_KEYS & set().union(info, *others):
            values = [info.get(name), *(o.get(name) for o in others)]
            if any(v != values[0] for v in values[1:]):
                info[name] = {} if name == "video.extra_options" else None
    chosen = spelling or spelling_of(first)
    return respelled_features(first, chosen) if chosen is not None else first


def for_lerobot(
    root: Path, version: LeRobotInfo, *, out: Path | None = None, options: Options | None = None
) -> EditReport:
    """Re-spell ``root``'s video ``info`` for LeRobot ``version``'s merge; rows, videos and
    stats as they are (the files are linked)."""

    def build(sources: Sequence[Source], result: Path, report: EditReport) -> None:
        source = sources[0]
        before = spelling_of(source.features)
        features = respelled_features(source.features, version)
        dropped = sorted(
            {k for spec in source.features.values() for k in (spec.get("info") or {})}
            - {k for spec in features.values() for k in (spec.get("info") or {})}
            - DEPTH_KEYS
        )
        report.notes.append(
            f"video info: {'LeRobot ' + before if before else 'no depth flag'} -> LeRobot {version}'s "
            f"spelling ('{version.depth_key}')"
            + (f"; dropped {dropped}, which LeRobot 0.4 does not write" if dropped else "")
        )
        if features == source.features:
            report.notes.append("nothing to change: no video info, or already in that spelling")
        write_dataset(
            result,
            sources,
            [Pick(0, i) for i in range(len(source.episodes))],
            features=features,
            command="for-lerobot",
            report=report,
            hook=hook_of(options),
        )

    return run_edit("for-lerobot", [root], out or root, build, options)
