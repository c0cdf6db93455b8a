"""A take that starts with the follower away from the leader (issue 22, item 13).

On a real bench the follower rests where it was left and swings to the leader when the take
starts, at its servos' speed, not the twin's. The check used to call that swing a divergence;
it now reports it as the approach and judges the rest, while a take that diverges after its
approach still fails.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
from _recordings import Frozen, RecordingSpec, make_twin, record, write_native
from _results import onset_of

from hilrec.daemon.replay.check import replay_dataset
from hilrec.daemon.replay.metrics import approach_end
from hilrec.daemon.replay.results import EpisodeResult, ReplayVerdict, to_json
from hilrec.daemon.replay.settings import ApproachSettings, ReplaySettings

# A folded arm, as a follower rests between takes; its servos move at most 120 deg/s, above every
# speed of the leader's paths and below the twin's swing on the first large move.
REST = (0.0, -100.0, 95.0, 70.0, 0.0, 2.0)
SPECS = {
    "approach": RecordingSpec(seed=0, frames=200, start=REST, max_speed_deg_s=120.0),
    "approach_then_jam": RecordingSpec(
        seed=3, frames=200, start=REST, max_speed_deg_s=120.0, frozen=Frozen("shoulder_lift", 120)
    ),
    "at_the_leader": RecordingSpec(seed=0, frames=200, max_speed_deg_s=120.0),
}
WHOLE = dataclasses.replace(ReplaySettings(), approach=ApproachSettings(max_s=0.0))  # the old judgement


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    twin = make_twin()
    episodes = [record(spec, twin) for spec in SPECS.values()]
    return write_native(tmp_path_factory.mktemp("approach") / "dataset", episodes, twin)


def results(root: Path, settings: ReplaySettings) -> dict[str, EpisodeResult]:
    check = replay_dataset(root, settings=settings, settings_source="test")
    return {name: check.results[i] for i, name in enumerate(SPECS)}


def test_the_swing_to_the_leader_is_reported_as_the_approach_and_the_rest_judged(root: Path) -> None:
    whole = results(root, WHOLE)["approach"]
    assert whole.verdict is ReplayVerdict.DIVERGED and onset_of(whole) < 5, whole.reason  # as before
    found = results(root, ReplaySettings())["approach"]
    assert found.verdict is ReplayVerdict.CONSISTENT, found.reason
    # The follower closes its 83 deg gap at 120 deg/s: 0.6..0.8 s at 25 fps.
    assert 15 <= found.approach_frames <= 20
    seconds = found.approach_frames / 25
    assert (
        f"approach: first {seconds:.2f} s" in found.reason and "follower moving to the leader" in found.reason
    )
    assert to_json(found)["approach"] == {"frames": found.approach_frames, "s": seconds}
    assert max(j.judged_max_error for j in found.joints) < 3.0


def test_a_take_that_diverges_after_its_approach_still_fails(root: Path) -> None:
    jammed = results(root, ReplaySettings())["approach_then_jam"]
    assert jammed.approach_frames > 0
    assert jammed.verdict is ReplayVerdict.DIVERGED and jammed.divergence_joint == "shoulder_lift"
    assert 120 <= onset_of(jammed) <= 123


def test_a_take_starting_at_the_leader_has_no_approach(root: Path) -> None:
    clean = results(root, ReplaySettings())["at_the_leader"]
    assert clean.approach_frames == 0 and clean.verdict is ReplayVerdict.CONSISTENT
    assert to_json(clean)["approach"] is None


def _gaps(*columns: list[float]) -> tuple[np.ndarray, np.ndarray]:
    """An action of zeros and a state whose distance from it is each column, frame by frame."""
    state = np.array(columns, dtype=np.float64).T
    return np.zeros_like(state), state


@pytest.mark.parametrize(
    ("gaps", "expected"),
    [
        (([40, 30, 20, 10, 4, 2, 1], [0, 0, 0, 0, 0, 0, 0]), 4),  # closes to 5 at frame 4
        (([40, 30, 20, 10, 4, 2, 1], [0, 0, 0, 0, 8, 3, 1]), 5),  # every joint must be close
        (([8, 6, 4, 2, 1, 1, 1], [0, 0, 0, 0, 0, 0, 0]), 0),  # started near: no approach
        (([40, 20, 30, 10, 4, 2, 1], [0, 0, 0, 0, 0, 0, 0]), 0),  # widened on the way: not one
        (([40, 38, 36, 34, 32, 30, 28], [0, 0, 0, 0, 0, 0, 0]), 0),  # never caught up: judged whole
    ],
)
def test_an_approach_starts_away_closes_steadily_and_ends_near_the_leader(
    gaps: tuple[list[float], list[float]], expected: int
) -> None:
    action, state = _gaps(*gaps)
    assert approach_end(action, state, min_gap=10.0, settled_gap=5.0, max_frames=6) == expected
