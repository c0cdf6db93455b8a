"""``hilrec export --format robomimic``: read back with h5py and with robomimic's own dataset class."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest

from hilrec.daemon.dataset.format.reader import load_episodes, read_episode, read_episode_frames
from hilrec.daemon.dataset.format.sidecar import load_episode_sidecar
from hilrec.daemon.errors import DatasetError
from hilrec.daemon.so101 import ACTION_KEY, STATE_KEY
from hilrec.daemon.tools.export import export_robomimic
from hilrec.sim.recorder import RecordConfig, record

# Real daemons, processes or kill loops: the slow tier (make test runs it; make test-fast does not).
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def sim_dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("export") / "sim"
    record(
        RecordConfig(
            root=root,
            episodes=3,
            seed=4,
            image_size=(48, 64),
            push_rate=0.5,
            video_codec="libx264",
            task=SIM_TASK,
        ),
        progress=False,
    )
    return root


SIM_TASK = "put the cube in the bowl"


def test_the_export_holds_every_episode_as_recorded(sim_dataset: Path, tmp_path: Path) -> None:
    out = tmp_path / "demo.hdf5"
    report = export_robomimic(sim_dataset, out)
    episodes = load_episodes(sim_dataset)
    assert report.demos == len(episodes) == 3 and report.with_states == 3
    with h5py.File(out, "r") as f:
        data = f["data"]
        assert data.attrs["total"] == sum(e["length"] for e in episodes)
        for episode in episodes:
            index = int(episode["episode_index"])
            demo = data[f"demo_{index}"]
            columns = read_episode(sim_dataset, index, [ACTION_KEY, STATE_KEY])
            assert demo.attrs["num_samples"] == episode["length"]
            np.testing.assert_array_equal(demo["actions"][:], columns[ACTION_KEY])
            np.testing.assert_array_equal(demo["obs/state"][:], columns[STATE_KEY])
            frames = read_episode_frames(sim_dataset, index, "observation.images.front")
            np.testing.assert_array_equal(demo["obs/front_image"][:], frames)
            meta, arrays = load_episode_sidecar(sim_dataset, index)
            assert meta is not None
            states = demo["states"][:]
            np.testing.assert_array_equal(states[0], arrays["initial_state"])
            assert states.shape[0] == episode["length"]
            success = bool(meta["success"])
            assert demo["dones"][-1] == int(success) and demo["rewards"][-1] == float(success)
            assert not demo["dones"][:-1].any()
        names = sorted(n.decode() for n in f["mask/all"][:])
        assert names == sorted(f"demo_{int(e['episode_index'])}" for e in episodes)
        successes = {n.decode() for n in f["mask/success"][:]}
        assert len(successes) == report.successes


def test_a_state_reproduces_its_row_on_the_twin(sim_dataset: Path, tmp_path: Path) -> None:
    from hilrec.sim.twin import Twin

    out = tmp_path / "demo.hdf5"
    export_robomimic(sim_dataset, out, episodes=[1])
    with h5py.File(out, "r") as f, Twin(fps=25, cameras=()) as twin:
        demo = f["data/demo_1"]
        for frame in (0, 17, int(demo.attrs["num_samples"]) - 1):
            twin.set_state(demo["states"][frame])
            np.testing.assert_array_equal(twin.observe(), demo["obs/state"][frame])


def test_robomimic_reads_the_export_with_its_own_dataset_class(sim_dataset: Path, tmp_path: Path) -> None:
    from robomimic.utils import obs_utils
    from robomimic.utils.dataset import SequenceDataset

    out = tmp_path / "demo.hdf5"
    export_robomimic(sim_dataset, out, size=(32, 24))
    obs_utils.initialize_obs_utils_with_obs_specs({"obs": {"low_dim": ["state"], "rgb": ["front_image"]}})
    keys = ("state", "front_image")
    # robomimic's defaults otherwise: load_next_obs=True, no filter key, swmr reads, no cache
    dataset = SequenceDataset(hdf5_path=str(out), obs_keys=keys, dataset_keys=("actions", "rewards", "dones"))
    episodes = load_episodes(sim_dataset)
    assert len(dataset) == sum(e["length"] for e in episodes)
    item = dataset[5]
    assert item["actions"].shape == (1, 6) and item["obs"]["state"].shape == (1, 6)
    assert item["obs"]["front_image"].shape == (1, 24, 32, 3)  # raw HWC; robomimic makes CHW in training
    assert item["next_obs"]["state"].shape == (1, 6)
    with h5py.File(out, "r") as f:
        demo = f["data/demo_0"]
        np.testing.assert_array_equal(item["next_obs"]["state"][0], demo["obs/state"][6])
        for key in keys:
            obs, following = demo[f"obs/{key}"][:], demo[f"next_obs/{key}"][:]
            np.testing.assert_array_equal(following[:-1], obs[1:])
            np.testing.assert_array_equal(following[-1], obs[-1])  # nothing observed after the end
    cached = SequenceDataset(
        hdf5_path=str(out), obs_keys=keys, dataset_keys=("actions",), hdf5_cache_mode="all"
    )
    last = int(episodes[0]["length"]) - 1
    np.testing.assert_array_equal(cached[last]["next_obs"]["front_image"], cached[last]["obs"]["front_image"])


def _lerobot_dataset(root: Path, tasks: list[str]) -> Path:
    """One episode per task, written by LeRobot 0.4.4's own LeRobotDataset and nothing else."""
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    from hilrec.daemon.so101 import ROBOT_TYPE, so101_features

    features = {k: {**v, "shape": tuple(v["shape"])} for k, v in so101_features().items()}
    dataset = LeRobotDataset.create(
        repo_id=f"test/{root.name}",
        fps=25,
        features=features,
        root=root,
        robot_type=ROBOT_TYPE,
        use_videos=False,
    )
    for e, task in enumerate(tasks):
        for i in range(5):
            value = np.full(6, float(e * 10 + i), np.float32)
            dataset.add_frame({STATE_KEY: value, ACTION_KEY: value, "task": task})
        dataset.save_episode()
    dataset.finalize()
    return root


