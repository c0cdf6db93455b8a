"""``hilrec collect --display rerun --display-rrd OUT.rrd`` over the emulated daemon: a
``hilrec display`` child logs the session, and the ``.rrd`` read back with rerun's own dataframe
API holds the cameras, the joints (follower, leader command, twin), the divergence, the events
and each take's verdict, with one joint row per recorded frame."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from _daemon import Daemon, check_passes, emulated_config

from hilrec.daemon.dataset.format.reader import load_episodes
from hilrec.daemon.dataset.format.sidecar import load_episode_sidecar

# Real daemons, processes or kill loops: the slow tier (make test runs it; make test-fast does not).
pytestmark = pytest.mark.slow

dataframe = pytest.importorskip("rerun.dataframe")

JOINTS = ("shoulder_pan", "shoulder_lift", "elbow_flex", "wrist_flex", "wrist_roll", "gripper")
CLI = (sys.executable, "-m", "hilrec.daemon.cli")
FPS = 25
TAKES = 2
TAKE_S = 3.0
CAMERAS = """
[cameras.front]
source = "twin"
height = 48
width = 64
fps = 10
stall_ms = 3000
"""


def skipped_slots(root: Path, episode_index: int) -> int:
    sidecar, _ = load_episode_sidecar(root, episode_index)
    assert sidecar is not None, f"episode {episode_index} has no sidecar"
    return int(sidecar["timing"]["skipped_slots"])


def display_config(root: Path) -> str:
    text = emulated_config(root, cameras=CAMERAS)
    return text.replace("preview_hz = 0.0", "preview_hz = 5.0\npreview_width = 64")


def collect(config: Path, *args: str, timeout_s: float = 400.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hilrec.daemon.cli", "collect", "--config", str(config), "--no-sounds", *args],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )


def entities(path: Path) -> set[str]:
    recording = dataframe.load_recording(str(path))
    return {c.entity_path for c in recording.schema().component_columns()}


def rows(path: Path, entity: str, index: str) -> int:
    """The number of ``index`` values at which ``entity`` has data."""
    table = dataframe.load_recording(str(path)).view(index=index, contents=entity).select().read_all()
    column = next((n for n in table.column_names if n.startswith(entity + ":")), None)
    return 0 if column is None else int(table.num_rows - table.column(column).null_count)


def recorded_ticks(path: Path, entity: str) -> int:
    """Ticks at which ``entity`` was logged with a dataset frame (while a take recorded)."""
    table = dataframe.load_recording(str(path)).view(index="tick", contents=entity).select().read_all()
    column = next(n for n in table.column_names if n.startswith(entity + ":"))
    logged = table.column(column).is_valid()
    framed = table.column("frame").is_valid()
    return sum(1 for a, b in zip(logged.to_pylist(), framed.to_pylist(), strict=True) if a and b)


def display_summary(log: str) -> dict[str, int]:
    """``hilrec display: 97 ticks, 19 previews, 4 events; missed 0, refused 0`` -> numbers."""
    last = next(line for line in reversed(log.splitlines()) if " ticks, " in line)
    counts = {name: int(n) for n, name in re.findall(r"(\d+) (ticks|previews|events)", last)}
    return counts | {name: int(n) for name, n in re.findall(r"(missed|refused) (\d+)", last)}


@pytest.mark.timeout(600)
def test_collect_display_rerun_writes_the_session_to_an_rrd(tmp_path: Path) -> None:
    root = tmp_path / "ds"
    config = Daemon(tmp_path, display_config(root)).config_path  # free ports; collect starts it
    out = tmp_path / "live" / "session.rrd"
    timed = ("--episode-time-s", str(TAKE_S), "--reset-time-s", "1")
    result = collect(
        config, "--episodes", str(TAKES), *timed, "--display", "rerun", "--display-rrd", str(out)
    )
    log_path = root.parent / "ds.display.log"
    said = result.stdout + result.stderr + (log_path.read_text() if log_path.exists() else "")
    assert result.returncode == 0, said
    assert f"collect: {TAKES} take(s) kept" in result.stdout, said
    assert f"collect: starting the rerun display; its log: {log_path}" in result.stdout
    for trouble in ("display exited", "receives nothing", "did not stop in time", "could not start"):
        assert trouble not in result.stdout, said
    check_passes(root)
    episodes = load_episodes(root)
    lengths = [int(e["length"]) for e in episodes]
    assert len(lengths) == TAKES, lengths
    # A take's slots are its rows plus the ticks the loop recorded as skipped (its sidecar's timing
    # summary): on a loaded machine rows alone fell to 53 of 75 (24 skipped slots recorded), which
    # is the loop measuring its lateness, not a take cut short (run 98).
    skipped = [skipped_slots(root, int(e["episode_index"])) for e in episodes]
    slots = [n + s for n, s in zip(lengths, skipped, strict=True)]
    assert min(slots) >= 0.8 * FPS * TAKE_S, (lengths, skipped)

    summary = display_summary(log_path.read_text())
    found = entities(out)
    expected = {"/camera/front", "/timing/late_ms", "/timing/duration_ms", "/events", "/verdicts"}
    expected |= {f"/{s}/{j}" for s in ("state", "action", "leader", "twin") for j in JOINTS}
    expected |= {
        f"/divergence/{k}/{j}" for k in ("commanded_vs_measured", "measured_vs_twin") for j in JOINTS
    }
    assert expected <= found, sorted(expected - found)
    # Every tick the display heard is in the file (its timing is logged on every tick), each
    # recorded frame once: a subscriber may miss messages (counted), never invent one. A tick
    # whose arm read failed (a loaded host stalls the emulators' pty now and then) has no state
    # to show, and is flagged.
    ticks = rows(out, "/timing/duration_ms", index="tick")
    assert ticks == summary["ticks"] > sum(lengths)
    flagged = rows(out, "/flags/text", index="tick")
    assert ticks - flagged <= rows(out, "/state/gripper", index="tick") <= ticks, (ticks, flagged)
    recorded = recorded_ticks(out, "/timing/duration_ms")
    assert sum(lengths) - summary["missed"] <= recorded <= sum(lengths), (recorded, lengths, summary)
    assert rows(out, "/camera/front", index="tick") >= 5 * TAKES * TAKE_S * 0.5
    assert rows(out, "/verdicts", index="tick") == TAKES


def test_display_rerun_without_a_screen_is_refused_before_the_daemon_starts(tmp_path: Path) -> None:
    root = tmp_path / "ds"
    config = Daemon(tmp_path, display_config(root)).config_path
    env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY")}
    done = subprocess.run(
        [*CLI, "collect", "--config", str(config), "--episodes", "1", "--no-sounds", "--display", "rerun"],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=env,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert "flag --display: there is no screen for rerun's viewer" in done.stderr, done.stderr
    assert "--display-rrd OUT.rrd" in done.stderr and "starting the daemon" not in done.stdout
    assert not root.exists()
