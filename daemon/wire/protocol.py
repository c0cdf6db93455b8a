"""The daemon's wire protocol: every message type, its version, and its checks on arrival.

One module owns the wire format (as zguide's ``MDP.py`` and jupyter's ``session.py`` do), so the
server, the client, the tests and docs/protocol.md describe the same bytes. Three channels:

- **control** (REQ -> REP, port 5555): one UTF-8 JSON object per request, ``{"v", "id", "cmd",
  ...arguments}``; one JSON object per reply, ``{"v", "id", "ok": true, ...}`` or
  ``{"v", "id", "ok": false, "error", "code"}``. ``id`` is echoed so a Lazy-Pirate client can
  match a reply to its request, and the server answers a repeated ``id`` from its cache so a
  retried ``start_episode`` is not run twice.
- **telemetry** (PUB, port 5556): multipart ``[topic, JSON header, binary frames...]``. Topics:
  ``tick`` (every loop tick), ``preview`` (JPEG camera frames after the header), ``event``.
- **remote leader** (PUSH -> PULL, port 5557): one JSON object ``{"v", "type": "leader", "seq",
  "action": [6 numbers]}`` in LeRobot units, joint order of :data:`hilrec.daemon.so101.POSITION_NAMES`.

Within a version, messages only gain fields, and only optional ones (a client ignores what it does
not know, and reads a missing optional field as unknown): :data:`TICK_OPTIONAL_FIELDS`. Removing,
renaming or retyping a field, or making one required, is a new :data:`PROTOCOL_VERSION`.

Everything that arrives is checked before it is used: size, frame count, UTF-8, JSON, object,
version, command, argument names and types. A refusal is a :class:`ProtocolError` whose message
names the problem; the server turns it into an error reply and carries on.
"""

from __future__ import annotations

import json
import math
import re
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Final

import numpy as np

from hilrec.daemon.errors import (
    OversizedMessageError,
    ProtocolError,
    UnknownCommandError,
    VersionMismatchError,
)
from hilrec.daemon.so101 import NUM_JOINTS
from hilrec.daemon.text import task_problem

PROTOCOL_VERSION: Final[int] = 1

DEFAULT_MAX_REQUEST_BYTES: Final[int] = 64 * 1024
DEFAULT_MAX_LEADER_BYTES: Final[int] = 4 * 1024
MAX_ID_CHARS: Final[int] = 128
# Bounds checked on the raw text before the parser sees it. Python's parser recurses once per
# level and raises RecursionError near 1,000; int() of thousands of digits is quadratic. No
# message of this protocol nests deeper than a status reply (5) or needs more digits than a
# float's repr (24).
MAX_JSON_DEPTH: Final[int] = 32
MAX_NUMBER_CHARS: Final[int] = 64

TOPIC_TICK: Final[bytes] = b"tick"
# Optional tick fields (present when the daemon can tell), name -> meaning.
TICK_OPTIONAL_FIELDS: Final[dict[str, str]] = {
    "video_backlog_s": "seconds of video handed to the encoder processes and not encoded yet",
}
TOPIC_PREVIEW: Final[bytes] = b"preview"
TOPIC_EVENT: Final[bytes] = b"event"

# Reply codes: a machine-readable class of refusal beside the human message.
CODE_BAD_REQUEST: Final[str] = "bad_request"
CODE_UNKNOWN_CMD: Final[str] = "unknown_command"
CODE_TOO_LARGE: Final[str] = "too_large"
CODE_BAD_VERSION: Final[str] = "bad_version"
CODE_BAD_STATE: Final[str] = "bad_state"
CODE_FAULT: Final[str] = "fault"
CODE_TIMEOUT: Final[str] = "timeout"
CODE_INTERNAL: Final[str] = "internal"


class CollectPhase(StrEnum):
    """What a ``collect`` session is doing, as its ``session_note`` says (values on the wire)."""

    RECORDING = "recording"
    RESET = "reset"
    FINAL_RESET = "final_reset"  # after the last take, before finalizing: ← can still redo it
    PAUSED = "paused"
    FINISHING = "finishing"


# Longest countdown a note may carry: a day (a bigger one is a unit or clock mix-up).
MAX_NOTE_SECONDS: Final[float] = 86400.0