def test_each_demo_carries_its_episodes_task(sim_dataset: Path, tmp_path: Path) -> None:
    import json

    out = tmp_path / "sim.hdf5"
    export_robomimic(sim_dataset, out)
    with h5py.File(out, "r") as f:
        for name in f["data"]:
            assert f["data"][name].attrs["task"] == SIM_TASK
            assert json.loads(f["data"][name].attrs["tasks"]) == [SIM_TASK]
    tasks = ["fold the towel", "pick the red block", "fold the towel"]
    root = _lerobot_dataset(tmp_path / "lerobot", tasks)
    out = tmp_path / "lerobot.hdf5"
    export_robomimic(root, out)
    with h5py.File(out, "r") as f:
        assert [f[f"data/demo_{i}"].attrs["task"] for i in range(3)] == tasks


def test_a_refusal_leaves_no_partial_file_and_names_the_problem(sim_dataset: Path, tmp_path: Path) -> None:
    out = tmp_path / "demo.hdf5"
    with pytest.raises(DatasetError, match="no episode"):
        export_robomimic(sim_dataset, out, episodes=[0, 99])
    assert not out.exists() and not list(tmp_path.iterdir())
    out.write_text("someone else's file")
    with pytest.raises(DatasetError, match="exists"):
        export_robomimic(sim_dataset, out)
    assert out.read_text() == "someone else's file"


def test_the_command_says_what_it_could_not_carry_over(tmp_path: Path) -> None:
    from hilrec.daemon.dataset.writer.dataset_writer import DatasetWriter
    from hilrec.daemon.so101 import ROBOT_TYPE, so101_features

    root = tmp_path / "hardware"
    with DatasetWriter.create(root, fps=25, features=so101_features(), robot_type=ROBOT_TYPE) as writer:
        for i in range(10):
            value = np.full(6, float(i), np.float32)
            writer.add_frame({STATE_KEY: value, ACTION_KEY: value, "task": "a real arm"})
        writer.save_episode()
    out = tmp_path / "hw.hdf5"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "hilrec.daemon.cli",
            "export",
            str(root),
            "--format",
            "robomimic",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "simulator states: a hardware" in result.stdout and "states: 0 of 1" in result.stdout
    with h5py.File(out, "r") as f:
        assert "states" not in f["data/demo_0"] and f["data"].attrs["total"] == 10
