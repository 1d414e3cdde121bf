"""fields.from_ext's generated readers (one straight-line function per header class) equal the generic loop.

Both must give the same header, or raise the same InvalidParameterError, for any extFields a
peer may send: valid renderings, missing keys, non-numeric or oversized numbers, enum ordinals
and names, booleans spelled every way, values that are not strings (a JSON header may carry them).
"""
from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.errors import InvalidParameterError
from sluice.protocol import fields
from sluice.protocol import headers as H

HEADER_CLASSES = [c for c in vars(H).values()
                  if isinstance(c, type) and issubclass(c, H.Header) and c is not H.Header]

raw_values = st.one_of(
    st.text(max_size=6),
    st.integers(-2**70, 2**70).map(str),
    st.sampled_from(["0", "007", " 5", "+3", "-1", "1x", "true", "TRUE", "false", "1", "", "CONSUME_PASSIVELY",
                     "9" * 19, "9" * 25]),
    st.integers(-5, 5), st.booleans(), st.floats(allow_nan=False, allow_infinity=False), st.none(),
    st.lists(st.integers(0, 3), max_size=2),
)


def outcome(fn, *args):
    try:
        return ("ok", fn(*args))
    except InvalidParameterError as e:
        return ("error", str(e))


@pytest.mark.parametrize("cls", HEADER_CLASSES, ids=lambda c: c.__name__)
@settings(max_examples=60, deadline=None, derandomize=True)
@given(data=st.data())
def test_generated_reader_equals_the_generic_loop(cls, data) -> None:
    wires = [f.wire for f in fields._plan(cls)]
    ext = data.draw(st.dictionaries(st.sampled_from(wires + ["extra"]), raw_values, max_size=len(wires) + 1))
    got, want = outcome(cls.from_ext, ext), outcome(fields._from_ext_generic, cls, ext)
    assert got == want
    if got[0] == "ok":  # equal and fully built: every field set, hashable like one made by __init__
        assert hash(got[1]) == hash(want[1])
        assert dataclasses.asdict(got[1]) == dataclasses.asdict(want[1])


def test_a_rendered_header_reads_back_through_the_generated_reader() -> None:
    h = H.PullMessageRequestHeader(consumer_group="g", topic="T", queue_id=3, queue_offset=64, max_msg_nums=32,
                                   sys_flag=4, commit_offset=0, suspend_timeout_millis=15000, subscription="a > 1",
                                   sub_version=7, expression_type="SQL92", max_msg_bytes=1 << 20)
    assert H.PullMessageRequestHeader.from_ext(h.to_ext()) == h
    with pytest.raises(InvalidParameterError, match=r"PullMessageRequestHeader\.queueId"):
        H.PullMessageRequestHeader.from_ext({**h.to_ext(), "queueId": "x"})
