"""The dataset's public surface: what the rest of hilrec imports from the format's rooms.

The rooms are layers of their own (ARCHITECTURE.md): ``video`` below ``format`` below ``store``
below ``check`` below ``repair`` below ``writer``. Code outside them imports only from here (a test
holds it to that), so a room's inside can change without touching its users. Names resolve on
first use, so ``import hilrec.daemon.dataset`` costs nothing until a name is asked for.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# name -> (module, attribute); an attribute of None is the module itself.
_WHERE: dict[str, tuple[str, str | None]] = {
    "checks_data": ("hilrec.daemon.dataset.check.data", None),
    "checks_rows": ("hilrec.daemon.dataset.check.rows", None),
    "checks_stats": ("hilrec.daemon.dataset.check.stats", None),
    "checks_video": ("hilrec.daemon.dataset.check.video", None),
    "CheckReport": ("hilrec.daemon.dataset.check.checker", "CheckReport"),
    "check_dataset": ("hilrec.daemon.dataset.check.checker", "check_dataset"),
    "classified": ("hilrec.daemon.dataset.check.checker", "classified"),
    "Findings": ("hilrec.daemon.dataset.check.common", "Findings"),
    "Severity": ("hilrec.daemon.dataset.check.common", "Severity"),
    "reader": ("hilrec.daemon.dataset.format.reader", None),
    "DEFAULT_FEATURES": ("hilrec.daemon.dataset.format.features", "DEFAULT_FEATURES"),
    "data_keys": ("hilrec.daemon.dataset.format.features", "data_keys"),
    "video_keys": ("hilrec.daemon.dataset.format.features", "video_keys"),
    "LATE_BUDGET_S": ("hilrec.daemon.dataset.format.frames", "LATE_BUDGET_S"),
    "EpisodeVerdict": ("hilrec.daemon.dataset.format.frames", "EpisodeVerdict"),
    "FrameFlag": ("hilrec.daemon.dataset.format.frames", "FrameFlag"),
    "flag_names": ("hilrec.daemon.dataset.format.frames", "flag_names"),
    "recorded_body_mode": ("hilrec.daemon.dataset.format.joint_units", "recorded_body_mode"),
    "PARQUET_OPTIONS": ("hilrec.daemon.dataset.format.layout", "PARQUET_OPTIONS"),
    "data_schema": ("hilrec.daemon.dataset.format.layout", "data_schema"),
    "episodes_table": ("hilrec.daemon.dataset.format.layout", "episodes_table"),
    "meta_json_bytes": ("hilrec.daemon.dataset.format.layout", "meta_json_bytes"),
    "tasks_table": ("hilrec.daemon.dataset.format.layout", "tasks_table"),
    "FileRef": ("hilrec.daemon.dataset.format.paths", "FileRef"),
    "INFO_PATH": ("hilrec.daemon.dataset.format.paths", "INFO_PATH"),
    "STATS_PATH": ("hilrec.daemon.dataset.format.paths", "STATS_PATH"),
    "TASKS_PATH": ("hilrec.daemon.dataset.format.paths", "TASKS_PATH"),
    "data_file_path": ("hilrec.daemon.dataset.format.paths", "data_file_path"),
    "data_path": ("hilrec.daemon.dataset.format.paths", "data_path"),
    "episodes_path": ("hilrec.daemon.dataset.format.paths", "episodes_path"),
    "video_file_path": ("hilrec.daemon.dataset.format.paths", "video_file_path"),
    "video_path": ("hilrec.daemon.dataset.format.paths", "video_path"),
    "column_to_numpy": ("hilrec.daemon.dataset.format.reader", "column_to_numpy"),
    "decoded_frames": ("hilrec.daemon.dataset.format.reader", "decoded_frames"),
    "load_episodes": ("hilrec.daemon.dataset.format.reader", "load_episodes"),
    "load_info": ("hilrec.daemon.dataset.format.reader", "load_info"),
    "load_stats": ("hilrec.daemon.dataset.format.reader", "load_stats"),
    "load_task_list": ("hilrec.daemon.dataset.format.reader", "load_task_list"),
    "load_tasks": ("hilrec.daemon.dataset.format.reader", "load_tasks"),
    "read_episode": ("hilrec.daemon.dataset.format.reader", "read_episode"),
    "read_episode_frames": ("hilrec.daemon.dataset.format.reader", "read_episode_frames"),
    "read_parquet": ("hilrec.daemon.dataset.format.reader", "read_parquet"),
    "episode_json_path": ("hilrec.daemon.dataset.format.sidecar", "episode_json_path"),
    "episode_npz_path": ("hilrec.daemon.dataset.format.sidecar", "episode_npz_path"),
    "EDIT_INTENT_PATH": ("hilrec.daemon.dataset.format.edit_intent", "EDIT_INTENT_PATH"),
    "IntentState": ("hilrec.daemon.dataset.format.edit_intent", "IntentState"),
    "describe_intent": ("hilrec.daemon.dataset.format.edit_intent", "describe_intent"),
    "load_edit_intent": ("hilrec.daemon.dataset.format.edit_intent", "load_edit_intent"),
    "remove_edit_intent": ("hilrec.daemon.dataset.format.edit_intent", "remove_edit_intent"),
    "write_edit_intent": ("hilrec.daemon.dataset.format.edit_intent", "write_edit_intent"),
    "load_dataset_sidecar": ("hilrec.daemon.dataset.format.sidecar", "load_dataset_sidecar"),
    "load_episode_sidecar": ("hilrec.daemon.dataset.format.sidecar", "load_episode_sidecar"),
    "sidecar_dir": ("hilrec.daemon.dataset.format.sidecar", "sidecar_dir"),
    "stored_episode_sidecars": ("hilrec.daemon.dataset.format.sidecar", "stored_episode_sidecars"),
    "update_dataset_sidecar": ("hilrec.daemon.dataset.format.sidecar", "update_dataset_sidecar"),
    "FrameSink": ("hilrec.daemon.dataset.format.sink", "FrameSink"),
    "DatasetStats": ("hilrec.daemon.dataset.format.stats", "DatasetStats"),
    "ImageSampler": ("hilrec.daemon.dataset.format.stats", "ImageSampler"),
    "aggregate_stats": ("hilrec.daemon.dataset.format.stats", "aggregate_stats"),
    "compute_episode_stats": ("hilrec.daemon.dataset.format.stats", "compute_episode_stats"),
    "flatten_episode_stats": ("hilrec.daemon.dataset.format.stats", "flatten_episode_stats"),
    "stats_to_json": ("hilrec.daemon.dataset.format.stats", "stats_to_json"),
    "journal": ("hilrec.daemon.dataset.store.journal", None),
    "LOCK_NAME": ("hilrec.daemon.dataset.store.rootlock", "LOCK_NAME"),
    "RootLock": ("hilrec.daemon.dataset.store.rootlock", "RootLock"),
    "holds_nothing": ("hilrec.daemon.dataset.store.rootlock", "holds_nothing"),
    "holds_only_edit_files": ("hilrec.daemon.dataset.store.rootlock", "holds_only_edit_files"),
    "finishing": ("hilrec.daemon.dataset.store.spilled", "finishing"),
    "open_av": ("hilrec.daemon.dataset.video.avlog", "open_av"),
    "LeRobotInfo": ("hilrec.daemon.dataset.video.codec", "LeRobotInfo"),
    "Segment": ("hilrec.daemon.dataset.video.codec", "Segment"),
    "StreamEncoder": ("hilrec.daemon.dataset.video.codec", "StreamEncoder"),
    "VideoSettings": ("hilrec.daemon.dataset.video.codec", "VideoSettings"),
    "concat_segments": ("hilrec.daemon.dataset.video.codec", "concat_segments"),
    "Adopter": ("hilrec.daemon.dataset.writer.adopt", "Adopter"),
    "EpisodeBundle": ("hilrec.daemon.dataset.writer.adopt", "EpisodeBundle"),
    "bundle_episode": ("hilrec.daemon.dataset.writer.adopt", "bundle_episode"),
    "sigint_deferred": ("hilrec.daemon.dataset.writer.adopt", "sigint_deferred"),
    "sigint_noted": ("hilrec.daemon.dataset.writer.adopt", "sigint_noted"),
    "DEFAULT_SPILL_BYTES_LIMIT": ("hilrec.daemon.dataset.writer.backlog", "DEFAULT_SPILL_BYTES_LIMIT"),
    "VideoEncoder": ("hilrec.daemon.dataset.writer.backlog", "VideoEncoder"),
    "DatasetWriter": ("hilrec.daemon.dataset.writer.dataset_writer", "DatasetWriter"),
    "EXIT_DROPPED": ("hilrec.daemon.dataset.repair.report", "EXIT_DROPPED"),
    "EXIT_NOT_REPAIRED": ("hilrec.daemon.dataset.repair.report", "EXIT_NOT_REPAIRED"),
    "EXIT_OK": ("hilrec.daemon.dataset.repair.report", "EXIT_OK"),
    "format_report": ("hilrec.daemon.dataset.repair.report", "format_report"),
    "Regenerate": ("hilrec.daemon.dataset.repair.rebuild", "Regenerate"),
    "repair_dataset": ("hilrec.daemon.dataset.repair.recover", "repair"),
    "save_crashed": ("hilrec.daemon.dataset.writer.crashed", "save_crashed"),
    "set_aside_crashed": ("hilrec.daemon.dataset.writer.crashed", "set_aside"),
}

__all__ = [
    "DEFAULT_FEATURES",
    "DEFAULT_SPILL_BYTES_LIMIT",
    "EDIT_INTENT_PATH",
    "EXIT_DROPPED",
    "EXIT_NOT_REPAIRED",
    "EXIT_OK",
    "INFO_PATH",
    "LATE_BUDGET_S",
    "LOCK_NAME",
    "PARQUET_OPTIONS",
    "STATS_PATH",
    "TASKS_PATH",
    "Adopter",
    "CheckReport",
    "DatasetStats",
    "DatasetWriter",
    "EpisodeBundle",
    "EpisodeVerdict",
    "FileRef",
    "Findings",
    "FrameFlag",
    "FrameSink",
    "ImageSampler",
    "IntentState",
    "LeRobotInfo",
    "Regenerate",
    "RootLock",
    "Segment",
    "Severity",
    "StreamEncoder",
    "VideoEncoder",
    "VideoSettings",
    "aggregate_stats",
    "bundle_episode",
    "check_dataset",
    "checks_data",
    "checks_rows",
    "checks_stats",
    "checks_video",
    "classified",
    "column_to_numpy",
    "compute_episode_stats",
    "concat_segments",
    "data_file_path",
    "data_keys",
    "data_path",
    "data_schema",
    "decoded_frames",
    "describe_intent",
    "episode_json_path",
    "episode_npz_path",
    "episodes_path",
    "episodes_table",
    "finishing",
    "flag_names",
    "flatten_episode_stats",
    "format_report",
    "holds_nothing",
    "holds_only_edit_files",
    "journal",
    "load_dataset_sidecar",
    "load_edit_intent",
    "load_episode_sidecar",
    "load_episodes",
    "load_info",
    "load_stats",
    "load_task_list",
    "load_tasks",
    "meta_json_bytes",
    "open_av",
    "read_episode",
    "read_episode_frames",
    "read_parquet",
    "reader",
    "recorded_body_mode",
    "remove_edit_intent",
    "repair_dataset",
    "save_crashed",
    "set_aside_crashed",
    "sidecar_dir",
    "sigint_deferred",
    "sigint_noted",
    "stats_to_json",
    "stored_episode_sidecars",
    "tasks_table",
    "update_dataset_sidecar",
    "video_file_path",
    "video_keys",
    "video_path",
    "write_edit_intent",
]

if TYPE_CHECKING:
    from hilrec.daemon.dataset.check import data as checks_data
    from hilrec.daemon.dataset.check import rows as checks_rows
    from hilrec.daemon.dataset.check import stats as checks_stats
    from hilrec.daemon.dataset.check import video as checks_video
    from hilrec.daemon.dataset.check.checker import CheckReport as CheckReport
    from hilrec.daemon.dataset.check.checker import check_dataset as check_dataset
    from hilrec.daemon.dataset.check.checker import classified as classified
    from hilrec.daemon.dataset.check.common import Findings as Findings
    from hilrec.daemon.dataset.check.common import Severity as Severity
    from hilrec.daemon.dataset.format import reader as reader
    from hilrec.daemon.dataset.format.edit_intent import EDIT_INTENT_PATH as EDIT_INTENT_PATH
    from hilrec.daemon.dataset.format.edit_intent import IntentState as IntentState
    from hilrec.daemon.dataset.format.edit_intent import describe_intent as describe_intent
    from hilrec.daemon.dataset.format.edit_intent import load_edit_intent as load_edit_intent
    from hilrec.daemon.dataset.format.edit_intent import remove_edit_intent as remove_edit_intent
    from hilrec.daemon.dataset.format.edit_intent import write_edit_intent as write_edit_intent
    from hilrec.daemon.dataset.format.features import DEFAULT_FEATURES as DEFAULT_FEATURES
    from hilrec.daemon.dataset.format.features import data_keys as data_keys
    from hilrec.daemon.dataset.format.features import video_keys as video_keys
    from hilrec.daemon.dataset.format.frames import LATE_BUDGET_S as LATE_BUDGET_S
    from hilrec.daemon.dataset.format.frames import EpisodeVerdict as EpisodeVerdict
    from hilrec.daemon.dataset.format.frames import FrameFlag as FrameFlag
    from hilrec.daemon.dataset.format.frames import flag_names as flag_names
    from hilrec.daemon.dataset.format.joint_units import recorded_body_mode as recorded_body_mode
    from hilrec.daemon.dataset.format.layout import PARQUET_OPTIONS as PARQUET_OPTIONS
    from hilrec.daemon.dataset.format.layout import data_schema as data_schema
    from hilrec.daemon.dataset.format.layout import episodes_table as episodes_table
    from hilrec.daemon.dataset.format.layout import meta_json_bytes as meta_json_bytes
    from hilrec.daemon.dataset.format.layout import tasks_table as tasks_table
    from hilrec.daemon.dataset.format.paths import INFO_PATH as INFO_PATH
    from hilrec.daemon.dataset.format.paths import STATS_PATH as STATS_PATH
    from hilrec.daemon.dataset.format.paths import TASKS_PATH as TASKS_PATH
    from hilrec.daemon.dataset.format.paths import FileRef as FileRef
    from hilrec.daemon.dataset.format.paths import data_file_path as data_file_path
    from hilrec.daemon.dataset.format.paths import data_path as data_path
    from hilrec.daemon.dataset.format.paths import episodes_path as episodes_path
    from hilrec.daemon.dataset.format.paths import video_file_path as video_file_path
    from hilrec.daemon.dataset.format.paths import video_path as video_path
    from hilrec.daemon.dataset.format.reader import column_to_numpy as column_to_numpy
    from hilrec.daemon.dataset.format.reader import decoded_frames as decoded_frames
    from hilrec.daemon.dataset.format.reader import load_episodes as load_episodes
    from hilrec.daemon.dataset.format.reader import load_info as load_info
    from hilrec.daemon.dataset.format.reader import load_stats as load_stats
    from hilrec.daemon.dataset.format.reader import load_task_list as load_task_list
    from hilrec.daemon.dataset.format.reader import load_tasks as load_tasks
    from hilrec.daemon.dataset.format.reader import read_episode as read_episode
    from hilrec.daemon.dataset.format.reader import read_episode_frames as read_episode_frames
    from hilrec.daemon.dataset.format.reader import read_parquet as read_parquet
    from hilrec.daemon.dataset.format.sidecar import episode_json_path as episode_json_path
    from hilrec.daemon.dataset.format.sidecar import episode_npz_path as episode_npz_path
    from hilrec.daemon.dataset.format.sidecar import load_dataset_sidecar as load_dataset_sidecar
    from hilrec.daemon.dataset.format.sidecar import load_episode_sidecar as load_episode_sidecar
    from hilrec.daemon.dataset.format.sidecar import sidecar_dir as sidecar_dir
    from hilrec.daemon.dataset.format.sidecar import stored_episode_sidecars as stored_episode_sidecars
    from hilrec.daemon.dataset.format.sidecar import update_dataset_sidecar as update_dataset_sidecar
    from hilrec.daemon.dataset.format.sink import FrameSink as FrameSink
    from hilrec.daemon.dataset.format.stats import DatasetStats as DatasetStats
    from hilrec.daemon.dataset.format.stats import ImageSampler as ImageSampler
    from hilrec.daemon.dataset.format.stats import aggregate_stats as aggregate_stats
    from hilrec.daemon.dataset.format.stats import compute_episode_stats as compute_episode_stats
    from hilrec.daemon.dataset.format.stats import flatten_episode_stats as flatten_episode_stats
    from hilrec.daemon.dataset.format.stats import stats_to_json as stats_to_json
    from hilrec.daemon.dataset.repair.rebuild import Regenerate as Regenerate
    from hilrec.daemon.dataset.repair.recover import repair as repair_dataset
    from hilrec.daemon.dataset.repair.report import EXIT_DROPPED as EXIT_DROPPED
    from hilrec.daemon.dataset.repair.report import EXIT_NOT_REPAIRED as EXIT_NOT_REPAIRED
    from hilrec.daemon.dataset.repair.report import EXIT_OK as EXIT_OK
    from hilrec.daemon.dataset.repair.report import format_report as format_report
    from hilrec.daemon.dataset.store import journal as journal
    from hilrec.daemon.dataset.store.rootlock import LOCK_NAME as LOCK_NAME
    from hilrec.daemon.dataset.store.rootlock import RootLock as RootLock
    from hilrec.daemon.dataset.store.rootlock import holds_nothing as holds_nothing
    from hilrec.daemon.dataset.store.rootlock import holds_only_edit_files as holds_only_edit_files
    from hilrec.daemon.dataset.store.spilled import finishing as finishing
    from hilrec.daemon.dataset.video.avlog import open_av as open_av
    from hilrec.daemon.dataset.video.codec import LeRobotInfo as LeRobotInfo
    from hilrec.daemon.dataset.video.codec import Segment as Segment
    from hilrec.daemon.dataset.video.codec import StreamEncoder as StreamEncoder
    from hilrec.daemon.dataset.video.codec import VideoSettings as VideoSettings
    from hilrec.daemon.dataset.video.codec import concat_segments as concat_segments
    from hilrec.daemon.dataset.writer.adopt import Adopter as Adopter
    from hilrec.daemon.dataset.writer.adopt import EpisodeBundle as EpisodeBundle
    from hilrec.daemon.dataset.writer.adopt import bundle_episode as bundle_episode
    from hilrec.daemon.dataset.writer.adopt import sigint_deferred as sigint_deferred
    from hilrec.daemon.dataset.writer.adopt import sigint_noted as sigint_noted
    from hilrec.daemon.dataset.writer.backlog import DEFAULT_SPILL_BYTES_LIMIT as DEFAULT_SPILL_BYTES_LIMIT
    from hilrec.daemon.dataset.writer.backlog import VideoEncoder as VideoEncoder
    from hilrec.daemon.dataset.writer.crashed import save_crashed as save_crashed
    from hilrec.daemon.dataset.writer.crashed import set_aside as set_aside_crashed
    from hilrec.daemon.dataset.writer.dataset_writer import DatasetWriter as DatasetWriter


def __getattr__(name: str) -> Any:
    try:
        module, attribute = _WHERE[name]
    except KeyError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    value = importlib.import_module(module)
    if attribute is not None:
        value = getattr(value, attribute)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
