"""Commit-log record codec: round trips, layout facts, corruption detection."""
from __future__ import annotations

import struct
import zlib

import pytest
from hypothesis import given, strategies as st

from sluice.errors import CorruptRecordError, MessageIllegalError
from sluice.protocol import record as R

topics = st.text(alphabet="abcXYZ019_%|-", min_size=1, max_size=127)
hosts = st.tuples(st.sampled_from(["127.0.0.1", "10.1.2.3", "::1", "fe80::1"]), st.integers(0, 65535))
props = st.text(alphabet=st.characters(blacklist_characters="\x01\x02", blacklist_categories=("Cs",)), max_size=200)


@given(
    topic=topics, body=st.binary(max_size=2000), properties=props, qid=st.integers(0, 1023),
    flag=st.integers(-(2**31), 2**31 - 1), born=hosts, store=hosts, ts=st.integers(0, 2**62),
    qoff=st.integers(0, 2**62), phys=st.integers(0, 2**62), reconsume=st.integers(0, 100),
)
def test_round_trip(topic, body, properties, qid, flag, born, store, ts, qoff, phys, reconsume):
    raw = R.encode_record(topic=topic, body=body, properties=properties, queue_id=qid, flag=flag,
                          born_host=born, store_host=store, born_timestamp=ts, store_timestamp=ts + 1,
                          queue_offset=qoff, physical_offset=phys, reconsume_times=reconsume)
    rec = R.decode_record(raw)
    assert rec.total_size == len(raw)
    assert (rec.topic, rec.body, rec.properties, rec.queue_id, rec.flag) == (topic, body, properties, qid, flag)
    assert rec.born_host[1] == born[1] and rec.store_host[1] == store[1]
    assert (rec.born_timestamp, rec.store_timestamp, rec.queue_offset, rec.physical_offset) == (ts, ts + 1, qoff, phys)
    assert rec.reconsume_times == reconsume
    assert rec.body_crc == zlib.crc32(body) & 0x7FFFFFFF


def test_v1_ipv4_size_is_91_plus_variable_parts():
    raw = R.encode_record(topic="TopicA", body=b"x" * 10, properties="TAGS\x01a\x02")
    assert len(raw) == 91 + 10 + 6 + 7
    assert struct.unpack_from(">iI", raw) == (len(raw), R.MAGIC_V1)
    assert R.store_timestamp_pos(0) == 56


def test_patch_positions_match_layout():
    raw = R.encode_record(topic="T", body=b"b")
    struct.pack_into(">q", raw, R.POS_QUEUEOFFSET, 42)
    struct.pack_into(">q", raw, R.POS_PHYSICALOFFSET, 4242)
    struct.pack_into(">q", raw, R.store_timestamp_pos(0), 777)
    rec = R.decode_record(raw)
    assert (rec.queue_offset, rec.physical_offset, rec.store_timestamp) == (42, 4242, 777)


def test_flipped_body_byte_is_detected():
    raw = R.encode_record(topic="T", body=b"hello world", properties="")
    raw[84 + 4 + 3] ^= 0x01
    with pytest.raises(CorruptRecordError, match="CRC"):
        R.decode_record(raw, where="00000000000000000000")
    assert R.decode_record(raw, check_crc=False).body != b"hello world"


@pytest.mark.parametrize("cut", [0, 4, 50, 90])
def test_truncated_record_is_reported_with_offset(cut):
    raw = bytes(R.encode_record(topic="T", body=b"abc"))
    with pytest.raises(CorruptRecordError) as e:
        R.decode_record(b"\0" * 7 + raw[:cut], 7, where="seg")
    assert e.value.offset == 7 and e.value.path == "seg"


def test_bad_magic():
    raw = R.encode_record(topic="T", body=b"abc")
    raw[4:8] = b"\0\0\0\0"
    with pytest.raises(CorruptRecordError, match="magic"):
        R.decode_record(raw)


@pytest.mark.parametrize("topic", ["", "a b", "x" * 128, "topic.with.dots", "ü"])
def test_bad_topics_refused(topic):
    with pytest.raises(MessageIllegalError):
        R.encode_record(topic=topic, body=b"x")


def test_oversized_body_refused():
    with pytest.raises(MessageIllegalError, match="limit is 1024"):
        R.encode_record(topic="T", body=b"x" * 1025, max_body=1024)


def test_iter_records_back_to_back():
    raws = [R.encode_record(topic="T", body=bytes([i]) * i, queue_offset=i) for i in range(1, 6)]
    recs = list(R.iter_records(b"".join(raws)))
    assert [r.queue_offset for r in recs] == [1, 2, 3, 4, 5]


def test_compressed_body_is_inflated():
    body = b"abc" * 1000
    raw = R.encode_record(topic="T", body=zlib.compress(body), sysflag=R.FLAG_COMPRESSED)
    assert R.decompress_body(R.decode_record(raw)) == body
