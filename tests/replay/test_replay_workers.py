"""``replay`` and ``check --replay`` with ``--workers N`` and ``--ray ADDRESS`` (issue 15, items 2-3).

Each episode replays as a task of its own (:func:`hilrec.daemon.fanout.run_tasks`) and the
results are gathered in episode order, so the reports (text, JSON, the replay PNGs) are the same
for one process, two, and a Ray cluster. ``hilrec replay`` prints how long it took (``seconds``,
frames/s): that measures the run, not the dataset, and is the one thing compared apart.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from hilrec.daemon.cli import main
from hilrec.daemon.replay.check_replay import default_workers

# Real daemons, processes or kill loops: the slow tier (make test runs it; make test-fast does not).
pytestmark = pytest.mark.slow

SIM_EPISODES = 3
TIMING = re.compile(r"in \d+\.\d s \(\d+ frames/s\)")

Run = Callable[..., tuple[int, str]]


@pytest.fixture
def run(capsys: pytest.CaptureFixture[str]) -> Run:
    def run_(*argv: str) -> tuple[int, str]:
        capsys.readouterr()
        status = main(list(argv))
        return status, capsys.readouterr().out

    return run_


@pytest.fixture(scope="module")
def sim_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("sim") / "ds"
    argv = ["record", "--sim", "--root", str(root), "--episodes", str(SIM_EPISODES), "--seed", "3"]
    assert main([*argv, "--cameras", "none", "--pushes", "1.5", "--no-progress"]) == 0
    return root


def without_timing(document: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in document.items() if k != "seconds"}


def report_files(directory: Path) -> dict[str, bytes]:
    files = {p.name: p.read_bytes() for p in sorted(directory.iterdir())}
    files["report.json"] = json.dumps(without_timing(json.loads(files["report.json"]))).encode()
    return files


def test_check_replay_of_a_sim_dataset_is_the_same_for_any_workers(sim_root: Path, run: Run) -> None:
    one = run("check", str(sim_root), "--replay", "--workers", "1", "--json")
    two = run("check", str(sim_root), "--replay", "--workers", "2", "--json")
    assert one == two
    status, out = one
    replay = json.loads(out)["replay"]
    assert status == 0 and replay["check"] == "sim" and replay["counts"]["passed"] == SIM_EPISODES
    assert all(e["disturbances"] and e["disturbance_effect"] for e in replay["episodes"])
    text_one = run("check", str(sim_root), "--replay", "--workers", "1")
    assert text_one == run("check", str(sim_root), "--replay", "--workers", "2")
    assert "replay check: bit-exact sim replay" in text_one[1]
    # Asked for no number, a dataset this small replays here: a worker would cost more than it saves.
    assert default_workers(sim_root) == 1
    assert run("check", str(sim_root), "--replay", "--json") == one


def test_hardware_flags_are_refused_on_a_sim_dataset(
    sim_root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["check", str(sim_root), "--replay", "--units", "degrees"]) == 2
    assert "flag --units" in (err := capsys.readouterr().err) and "is a sim dataset" in err


def test_hardware_replay_is_the_same_for_any_workers(
    mixed_hardware_root: Path, tmp_path: Path, run: Run
) -> None:
    root = str(mixed_hardware_root)
    status, out = run("replay", root, "--json", "--workers", "1")
    status2, out2 = run("replay", root, "--json", "--workers", "2")
    one, two = json.loads(out), json.loads(out2)
    assert status == status2 == 4  # the worst verdict, diverged
    assert without_timing(one) == without_timing(two)
    assert [e["verdict"] for e in one["episodes"]] == ["consistent", "diverged", "lagging"]

    text = [run("replay", root, "--workers", n, "--report", str(tmp_path / n)) for n in ("1", "2")]
    assert text[0][0] == text[1][0] == 4
    texts = [
        TIMING.sub("", out).replace(str(tmp_path / n), "DIR") for (_, out), n in zip(text, "12", strict=True)
    ]
    assert texts[0] == texts[1]
    files = report_files(tmp_path / "1")
    assert {f"episode-{i:06d}.png" for i in range(3)} <= set(files)
    assert files == report_files(tmp_path / "2")  # the PNGs byte for byte

    check = [run("check", root, "--replay", "--workers", n, "--json") for n in ("1", "2")]
    assert check[0] == check[1] and check[0][0] == 1


def test_ray_gives_the_reports_of_the_process_pool(
    ray_address: str,
    sim_root: Path,
    mixed_hardware_root: Path,
    tmp_path: Path,
    run: Run,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sim = run("check", str(sim_root), "--replay", "--workers", "1", "--json")
    assert run("check", str(sim_root), "--replay", "--ray", ray_address, "--json") == sim
    hardware = str(mixed_hardware_root)
    checked = run("check", hardware, "--replay", "--workers", "2", "--json")
    assert run("check", hardware, "--replay", "--ray", ray_address, "--json") == checked

    # A relative root: the Ray workers run elsewhere, the same dataset is replayed all the same.
    for root, expected in ((sim_root, sim), (mixed_hardware_root, checked)):
        monkeypatch.chdir(root.parent)
        assert run("check", root.name, "--replay", "--ray", ray_address, "--json") == (
            expected[0],
            expected[1].replace(str(root), root.name),
        )

    pool = run("replay", hardware, "--workers", "2", "--json", "--report", str(tmp_path / "pool"))
    on_ray = run("replay", hardware, "--ray", ray_address, "--json", "--report", str(tmp_path / "ray"))
    assert pool[0] == on_ray[0] == 4
    assert without_timing(json.loads(pool[1])) == without_timing(json.loads(on_ray[1]))
    assert report_files(tmp_path / "pool") == report_files(tmp_path / "ray")
