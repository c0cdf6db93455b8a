"""The wire protocol: what is accepted, and that every refusal names the problem."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from hilrec.daemon.dataset import FrameFlag, flag_names
from hilrec.daemon.errors import (
    OversizedMessageError,
    ProtocolError,
    UnknownCommandError,
    VersionMismatchError,
)
from hilrec.daemon.wire.protocol import (
    COMMANDS,
    PROTOCOL_VERSION,
    TOPIC_TICK,
    encode_leader,
    error_code,
    error_reply,
    new_request,
    ok_reply,
    parse_leader,
    parse_reply,
    parse_request,
    parse_telemetry,
    telemetry_header,
)


def test_every_command_round_trips_through_the_client_encoding() -> None:
    examples: dict[str, dict[str, Any]] = {
        "start_episode": {"task": "pick the cube", "seed": 7},
        "stop_episode": {"success": True},
        "session_note": {"phase": "reset", "take": 1, "takes": 3, "seconds_left": 2.5, "task": "x"},
    }
    for cmd in COMMANDS:
        request = new_request(cmd, **examples.get(cmd, {}))
        parsed = parse_request([request.encode()])
        assert parsed.cmd == cmd and dict(parsed.args) == examples.get(cmd, {})
        assert parsed.id == request.id and json.loads(request.encode())["v"] == PROTOCOL_VERSION


def test_a_hand_typed_request_without_version_or_id_is_read_as_the_current_version() -> None:
    parsed = parse_request([b'{"cmd": "status"}'])
    assert parsed.cmd == "status" and parsed.id is None


@pytest.mark.parametrize(
    ("frames", "error", "fragment"),
    [
        ([b"not json"], ProtocolError, "not valid JSON"),
        ([b"\xff\xfe"], ProtocolError, "not UTF-8"),
        ([b"[1, 2]"], ProtocolError, "must be a JSON object, got list"),
        ([b'{"task": "x"}'], ProtocolError, "no 'cmd' field"),
        ([b'{"cmd": 3}'], ProtocolError, "'cmd' must be a string"),
        ([b'{"cmd": "fly"}'], UnknownCommandError, "unknown command 'fly'"),
        ([b'{"cmd": "status", "v": 2}'], VersionMismatchError, "protocol version int 2"),
        ([b'{"cmd": "status", "verbose": true}'], ProtocolError, "unknown argument 'verbose'"),
        ([b'{"cmd": "start_episode"}'], ProtocolError, "needs argument 'task'"),
        ([b'{"cmd": "start_episode", "task": ""}'], ProtocolError, "must not be empty"),
        ([b'{"cmd": "start_episode", "task": "a", "seed": "1"}'], ProtocolError, "'seed' must be int"),
        ([b'{"cmd": "start_episode", "task": "a", "seed": true}'], ProtocolError, "'seed' must be int"),
        ([b'{"cmd": "start_episode", "task": "a", "seed": -1}'], ProtocolError, "'seed' must be in"),
        ([b'{"cmd": "stop_episode", "success": 1}'], ProtocolError, "'success' must be bool"),
        ([b'{"cmd": "status", "x": NaN}'], ProtocolError, "NaN is not a JSON number"),
        ([b'{"cmd": "status"}', b"extra"], ProtocolError, "has 2 frames, expected exactly 1"),
        ([b'{"cmd": "status", "id": 5}'], ProtocolError, "'id' must be a string"),
    ],
)
def test_malformed_requests_are_refused_naming_the_problem(
    frames: list[bytes], error: type, fragment: str
) -> None:
    with pytest.raises(error, match=fragment.replace("(", r"\(")):
        parse_request(frames)


def test_oversized_request_names_its_size_and_the_limit() -> None:
    payload = json.dumps({"cmd": "start_episode", "task": "x" * 500}).encode()
    with pytest.raises(
        OversizedMessageError, match=f"{len(payload)} bytes, over the limit of 100 bytes"
    ) as info:
        parse_request([payload], max_bytes=100)
    assert error_code(info.value) == "too_large"


def test_replies_carry_version_and_echo_the_id() -> None:
    ok = parse_reply(ok_reply("abc", cmd="status", state="idle"))
    assert ok == {"v": PROTOCOL_VERSION, "id": "abc", "ok": True, "cmd": "status", "state": "idle"}
    err = parse_reply(error_reply(None, "no episode", "bad_state"))
    assert err["ok"] is False and err["error"] == "no episode" and err["code"] == "bad_state"
    with pytest.raises(VersionMismatchError):
        parse_reply(b'{"ok": true}')


def test_leader_command_is_six_finite_numbers_cast_to_float32() -> None:
    command = parse_leader([encode_leader([1.5, -2, 3, 4, 5, 60], seq=9)])
    assert command.seq == 9 and command.action.dtype == np.float32
    np.testing.assert_array_equal(command.action, np.array([1.5, -2, 3, 4, 5, 60], dtype=np.float32))


@pytest.mark.parametrize(
    ("payload", "fragment"),
    [
        (b'{"v": 1, "type": "leader", "action": [1, 2, 3]}', "list of 6 numbers"),
        (b'{"v": 1, "type": "leader", "action": [1, 2, 3, 4, 5, "6"]}', "'action[5]' must be a number"),
        (b'{"v": 1, "type": "leader", "action": [1, 2, 3, 4, 5, 1e999]}', "'action[5]' must be a finite"),
        (b'{"v": 1, "type": "goal", "action": [1, 2, 3, 4, 5, 6]}', "'type' must be 'leader'"),
        (b'{"type": "leader", "action": [1, 2, 3, 4, 5, 6]}', "no protocol version"),
        (b'{"v": 1, "type": "leader", "action": [1, 2, 3, 4, 5, 6], "speed": 2}', "unknown field 'speed'"),
    ],
)
def test_bad_leader_commands_are_refused(payload: bytes, fragment: str) -> None:
    with pytest.raises(ProtocolError, match=fragment.replace("[", r"\[").replace("(", r"\(")):
        parse_leader([payload])


def test_telemetry_header_is_checked_against_its_topic() -> None:
    topic, header, rest = parse_telemetry([TOPIC_TICK, telemetry_header(TOPIC_TICK, 4, slot=4), b"x"])
    assert topic == "tick" and header["seq"] == 4 and header["v"] == PROTOCOL_VERSION and rest == [b"x"]
    with pytest.raises(ProtocolError, match="does not match topic"):
        parse_telemetry([b"event", telemetry_header(TOPIC_TICK, 0)])


def test_frame_flag_names_are_stable_bits() -> None:
    assert FrameFlag.FOLLOWER_RETRIED == 1 and FrameFlag.OVERRUN == 1 << 10
    assert flag_names(int(FrameFlag.LATE | FrameFlag.CLAMPED)) == ["clamped", "late"]


def test_the_protocol_doc_lists_the_frame_flags_as_the_enum_defines_them() -> None:
    import re
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "protocol.md").read_text(encoding="utf-8")
    section = doc.split("## Frame flags", 1)[1].split("\n#", 1)[0]
    rows = re.findall(r"^\|\s*(\d+)\s*\|\s*`([a-z_]+)`\s*\|", section, re.M)
    assert [(int(bit), name) for bit, name in rows] == [
        (int(f).bit_length() - 1, str(f.name).lower()) for f in FrameFlag
    ]


HOSTILE_LEADER = [
    b'{"v":1,"type":"leader","seq":1,"action":[1e39,0,0,0,0,0]}',  # finite JSON, inf as float32
    b'{"v":1,"type":"leader","seq":1,"action":[-3.5e38,0,0,0,0,0]}',
    b'{"v":1,"type":"leader","seq":1,"action":[0,0,0,0,0,0],"action":[1e39,0,0,0,0,0]}',
    b'{"v":1,"type":"leader","seq":1,"action":[' + b"9" * 401 + b",0,0,0,0,0]}",  # OverflowError
    b'{"v":1.0,"type":"leader","seq":1,"action":[0,0,0,0,0,0]}',
    b'{"v":true,"type":"leader","seq":1,"action":[0,0,0,0,0,0]}',
]


@pytest.mark.parametrize("raw", HOSTILE_LEADER)
def test_leader_commands_the_float32_cast_cannot_carry_are_refused(raw: bytes) -> None:
    with pytest.raises(ProtocolError):
        parse_leader([raw])


def test_the_largest_finite_float32_passes_the_protocol_for_the_clamp_to_judge() -> None:
    big = float(np.finfo(np.float32).max)
    command = parse_leader([encode_leader([big, 0, 0, 0, 0, 0], seq=1)])
    assert command.action[0] == np.float32(big)


@pytest.mark.parametrize(
    "task, why",
    [
        ("bad \ud800", "not valid Unicode"),
        ("two\nlines", "control characters"),
        ("nul\x00", "control characters"),
        ("   ", "empty"),
        ("x" * 1001, "at most 1000"),
    ],
)
def test_task_strings_that_cannot_be_written_are_refused_at_the_socket(task: str, why: str) -> None:
    raw = json.dumps({"v": 1, "cmd": "start_episode", "task": task}).encode()  # \ud800 as JSON escapes it
    with pytest.raises(ProtocolError, match=why):
        parse_request([raw])


def test_a_request_key_given_twice_is_refused() -> None:
    with pytest.raises(ProtocolError, match="appears twice"):
        parse_request([b'{"v":1,"cmd":"status","cmd":"shutdown"}'])


def _note(**fields: Any) -> bytes:
    return json.dumps({"cmd": "session_note", "phase": "recording", "take": 1, "takes": 2, **fields}).encode()


@pytest.mark.parametrize("phase", ["recording", "reset", "final_reset", "paused", "finishing"])
def test_a_session_note_carries_collects_phase_and_1_based_take(phase: str) -> None:
    parsed = parse_request([_note(phase=phase, take=2, seconds_left=0, task="pick")])
    assert dict(parsed.args) == {"phase": phase, "take": 2, "takes": 2, "seconds_left": 0, "task": "pick"}
    assert "seconds_left" not in parse_request([_note()]).args  # a phase with no countdown


@pytest.mark.parametrize(
    ("fields", "fragment"),
    [
        ({"phase": "idle"}, "argument 'phase' must be one of recording, reset, final_reset"),
        ({"phase": 3}, "argument 'phase' must be str"),
        ({"take": 0}, "argument 'take' must be in [1, takes=2] (1-based), got 0"),
        ({"take": 3}, "argument 'take' must be in [1, takes=2]"),
        ({"take": True}, "argument 'take' must be int"),
        ({"take": 1.0}, "argument 'take' must be int"),
        ({"takes": 0, "take": 0}, "argument 'takes' must be at least 1"),
        ({"seconds_left": -1}, "argument 'seconds_left' must be a finite number in [0, 86400]"),
        ({"seconds_left": 1e300}, "argument 'seconds_left' must be a finite number"),
        ({"seconds_left": "5"}, "argument 'seconds_left' must be int or float"),
        ({"task": ""}, "argument 'task'"),
        ({"ends_at": 3.0}, "unknown argument 'ends_at'"),
    ],
)
def test_bad_session_notes_are_refused_naming_the_field(fields: dict[str, Any], fragment: str) -> None:
    with pytest.raises(ProtocolError) as caught:
        parse_request([_note(**fields)])
    assert fragment in str(caught.value)


def test_a_session_note_without_its_required_fields_is_refused() -> None:
    for name in ("phase", "take", "takes"):
        obj = json.loads(_note())
        del obj[name]
        with pytest.raises(ProtocolError, match=f"needs argument '{name}'"):
            parse_request([json.dumps(obj).encode()])
