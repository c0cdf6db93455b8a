"""``hilrec collect``'s last take can be redone: a final reset holds until its verdict is in, with
← and → working, and only then is the dataset finalized. And ← in the reset after an ``r`` (the
take was discarded) says nothing was saved and counts one re-record, not two."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from _daemon import Daemon, check_passes, sim_config
from _terminal import Terminal
from test_collect_terminal import LEFT, RIGHT, collect_argv, wait_frames

from hilrec.daemon.dataset.format.reader import load_episodes
from hilrec.daemon.wire.client import ControlClient

# Real daemons, processes or kill loops: the slow tier (make test runs it; make test-fast does not).
pytestmark = pytest.mark.slow


def test_the_last_take_is_judged_before_finalizing_and_can_be_recorded_again(tmp_path: Path) -> None:
    root = tmp_path / "ds"
    daemon = Daemon(tmp_path, sim_config(root))
    argv = collect_argv(
        daemon.config_path, "--episodes", "1", "--episode-time-s", "2", "--reset-time-s", "60", "--no-sounds"
    )
    term = Terminal(argv, env=dict(os.environ))
    client = ControlClient(daemon.control, timeout_ms=3000, retries=5)
    try:
        # r during the take: discarded; ← in the reset after it: nothing of it was ever saved.
        term.wait_for(r"take 1 of 1: recording episode 0", 120)
        wait_frames(client, 0, 10)
        term.send("r")
        term.wait_for(r"take 1: episode 0 discarded \(\d+ frames\); recording it again", 30)
        term.send(LEFT)
        term.wait_for(r"take 1: nothing of it was saved; recording it now", 30)
        # The last take runs its time; its verdict comes before any finalizing, in a reset.
        term.wait_for(r"take 1 of 1: recording episode 0", 60)
        term.wait_for(r"take 1 saved: episode 0, \d+ frames \(ended by 2 s\)", 60)
        term.wait_for(r"verdict take 1 \(episode 0\): SOUND: ", 120)
        term.wait_for(r"the last take is in: 60 s to press ← to record it again", 30)
        assert "finalizing the dataset" not in term.text
        term.send(LEFT)  # the saved last take, once more
        term.wait_for(r"take 1 will be recorded again; its episode stays in the dataset", 30)
        term.wait_for(r"take 1 of 1: recording episode 1", 60)
        term.wait_for(r"take 1 saved: episode 1", 60)
        term.wait_for(r"verdict take 1 \(episode 1\): SOUND: ", 120)
        term.wait_for(r"the last take is in", 30)
        term.send(RIGHT)  # finish now
        term.wait_for(r"finalizing the dataset", 30)
        term.wait_for(r"collect: 1 take\(s\) kept, 2 re-recorded, 0 discarded", 120)
        assert term.wait_exit(120) == 0
    finally:
        client.close()
        term.close()
    assert len(load_episodes(root)) == 2  # the superseded take stays: a saved episode is never lost
    check_passes(root)