# command -> {argument: (accepted python types, required)}. The table *is* the request schema.
_INT = (int,)
_STR = (str,)
_BOOL = (bool,)
_NUM = (int, float)
COMMANDS: Final[dict[str, dict[str, tuple[tuple[type, ...], bool]]]] = {
    "status": {},
    "start_episode": {"task": (_STR, True), "seed": (_INT, False)},
    "stop_episode": {"success": (_BOOL, False)},
    "discard_episode": {},
    "finalize": {},
    "shutdown": {},
    # A rollout's switches (hilrec ctl takeover / handback, space in hilrec rollout): a person
    # takes the arm from the policy, and gives it back.
    "takeover": {},
    "handback": {},
    # collect's session state, for the pages beside it: take is 1-based (take 1 is episode 0),
    # seconds_left the phase's countdown when it has one (the daemon adds its own clock).
    "session_note": {
        "phase": (_STR, True),
        "take": (_INT, True),
        "takes": (_INT, True),
        "seconds_left": (_NUM, False),
        "task": (_STR, False),
    },
}
_ENVELOPE_KEYS: Final[frozenset[str]] = frozenset({"v", "id", "cmd"})


@dataclass(frozen=True, kw_only=True)
class Request:
    """A checked control request. ``args`` holds only the arguments its command declares."""

    cmd: str
    args: Mapping[str, Any]
    id: str | None = None

    def encode(self) -> bytes:
        return dumps({"v": PROTOCOL_VERSION, "id": self.id, "cmd": self.cmd, **self.args})


@dataclass(frozen=True, kw_only=True)
class LeaderCommand:
    """A checked remote-leader command: six float32 joint targets in LeRobot units."""

    seq: int
    action: np.ndarray


def new_request(cmd: str, **args: Any) -> Request:
    """Build a request with a fresh id (what a client sends)."""
    request = Request(cmd=cmd, args={k: v for k, v in args.items() if v is not None}, id=uuid.uuid4().hex)
    _check_args(request.cmd, dict(request.args))
    return request


def dumps(obj: Mapping[str, Any]) -> bytes:
    """Compact JSON; NaN/inf are refused because JSON has no spelling for them."""
    return json.dumps(obj, separators=(",", ":"), allow_nan=False, default=_json_default).encode()


# --- checks on arrival ---------------------------------------------------------------------------


def parse_request(frames: Sequence[bytes], *, max_bytes: int = DEFAULT_MAX_REQUEST_BYTES) -> Request:
    """Check one control request as received (all its frames) and return it."""
    payload = _single_frame(frames, "request", max_bytes)
    obj = _json_object(payload, "request")
    _check_version(obj, "request", required=False)
    request_id = obj.get("id")
    if request_id is not None and (not isinstance(request_id, str) or len(request_id) > MAX_ID_CHARS):
        raise ProtocolError(
            f"request field 'id' must be a string of at most {MAX_ID_CHARS} "
            f"characters, got {_describe(request_id)}"
        )
    if "cmd" not in obj:
        raise ProtocolError("request has no 'cmd' field")
    cmd = obj["cmd"]
    if not isinstance(cmd, str):
        raise ProtocolError(f"request field 'cmd' must be a string, got {_describe(cmd)}")
    if cmd not in COMMANDS:
        raise UnknownCommandError(f"unknown command {cmd!r} (known: {', '.join(COMMANDS)})")
    args = {k: v for k, v in obj.items() if k not in _ENVELOPE_KEYS}
    _check_args(cmd, args)
    return Request(cmd=cmd, args=args, id=request_id)


def request_id_of(frames: Sequence[bytes]) -> str | None:
    """The ``id`` of a request that failed its checks, if one can be read, for the error reply."""
    if len(frames) != 1 or len(frames[0]) > DEFAULT_MAX_REQUEST_BYTES:
        return None
    try:
        obj = _json_object(frames[0], "request")
    except ProtocolError:
        return None
    rid = obj.get("id")
    return rid if isinstance(rid, str) and len(rid) <= MAX_ID_CHARS else None


def parse_reply(payload: bytes) -> dict[str, Any]:
    """Check a control reply (client side)."""
    obj = _json_object(payload, "reply")
    _check_version(obj, "reply", required=True)
    if not isinstance(obj.get("ok"), bool):
        raise ProtocolError("reply has no boolean 'ok' field")
    if not obj["ok"] and not isinstance(obj.get("error"), str):
        raise ProtocolError("error reply has no 'error' string")
    return obj


