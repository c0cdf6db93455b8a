"""The daemon's copy of collect's session note: counted down on its own clock, dropped when stale."""

from __future__ import annotations

from hilrec.daemon.control.collect_note import NOTE_GRACE_S, NOTE_TTL_S, CollectNotes


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_note_counts_down_on_the_daemons_clock() -> None:
    clock = Clock()
    notes = CollectNotes(clock=clock)
    assert notes.status() is None
    notes.note({"phase": "reset", "take": 1, "takes": 3, "seconds_left": 4.0, "task": "pick"})
    clock.now += 1.5
    note = notes.status()
    assert note is not None
    assert (note["phase"], note["take"], note["takes"], note["task"]) == ("reset", 1, 3, "pick")
    assert note["seconds_left"] == 2.5 and note["age_s"] == 1.5


def test_a_note_from_a_collect_that_went_away_is_not_reported() -> None:
    clock = Clock()
    notes = CollectNotes(clock=clock)
    notes.note({"phase": "final_reset", "take": 2, "takes": 2})  # no countdown: waiting for a verdict
    clock.now += NOTE_TTL_S - 0.1
    assert notes.status() is not None and notes.status()["seconds_left"] is None  # type: ignore[index]
    clock.now += 0.2
    assert notes.status() is None


def test_a_note_whose_countdown_ended_long_ago_is_not_reported() -> None:
    clock = Clock()
    notes = CollectNotes(clock=clock)
    notes.note({"phase": "recording", "take": 1, "takes": 1, "seconds_left": 0.5})
    clock.now += 0.5 + NOTE_GRACE_S - 0.1
    assert notes.status() is not None and notes.status()["seconds_left"] == 0.0  # type: ignore[index]
    clock.now += 0.2
    assert notes.status() is None
