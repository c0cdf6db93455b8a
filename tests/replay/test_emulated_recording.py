"""The emulated-follower recordings the replay tests judge do not change with the host's load.

On the tick clock a reading is fixed by the tick, so a reply that a loaded host held past the
client's timeout must not turn into a FOLLOWER_FAILED row (which would change what the check is
asked to judge); only a servo that really stopped answering flags its rows.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from _recordings import Frozen, RecordingSpec, record_emulated

from hilrec.daemon.dataset import FrameFlag

FRAMES = 20


def test_replies_a_loaded_host_held_leave_the_recording_unchanged(tmp_path: Path) -> None:
    clean = record_emulated(RecordingSpec(seed=3, frames=FRAMES), tmp_path)
    # Six held replies: every attempt of the driver's read at frame 5 and the next one's too.
    held = record_emulated(RecordingSpec(seed=3, frames=FRAMES, held_replies=(5, 6)), tmp_path)
    assert not held.frame_flags.any(), held.frame_flags
    np.testing.assert_array_equal(held.state, clean.state)
    np.testing.assert_array_equal(held.action, clean.action)


def test_a_silent_servo_still_flags_its_rows(tmp_path: Path) -> None:
    silent = record_emulated(
        RecordingSpec(seed=3, frames=FRAMES, unresponsive=Frozen("wrist_flex", 15)), tmp_path
    )
    failed = silent.frame_flags & int(FrameFlag.FOLLOWER_FAILED) != 0
    np.testing.assert_array_equal(failed, np.arange(FRAMES) >= 15)
