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


def both(body: bytes, check_crc: bool = True):  # type: ignore[no-untyped-def]
    def one(c):  # type: ignore[no-untyped-def]
        try:
            return [dataclasses.astuple(m) for m in api.decode_messages(body, check_crc=check_crc)]
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


@settings(max_examples=200, deadline=None)
@given(st.lists(records(), min_size=1, max_size=5), st.booleans())
def test_c_decoder_equals_python(recs: list[bytes], check_crc: bool) -> None:
    body = b"".join(recs)
    fast, slow = both(body, check_crc)
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
