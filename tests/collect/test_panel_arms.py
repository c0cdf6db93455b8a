"""collect's live panel with a two-arm daemon's tick (twelve joints): the follower against the
leader as two tables side by side, named left and right, each with its own arm's values; a
one-arm tick keeps its one table."""

from __future__ import annotations

from rich.console import Console

from hilrec.daemon.collect.panel import _joints_table
from hilrec.daemon.so101 import JOINT_NAMES


def rendered(tick: dict) -> list[str]:
    console = Console(width=200, record=True, color_system=None)
    console.print(_joints_table(tick))
    return console.export_text().splitlines()


def test_twelve_joints_show_as_a_left_and_a_right_table_side_by_side() -> None:
    state = [float(i) for i in range(12)]  # left 0..5, right 6..11
    leader = [v + 0.5 for v in state]
    lines = rendered({"state": state, "leader": leader})
    titles = next(line for line in lines if "left arm" in line)
    assert "right arm" in titles and titles.index("left arm") < titles.index("right arm")
    for j, joint in enumerate(JOINT_NAMES):
        row = next(line for line in lines if line.lstrip().startswith(joint))
        assert row.count(joint) == 2, row  # both arms' row for the joint, on one line
        left, right = row.split(joint)[1], row.split(joint)[2]
        assert left.split()[:2] == [f"{j:.2f}", f"{j + 0.5:.2f}"], row
        assert right.split()[:2] == [f"{j + 6:.2f}", f"{j + 6.5:.2f}"], row


def test_six_joints_keep_one_table_without_an_arm_name() -> None:
    lines = rendered({"state": [1.0] * 6, "leader": [2.0] * 6})
    assert not any("arm" in line for line in lines)
    assert sum(line.lstrip().startswith(JOINT_NAMES[0]) for line in lines) == 1
    assert rendered({}) and not any("arm" in line for line in rendered({}))  # no tick yet
