"""SEND_BATCH_MESSAGE bodies (MessageDecoder.encodeMessages / decodeMessages)."""
from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.errors import MessageIllegalError
from sluice.protocol.batch import BatchEntry, decode_batch, encode_batch

names = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"], exclude_characters="\x01\x02"), min_size=1, max_size=8)
entries = st.builds(BatchEntry, body=st.binary(max_size=64),
                    properties=st.dictionaries(names, names, max_size=4), flag=st.integers(-2**31, 2**31 - 1))


@settings(derandomize=True)  # deterministic runs; widen max_examples locally to fuzz harder
@given(st.lists(entries, max_size=5))
def test_round_trip(batch: list[BatchEntry]) -> None:
    assert decode_batch(encode_batch(batch)) == batch


def test_layout_matches_java_encode_message() -> None:
    data = encode_batch([BatchEntry(b"hi", {"TAGS": "A"}, 7)])
    props = b"TAGS\x01A\x02"
    assert data == struct.pack(">iiiii", 22 + 2 + len(props), 0, 0, 7, 2) + b"hi" + struct.pack(">h", len(props)) + props


@pytest.mark.parametrize("cut", [1, 5, 21, 25])
def test_truncated_batches_are_refused_with_the_offset(cut: int) -> None:
    data = encode_batch([BatchEntry(b"a", {"k": "v"}), BatchEntry(b"bcd", {"k": "w"})])
    with pytest.raises(MessageIllegalError, match="batch body"):
        decode_batch(data[:-cut])


def test_inconsistent_sizes_are_refused() -> None:
    good = bytearray(encode_batch([BatchEntry(b"abc", {"k": "v"})]))
    struct.pack_into(">i", good, 16, 100)  # body length past the message
    with pytest.raises(MessageIllegalError, match="bad body length"):
        decode_batch(bytes(good))
    with pytest.raises(MessageIllegalError, match="exceed"):
        encode_batch([BatchEntry(b"x", {"k": "v" * 40000})])


@settings(derandomize=True)
@given(st.lists(entries, max_size=8))
def test_columns_match_entries(batch: list[BatchEntry]) -> None:
    from sluice.protocol import properties as P
    from sluice.protocol.batch import decode_batch_columns
    data = encode_batch(batch)
    bodies, raw, flags = decode_batch_columns(memoryview(data))
    assert bodies == [e.body for e in batch] and flags == [e.flag for e in batch]
    assert [P.decode_properties(r) for r in raw] == [e.properties for e in batch]


def test_columns_name_the_message_with_bad_utf8() -> None:
    from sluice.protocol.batch import decode_batch_columns
    first = encode_batch([BatchEntry(b"a", {"k": "v"})])
    bad = bytearray(encode_batch([BatchEntry(b"b", {"k": "w"})]))
    bad[-2] = 0xFF  # inside the property value
    with pytest.raises(MessageIllegalError, match=f"offset {len(first)} are not UTF-8"):
        decode_batch_columns(first + bytes(bad))
