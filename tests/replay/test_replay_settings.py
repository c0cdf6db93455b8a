"""The thresholds file: shipped values equal the defaults, bad values are refused by key."""

from __future__ import annotations

from pathlib import Path

import pytest

from hilrec.daemon.errors import ConfigError
from hilrec.daemon.replay.settings import (
    DEFAULT_CONFIG_PATH,
    ReplaySettings,
    load_replay_settings,
)


def test_shipped_config_equals_the_defaults() -> None:
    assert DEFAULT_CONFIG_PATH.is_file()
    assert load_replay_settings() == ReplaySettings()
    assert load_replay_settings(DEFAULT_CONFIG_PATH) == ReplaySettings()


def test_a_partial_file_overrides_only_its_keys(tmp_path: Path) -> None:
    path = tmp_path / "replay.toml"
    path.write_text("[lag]\ntolerance_frames = 0.3\n[consistency.body]\nrms = 1.0\nmax = 4.0\nfloor = 0.2\n")
    settings = load_replay_settings(path)
    assert settings.lag.tolerance_frames == 0.3
    assert settings.consistency.body.max == 4.0
    assert settings.consistency.gripper == ReplaySettings().consistency.gripper


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("[lag]\ntolerance_frames = 1.5\n", "lag.tolerance_frames"),
        ("[lag]\nmin_shift_frames = 2\n", "lag.min_shift_frames"),
        ("[consistency.body]\nrms = 8.0\nmax = 6.0\nfloor = 0.2\n", "consistency.body.rms"),
        ("[consistency.body]\nrms = 1.0\n", "consistency.body.max"),
        ("[engine]\nsettle_iterations = 0\n", "engine.settle_iterations"),
        ("[lag]\ntolerance = 0.5\n", "lag.tolerance"),
        ("[approach]\nsettled_gap_deg = 12.0\n", "approach.settled_gap_deg"),
        ("[approach]\nmax_s = -1.0\n", "approach.max_s"),
    ],
)
def test_bad_values_name_their_key(tmp_path: Path, text: str, key: str) -> None:
    path = tmp_path / "replay.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_replay_settings(path)
    assert err.value.key == key
    assert str(path) in str(err.value)
