"""The batch encoder is byte-for-byte the reference codec (sluice.protocol.record.encode_record)."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.errors import MessageIllegalError
from sluice.protocol.properties import encode_properties
from sluice.protocol.record import encode_record
from sluice.store.encode import encode_batch
from sluice.store.types import StoreMessage

text = st.text(st.characters(blacklist_characters="\x01\x02", blacklist_categories=("Cs",)), min_size=1, max_size=12)
hosts = st.sampled_from([("127.0.0.1", 0), ("10.1.2.3", 10911), ("::1", 7), ("fe80::1", 65535)])
messages = st.builds(
    StoreMessage, topic=st.just("Topic_1"), body=st.binary(max_size=300), queue_id=st.just(3),
    properties=st.dictionaries(text, text, max_size=4), flag=st.integers(-2**31, 2**31 - 1),
    sysflag=st.sampled_from([0, 0x1, 0x2, 0x4, 0x8, 0xC, 0x10, 0x30]), born_timestamp=st.integers(0, 2**62),
    born_host=hosts, reconsume_times=st.integers(0, 16), prepared_tx_offset=st.integers(0, 2**40))


@settings(max_examples=200, deadline=None)
@given(batch=st.lists(messages, min_size=1, max_size=6), store_host=hosts)
def test_batch_equals_reference(batch, store_host) -> None:
    enc = encode_batch(batch, store_host=store_host, max_body=1000)
    buf, sizes, ts_pos, queued = enc.buf, enc.sizes, enc.ts_positions, enc.queued
    ref = [encode_record(topic=m.topic, body=m.body, properties=encode_properties(m.properties),
                         queue_id=m.queue_id, flag=m.flag, sysflag=m.sysflag, born_timestamp=m.born_timestamp,
                         born_host=m.born_host, store_host=store_host, reconsume_times=m.reconsume_times,
                         prepared_tx_offset=m.prepared_tx_offset) for m in batch]
    assert bytes(buf) == b"".join(ref)
    assert sizes == [len(r) for r in ref]
    assert ts_pos == [68 if r[39] & 0x10 else 56 for r in ref]
    assert enc.sysflags == [int.from_bytes(r[36:40], "big", signed=True) for r in ref]
    want_queued = [(m.sysflag & 0xC) not in (0x4, 0xC) for m in batch]
    assert queued == (None if all(want_queued) else want_queued)


@pytest.mark.parametrize("m, why", [
    (StoreMessage("T", bytes(11)), "limit is 10"),
    (StoreMessage("T", b"x", 0, {"": "v"}), "name is empty"),
    (StoreMessage("T", b"x", 0, {"a": 1}), "str to a str"),  # type: ignore[dict-item]
    (StoreMessage("T", b"x", 0, {"a": "x" * 40000}), "32767"),
    (StoreMessage("T/x", b"x"), "contains"),
])
def test_refusals(m: StoreMessage, why: str) -> None:
    with pytest.raises(MessageIllegalError, match=why):
        encode_batch([m], store_host=("127.0.0.1", 1), max_body=10 if "limit" in why else 100_000)


# -- the usual batch (one topic, queue and IPv4 born host, non-empty properties, no transaction flag): the
# plain loop and the C twin both equal the reference --

usual = st.builds(
    StoreMessage, topic=st.just("Topic_1"), body=st.binary(max_size=300), queue_id=st.just(3),
    properties=st.dictionaries(text, text, min_size=1, max_size=4), flag=st.integers(-2**31, 2**31 - 1),
    sysflag=st.sampled_from([0, 0x1, 0x2, 0x10, 0x30]), born_timestamp=st.integers(0, 2**62),
    born_host=st.just(("10.1.2.3", 10911)), reconsume_times=st.integers(0, 16),
    prepared_tx_offset=st.integers(0, 2**40))


@pytest.mark.parametrize("with_c", [False, True])
@settings(max_examples=150, deadline=None)
@given(batch=st.lists(usual, min_size=2, max_size=8))
def test_usual_batch_equals_reference(batch, with_c) -> None:
    import sluice.store.encode as E

    if with_c and E.C is None:
        pytest.skip("the C extension is not in use")
    store_host = ("127.0.0.1", 10911)
    saved = E.C
    E.C = saved if with_c else None
    try:
        enc = encode_batch(batch, store_host=store_host, max_body=1000)
    finally:
        E.C = saved
    ref = [encode_record(topic=m.topic, body=m.body, properties=encode_properties(m.properties), queue_id=3,
                         flag=m.flag, sysflag=m.sysflag, born_timestamp=m.born_timestamp, born_host=m.born_host,
                         store_host=store_host, reconsume_times=m.reconsume_times,
                         prepared_tx_offset=m.prepared_tx_offset) for m in batch]
    assert bytes(enc.buf) == b"".join(ref) and enc.sizes == [len(r) for r in ref]
    assert enc.ts_positions == [56] * len(batch) and enc.queued is None
    assert enc.props == [encode_properties(m.properties) for m in batch]
    assert enc.tags == [m.properties.get("TAGS") for m in batch]


@pytest.mark.parametrize("bad, why", [
    ({"": "v"}, "name is empty"),
    ({"a": "x\x01y"}, "contains"),
    ({"a\x02": "y"}, "contains"),
    ({"a": 1}, "str to a str"),
])
def test_a_bad_message_in_a_batch_is_refused_precisely(bad, why) -> None:
    good = StoreMessage("T", b"x", 0, {"TAGS": "a", "KEYS": "k"})
    with pytest.raises(MessageIllegalError, match=why):
        encode_batch([good, StoreMessage("T", b"y", 0, bad), good], store_host=("127.0.0.1", 1), max_body=100)


def test_transient_properties_are_not_stored_by_either_path() -> None:
    batch = [StoreMessage("T", b"x", 0, {"TAGS": "a", "__RMQ.TRANSIENT.x": "t"}) for _ in range(3)]
    enc = encode_batch(batch, store_host=("127.0.0.1", 1), max_body=100)
    assert enc.props == ["TAGS\x01a\x02"] * 3 and b"TRANSIENT" not in enc.buf
