"""What the page is told, from the daemon's replies and events (the model alone, no sockets)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from hilrec.daemon.dataset.format.sidecar import episode_json_path
from hilrec.daemon.ui.model import BenchModel
from hilrec.daemon.ui.takes import TakeFiles


def status(uptime_s: float, episodes: int = 0) -> dict[str, Any]:
    return {"ok": True, "state": "idle", "uptime_s": uptime_s, "dataset": {"episodes": episodes}}


def take(index: int) -> dict[str, Any]:
    return {"episode_index": index, "replay_png": False}


def test_verdicts_are_shown_when_they_come_and_none_otherwise() -> None:
    model = BenchModel(started_at=0.0)
    model.on_status(status(5.0, episodes=2), [take(1), take(0)], now=10.0)
    assert [t["verdict"] for t in model.takes()] == [None, None]
    [event, pushed] = model.on_event(
        {"event": "episode_verdict", "episode_index": 1, "verdict": "bad", "summary": "episode 1 lags"},
        now=11.0,
    )
    assert event["type"] == "event" and pushed["type"] == "status"
    verdicts = {t["episode_index"]: t["verdict"] for t in pushed["takes"]}
    assert verdicts[0] is None
    assert verdicts[1] is not None and (verdicts[1]["verdict"], verdicts[1]["summary"]) == (
        "bad",
        "episode 1 lags",
    )


def test_a_stopped_take_is_listed_as_saving_until_the_daemon_counts_it() -> None:
    model = BenchModel(started_at=0.0)
    model.on_status(status(5.0), [], now=10.0)
    model.on_event({"event": "episode_stopped", "episode_index": 0, "frames": 80, "saving": True}, now=11.0)
    [pending] = model.takes()
    assert pending["saving"] and pending["frames"] == 80 and pending["verdict"] is None
    model.on_status(status(6.0, episodes=1), [{**take(0), "frames": 80}], now=12.0)
    [saved] = model.takes()
    assert not saved["saving"] and saved["frames"] == 80


def test_a_silent_daemon_is_down_since_its_last_answer_and_up_again_when_it_answers() -> None:
    model = BenchModel(started_at=1.0)
    [link] = model.on_unreachable("no reply", now=2.0)
    assert link["daemon"] == "down" and link["down_since"] == 1.0  # never answered: since start
    messages = model.on_status(status(5.0), [], now=3.0)
    assert messages[0]["type"] == "link" and messages[0]["daemon"] == "up"
    assert [m["type"] for m in model.on_status(status(5.5), [], now=3.5)] == ["status"]
    [link] = model.on_unreachable("no reply", now=9.0)
    assert link["down_since"] == 3.5
    assert model.on_unreachable("no reply", now=10.0) == []  # said once
    # A new daemon process (its uptime starts again) is a restart.
    model.on_status(status(0.5), [], now=11.0)
    assert model.link_message()["restarts"] == 1 and model.snapshot()["link"]["daemon"] == "up"


def test_faults_are_logged_as_they_happen_newest_first() -> None:
    model = BenchModel(started_at=0.0)
    fault = {"kind": "device_lost", "device": "follower", "message": "port /dev/pts/0 is gone"}
    model.on_event({"event": "fault", "t_wall": 5.0, "fault": fault}, now=5.1)
    model.on_event({"event": "fault_cleared", "t_wall": 6.0, "fault": fault}, now=6.1)
    log = list(model.faults_log)
    assert [(f["at"], f["cleared"], f["device"]) for f in log] == [
        (6.0, True, "follower"),
        (5.0, False, "follower"),
    ]


def test_the_take_files_are_read_again_when_the_daemon_adds_the_verdict(tmp_path: Path) -> None:
    path = episode_json_path(tmp_path, 0)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"task": "t", "frames": 80, "ended_by": "stop_episode", "timing": {}}))
    files = TakeFiles(tmp_path)
    [listed] = files.scan(1)
    assert listed == {
        "episode_index": 0,
        "task": "t",
        "frames": 80,
        "ended_by": "stop_episode",
        "replay_png": False,
    }
    path.write_text(
        json.dumps(
            {"task": "t", "frames": 80, "verdict": {"verdict": "sound", "summary": "keep it", "details": {}}}
        )
    )
    os.utime(path, ns=(path.stat().st_mtime_ns + 10**9,) * 2)  # a later write, whatever the clock's grain
    [listed] = files.scan(1)
    assert listed["verdict"] == {"verdict": "sound", "summary": "keep it"}
    model = BenchModel(started_at=0.0)
    model.on_status(status(1.0, episodes=1), [listed], now=1.0)
    assert model.takes()[0]["verdict"]["verdict"] == "sound"


def test_collects_note_becomes_the_pages_phase_take_and_countdown() -> None:
    model = BenchModel(started_at=0.0)
    note = {"phase": "reset", "take": 1, "takes": 3, "task": "pick", "seconds_left": 4.5, "age_s": 0.1}
    pushed = model.on_status({**status(5.0, episodes=1), "collect": note}, [take(0)], now=20.0)[-1]
    assert pushed["session"] == {
        "source": "collect",
        "phase": "reset",
        "take": "take 1 of 3",
        "task": "pick",
        "ends_at": 24.5,
    }
    waiting = {**note, "phase": "final_reset", "take": 3, "seconds_left": None}
    pushed = model.on_status({**status(6.0, episodes=3), "collect": waiting}, [], now=30.0)[-1]
    assert (pushed["session"]["phase"], pushed["session"]["take"]) == ("final_reset", "take 3 of 3")
    assert pushed["session"]["ends_at"] is None


def test_without_collect_the_page_shows_the_daemons_state_with_takes_from_1() -> None:
    model = BenchModel(started_at=0.0)
    pushed = model.on_status({**status(5.0, episodes=0), "collect": None}, [], now=10.0)[-1]
    assert pushed["session"]["source"] == "daemon"
    assert (pushed["session"]["phase"], pushed["session"]["take"]) == ("idle", "next: take 1")
    recording = {**status(6.0), "state": "recording", "episode": {"index": 0, "task": "pick"}}
    pushed = model.on_status(recording, [], now=11.0)[-1]
    assert (pushed["session"]["phase"], pushed["session"]["take"]) == ("recording", "take 1")
