"""sluice._speedups.record_spans against its Python twin (sluice/filtersrv/spans.py): the same offsets and
properties texts for every body C takes, None exactly where it is unusual or the twin raises."""
from __future__ import annotations

import os
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import sluice.speedups
from sluice.filtersrv import spans
from sluice.format import FLAG_COMPRESSED
from sluice.protocol import properties as P
from sluice.protocol.record import encode_record

C = sluice.speedups.C
REQUIRED = os.environ.get("SLUICE_REQUIRE_EXTENSIONS", "") not in ("", "0")
pytestmark = pytest.mark.skipif(C is None and not REQUIRED, reason="sluice._speedups is not built")

prop_values = st.text(st.characters(codec="utf-8", blacklist_characters="\x01\x02"), min_size=1, max_size=12)
record = st.fixed_dictionaries({
    "props": st.dictionaries(st.sampled_from(["k", "TAGS", "KEYS", "UNIQ_KEY", "é", "😀"]), prop_values, max_size=4),
    "body": st.binary(max_size=64),
    "v6": st.booleans(),
    "compressed": st.booleans(),
    "topic": st.sampled_from(["T", "%RETRY%g", "topic_1"]),
})


def encode(r: dict, i: int) -> bytes:
    body = zlib.compress(r["body"]) if r["compressed"] else r["body"]
    host = ("::1", 10911) if r["v6"] else ("127.0.0.1", 10911)
    return bytes(encode_record(topic=r["topic"], body=body, properties=P.encode_properties(r["props"]),
                               sysflag=FLAG_COMPRESSED if r["compressed"] else 0, queue_offset=i,
                               born_host=host, store_host=host))


@settings(max_examples=300)
@given(st.lists(record, max_size=6), st.booleans())
def test_record_spans_equals_python(recs, with_properties):
    body = b"".join(encode(r, i) for i, r in enumerate(recs))
    py = spans._py_record_spans(body, with_properties)
    c = C.record_spans(body, with_properties)
    if c is None:  # only what C leaves to Python: IPv6 hosts when the properties are asked for
        assert with_properties and any(r["v6"] for r in recs)
    else:
        assert c == py
    assert spans.record_spans(body, with_properties) == py
    if with_properties:
        assert py[1] == [P.encode_properties(r["props"]) for r in recs]


@settings(max_examples=300)
@given(st.lists(record, min_size=1, max_size=4), st.data())
def test_damaged_bodies_none_exactly_where_python_refuses(recs, data):
    body = bytearray(b"".join(encode(r, i) for i, r in enumerate(recs)))
    what = data.draw(st.sampled_from(["cut", "size", "byte"]))
    if what == "cut":
        body = body[:data.draw(st.integers(0, len(body) - 1))]
    elif what == "size":
        at = 0 if len(recs) == 1 else data.draw(st.sampled_from([0, len(encode(recs[0], 0))]))
        body[at:at + 4] = data.draw(st.integers(-5, len(body) + 5)).to_bytes(4, "big", signed=True)
    else:
        at = data.draw(st.integers(0, len(body) - 1))
        body[at] = data.draw(st.integers(0, 255))
    body = bytes(body)
    for with_properties in (False, True):
        try:
            py = spans._py_record_spans(body, with_properties)
        except ValueError:
            assert C.record_spans(body, with_properties) is None
            with pytest.raises(ValueError):
                spans.record_spans(body, with_properties)
        else:
            c = C.record_spans(body, with_properties)
            assert c is None or c == py
            assert spans.record_spans(body, with_properties) == py


@settings(max_examples=200)
@given(st.lists(record, max_size=6))
def test_record_views_equal_python(recs):
    from sluice.filtersrv.view import MessageView
    body = b"".join(encode(r, i) for i, r in enumerate(recs))
    c = C.record_views(body, MessageView)
    if c is None:
        assert any(r["v6"] for r in recs)
        return
    offsets, texts = spans._py_record_spans(body, True)
    py = [MessageView(body, at, text) for at, text in zip(memoryview(offsets).cast("I"), texts)]
    assert [type(v) for v in c] == [MessageView] * len(py)
    assert [(v._buf is body, v._at, v._ext, list(v.properties.items())) for v in c] == \
        [(True, v._at, None, list(v.properties.items())) for v in py]
    assert c == py


def test_record_views_refuse_other_shapes():
    from sluice.filtersrv.view import MessageView
    from sluice.message import MessageExt
    body = encode({"props": {"k": "1"}, "body": b"x", "v6": False, "compressed": False, "topic": "T"}, 0)

    class Other(MessageView):
        __slots__ = ()
        _at = 0  # a class attribute shadows the slot: not the layout C fills

    assert C.record_views(body, Other) is None
    assert C.record_views(body, MessageExt) is None  # no _buf slot
    assert C.record_views(bytearray(body), MessageView) is None  # the views hold the body: bytes only
    assert C.record_views(body[:-1], MessageView) is None
    assert len(C.record_views(body, MessageView)) == 1


