"""``hilrec view`` and ``hilrec display`` to an ``.rrd``, read back with rerun's own dataframe API."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from _daemon import Daemon, emulated_config, run_cli, sim_config

# Real daemons, processes or kill loops: the slow tier (make test runs it; make test-fast does not).
pytestmark = pytest.mark.slow

rr = pytest.importorskip("rerun")
dataframe = pytest.importorskip("rerun.dataframe")

JOINTS = ("shoulder_pan", "shoulder_lift", "elbow_flex", "wrist_flex", "wrist_roll", "gripper")
DISPLAY_TIMEOUT_S = 60.0


def entities(path: Path) -> set[str]:
    recording = dataframe.load_recording(str(path))
    return {c.entity_path for c in recording.schema().component_columns()}


def rows(path: Path, entity: str, index: str = "frame") -> int:
    """The number of ``index`` values at which ``entity`` has data."""
    recording = dataframe.load_recording(str(path))
    table = recording.view(index=index, contents=entity).select().read_all()
    column = next(n for n in table.column_names if n.startswith(entity + ":"))
    return int(table.num_rows - table.column(column).null_count)


@pytest.fixture(scope="module")
def sim_dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from hilrec.sim.recorder import RecordConfig, record

    root = tmp_path_factory.mktemp("viz") / "sim"
    record(
        RecordConfig(root=root, episodes=1, seed=3, image_size=(48, 64), video_codec="libx264"),
        progress=False,
    )
    return root


def test_view_sim_episode_to_rrd(sim_dataset: Path, tmp_path: Path) -> None:
    from hilrec.daemon.dataset.format.reader import load_episodes

    frames = int(load_episodes(sim_dataset)[0]["length"])
    out = tmp_path / "view.rrd"
    result = run_cli("view", str(sim_dataset), "--episode", "0", "--rrd", str(out), timeout_s=120)
    assert result.returncode == 0, result.stderr
    found = entities(out)
    expected = {"/camera/front"} | {f"/{s}/{j}" for s in ("state", "action") for j in JOINTS}
    assert expected <= found, found
    assert rows(out, "/camera/front") == frames
    assert rows(out, "/state/gripper") == frames
    assert rows(out, "/action/shoulder_pan", index="time") == frames
    # A sim recording has no tick timing and is not a hardware one: nothing of either is made up.
    assert not {e for e in found if e.startswith(("/timing", "/replay"))}


def test_view_refuses_a_missing_episode(sim_dataset: Path, tmp_path: Path) -> None:
    result = run_cli("view", str(sim_dataset), "--episode", "7", "--rrd", str(tmp_path / "x.rrd"))
    assert result.returncode == 2
    assert "no episode 7" in result.stderr


def _display(config: Path, out: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "hilrec.daemon.cli", "display", "--config", str(config), "--rrd", str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _wait_line(process: subprocess.Popen[str], text: str, seen: list[str]) -> None:
    assert process.stdout is not None
    for line in process.stdout:  # ends when the process does; the test's timeout bounds it
        seen.append(line)
        if text in line:
            return
    raise AssertionError(f"display exited before {text!r}:\n{''.join(seen)}")


def _summary(lines: list[str]) -> dict[str, int]:
    """``hilrec display: 97 ticks, 19 previews, 4 events; missed 0, refused 0`` -> numbers."""
    last = next(line for line in reversed(lines) if " ticks, " in line)
    counts = {name: int(n) for n, name in re.findall(r"(\d+) (ticks|previews|events)", last)}
    return counts | {name: int(n) for name, n in re.findall(r"(missed|refused) (\d+)", last)}


def _daemon_config(root: Path) -> str:
    # H.264 keeps the tiny test video quick to encode on a loaded machine.
    return sim_config(root).replace(f'root = "{root}"', f'root = "{root}"\nvideo_codec = "libx264"', 1)


@pytest.mark.timeout(240)
def test_display_live_sim_daemon_then_view(tmp_path: Path) -> None:
    root = tmp_path / "data"
    daemon = Daemon(tmp_path, _daemon_config(root))
    out = tmp_path / "display.rrd"
    process: subprocess.Popen[str] | None = None
    seen: list[str] = []
    try:
        daemon.start()
        process = _display(daemon.config_path, out)
        _wait_line(process, "hilrec display: receiving", seen)
        events = daemon.telemetry(topics=(b"event",))
        try:
            daemon.call("start_episode", task="Put the cube in the bin.", seed=4)
            daemon.wait_frames(40)
            frames = int(daemon.call("stop_episode", success=True)["frames"])
            daemon.wait_saved(1)
            verdict = events.wait_for(lambda _t, h: h.get("event") == "episode_verdict", 120.0)
            assert verdict is not None, daemon.log()
        finally:
            events.close()
        process.send_signal(signal.SIGINT)
        rest, _ = process.communicate(timeout=DISPLAY_TIMEOUT_S)
        seen.extend(rest.splitlines())
        assert process.returncode == 0, "".join(seen)
        assert daemon.shutdown() == 0
    finally:
        if process is not None and process.poll() is None:
            process.kill()
            process.wait(10)
        daemon.close()
    counts = _summary(seen)
    found = entities(out)
    expected = {"/camera/front", "/timing/late_ms", "/timing/duration_ms", "/events", "/verdicts"}
    expected |= {f"/{s}/{j}" for s in ("state", "action") for j in JOINTS}
    expected |= {f"/divergence/commanded_vs_measured/{j}" for j in JOINTS}
    assert expected <= found, found
    assert rows(out, "/timing/late_ms", index="tick") == counts["ticks"] > 0
    recorded = rows(out, "/state/gripper", index="frame")
    # A subscriber may only miss messages (the PUB socket drops them), never invent one.
    assert recorded == frames if counts["missed"] == 0 else recorded <= frames
    assert rows(out, "/verdicts", index="tick") == 1

    # The same episode after the fact: the sidecar's tick timing and flags come too.
    view = tmp_path / "view.rrd"
    result = run_cli("view", str(root), "--rrd", str(view), timeout_s=120)
    assert result.returncode == 0, result.stderr
    for entity in ("/camera/front", "/timing/late_ms", "/timing/skipped", "/flags/bits", "/state/wrist_roll"):
        assert rows(view, entity) == frames, entity


@pytest.mark.timeout(300)
def test_view_hardware_episode_with_its_replay(tmp_path: Path) -> None:
    """An emulated (hardware) episode: the twin's replay is logged beside the recorded joints."""
    root = tmp_path / "data"
    daemon = Daemon(tmp_path, emulated_config(root))
    try:
        daemon.start()
        daemon.call("start_episode", task="Put the cube in the bin.")
        daemon.wait_frames(60)
        frames = int(daemon.call("stop_episode", success=True)["frames"])
        daemon.wait_saved(1)
        assert daemon.shutdown() == 0
    finally:
        daemon.close()
    out = tmp_path / "view.rrd"
    result = run_cli("view", str(root), "--rrd", str(out), timeout_s=240)
    assert result.returncode == 0, result.stderr
    assert "replay " in result.stdout, result.stdout
    for joint in JOINTS:
        assert rows(out, f"/replay/recorded/{joint}") == frames
        assert rows(out, f"/replay/replayed/{joint}") == frames
    assert rows(out, "/replay/verdict") == 1
    assert rows(out, "/timing/late_ms") == frames
