"""speedups.json_command (src/csrc/speedups/command.c) against the Python lines it stands in for in
protocol/command.py's _decode_json_header: for any JSON header, the same RemotingCommand (every field, its
type, the ext_fields dict) or the same error, whether C takes the header or leaves it to the Python path."""
from __future__ import annotations

import json

import orjson
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from sluice.errors import ProtocolError
from sluice.protocol import command as CMD
from sluice.protocol.command import RemotingCommand
from sluice.protocol.frame import FrameCodec, encode_frame
from sluice.speedups import C

pytestmark = pytest.mark.skipif(C is None, reason="sluice._speedups is not built")

FIELDS = ("code", "ext_fields", "body", "remark", "opaque", "flag", "language", "version", "serialize_type")

scalars = st.one_of(st.none(), st.booleans(), st.integers(-(2 ** 70), 2 ** 70), st.floats(allow_nan=False),
                    st.text(max_size=6), st.lists(st.integers(), max_size=2))
ext_values = st.one_of(st.text(max_size=8), st.text(max_size=8), scalars)


USUAL = {"code": st.integers(-(2 ** 63), 2 ** 63 - 1), "version": st.integers(0, 500),
         "opaque": st.integers(-(2 ** 31), 2 ** 31), "flag": st.integers(0, 3), "language": st.text(max_size=8),
         "remark": st.one_of(st.none(), st.text(max_size=8))}


@st.composite
def headers(draw):
    """Mostly what clients send, each field now and then absent or of another type (a bool, a float, a
    string number, an integer past 64 bits, a list), so each check of the usual shape meets its exception."""
    h = {}
    for name, usual in USUAL.items():
        how = draw(st.sampled_from(["usual"] * 6 + ["absent", "odd"]))
        if how != "absent":
            h[name] = draw(usual if how == "usual" else scalars)
    shape = draw(st.sampled_from(["dict"] * 4 + ["odd dict", "none", "absent", "other"]))
    if shape == "dict":
        h["extFields"] = draw(st.dictionaries(st.text(max_size=4), st.text(max_size=8), max_size=5))
    elif shape == "odd dict":
        h["extFields"] = draw(st.dictionaries(st.text(max_size=4), ext_values, max_size=5))
    elif shape == "none":
        h["extFields"] = None
    elif shape == "other":
        h["extFields"] = draw(scalars)
    if draw(st.booleans()):
        h["serializeTypeCurrentRPC"] = "JSON"
    return h


def decoded(raw: bytes, use_c: bool) -> tuple | str:
    with pytest.MonkeyPatch.context() as m:
        if not use_c:
            m.setattr(CMD, "_json_command", None)
        try:
            cmd = CMD._decode_json_header(raw, b"body")
        except ProtocolError as e:
            return f"ProtocolError: {e}"
    assert type(cmd) is RemotingCommand
    return tuple((getattr(cmd, f), type(getattr(cmd, f))) for f in FIELDS)


@settings(max_examples=400, deadline=None)
@given(headers())
@example({"code": 310, "language": "JAVA", "version": 393, "opaque": 7, "flag": 0, "extFields": {"a": "g"}})
@example({"code": 310, "language": "JAVA", "extFields": {"a": 1}})
@example({"code": True, "language": "JAVA"})
@example({"code": 1, "language": "JAVA", "flag": True})
@example({"code": 1, "language": "JAVA", "version": "3"})
@example({"code": 1, "language": "JAVA", "opaque": 1.0})
@example({"code": 1, "language": "JAVA", "remark": 5})
@example({"code": 1, "language": 5})
@example({"code": 1, "language": "JAVA", "extFields": {"a": None}})
@example({"code": 1, "language": "JAVA", "extFields": []})
@example({"code": 1, "language": "JAVA", "remark": None, "extFields": None})
def test_c_equals_python(header) -> None:
    raw = json.dumps(header).encode()  # not orjson: integers past 64 bits too
    assert decoded(raw, True) == decoded(raw, False)


def test_c_takes_the_usual_header() -> None:
    """What every client sends is C's (so the twin test above compares C with Python, not Python with itself)."""
    raw = orjson.dumps({"code": 10, "language": "JAVA", "version": 1, "opaque": 3, "flag": 0, "remark": None,
                        "extFields": {"topic": "T"}})
    header = orjson.loads(raw)
    cmd = C.json_command(RemotingCommand, header, b"", CMD._JSON)
    assert cmd is not None and cmd.ext_fields is header["extFields"] and cmd.code == 10
    assert C.json_command(RemotingCommand, {"code": 10}, b"", CMD._JSON) is None  # no language: Python's


def test_a_class_of_another_layout_is_left_to_python() -> None:
    class Other:
        pass
    assert C.json_command(Other, {"code": 10, "language": "JAVA"}, b"", CMD._JSON) is None


def test_a_whole_frame_decodes_through_c(monkeypatch) -> None:
    """A frame read by FrameCodec takes the C road and gives the command that was sent."""
    calls = []
    real = CMD._json_command
    monkeypatch.setattr(CMD, "_json_command", lambda *a: calls.append(1) or real(*a))
    codec = FrameCodec()
    codec.receive_data(encode_frame(RemotingCommand.request(310, {"a": "g", "b": "T"}, b"xyz")))
    back = codec.next_frame()
    assert calls and isinstance(back, RemotingCommand)
    assert (back.code, back.ext_fields, back.body, back.language) == (310, {"a": "g", "b": "T"}, b"xyz", "PYTHON")
