"""The TOML edge: every refusal names the dotted key."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import pytest

from hilrec.daemon.config import from_mapping, load_toml
from hilrec.daemon.errors import ConfigError
from hilrec.daemon.so101 import BodyMode


@dataclass(frozen=True, kw_only=True)
class Port:
    path: str
    baudrate: int = 1_000_000


@dataclass(frozen=True, kw_only=True)
class Root:
    mode: Literal["sim", "hil"]
    fps: int = 25
    follower: Port
    gains: dict[str, float] = field(default_factory=dict)
    cameras: tuple[str, ...] = ()

    def validate(self) -> None:
        if self.fps <= 0:
            raise ConfigError("fps", "must be positive")


def test_builds_nested_frozen_config() -> None:
    cfg = from_mapping(
        Root, {"mode": "hil", "follower": {"path": "/dev/ttyACM0"}, "gains": {"p": 16}, "cameras": ["front"]}
    )
    assert cfg.follower.path == "/dev/ttyACM0" and cfg.follower.baudrate == 1_000_000
    assert cfg.gains == {"p": 16.0} and cfg.cameras == ("front",)
    with pytest.raises(AttributeError):
        cfg.fps = 30  # type: ignore[misc]  # the point: a frozen config refuses assignment


@pytest.mark.parametrize(
    ("data", "key", "fragment"),
    [
        ({"mode": "hil", "follower": {"path": "x", "baud": 1}}, "follower.baud", "unknown key"),
        ({"mode": "hil"}, "follower", "required"),
        ({"mode": "real", "follower": {"path": "x"}}, "mode", "one of"),
        ({"mode": "sim", "follower": {"path": "x", "baudrate": "fast"}}, "follower.baudrate", "integer"),
        ({"mode": "sim", "follower": {"path": "x"}, "fps": 0}, "fps", "positive"),
        ({"mode": "sim", "follower": {"path": "x"}, "gains": {"p": "x"}}, "gains.p", "number"),
    ],
)
def test_errors_name_the_key(data: dict, key: str, fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        from_mapping(Root, data)
    assert info.value.key == key
    assert fragment in str(info.value)


def test_load_toml_names_file(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text('mode = "sim"\n[follower]\npath = 3\n')
    with pytest.raises(ConfigError) as info:
        load_toml(Root, path)
    assert "follower.path" in str(info.value) and str(path) in str(info.value)
    path.write_text("mode = \n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_toml(Root, path)


@dataclass(frozen=True, kw_only=True)
class _ArmWithMode:
    body_mode: BodyMode = BodyMode.DEGREES


def test_enum_fields_take_their_values_and_name_the_key_otherwise() -> None:
    built = from_mapping(_ArmWithMode, {"body_mode": "range_m100_100"})
    assert built.body_mode is BodyMode.RANGE_M100_100
    with pytest.raises(ConfigError) as caught:
        from_mapping(_ArmWithMode, {"body_mode": "radians"}, prefix="follower")
    assert caught.value.key == "follower.body_mode"
    assert "'degrees', 'range_m100_100'" in caught.value.problem and "'radians'" in caught.value.problem


def test_errors_about_flag_values_name_the_flag_not_a_config_key() -> None:
    from hilrec.daemon.config import flag_errors
    from hilrec.daemon.errors import FlagError

    with pytest.raises(FlagError) as named, flag_errors({"push_rate": "--pushes"}):
        raise ConfigError("push_rate", "must be non-negative")
    assert str(named.value) == "flag --pushes: must be non-negative" and "config key" not in str(named.value)
    with pytest.raises(FlagError, match=r"^flag --video-codec: "), flag_errors():
        raise ConfigError("video_codec", "unknown codec")


@pytest.mark.slow
def test_record_names_its_flags(tmp_path: Path) -> None:
    import subprocess
    import sys

    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "hilrec.daemon.cli",
            "record",
            "--sim",
            "--root",
            str(tmp_path / "r"),
            "--episodes",
            "0",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2 and "flag --episodes: must be at least 1" in done.stderr, done.stderr
