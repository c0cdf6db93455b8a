"""hilrec check tells errors from warnings, and names the tool that fixes each finding.

(1) Every rule has a severity (ERROR or WARNING) and a fix (hilrec repair, hilrec edit
    recompute-stats, re-recording); the JSON report carries both per finding.
(2) A dataset edited by LeRobot 0.4.4's own ``delete_episodes`` (which renumbers index,
    episode_index and task_index but keeps their old stats) passes with warnings: exit 0, and
    exit 1 with ``--strict``. Its video was re-encoded by LeRobot; its image stats still pass.
(3) An error fails with or without ``--strict``; the text report says which is which.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from _frames import write_dataset

from hilrec.daemon.cli import main as cli_main
from hilrec.daemon.dataset.check.checker import RULES, check_dataset
from hilrec.daemon.dataset.check.common import Fix, Rule, Severity
from hilrec.daemon.dataset.writer.dataset_writer import DatasetWriter
from hilrec.daemon.dataset.writer.lerobot_sink import LeRobotSink

DEFAULT_COLUMNS = {"timestamp", "frame_index", "episode_index", "index", "task_index"}
EPISODES = "meta/episodes/chunk-000/file-000.parquet"


def run_check(root: Path, capsys: pytest.CaptureFixture[str], *flags: str) -> tuple[int, dict]:
    rc = cli_main(["check", str(root), "--json", *flags])
    return rc, json.loads(capsys.readouterr().out)


@pytest.fixture(scope="module", params=["native", "lerobot"])
def deleted(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Episode 1 of four deleted by LeRobot's dataset_tools.delete_episodes."""
    from lerobot.datasets.dataset_tools import delete_episodes
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    base = tmp_path_factory.mktemp("deleted")
    create = DatasetWriter.create if request.param == "native" else LeRobotSink.create
    write_dataset(create, base / "src", [12, 9, 14, 7], cameras=("front",))
    source = LeRobotDataset("hilrec/src", root=base / "src", video_backend="pyav")
    delete_episodes(source, [1], output_dir=base / "out", repo_id="hilrec/out")
    return base / "out"


def test_every_rule_has_a_severity_and_a_fix() -> None:
    assert all(isinstance(rule, Rule) for rule in RULES.values())
    assert {rule.severity for rule in RULES.values()} == set(Severity)
    assert {rule.fix for rule in RULES.values()} == set(Fix)
    assert [str(f) for f in Fix] == [
        "hilrec repair",
        "hilrec edit recompute-stats",
        "re-record the episode",
        "run the hilrec edit it names again",
        "record into the folder again, or delete it",
    ]
    warnings = {name for name, rule in RULES.items() if rule.severity is Severity.WARNING}
    assert warnings == {"stats.default_columns", "journal.entries", "edit.part"}
    stats_rules = {name for name in RULES if name.startswith("stats.")}
    assert {RULES[name].fix for name in stats_rules} == {Fix.RECOMPUTE_STATS}


@pytest.mark.slow
def test_lerobot_delete_episodes_output_passes_with_warnings(
    deleted: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, report = run_check(deleted, capsys)
    assert rc == 0 and report["passed"] is True
    assert report["summary"]["episodes"] == 3
    assert report["errors"] == 0 and report["warnings"] == len(report["failures"]) > 0
    for finding in report["failures"]:
        assert finding["rule"] == "stats.default_columns"
        assert finding["severity"] == "warning" and finding["fix"] == "hilrec edit recompute-stats"
        assert finding["key"] in DEFAULT_COLUMNS
    # The renumbered columns are the stale ones: episode 1 was episode 2 before the delete.
    stale = {(f["episode"], f["key"]) for f in report["failures"]}
    assert {(1, "episode_index"), (1, "index"), (2, "episode_index"), (2, "index")} <= stale
    assert report["rules"]["stats.default_columns"]["severity"] == "warning"

    rc, strict = run_check(deleted, capsys, "--strict")
    assert rc == 1 and strict["passed"] is False and strict["strict"] is True
    assert strict["failures"] == report["failures"]


@pytest.mark.slow
def test_text_report_says_passed_with_warnings(deleted: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["check", str(deleted)]) == 0
    text = capsys.readouterr().out
    assert "WARNING [stats.default_columns]" in text and "(fix: hilrec edit recompute-stats)" in text
    assert text.rstrip().splitlines()[-1].startswith("PASSED with ")
    assert cli_main(["check", str(deleted), "--strict"]) == 1
    assert capsys.readouterr().out.rstrip().endswith("FAILED")


@pytest.mark.slow
def test_an_error_fails_with_and_without_strict(
    deleted: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "ds"
    shutil.copytree(deleted, root)
    table = pq.read_table(root / EPISODES)
    pq.write_table(table.slice(0, 2), root / EPISODES)  # episode 2 loses its metadata row
    for flags in ((), ("--strict",)):
        rc, report = run_check(root, capsys, *flags)
        assert rc == 1 and report["passed"] is False and report["errors"] > 0
        errors = [f for f in report["failures"] if f["severity"] == "error"]
        assert {f["rule"] for f in errors} >= {"episode_index.contiguous", "info.totals"}
        assert all(f["fix"] == RULES[f["rule"]].fix for f in report["failures"])
    assert cli_main(["check", str(root)]) == 1
    text = capsys.readouterr().out
    assert "ERROR [episode_index.contiguous]" in text and "(fix: hilrec repair)" in text
    assert text.rstrip().endswith("FAILED")


def test_library_report_severities(deleted: Path) -> None:
    report = check_dataset(deleted)
    assert report.passed and report.errors == [] and len(report.warnings) == len(report.failures)
    assert not check_dataset(deleted, strict=True).passed
