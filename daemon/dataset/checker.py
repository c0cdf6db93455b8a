"""``hilrec check``: is this directory a LeRobot v3.0 dataset that says exactly what it holds?

The checker reads (never writes) a dataset and reports every rule it breaks. The rules are data,
in :data:`RULES`; each failure names the rule, the file (relative to the root), the episode and the
key it is about, so a person can go straight to the broken row.

The checks run in order of dependence: ``info.json`` first (nothing else can be read without it),
then tasks and episode metadata, then the data files, then stats and videos. A file that cannot be
read is itself a failure (``file.unreadable``), and the checks that needed it are skipped rather
than reported a second time.

It accepts what LeRobot 0.4.4 writes and what the native writer writes; where the two differ
legitimately (float32 stats from LeRobot, float64 from us; histogram quantile estimates; LeRobot's
uint8-overflowed image std) the tolerance is chosen so that both pass and a wrong number does not.
See :mod:`.checks_stats` and :mod:`.checks_video` for the numbers.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final

from hilrec.daemon.dataset import checks_data, checks_rows, checks_stats, checks_video
from hilrec.daemon.dataset.checks_common import Contents, Failure, Findings

# rule -> what it demands. The order is the order of the report.
RULES: Final[dict[str, str]] = {
    "file.unreadable": "every metadata, data and video file named by the dataset can be read",
    "info.fields": "info.json has the fields of LeRobot v3.0 with valid values and the five default columns",
    "info.totals": "total_episodes, total_frames, total_tasks and splits match the files",
    "schema.columns": "each data file has exactly one column per non-video feature",
    "schema.dtype": "each column stores the dtype info.json declares",
    "schema.shape": "each row of a column holds the shape info.json declares, no nulls",
    "data.finite": "float columns hold no NaN or infinity",
    "index.contiguous": "index runs 0 .. total_frames-1 through the data files in order",
    "episode_index.contiguous": "episodes are 0 .. N-1, each a single block of rows with a metadata row",
    "frame_index.contiguous": "frame_index runs 0 .. length-1 in every episode",
    "timestamp.grid": "timestamp is frame_index / fps within 1e-4 s",
    "tasks.table": "tasks.parquet maps task_index 0 .. T-1 to distinct non-empty strings",
    "tasks.unknown": "every row's task_index is in tasks.parquet",
    "tasks.episode": "an episode's metadata lists exactly the tasks its rows use",
    "episodes.range": "length, dataset_from/to_index and data chunk/file of each episode match "
    "its rows; the metadata row sits in the file it names",
    "video.file": "each episode's video file exists and its stream can be demuxed and decoded",
    "video.range": "from/to timestamps: to - from = length / fps, no overlap inside a file",
    "video.frame_count": "an episode's span of its video holds exactly `length` frames",
    "video.timestamps": "frame i of an episode is presented at from_timestamp + i / fps "
    "(within 1e-4 s, LeRobot's tolerance)",
    "video.fps": "the stream's frame rate and info's video.fps equal info fps",
    "video.size": "the stream's frame size equals the feature's [height, width] (and info's)",
    "stats.episode": "each episode's stats/* columns match its data",
    "stats.dataset": "meta/stats.json is the aggregate of the episodes' stats",
}


@dataclass
class CheckReport:
    root: Path
    failures: list[Failure] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)
    replay: Any = None  # a hilrec.sim.replay ReplayReport when --replay ran

    @property
    def passed(self) -> bool:
        return not self.failures and (self.replay is None or bool(self.replay.passed))

    def rules_failed(self) -> set[str]:
        return {f.rule for f in self.failures}

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "root": str(self.root),
            "passed": self.passed,
            "summary": self.summary,
            "rules": RULES,
            "failures": [asdict(f) for f in self.failures],
        }
        if self.replay is not None:
            out["replay"] = self.replay.to_dict()
        return out

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, default=str)

    def format_text(self) -> str:
        s = self.summary
        head = (
            f"hilrec check {self.root}: {s.get('episodes', '?')} episodes, "
            f"{s.get('frames', '?')} frames, fps {s.get('fps', '?')}, "
            f"video keys {s.get('video_keys', [])}"
        )
        lines = [head]
        if self.failures:
            lines.append(f"FAILED: {len(self.failures)} problem(s) in {len(self.rules_failed())} rule(s)")
            order = {rule: i for i, rule in enumerate(RULES)}
            for failure in sorted(
                self.failures,
                key=lambda f: (order.get(f.rule, 99), f.file, -1 if f.episode is None else f.episode),
            ):
                lines.append("  " + failure.format())
        else:
            lines.append(f"data checks: all {len(RULES)} rules passed")
        if self.replay is not None:
            lines.append(self.replay.format_text())
        lines.append("PASSED" if self.passed else "FAILED")
        return "\n".join(lines)


def check_dataset(root: str | Path, *, decode_video: bool = True) -> CheckReport:
    """Check the dataset at ``root`` against every rule in :data:`RULES`.

    ``decode_video`` also decodes each episode's sampled frames to check the image stats; without
    it the videos are only demuxed (frame counts, timestamps, size and rate are still checked).
    """
    root = Path(root)
    findings = Findings(root)
    report = CheckReport(root=root)
    contents = checks_data.load_contents(root, findings)
    if contents is not None:
        checks_rows.check_rows(contents, findings)
        checks_stats.check_episode_stats(contents, findings)
        checks_stats.check_image_feature_stats(contents, findings)
        checks_stats.check_dataset_stats(contents, findings)
        checks_video.check_videos(contents, findings, decode=decode_video)
    report.failures = list(findings.failures)
    report.summary = _summary(contents)
    return report


def _summary(contents: Contents | None) -> dict[str, Any]:
    if contents is None:
        return {}
    return {
        "fps": contents.fps,
        "episodes": len(contents.episodes),
        "frames": sum(r.length for r in contents.rows.values()),
        "tasks": len(contents.tasks or {}),
        "video_keys": contents.video_keys,
        "data_files": len(contents.data_files),
    }
