"""hilrec record --sim --arms 2: the handover recorded with LeRobot's bi_so_follower columns,
replayed bit for bit, and loaded bit-equal by LeRobot 0.4.4 through a DataLoader."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hilrec.daemon.cli import main
from hilrec.daemon.dataset import load_episode_sidecar, load_info, read_episode
from hilrec.daemon.so101 import ACTION_KEY, BIMANUAL_ROBOT_TYPE, STATE_KEY, position_names
from hilrec.sim.replay import replay_check

# Real daemons, processes or kill loops: the slow tier (make test runs it; make test-fast does not).
pytestmark = pytest.mark.slow

EPISODES = 3  # the conftest's recording

CAMERA = "observation.images.front"


def test_columns_are_bi_so_followers(recorded: Path) -> None:
    info = load_info(recorded)
    assert info["robot_type"] == BIMANUAL_ROBOT_TYPE
    for key in (ACTION_KEY, STATE_KEY):
        spec = info["features"][key]
        assert spec["dtype"] == "float32" and list(spec["shape"]) == [12]
        assert spec["names"] == position_names(2)
        assert spec["names"][0] == "left_shoulder_pan.pos" and spec["names"][-1] == "right_gripper.pos"
    assert info["features"][CAMERA]["dtype"] == "video"
    meta, arrays = load_episode_sidecar(recorded, 0)
    assert meta is not None and meta["success"] is True
    assert (
        meta["sim"]["operator_phase_starts"]["right_reach"]
        > meta["sim"]["operator_phase_starts"]["left_home"]
    )
    assert "initial_state" in arrays


def test_check_replay_passes_bit_for_bit_and_names_the_arms(recorded: Path, capsys: Any) -> None:
    assert main(["check", "--replay", str(recorded)]) == 0
    assert "replay PASSED: 3 passed" in capsys.readouterr().out
    report = replay_check(recorded)
    assert report.passed
    joints = list(report.episodes[0].max_error_per_joint)
    assert joints == [n.removesuffix(".pos") for n in position_names(2)]


def test_replay_names_the_arm_whose_rows_differ(recorded: Path, tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    copy = tmp_path / "copy"
    shutil.copytree(recorded, copy)
    data = next((copy / "data").rglob("*.parquet"))
    table = pq.read_table(data)
    state = np.stack(table.column(STATE_KEY).to_numpy(zero_copy_only=False)).astype(np.float32)
    state[5, 8] += 0.5  # right_elbow_flex of one row
    column = table.schema.get_field_index(STATE_KEY)
    import pyarrow as pa

    table = table.set_column(
        column, table.schema.field(column), pa.array(list(state), type=table.schema.field(column).type)
    )
    pq.write_table(table, data)
    result = replay_check(copy, episodes=[0]).episodes[0]
    assert not result.passed
    worst = {j: e for j, e in result.max_error_per_joint.items() if e > 0}
    assert list(worst) == ["right_elbow_flex"]
    assert result.max_error_per_arm == {"left": 0.0, "right": pytest.approx(0.5, abs=1e-3)}
    text = result.format_text()
    assert "right_elbow_flex" in text and "per arm: left arm exact (max 0), right arm differs" in text
    assert result.to_dict()["max_error_per_arm"]["left"] == 0.0


def test_lerobot_loads_it_bit_equal_through_a_dataloader(recorded: Path) -> None:
    import torch
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    dataset = LeRobotDataset(f"hilrec/{recorded.name}", root=recorded, video_backend="pyav")
    assert dataset.meta.robot_type == BIMANUAL_ROBOT_TYPE
    assert dataset.meta.features[STATE_KEY]["names"] == position_names(2)
    ours = {
        key: np.concatenate([read_episode(recorded, e, [key])[key] for e in range(EPISODES)])
        for key in (ACTION_KEY, STATE_KEY)
    }
    loader = torch.utils.data.DataLoader(dataset, batch_size=64, shuffle=False, num_workers=0)
    theirs: dict[str, list[np.ndarray]] = {ACTION_KEY: [], STATE_KEY: []}
    for batch in loader:
        for key, batches in theirs.items():
            batches.append(batch[key].numpy())
        assert batch[CAMERA].shape[1:] == (3, 48, 64)
    for key, batches in theirs.items():
        got = np.concatenate(batches)
        assert got.dtype == np.float32 and got.shape == ours[key].shape == (len(dataset), 12)
        assert got.tobytes() == ours[key].tobytes(), key


def test_record_refuses_a_one_arm_camera_name_in_the_two_arm_scene(tmp_path: Path, capsys: Any) -> None:
    argv = ["record", "--sim", "--arms", "2", "--episodes", "1", "--cameras", "wrist"]
    assert main([*argv, "--root", str(tmp_path / "x"), "--no-progress"]) != 0
    err = capsys.readouterr().err
    assert "unknown camera wrist" in err and "left_wrist" in err


def test_dataset_sidecar_says_it_is_the_two_arm_world(recorded: Path) -> None:
    sidecar = json.loads((recorded / "hilrec" / "dataset.json").read_text())
    assert sidecar["sim"]["operator"]["name"] == "hilrec.sim.bimanual_operator.BimanualOperator"
    assert "bimanual_operator.py" in sidecar["sim"]["operator"]["source"]["files"]
    assert sidecar["sim"]["scene"]["config"]["arm_spacing"] == 0.5
    assert sidecar["units"]["arm_prefixes"] == ["left_", "right_"]