def parse_leader(frames: Sequence[bytes], *, max_bytes: int = DEFAULT_MAX_LEADER_BYTES) -> LeaderCommand:
    """Check one remote-leader command as received."""
    obj = _json_object(_single_frame(frames, "leader command", max_bytes), "leader command")
    _check_version(obj, "leader command", required=True)
    if obj.get("type") != "leader":
        raise ProtocolError(f"leader command field 'type' must be 'leader', got {_describe(obj.get('type'))}")
    unknown = sorted(set(obj) - {"v", "type", "seq", "action"})
    if unknown:
        raise ProtocolError(f"leader command has unknown field {unknown[0]!r}")
    seq = obj.get("seq", 0)
    if isinstance(seq, bool) or not isinstance(seq, int):
        raise ProtocolError(f"leader command field 'seq' must be an integer, got {_describe(seq)}")
    action = obj.get("action")
    if not isinstance(action, list) or len(action) != NUM_JOINTS:
        raise ProtocolError(
            f"leader command field 'action' must be a list of {NUM_JOINTS} numbers, got {_describe(action)}"
        )
    # The check is on the float32 the servo would get: 1e39 is finite as JSON and inf as float32,
    # and an integer of hundreds of digits overflows the cast itself.
    targets = np.empty(NUM_JOINTS, dtype=np.float32)
    for i, value in enumerate(action):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ProtocolError(
                f"leader command field 'action[{i}]' must be a number, got {_describe(value)}"
            )
        try:
            with np.errstate(over="raise", invalid="raise"):
                targets[i] = np.float32(value)
        except (OverflowError, FloatingPointError):
            targets[i] = np.inf
        if not math.isfinite(targets[i]):
            raise ProtocolError(
                f"leader command field 'action[{i}]' must be a finite float32, got {_describe(value)}"
            )
    return LeaderCommand(seq=seq, action=targets)


def encode_leader(action: Sequence[float] | np.ndarray, seq: int) -> bytes:
    values = [float(x) for x in np.asarray(action, dtype=np.float32).reshape(-1)]
    return dumps({"v": PROTOCOL_VERSION, "type": "leader", "seq": seq, "action": values})


def parse_telemetry(frames: Sequence[bytes]) -> tuple[str, dict[str, Any], list[bytes]]:
    """Split a telemetry message into (topic, header, binary frames) and check the header."""
    if len(frames) < 2:
        raise ProtocolError(f"telemetry message has {len(frames)} frame(s), expected at least 2")
    topic = frames[0].decode("ascii", errors="replace")
    header = _json_object(frames[1], f"telemetry {topic!r} header")
    _check_version(header, f"telemetry {topic!r} header", required=True)
    if header.get("type") != topic:
        raise ProtocolError(f"telemetry header type {header.get('type')!r} does not match topic {topic!r}")
    return topic, header, list(frames[2:])


# --- replies -------------------------------------------------------------------------------------


def ok_reply(request_id: str | None, **fields: Any) -> bytes:
    return dumps({"v": PROTOCOL_VERSION, "id": request_id, "ok": True, **fields})


def error_reply(request_id: str | None, error: str, code: str) -> bytes:
    return dumps({"v": PROTOCOL_VERSION, "id": request_id, "ok": False, "error": error, "code": code})


def telemetry_header(topic: bytes, seq: int, **fields: Any) -> bytes:
    return dumps({"v": PROTOCOL_VERSION, "type": topic.decode("ascii"), "seq": seq, **fields})


def error_code(exc: ProtocolError) -> str:
    if isinstance(exc, UnknownCommandError):
        return CODE_UNKNOWN_CMD
    if isinstance(exc, OversizedMessageError):
        return CODE_TOO_LARGE
    if isinstance(exc, VersionMismatchError):
        return CODE_BAD_VERSION
    return CODE_BAD_REQUEST


# --- helpers ---------------------------------------------------------------------------------------


def _single_frame(frames: Sequence[bytes], what: str, max_bytes: int) -> bytes:
    if len(frames) != 1:
        raise ProtocolError(f"{what} has {len(frames)} frames, expected exactly 1")
    payload = frames[0]
    if len(payload) > max_bytes:
        raise OversizedMessageError(f"{what} is {len(payload)} bytes, over the limit of {max_bytes} bytes")
    return payload


def _json_object(payload: bytes, what: str) -> dict[str, Any]:
    try:
        text = payload.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ProtocolError(f"{what} is not UTF-8 (byte {exc.start})") from None
    _check_shape(text, what)
    try:
        obj = json.loads(text, parse_constant=_refuse_constant, object_pairs_hook=_unique_keys)
    except (ValueError, RecursionError) as exc:  # RecursionError: the shape check should prevent it
        raise ProtocolError(f"{what} is not valid JSON: {_shorten(str(exc))}") from None
    if not isinstance(obj, dict):
        raise ProtocolError(f"{what} must be a JSON object, got {_describe(obj)}")
    return obj


# A JSON string as the parser lexes it, from its opening quote (or to the end when unterminated),
# and what the shape check looks for outside strings.
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"?', re.DOTALL)
_LONG_NUMBER = re.compile(rf"[-+0-9.eE]{{{MAX_NUMBER_CHARS + 1},}}")
_DEPTH_STEP = np.zeros(256, dtype=np.int8)
_DEPTH_STEP[[ord("["), ord("{")]] = 1
_DEPTH_STEP[[ord("]"), ord("}")]] = -1


