"""speedups.read_header (src/csrc/speedups/command.c), the C twin of fields.py's generated header readers:
for extFields as clients render them (and every near miss: a missing key, a number of 19 digits, a sign,
a space, another spelling of a boolean, a value that is not a string), the same header or the same error as
the Python reader it falls back to and the generic loop both give; and values as clients send them are read
by C alone (the fallback is not called)."""
from __future__ import annotations

import dataclasses
import functools

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from sluice.errors import InvalidParameterError
from sluice.protocol import fields
from sluice.protocol import headers as H
from sluice.speedups import C

pytestmark = pytest.mark.skipif(C is None, reason="sluice._speedups is not built")

HEADER_CLASSES = [c for c in vars(H).values()
                  if isinstance(c, type) and issubclass(c, H.Header) and c is not H.Header]
C_READ = [c for c in HEADER_CLASSES if isinstance(fields._compile_reader(c), functools.partial)]


def outcome(fn, *args):
    try:
        return ("ok", fn(*args))
    except InvalidParameterError as e:
        return ("error", str(e))


def usual(tp):
    """A value as clients render the field's type."""
    if tp is int:
        return st.integers(0, 10 ** 18 - 1).map(str)
    if tp is bool:
        return st.sampled_from(["true", "false"])
    return st.text(max_size=6)


odd = st.one_of(st.sampled_from(["", "-1", "+3", " 5", "007", "9" * 18, "9" * 19, "1x", "TRUE", "False", "٣"]),
                st.integers(-3, 3), st.booleans(), st.none(), st.floats(allow_nan=False))


@st.composite
def renderings(draw, cls):
    ext = {}
    for f in fields._plan(cls):
        how = draw(st.sampled_from(["usual"] * 6 + ["absent", "odd"]))
        if how == "usual":
            ext[f.wire] = draw(usual(f.tp))
        elif how == "odd":
            ext[f.wire] = draw(odd)
    return ext


def test_the_hot_headers_are_read_in_c() -> None:
    assert H.PullMessageRequestHeader in C_READ and H.SendMessageRequestHeader in C_READ
    assert isinstance(fields.keyed_reader(H.SendMessageRequestHeader, H._V2_NAMES), functools.partial)


@pytest.mark.parametrize("cls", C_READ, ids=lambda c: c.__name__)
@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_c_equals_python(cls, data) -> None:
    ext = data.draw(renderings(cls))
    reader = fields._compile_reader(cls)
    spec = reader.args[0]
    python = spec[1]
    got, want = outcome(reader, ext), outcome(python, ext)
    assert got == want == outcome(fields._from_ext_generic, cls, ext)
    if got[0] == "ok":
        assert type(got[1]) is cls and dataclasses.asdict(got[1]) == dataclasses.asdict(want[1])
        assert [type(getattr(got[1], f.name)) for f in fields._plan(cls)] == \
            [type(getattr(want[1], f.name)) for f in fields._plan(cls)]
        assert hash(got[1]) == hash(want[1])


@pytest.mark.parametrize("cls", C_READ, ids=lambda c: c.__name__)
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_usual_values_never_fall_back(cls, data) -> None:
    """Every field present and rendered as clients do: C builds the header itself."""
    ext = {f.wire: data.draw(usual(f.tp)) for f in fields._plan(cls)}
    spec = fields._compile_reader(cls).args[0]
    calls = []

    def fallback(e):
        calls.append(e)
        return spec[1](e)
    got = C.read_header((spec[0], fallback, spec[2]), ext)
    assert not calls and got == fields._from_ext_generic(cls, ext)


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.sampled_from(list(H._V2_NAMES.values()) + ["z"]), st.one_of(st.text(max_size=4), odd),
                       max_size=16))
@example({"a": "PG", "b": "T", "c": "TBW102", "d": "4", "e": "0", "f": "0", "g": "1", "h": "0", "i": "",
          "k": "false", "m": "true"})
def test_the_v2_letters_reader_equals_python(ext) -> None:
    reader = fields.keyed_reader(H.SendMessageRequestHeader, H._V2_NAMES)
    assert outcome(reader, ext) == outcome(reader.args[0][1], ext)


def test_a_spec_naming_no_slot_of_the_class_is_refused() -> None:
    spec = fields._compile_reader(H.PullMessageRequestHeader).args[0]
    bad = (spec[0], spec[1], tuple(f[:4] + (10 ** 6,) for f in spec[2]))  # offsets past the instance
    ext = {f.wire: "1" for f in fields._plan(H.PullMessageRequestHeader)}
    assert C.read_header(bad, ext) == spec[1](ext)  # the Python reader's answer, nothing written out of bounds
    assert C.slot_offsets(dict, ("x",)) is None
