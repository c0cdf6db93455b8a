"""Which failed LeRobot runs the teleoperate tests put down to the host's timing and run again.

The texts are LeRobot 0.4.4's own (``FeetechMotorsBus._assert_motors_exist`` and the Feetech
SDK's ``getTxRxResult``), as a failed ``lerobot-teleoperate`` printed them in a loaded make test.
"""

from __future__ import annotations

from _teleoperate import missed_a_reply

HEAD = "RuntimeError: FeetechMotorsBus motor check failed on port '/dev/pts/1':\n\n"
EXPECTED = (
    "\nFull expected motor list (id: model_number):\n{1: 777, 2: 777, 3: 777, 4: 777, 5: 777, 6: 777}\n"
)


def test_a_servo_missing_from_the_connect_pings_is_a_missed_reply() -> None:
    assert missed_a_reply(HEAD + "Missing motor IDs:\n  - 1 (expected model: 777)\n" + EXPECTED)


def test_a_read_with_no_status_packet_is_a_missed_reply() -> None:
    assert missed_a_reply(
        "ConnectionError: Failed to sync read 'Present_Position' on ids=[1, 2, 3, 4, 5, 6] "
        "after 1 tries. [TxRxResult] There is no status packet!"
    )


def test_a_wrong_model_or_another_error_is_not() -> None:
    wrong = "Motors with incorrect model numbers:\n  - 2 (shoulder_lift): expected 777, found 1024\n"
    assert not missed_a_reply(HEAD + "Missing motor IDs:\n  - 1 (expected model: 777)\n" + wrong + EXPECTED)
    assert not missed_a_reply(HEAD + wrong + EXPECTED)
    assert not missed_a_reply(
        "FileNotFoundError: [Errno 2] No such file or directory: 'emulated_leader.json'"
    )