def _check_shape(text: str, what: str) -> None:
    """Refuse nesting deeper than :data:`MAX_JSON_DEPTH` and numbers longer than
    :data:`MAX_NUMBER_CHARS`, in linear time on the text, before the parser can recurse or
    convert. Strings are blanked first, as the parser lexes them, so brackets and digits inside
    a string count for nothing."""
    bare = _STRING.sub('""', text)
    long_number = _LONG_NUMBER.search(bare)
    if long_number is not None:
        raise ProtocolError(
            f"{what} has a number of {len(long_number.group())} characters at character "
            f"{long_number.start()} (of the text without strings), over the limit of {MAX_NUMBER_CHARS}"
        )
    codes = np.frombuffer(bare.encode("utf-8"), dtype=np.uint8)
    if codes.size:
        depth = int(np.cumsum(_DEPTH_STEP[codes], dtype=np.int64).max())
        if depth > MAX_JSON_DEPTH:
            raise ProtocolError(f"{what} is nested {depth} levels deep, over the limit of {MAX_JSON_DEPTH}")


def _shorten(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _check_version(obj: Mapping[str, Any], what: str, *, required: bool) -> None:
    if "v" not in obj:
        if required:
            raise VersionMismatchError(f"{what} has no protocol version field 'v'")
        return  # a hand-typed {"cmd": "status"} is read as the current version
    version = obj["v"]
    if type(version) is not int or version != PROTOCOL_VERSION:  # 1.0 and true are not version 1
        raise VersionMismatchError(
            f"{what} has protocol version {_describe(version)}, this daemon speaks version {PROTOCOL_VERSION}"
        )


def _check_args(cmd: str, args: Mapping[str, Any]) -> None:
    schema = COMMANDS[cmd]
    for name in args:
        if name not in schema:
            known = ", ".join(schema) or "none"
            raise ProtocolError(f"command {cmd!r} has unknown argument {name!r} (arguments: {known})")
    for name, (types_, required) in schema.items():
        if name not in args:
            if required:
                raise ProtocolError(f"command {cmd!r} needs argument {name!r}")
            continue
        value = args[name]
        if (isinstance(value, bool) and bool not in types_) or not isinstance(value, types_):
            kind = " or ".join(t.__name__ for t in types_)
            raise ProtocolError(f"command {cmd!r} argument {name!r} must be {kind}, got {_describe(value)}")
    if "task" in args:
        problem = task_problem(args["task"])
        if problem is not None:
            raise ProtocolError(f"command {cmd!r} argument 'task' {problem}")
    seed = args.get("seed")
    if isinstance(seed, int) and not 0 <= seed < 2**32:
        raise ProtocolError(f"command {cmd!r} argument 'seed' must be in [0, 2**32), got {seed}")
    if cmd == "session_note":
        _check_note(args)


def _check_note(args: Mapping[str, Any]) -> None:
    """The values of a ``session_note`` (their types are checked already)."""
    phases = ", ".join(p.value for p in CollectPhase)
    if args["phase"] not in {p.value for p in CollectPhase}:
        raise ProtocolError(
            f"command 'session_note' argument 'phase' must be one of {phases}, got {_describe(args['phase'])}"
        )
    if args["takes"] < 1:
        raise ProtocolError(
            f"command 'session_note' argument 'takes' must be at least 1, got {args['takes']}"
        )
    if not 1 <= args["take"] <= args["takes"]:
        raise ProtocolError(
            f"command 'session_note' argument 'take' must be in [1, takes={args['takes']}] "
            f"(1-based), got {args['take']}"
        )
    left = args.get("seconds_left")
    if left is not None and not (math.isfinite(left) and 0.0 <= left <= MAX_NOTE_SECONDS):
        raise ProtocolError(
            f"command 'session_note' argument 'seconds_left' must be a finite number in "
            f"[0, {MAX_NOTE_SECONDS:g}], got {_describe(left)}"
        )


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A key given twice is refused: which one counts differs between JSON parsers, so a check
    passed by one value could let the other through."""
    obj: dict[str, Any] = {}
    for key, value in pairs:
        if key in obj:
            raise ValueError(f"key {key!r} appears twice")
        obj[key] = value
    return obj


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _describe(value: Any) -> str:
    text = json.dumps(value, default=repr) if not isinstance(value, bytes) else repr(value)
    if len(text) > 40:
        text = text[:37] + "..."
    kind = "null" if value is None else type(value).__name__
    return f"{kind} {text}" if value is not None else "null"


def _json_default(obj: Any) -> Any:
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, np.generic):
        return obj.item()
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")
