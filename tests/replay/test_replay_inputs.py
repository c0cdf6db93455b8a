"""What the command accepts: episode selections, and action/state columns by name."""

from __future__ import annotations

import pytest

from hilrec.daemon.errors import ReplayError
from hilrec.daemon.replay.check import column_order, parse_episode_spec
from hilrec.daemon.so101 import POSITION_NAMES


def test_episode_specs_take_indices_lists_and_ranges() -> None:
    assert parse_episode_spec(["0", "3,5-7", "5", "10"]) == [0, 3, 5, 6, 7, 10]
    for bad in (["a"], ["3-1"], ["1-"], ["-2"]):
        with pytest.raises(ReplayError, match="--episodes"):
            parse_episode_spec(bad)


def test_columns_are_taken_by_name_in_any_order() -> None:
    shuffled = list(reversed(POSITION_NAMES))
    info = {"features": {"action": {"names": shuffled}}}
    order = column_order(info, "action")
    assert [shuffled[i] for i in order] == POSITION_NAMES
    # LeRobot 2.x wrote names as {"motors": [...]}.
    assert column_order({"features": {"action": {"names": {"motors": POSITION_NAMES}}}}, "action") == list(
        range(6)
    )


def test_columns_that_are_not_an_so101_are_refused() -> None:
    with pytest.raises(ReplayError, match=r"no 'observation\.state' feature"):
        column_order({"features": {}}, "observation.state")
    names = [f"motor_{i}" for i in range(6)]
    with pytest.raises(ReplayError, match="not the six SO-101 joints"):
        column_order({"features": {"action": {"names": names}}}, "action")
