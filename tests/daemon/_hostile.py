"""Structure-aware hostile payloads for the control and leader sockets.

Random bytes rarely reach the JSON parser's deep corners; these are built from the grammar:
nesting thousands deep (open, closed, mixed, unclosed), numbers of tens of thousands of digits
(integers, fractions, exponents), long strings and escapes, put into every field of every verb
of :data:`hilrec.daemon.wire.protocol.COMMANDS` and of the leader command.
"""

from __future__ import annotations

import json

from hypothesis import strategies as st

from hilrec.daemon.wire.protocol import COMMANDS, PROTOCOL_VERSION

# Over the parser's recursion limit (about 1,000), and well under the 64 KiB request limit.
DEPTHS = st.one_of(st.integers(1, 40), st.integers(900, 5000), st.sampled_from([33, 999, 1000, 1001]))
DIGITS = st.one_of(st.integers(1, 30), st.integers(300, 60_000), st.sampled_from([4300, 4301, 10**4]))


@st.composite
def deep_text(draw: st.DrawFn) -> str:
    depth = draw(DEPTHS)
    leaf = draw(st.sampled_from(["", "0", '"x"', "null", "[]", "{}"]))
    shape = draw(st.sampled_from(["list", "dict", "mixed", "unclosed", "closers"]))
    if shape == "list":
        return "[" * depth + leaf + "]" * depth
    if shape == "dict":
        return '{"a":' * depth + (leaf or "0") + "}" * depth
    if shape == "mixed":
        return '[{"a":' * (depth // 2) + (leaf or "0") + "}]" * (depth // 2)
    if shape == "unclosed":
        return "[" * depth
    return "]" * depth


@st.composite
def huge_number_text(draw: st.DrawFn) -> str:
    digits = "9" * draw(DIGITS)
    form = draw(st.sampled_from(["int", "negative", "fraction", "exponent", "tiny", "leading-zero"]))
    return {
        "int": digits,
        "negative": "-" + digits,
        "fraction": "1." + digits,
        "exponent": "1e" + digits,
        "tiny": "0." + "0" * len(digits) + "1",
        "leading-zero": "0" + digits,  # not JSON
    }[form]


@st.composite
def long_string_text(draw: st.DrawFn) -> str:
    size = draw(st.one_of(st.integers(0, 200), st.integers(10_000, 70_000)))
    unit = draw(st.sampled_from(["x", "\\u0000", "\\ud800", "\\\\", '\\"', "\u00e9", "\\n"]))
    closed = draw(st.booleans()) or draw(st.booleans())
    return '"' + unit * max(1, size // len(unit)) + ('"' if closed else "")


plain_value_text = st.sampled_from(
    ["true", "false", "null", "0", "1", "-1", "4294967296", "1.5", '"x"', '""', "[]", "{}", "1e400"]
)
hostile_value_text = st.one_of(deep_text(), huge_number_text(), long_string_text(), plain_value_text)
well_typed = {
    "task": st.just('"fuzzed task"'),
    "seed": st.integers(0, 2**32 - 1).map(str),
    "success": st.sampled_from(["true", "false"]),
    "phase": st.sampled_from(['"recording"', '"reset"', '"final_reset"', '"paused"', '"finishing"']),
    "take": st.integers(1, 5).map(str),
    "takes": st.integers(1, 5).map(str),
    "seconds_left": st.floats(0, 100).map(repr),
}


def _object(fields: list[tuple[str, str]]) -> bytes:
    return ("{" + ",".join(f"{json.dumps(k)}:{v}" for k, v in fields) + "}").encode("utf-8", "surrogatepass")


@st.composite
def structured_request(draw: st.DrawFn) -> bytes:
    """One request: a verb, every one of its fields (some well typed, some hostile), envelope too."""
    if draw(st.integers(0, 9)) == 0:
        return draw(hostile_value_text).encode("utf-8", "surrogatepass")  # not an object at all
    cmd = draw(st.sampled_from(sorted(COMMANDS)))
    fields: list[tuple[str, str]] = []
    for name in ("v", "id"):
        if draw(st.booleans()):
            good = (
                st.just(str(PROTOCOL_VERSION))
                if name == "v"
                else st.integers(0, 10**9).map('"req-{}"'.format)
            )
            fields.append((name, draw(st.one_of(good, hostile_value_text))))
    fields.append(("cmd", draw(st.one_of(st.just(json.dumps(cmd)), hostile_value_text))))
    for name in COMMANDS[cmd]:
        # test_fuzz_structure holds well_typed to every field of every verb.
        fields.append((name, draw(st.one_of(well_typed.get(name, hostile_value_text), hostile_value_text))))
    if cmd in ("shutdown", "finalize") or draw(st.integers(0, 4)) == 0:
        # A field the verb does not have: a shutdown or finalize must be refused, not obeyed.
        fields.append(("extra", draw(hostile_value_text)))
    return _object(fields)


@st.composite
def structured_leader(draw: st.DrawFn) -> bytes:
    values = [draw(st.one_of(st.floats(-100, 100).map(repr), hostile_value_text)) for _ in range(6)]
    fields = [
        ("v", draw(st.one_of(st.just(str(PROTOCOL_VERSION)), hostile_value_text))),
        ("type", draw(st.one_of(st.just('"leader"'), hostile_value_text))),
        ("seq", draw(st.one_of(st.integers(0, 2**40).map(str), hostile_value_text))),
        ("action", draw(st.one_of(st.just("[" + ",".join(values) + "]"), deep_text()))),
    ]
    return _object(fields)


# Each of these killed the daemon or would cost it a parse it cannot afford.
HOSTILE_REQUESTS: dict[str, bytes] = {
    "[ x 1000": b"[" * 1000,
    "{ x 1000": b"{" * 1000,
    "deep lists, closed": b"[" * 5000 + b"]" * 5000,
    "deep dicts": b'{"a":' * 3000 + b"0" + b"}" * 3000,
    "deep value of a known field": b'{"cmd":"start_episode","task":' + b"[" * 2000 + b"]" * 2000 + b"}",
    "deep id": b'{"cmd":"status","id":' + b"[" * 2000 + b"}",
    "depth 40 in a field": b'{"cmd":"status","id":' + b"[" * 40 + b"]" * 40 + b"}",
    "10^6-digit integer": b'{"cmd":"start_episode","task":"t","seed":1' + b"0" * 10**6 + b"}",
    "60,000-digit integer": b'{"cmd":"start_episode","task":"t","seed":' + b"9" * 60_000 + b"}",
    "60,000-digit fraction": b'{"cmd":"stop_episode","success":0.' + b"9" * 60_000 + b"}",
    "60,000-digit exponent": b'{"cmd":"stop_episode","success":1e' + b"9" * 60_000 + b"}",
    "long task": b'{"cmd":"start_episode","task":"' + b"x" * 60_000 + b'"}',
    "long unterminated string": b'{"cmd":"status","id":"' + b"\\u0000" * 10_000,
}
