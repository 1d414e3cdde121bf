"""The lazy messages a worker hands a filter class (sluice/filtersrv/view.py) read exactly as the fully
decoded MessageExt of the same record, field by field, with and without the C extension."""
from __future__ import annotations

import copy
import dataclasses
import pickle
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.filter import MessageFilter
from sluice.filtersrv import spans
from sluice.filtersrv.view import MessageView, decode_messages, views
from sluice.filtersrv.worker import decode, filter_batch
from sluice.format import FLAG_COMPRESSED
from sluice.message import MessageExt
from sluice.protocol import properties as P
from sluice.protocol.record import encode_record

FIELDS = [f.name for f in dataclasses.fields(MessageExt)] + ["tags", "keys", "user_properties"]

values = st.text(st.characters(codec="utf-8", blacklist_characters="\x01\x02 "), min_size=1, max_size=10)
record = st.fixed_dictionaries({
    "props": st.dictionaries(st.sampled_from(["k", P.TAGS, P.KEYS, P.UNIQ_KEY, "é"]), values, max_size=4),
    "body": st.binary(max_size=40),
    "v6": st.booleans(),
    "compressed": st.booleans(),
    "topic": st.sampled_from(["T", "%RETRY%g"]),
    "queue_id": st.integers(0, 2**31 - 1),
    "flag": st.integers(-2**31, 2**31 - 1),
    "reconsume": st.integers(0, 16),
})


def encode(r: dict, i: int) -> bytes:
    body = zlib.compress(r["body"]) if r["compressed"] else r["body"]
    born = ("::1", 5555) if r["v6"] else ("10.1.2.3", 5555)
    return bytes(encode_record(topic=r["topic"], body=body, properties=P.encode_properties(r["props"]),
                               sysflag=FLAG_COMPRESSED if r["compressed"] else 0, queue_offset=1000 + i,
                               physical_offset=400 * i, queue_id=r["queue_id"], flag=r["flag"],
                               reconsume_times=r["reconsume"], born_host=born, store_host=("127.0.0.1", 10911),
                               born_timestamp=17 + i, store_timestamp=99 + i))


@settings(max_examples=200, deadline=None)
@given(st.lists(record, max_size=5))
def test_views_read_as_decoded_messages(recs):
    body = b"".join(encode(r, i) for i, r in enumerate(recs))
    got, want = decode(body), decode_messages(body)
    assert len(got) == len(want) == len(recs)
    for v, m in zip(got, want):
        assert isinstance(v, MessageView) and isinstance(v, MessageExt)
        assert {n: getattr(v, n) for n in FIELDS} == {n: getattr(m, n) for n in FIELDS}
        assert v == m and m == v


def test_a_view_copies_pickles_and_prints_as_its_message():
    r = {"props": {"k": "7", P.TAGS: "t", P.KEYS: "a b"}, "body": b"hello", "v6": False, "compressed": True,
         "topic": "T", "queue_id": 3, "flag": 0, "reconsume": 1}
    body = encode(r, 0) + encode({**r, "props": {"k": "8"}}, 1)
    v, other = views(body)
    m = decode_messages(body)[0]
    assert type(copy.copy(v)) is MessageExt and copy.copy(v) == m
    assert pickle.loads(pickle.dumps(v)) == m
    assert dataclasses.asdict(v) == dataclasses.asdict(m)
    assert repr(v) == "MessageView" + repr(m)[len("MessageExt"):]
    assert v != other and v.body == b"hello" and v.keys == ["a", "b"] and v.tags == "t"
    with pytest.raises(AttributeError):
        v.topic = "U"  # read-only: the class decides, it does not edit
    with pytest.raises(TypeError):
        hash(v)


class Below(MessageFilter):
    def match(self, message) -> bool:
        return int(message.properties["k"]) < 3


def test_filter_batch_masks_in_order():
    base = {"body": b"b", "v6": False, "compressed": False, "topic": "T", "queue_id": 0, "flag": 0, "reconsume": 0}
    body = b"".join(encode({**base, "props": {"k": str(i)}}, i) for i in range(6))
    assert filter_batch(Below().match, body) == bytes([1, 1, 1, 0, 0, 0])
    assert filter_batch(Below().match, b"") == b""
    with pytest.raises(ValueError, match="stray bytes"):
        filter_batch(Below().match, body + b"\0")


def test_offsets_of_and_errors_name_the_record():
    one = encode({"props": {"k": "1"}, "body": b"x", "v6": False, "compressed": False, "topic": "T", "queue_id": 0,
                  "flag": 0, "reconsume": 0}, 0)
    assert list(spans.offsets_of(one * 3)) == [0, len(one), 2 * len(one), 3 * len(one)]
    assert list(spans.offsets_of(b"")) == [0]
    with pytest.raises(ValueError, match="ends with 2 stray bytes at"):
        spans.record_spans(one + b"\0\0")
    with pytest.raises(ValueError, match=f"a record at {len(one)} claims 9999 bytes"):
        spans.record_spans(one + (9999).to_bytes(4, "big") + b"\0" * 8)
    with pytest.raises(ValueError, match="bad magic code"):
        spans.record_spans(one[:4] + b"\0\0\0\0" + one[8:], True)
