"""30 fps, LeRobot's default rate: the daemon's twins choose a physics step that makes whole frames.

``[twin] timestep = 0`` (the default) leaves the step to :func:`hilrec.sim.twin.timestep_for`
(1/210 s, 7 steps a frame, at 30 fps; 5 ms at 25 fps); a given one is kept, and an fps it does
not divide is refused naming ``twin.timestep`` and the valid rates. End to end: sim mode and
emulated mode with the mirroring twin, each recording a few frames that ``hilrec check`` passes.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from _daemon import Daemon, check_passes, emulated_config, run_cli, sim_config

from hilrec.daemon.dataset.format.reader import load_episodes, load_info
from hilrec.daemon.dataset.format.sidecar import load_dataset_sidecar, load_episode_sidecar
from hilrec.daemon.errors import ConfigError
from hilrec.daemon.wire.settings import DaemonSettings, load_settings

# Real daemons, processes or kill loops: the slow tier (make test runs it; make test-fast does not).
pytestmark = pytest.mark.slow

STEP_30 = 1 / 210


def _at_30_fps(config: str) -> str:
    assert "\nfps = 25\n" in config
    return config.replace("\nfps = 25\n", "\nfps = 30\n", 1)


def _settings(tmp_path: Path, text: str) -> DaemonSettings:
    path = tmp_path / "daemon.toml"
    path.write_text(text)
    return load_settings(path)


@pytest.fixture
def daemons(tmp_path: Path):
    started: list[Daemon] = []

    def make(config: str) -> Daemon:
        daemon = Daemon(tmp_path, config)
        started.append(daemon)
        return daemon.start()

    yield make
    for daemon in started:
        daemon.close()


def test_settings_at_30_fps_choose_a_timestep_and_refuse_a_given_one_that_does_not_divide(
    tmp_path: Path,
) -> None:
    root = tmp_path / "ds"
    for config in (sim_config(root), emulated_config(root)):
        settings = _settings(tmp_path, _at_30_fps(config))
        assert settings.fps == 30 and settings.twin.timestep == 0.0 and settings.twin.mirror
        assert settings.twin.given_timestep is None
    # A given step that makes whole frames is kept: 1/240 s, 8 steps a frame.
    given = _settings(tmp_path, _at_30_fps(sim_config(root, extra=f"[twin]\ntimestep = {1 / 240!r}")))
    assert given.twin.given_timestep == 1 / 240
    for config in (sim_config(root), emulated_config(root)):
        with pytest.raises(ConfigError) as caught:
            _settings(tmp_path, _at_30_fps(config + "\n[twin]\ntimestep = 0.005\n"))
        assert caught.value.key == "twin.timestep"
        problem = caught.value.problem
        assert "fps 30" in problem and "valid rates near it: 10, 20, 25, 40" in problem
    # hil: only the mirror steps the twin, so without it a given step puts no constraint on fps.
    hil = (
        'fps = 30\nmode = "hil"\n[dataset]\nroot = "x"\n[follower]\nport = "/dev/a"\n'
        '[leader]\nsource = "serial"\nport = "/dev/b"\n'
    )
    assert _settings(tmp_path, hil).twin.mirror
    with pytest.raises(ConfigError, match=r"twin\.timestep = 0 .*twin\.mirror = false"):
        _settings(tmp_path, hil + "[twin]\ntimestep = 0.005\n")
    assert _settings(tmp_path, hil + "[twin]\ntimestep = 0.005\nmirror = false\n").fps == 30
    with pytest.raises(ConfigError) as caught:
        _settings(tmp_path, sim_config(root) + "\n[twin]\ntimestep = 0.5\n")
    assert caught.value.key == "twin.timestep" and "0.0005..0.02" in caught.value.problem
    # 25 fps keeps its 5 ms whether given or chosen.
    assert _settings(tmp_path, sim_config(root) + "\n[twin]\ntimestep = 0.005\n").twin.timestep == 0.005


def test_sim_mode_records_at_30_fps_and_replays_bit_for_bit(tmp_path: Path, daemons) -> None:
    root = tmp_path / "ds"
    daemon = daemons(_at_30_fps(sim_config(root, realtime=False)))
    assert daemon.call("status")["fps"] == 30
    daemon.call("start_episode", task="put the cube in the bin", seed=2)
    daemon.wait_frames(12)
    daemon.call("stop_episode", success=True)
    daemon.wait_saved(1)
    assert daemon.shutdown() == 0

    check_passes(root)
    assert load_info(root)["fps"] == 30
    sidecar = load_dataset_sidecar(root)
    assert sidecar is not None
    for physics in (sidecar["twin"], sidecar["sim"]["physics"]):
        assert (physics["timestep"], physics["substeps"], physics["fps"]) == (STEP_30, 7, 30)
    assert sidecar["sim"]["scene"]["config"]["timestep"] == STEP_30
    meta, _ = load_episode_sidecar(root, 0)
    assert meta is not None and meta["sim"]["physics"]["timestep"] == STEP_30
    check = run_cli("check", str(root), "--replay")
    assert check.returncode == 0 and "replay PASSED" in check.stdout, check.stdout + check.stderr


def test_emulated_mode_records_at_30_fps_with_the_mirroring_twin(tmp_path: Path, daemons) -> None:
    root = tmp_path / "ds"
    camera = '[cameras.front]\nsource = "twin"\nheight = 48\nwidth = 64\nfps = 30\nstall_ms = 2000\n'
    daemon = daemons(_at_30_fps(emulated_config(root, cameras=camera)))
    status = daemon.call("status")
    assert status["fps"] == 30
    # The emulated follower's twin steps what the mirror steps (passed in its environment).
    pid = status["devices"]["follower"]["emulator_pid"]
    environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    assert f"HILREC_TWIN_TIMESTEP={STEP_30!r}".encode() in environ
    daemon.call("start_episode", task="pick the cube", seed=4)
    daemon.wait_frames(40)  # the hardware replay check needs 25 or more
    daemon.call("stop_episode", success=True)
    daemon.wait_saved(1)
    assert not daemon.call("status")["faults"]
    assert daemon.shutdown() == 0

    check_passes(root)
    [episode] = load_episodes(root)
    meta, arrays = load_episode_sidecar(root, 0)
    assert meta is not None and meta["mode"] == "emulated"
    assert arrays["twin_state"].shape == (episode["length"], 6)  # the mirror followed every frame
    assert {"tracking", "twin_vs_measured"} <= set(meta["divergence"])
    sidecar = load_dataset_sidecar(root)
    assert sidecar is not None
    twin = sidecar["twin"]
    assert (twin["timestep"], twin["substeps"], twin["fps"]) == (STEP_30, 7, 30)
    # Hardware replay takes the recorded step (not one of its own).
    replay = run_cli("replay", str(root), "--json")
    assert replay.returncode in (0, 3, 4), replay.stdout + replay.stderr
    described = json.loads(replay.stdout)["twin"]
    assert described["timestep"] == STEP_30 and described["timestep_source"] == "dataset metadata"


def test_an_emulated_follower_steps_the_timestep_it_is_given(monkeypatch: pytest.MonkeyPatch) -> None:
    from hilrec.drivers.emulated.motion import TIMESTEP_ENV, MechanicalFrame, TwinMotion

    monkeypatch.setenv(TIMESTEP_ENV, repr(STEP_30))
    motion = TwinMotion(MechanicalFrame.from_sim())
    try:
        assert motion.twin.timestep == STEP_30 and motion.twin.substeps == 1 and motion.twin.fps == 210
    finally:
        motion.close()
    monkeypatch.delenv(TIMESTEP_ENV)
    motion = TwinMotion(MechanicalFrame.from_sim())
    try:
        assert motion.twin.timestep == 0.005 and motion.twin.fps == 200  # as ever without one
    finally:
        motion.close()