def test_a_topic_that_is_not_utf8_is_left_to_python():
    """Found by test_damaged_bodies_none_exactly_where_python_refuses: C took the properties of a record whose
    topic does not decode, which the Python twin (read_tail) refuses."""
    r = {"props": {"k": "v"}, "body": b"abc", "v6": False, "compressed": False, "topic": "T"}
    body = bytearray(encode(r, 0))
    body[88 + 3 + 1] = 0x80  # the topic's only byte (after the IPv4 head and the 3-byte body)
    body = bytes(body)
    assert C.record_spans(body, False) is not None  # boundaries alone never read the topic
    assert C.record_spans(body, True) is None
    with pytest.raises(ValueError):
        spans.record_spans(body, True)


# ------------------------------------------------------------------------------------------ filter_views

raw_props = st.text(st.sampled_from(["a", "k", "é", "\x01", "\x02", "7"]), max_size=16)  # separators anywhere


def _seen_by(match_result):
    """A class's match that records what each view reads, and answers ``match_result(view)``."""
    seen: list = []

    def match(v):
        seen.append((type(v), v._at, v._ext, list(v.properties.items()), v.topic, v.queue_offset))
        return match_result(v)
    return seen, match


def _py_views(body):
    from sluice.filtersrv.view import MessageView
    offsets, texts = spans._py_record_spans(body, True)
    return [MessageView(body, at, text) for at, text in zip(memoryview(offsets).cast("I"), texts)]


@settings(max_examples=300)
@given(st.lists(st.tuples(record, raw_props, st.booleans()), max_size=8))
def test_filter_views_equal_python(rows):
    """The same mask and the same views, one per call in order, as the twin's views decoded all at once; raw
    properties texts exercise the parser's dropping rules (short parts, empty names or values)."""
    from sluice.filtersrv.view import MessageView
    recs = []
    for i, (r, raw, use_raw) in enumerate(rows):
        body = zlib.compress(r["body"]) if r["compressed"] else r["body"]
        host = ("::1", 10911) if r["v6"] else ("127.0.0.1", 10911)
        recs.append(bytes(encode_record(topic=r["topic"], body=body, sysflag=FLAG_COMPRESSED if r["compressed"] else 0,
                                        properties=raw if use_raw else P.encode_properties(r["props"]),
                                        queue_offset=i, born_host=host, store_host=host)))
    body = b"".join(recs)
    answer = [lambda v: len(v.properties) % 2, lambda v: v.properties.get("k", ""), lambda v: [v] * (v._at % 3)]
    for result in answer:
        c_seen, c_match = _seen_by(result)
        got = C.filter_views(body, MessageView, c_match)
        if got is None:
            assert any(r["v6"] for r, _, _ in rows) and c_seen == []  # left to Python before any call
            continue
        py_seen, py_match = _seen_by(result)
        assert got == bytes([1 if py_match(v) else 0 for v in _py_views(body)])
        assert c_seen == py_seen


@settings(max_examples=200)
@given(st.lists(record, min_size=1, max_size=4), st.data())
def test_filter_views_damaged_bodies_none_before_any_call(recs, data):
    from sluice.filtersrv.view import MessageView
    body = bytearray(b"".join(encode(r, i) for i, r in enumerate(recs)))
    at = data.draw(st.integers(0, len(body) - 1))
    body[at] = data.draw(st.integers(0, 255))
    body = bytes(body)
    calls: list = []
    got = C.filter_views(body, MessageView, lambda v: calls.append(v) or True)
    try:
        py = _py_views(body)
    except ValueError:
        assert got is None and calls == []
        return
    if got is None:
        assert calls == [] and C.record_views(body, MessageView) is None
    else:
        assert got == b"\x01" * len(py)  # a damaged body may not decode whole: what C set is compared
        assert [(v._at, v.properties) for v in calls] == [(v._at, v.properties) for v in py]


def test_filter_views_errors_propagate_and_kept_views_stay_whole():
    from sluice.filtersrv.view import MessageView
    body = b"".join(encode({"props": {"k": str(i), "WAIT": "true"}, "body": b"x", "v6": False, "compressed": False,
                            "topic": "T"}, i) for i in range(5))
    kept = []

    def match(v):
        kept.append(v)
        if v.queue_offset == 3:
            raise KeyError("k")
        return True
    with pytest.raises(KeyError):
        C.filter_views(body, MessageView, match)
    assert [v.properties for v in kept] == [{"k": str(i), "WAIT": "true"} for i in range(4)]
    assert kept == _py_views(body)[:4]

    class Falsy:
        def __bool__(self):
            raise RuntimeError("no truth")
    with pytest.raises(RuntimeError, match="no truth"):
        C.filter_views(body, MessageView, lambda v: Falsy())
    assert C.filter_views(b"", MessageView, None) == b""
    assert C.filter_views(bytearray(body), MessageView, match) is None  # the views hold the body: bytes only
    assert C.filter_views(body, type("Plain", (), {}), match) is None  # not the view layout C fills
