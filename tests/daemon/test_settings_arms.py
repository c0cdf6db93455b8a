"""Two arm pairs in a daemon config ([arms.left], [arms.right]): the shipped configs load, a bad
one is refused at start naming the key, and a one-arm config means what it meant."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest

from hilrec.daemon.errors import ConfigError
from hilrec.daemon.so101 import STATE_KEY, position_names
from hilrec.daemon.wire.root import daemon_features
from hilrec.daemon.wire.settings import load_settings

REPO = Path(__file__).resolve().parents[2]
EMULATED = """
mode = "emulated"
[dataset]
root = "data/x"
[leader]
source = "serial"
"""
HIL = """
mode = "hil"
[dataset]
root = "data/x"
[leader]
source = "serial"
[arms.left]
follower_port = "/dev/ttyACM0"
leader_port = "/dev/ttyACM1"
[arms.right]
follower_port = "/dev/ttyACM2"
leader_port = "/dev/ttyACM3"
"""
BOTH = "[arms.left]\n[arms.right]\n"


def _load(tmp_path: Path, text: str):
    path = tmp_path / "d.toml"
    path.write_text(text)
    return load_settings(path)


def _refused(tmp_path: Path, text: str) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        _load(tmp_path, text)
    return info.value


@pytest.mark.parametrize("name", ["bimanual-emulated", "bimanual-hil"])
def test_the_shipped_two_arm_configs_load_with_both_arms(name: str) -> None:
    settings = load_settings(REPO / "configs" / f"{name}.toml")
    assert settings.arm_count == 2 and [side for side, _ in settings.arm_pairs()] == ["left", "right"]
    assert daemon_features(settings)[STATE_KEY]["names"] == position_names(2)
    if settings.mode == "hil":
        ports = [getattr(arm, f"{r}_port") for _, arm in settings.arm_pairs() for r in ("follower", "leader")]
        assert len(set(ports)) == 4 and all(p.startswith("/dev/serial/by-id/") for p in ports)
        assert all(arm.max_relative_target == 10.0 for _, arm in settings.arm_pairs())
        assert [arm.arm_id(side, r) for side, arm in settings.arm_pairs() for r in ("follower", "leader")][
            :2
        ] == ["so101_follower_left", "so101_leader_left"]


@pytest.mark.parametrize("mode", ["sim", "hil", "emulated"])
def test_a_one_arm_config_stays_one_arm(mode: str) -> None:
    settings = load_settings(REPO / "configs" / f"{mode}.toml")
    assert settings.arm_count == 1 and settings.arm_pairs() == []
    assert daemon_features(settings)[STATE_KEY]["names"] == position_names(1)


def test_an_emulated_two_arm_config_needs_no_ports_and_takes_faults_per_arm(tmp_path: Path) -> None:
    settings = _load(tmp_path, EMULATED + '[arms.left]\nfollower_faults = ["drop:p=0.1"]\n[arms.right]\n')
    left, right = (arm for _, arm in settings.arm_pairs())
    assert left.follower_faults == ("drop:p=0.1",) and right.follower_faults == ()


@pytest.mark.parametrize(
    ("text", "key", "words"),
    [
        ("arms = 2\n" + EMULATED, "arms", "expected a table"),
        (
            EMULATED + "[arms.left]\n",
            "arms.right",
            "both",
        ),
        (
            EMULATED + BOTH + "[arms.middle]\n",
            "arms.middle",
            "left or right",
        ),
        (
            EMULATED + BOTH.replace("[arms.right]", '[arms.right]\nfollower_port = "/dev/x"'),
            "arms.right.follower_port",
            "makes its own",
        ),
        (
            EMULATED + BOTH + "[follower]\nmax_relative_target = 5.0\n",
            "follower.max_relative_target",
            "each arm",
        ),
        (
            EMULATED + BOTH.replace("[arms.left]", "[arms.left]\nmax_relative_target = 0.0"),
            "arms.left.max_relative_target",
            "positive",
        ),
        (
            EMULATED + BOTH.replace("[arms.left]", '[arms.left]\nleader_faults = ["nonsense"]'),
            "arms.left.leader_faults[0]",
            "",
        ),
        (
            EMULATED + BOTH + '[emulated]\nfollower_faults = ["drop:p=0.1"]\n',
            "emulated.follower_faults",
            "own section",
        ),
        (
            EMULATED.replace('"serial"', '"remote"') + BOTH,
            "leader.source",
            "serial",
        ),
        (
            HIL.replace('follower_port = "/dev/ttyACM2"', ""),
            "arms.right.follower_port",
            "needs the right follower",
        ),
        (
            HIL.replace("/dev/ttyACM3", "/dev/ttyACM0"),
            "arms.right.leader_port",
            "arms.left.follower_port",
        ),
        (
            HIL + '[follower]\nport = "/dev/ttyUSB9"\n',
            "follower.port",
            "each arm",
        ),
        (
            HIL + '[leader]\nid = "mine"\n',
            "",
            "",
        ),  # a second [leader] table: not TOML
        (
            HIL.replace("[arms.left]", '[arms.left]\nbody_mode = "degrees"'),
            "arms.left.body_mode",
            "unknown key",
        ),
        (
            HIL.replace('"hil"', '"sim"').replace('"serial"', '"scripted"'),
            "arms.left.follower_port",
            "sim mode makes its own",
        ),
    ],
)
def test_a_bad_two_arm_config_is_refused_naming_the_key(
    tmp_path: Path, text: str, key: str, words: str
) -> None:
    error = _refused(tmp_path, text)
    if key:
        assert error.key == key, error
    assert words in str(error)


def test_a_hil_arm_that_does_not_open_names_its_key(tmp_path: Path) -> None:
    """No calibration for the arm's id: its id key; a calibration but no port: its port key."""
    from hilrec.daemon.control.arm_pair_rig import arm_pair_rig_factory
    from hilrec.drivers.calibration import ArmCalibration, save_calibration
    from hilrec.sim.units import emulated_calibration

    text = HIL.replace("/dev/ttyACM0", str(tmp_path / "no-such-port")) + "[twin]\nmirror = false\n"
    with contextlib.ExitStack() as stack, pytest.raises(ConfigError) as info:
        arm_pair_rig_factory(_load(tmp_path, text))(stack)
    assert info.value.key == "arms.left.follower_id" and "left follower" in str(info.value)

    calibration = tmp_path / "left.json"
    save_calibration(ArmCalibration.from_mapping(emulated_calibration(), source="test"), calibration)
    text = text.replace("[arms.left]", f'[arms.left]\nfollower_calibration = "{calibration}"')
    with contextlib.ExitStack() as stack, pytest.raises(ConfigError) as info:
        arm_pair_rig_factory(_load(tmp_path, text))(stack)
    assert info.value.key == "arms.left.follower_port" and "left follower" in str(info.value)
