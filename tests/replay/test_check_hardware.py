"""``hilrec check --replay`` on hardware datasets runs the hardware replay check (issue 11).

Before, it ran the bit-exact sim replay on every dataset, so a recording of the emulated (or a
real) follower, which has no recorded sim start state, was NOT REPLAYABLE and failed the check.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hilrec.daemon.cli import main
from hilrec.daemon.replay.check import replay_dataset
from hilrec.daemon.replay.check_replay import HardwareReplaySection, ReplayKind, replay_kind
from hilrec.daemon.replay.results import ReplayVerdict
from hilrec.daemon.replay.settings import ReplaySettings


@pytest.mark.slow
def test_a_clean_hardware_recording_passes_the_hardware_replay(
    clean_hardware_root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["check", str(clean_hardware_root), "--replay", "--workers", "1"]) == 0
    text = capsys.readouterr().out
    assert "replay check: hardware replay check" in text
    assert "replay PASSED: 2 consistent" in text and "NOT REPLAYABLE" not in text
    assert text.rstrip().endswith("PASSED")

    assert main(["check", str(clean_hardware_root), "--replay", "--workers", "1", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    replay = doc["replay"]
    assert doc["passed"] and replay["passed"] and replay["check"] == "hardware"
    assert [e["verdict"] for e in replay["episodes"]] == ["consistent", "consistent"]
    assert replay["units"]["source"].startswith("dataset metadata")
    assert "seconds" not in replay  # wall time: the report is the same however it ran


@pytest.mark.slow
def test_a_diverged_hardware_recording_fails_the_check_on_its_replay(
    mixed_hardware_root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["check", str(mixed_hardware_root), "--replay", "--workers", "1", "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["errors"] == 0 and doc["warnings"] == 0  # the data are sound: the replay fails it
    replay = doc["replay"]
    assert replay["check"] == "hardware" and not replay["passed"]
    assert [e["verdict"] for e in replay["episodes"]] == ["consistent", "diverged", "lagging"]
    assert replay["episodes"][1]["divergence"]["joint"] == "elbow_flex"

    assert main(["check", str(mixed_hardware_root), "--replay", "--workers", "1"]) == 1
    text = capsys.readouterr().out
    assert "replay FAILED: 1 consistent, 1 lagging, 1 diverged" in text
    table = text[text.index("replay FAILED") :].splitlines()
    assert table[1].split()[:5] == ["episode", "frames", "verdict", "lag", "worst"]
    assert table[3].split()[:3] == ["1", "100", "diverged"] and "elbow_flex" in table[3]
    assert text.rstrip().endswith("FAILED")


def test_lagging_passes_and_fails_only_under_strict(mixed_hardware_root: Path) -> None:
    check = replay_dataset(
        mixed_hardware_root, settings=ReplaySettings(), settings_source="x", episodes=[0, 2]
    )
    assert [r.verdict for r in check.results] == [ReplayVerdict.CONSISTENT, ReplayVerdict.LAGGING]
    assert HardwareReplaySection(check).passed
    strict = HardwareReplaySection(check, strict=True)
    assert not strict.passed and "--strict: a lagging episode fails the check" in strict.format_text()


def test_which_replay_a_dataset_gets() -> None:
    assert replay_kind(None) is ReplayKind.HARDWARE  # another recorder's dataset
    assert replay_kind({"units": {}, "physics": {}}) is ReplayKind.HARDWARE
    assert replay_kind({"daemon": {"mode": "emulated"}, "twin": {}}) is ReplayKind.HARDWARE
    assert replay_kind({"sim": {"physics": {}}, "units": {}}) is ReplayKind.SIM
    assert replay_kind({"daemon": {"mode": "sim"}}) is ReplayKind.SIM


def test_replay_flags_are_refused_where_they_mean_nothing(
    clean_hardware_root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["check", str(clean_hardware_root), "--ray", "127.0.0.1:1"]) == 2
    assert "flag --ray: it applies to the replay: add --replay" in capsys.readouterr().err
    assert main(["check", str(clean_hardware_root), "--units", "degrees"]) == 2
    assert "flag --units" in capsys.readouterr().err


def test_another_recorders_dataset_gets_the_hardware_check_and_its_units_flag(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from _recordings import RecordingSpec, make_twin, record, write_with_lerobot

    twin = make_twin(30)
    root = write_with_lerobot(tmp_path / "lerobot", [record(RecordingSpec(seed=5, frames=150), twin)], fps=30)
    assert main(["check", str(root), "--replay", "--json"]) == 1
    replay = json.loads(capsys.readouterr().out)["replay"]
    assert replay["check"] == "hardware" and replay["episodes"][0]["verdict"] == "not_replayable"
    assert "pass --units degrees" in replay["episodes"][0]["reason"]
    assert main(["check", str(root), "--replay", "--units", "degrees", "--json"]) == 0
    replay = json.loads(capsys.readouterr().out)["replay"]
    assert replay["passed"] and replay["units"]["source"] == "--units flag"
