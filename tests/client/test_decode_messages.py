"""decode_messages in C (speedups.decode_messages) equals the Python decoder, record for record.

Pull, view and query bodies: stored records back to back. For any body the C path either declines
(None: the Python decoder then decodes it or raises its precise error) or gives MessageExt objects
equal, field by field, to MessageExt.from_record of each record.
"""
from __future__ import annotations

import dataclasses
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.client import broker_api as api
from sluice.errors import CorruptRecordError
from sluice.message import MessageExt
from sluice.protocol import properties as P
from sluice.protocol.record import FLAG_COMPRESSED, encode_record
from sluice.speedups import C

pytestmark = pytest.mark.skipif(C is None, reason="the C extension is not built")

hosts = st.sampled_from([("127.0.0.1", 10911), ("10.1.2.3", 51000), ("255.255.255.255", 2**31 - 1),
                         ("0.0.0.0", 0), ("::1", 10911)])
texts = st.text(st.characters(min_codepoint=3, max_codepoint=0x10FFFF, exclude_categories=["Cs"]), min_size=1,
                max_size=6)


@st.composite
def records(draw) -> bytes:  # type: ignore[no-untyped-def]
    props = draw(st.dictionaries(st.sampled_from(["TAGS", "KEYS", "UNIQ_KEY", "a", "ü"]) | texts, texts, max_size=4))
    body = draw(st.binary(max_size=80))
    sysflag = draw(st.sampled_from([0, 0, 0x8, FLAG_COMPRESSED]))
    if sysflag & FLAG_COMPRESSED:
        body = zlib.compress(body)
    rec = encode_record(topic=draw(st.sampled_from(["T", "Orders", "%RETRY%g"])), body=body,
                        properties=P.encode_properties(props), queue_id=draw(st.integers(0, 2**31 - 1)),
                        flag=draw(st.integers(-2**31, 2**31 - 1)), sysflag=sysflag,
                        born_timestamp=draw(st.integers(0, 2**63 - 1)), born_host=draw(hosts),
                        store_host=draw(hosts), store_timestamp=draw(st.integers(0, 2**62)),
                        reconsume_times=draw(st.integers(0, 16)), queue_offset=draw(st.integers(0, 2**40)),
                        physical_offset=draw(st.integers(0, 2**62)))
    return bytes(rec)


def both(body: bytes, check_crc: bool = True, extra: dict[str, str] | None = None):  # type: ignore[no-untyped-def]
    def one(c):  # type: ignore[no-untyped-def]
        try:
            return [dataclasses.astuple(m) for m in api.decode_messages(body, check_crc=check_crc, extra=extra)]
        except (CorruptRecordError, zlib.error) as e:
            return type(e).__name__, str(e)
    fast = one(C)
    original, api.C = api.C, None
    try:
        slow = one(None)
    finally:
        api.C = original
    return fast, slow


taken: list[int] = []


#: a pull's extra properties; "a" and "TAGS" may already be among a record's, which the extra value replaces
extras = st.one_of(st.none(), st.dictionaries(st.sampled_from(["MIN_OFFSET", "MAX_OFFSET", "a", "TAGS"]),
                                              st.text(max_size=6), max_size=3))


@settings(max_examples=200, deadline=None)
@given(st.lists(records(), min_size=1, max_size=5), st.booleans(), extras)
def test_c_decoder_equals_python(recs: list[bytes], check_crc: bool, extra: dict[str, str] | None) -> None:
    body = b"".join(recs)
    fast, slow = both(body, check_crc, extra)
    assert fast == slow
    if C.decode_messages(body, check_crc, api.crc32, MessageExt, zlib.decompress) is not None:
        taken.append(1)


@settings(max_examples=200, deadline=None)
@given(st.lists(records(), min_size=1, max_size=3), st.data())
def test_damaged_bodies_are_refused_alike(recs: list[bytes], data: st.DataObject) -> None:
    body = bytearray(b"".join(recs))
    how = data.draw(st.sampled_from(["flip", "truncate", "extend"]))
    if how == "flip":
        at = data.draw(st.integers(0, len(body) - 1))
        body[at] ^= data.draw(st.integers(1, 255))
    elif how == "truncate":
        del body[data.draw(st.integers(1, len(body) - 1)):]
    else:
        body += data.draw(st.binary(min_size=1, max_size=100))
    fast, slow = both(bytes(body))
    assert fast == slow


def test_most_generated_bodies_were_taken_by_c() -> None:
    """The comparison means something only if C decoded many of them itself (not IPv6, not declined)."""
    assert len(taken) > 50


def test_the_objects_are_whole_message_exts() -> None:
    rec = bytes(encode_record(topic="T", body=b"hi", properties="TAGS\x01a\x02UNIQ_KEY\x01ABC\x02",
                              store_host=("10.0.0.1", 10911), physical_offset=77))
    [m] = C.decode_messages(rec, True, api.crc32, MessageExt, zlib.decompress)
    assert type(m) is MessageExt and m.msg_id == "ABC" and m.tags == "a" and m.body == b"hi"
    assert m.offset_msg_id == "0A00000100002A9F000000000000004D"
    m.body = b"changed"  # an ordinary, mutable instance
    assert dataclasses.replace(m, queue_id=3).queue_id == 3


def test_equal_ints_of_neighbouring_records_are_shared_and_unequal_ones_are_not() -> None:
    """Records appended (or sent) together share timestamps and sizes: C reuses the previous record's int
    object for an equal value, which must never hand a record its neighbour's different value."""
    def rec(i: int, born: int, stored: int, body: bytes) -> bytes:
        return bytes(encode_record(topic="T", body=body, properties=f"a\x01{i}\x02", born_timestamp=born,
                                   store_timestamp=stored, physical_offset=1000 * i, queue_offset=i))
    ts = 1_764_000_000_123
    body = b"".join([rec(0, ts, ts + 5, b"x" * 300), rec(1, ts, ts + 5, b"y" * 300), rec(2, ts + 1, ts + 5, b"z" * 301),
                     rec(3, ts + 1, ts + 6, b"w" * 301), rec(4, ts, ts + 5, b"v" * 300)])
    fast, slow = both(body, True, {"MIN_OFFSET": "0", "MAX_OFFSET": "5"})
    assert fast == slow
    m = C.decode_messages(body, True, api.crc32, MessageExt, zlib.decompress, {"MIN_OFFSET": "0"})
    assert [x.born_timestamp for x in m] == [ts, ts, ts + 1, ts + 1, ts]
    assert [x.store_timestamp for x in m] == [ts + 5] * 3 + [ts + 6, ts + 5]
    assert [x.store_size for x in m] == [m[0].store_size] * 2 + [m[0].store_size + 1] * 2 + [m[0].store_size]
    assert m[0].store_timestamp is m[1].store_timestamp is m[2].store_timestamp
    assert m[0].born_timestamp is m[1].born_timestamp and m[2].born_timestamp is m[3].born_timestamp
    assert [x.properties for x in m] == [{"a": str(i), "MIN_OFFSET": "0"} for i in range(5)]
    assert len({id(x.properties) for x in m}) == 5  # every message its own dict


def test_extra_must_be_a_dict() -> None:
    rec = bytes(encode_record(topic="T", body=b"hi", properties="a\x01b\x02"))
    with pytest.raises(TypeError, match="extra"):
        C.decode_messages(rec, True, api.crc32, MessageExt, zlib.decompress, [("MIN_OFFSET", "0")])
