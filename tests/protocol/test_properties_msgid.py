"""Properties encoding, message ids and the user-facing Message."""
from __future__ import annotations

import pytest
from hypothesis import given, strategies as st

from sluice import Message
from sluice.errors import InvalidParameterError, MessageIdKindError, MessageIllegalError
from sluice.protocol import msgid
from sluice.protocol import properties as P

names = st.text(alphabet=st.characters(blacklist_characters="\x01\x02", blacklist_categories=("Cs",)), min_size=1, max_size=20)
values = st.text(alphabet=st.characters(blacklist_characters="\x01\x02", blacklist_categories=("Cs",)), min_size=1, max_size=50)


@given(st.dictionaries(names, values, max_size=10))
def test_properties_round_trip(props):
    # RocketMQ drops parts shorter than 3 characters (a 1-char name with a 1-char value).
    expect = {k: v for k, v in props.items() if len(k) + len(v) + 1 >= 3 and not k.startswith(P.TRANSIENT_PREFIX)}
    assert P.decode_properties(P.encode_properties(props)) == expect


def test_properties_encoding_matches_rocketmq():
    assert P.encode_properties({"TAGS": "TagA", "KEYS": "k1 k2"}) == "TAGS\x01TagA\x02KEYS\x01k1 k2\x02"
    assert P.decode_properties("a\x01\x02\x01v\x02ok\x01yes\x02") == {"ok": "yes"}


@pytest.mark.parametrize("name,value", [("a\x01", "v"), ("a", "v\x02"), ("", "v")])
def test_bad_property_refused(name, value):
    with pytest.raises(MessageIllegalError):
        P.check_property(name, value)


def test_unique_id_layout():
    gen = msgid.UniqueIdGenerator(ip=bytes([10, 0, 0, 7]), pid=4321)
    a, b = gen.next_id(), gen.next_id()
    assert len(a) == 32 and a == a.upper() and a != b
    info = msgid.decode_unique_id(a)
    assert info.ip == "10.0.0.7" and info.pid == 4321
    assert (msgid.decode_unique_id(b).counter - info.counter) % 65536 == 1


@given(st.integers(0, 2**63 - 1), st.integers(0, 65535))
def test_offset_msg_id_round_trip(offset, port):
    mid = msgid.create_offset_msg_id("192.168.3.4", port, offset)
    assert len(mid) == 32
    d = msgid.decode_offset_msg_id(mid)
    assert (d.host, d.port, d.offset) == ("192.168.3.4", port, offset)


def test_offset_msg_id_known_value():
    # 127.0.0.1:10911 at offset 0x1234, as MessageDecoder.createMessageId writes it.
    assert msgid.create_offset_msg_id("127.0.0.1", 10911, 0x1234) == "7F00000100002A9F0000000000001234"


@pytest.mark.parametrize("bad", ["xyz", "ABCD", "7F00000100002A9F00000000000012"])
def test_bad_msg_ids(bad):
    with pytest.raises(InvalidParameterError):
        msgid.decode_offset_msg_id(bad)


@given(st.integers(0, 2**63 - 1), st.integers(1, 65535))
def test_offset_msg_id_checked_for_a_lookup(offset, port):
    mid = msgid.create_offset_msg_id("10.1.2.3", port, offset)
    assert msgid.check_offset_msg_id(mid) == msgid.decode_offset_msg_id(mid)


@given(st.integers(1, 0xFFFF))
def test_unique_id_named_when_an_offset_id_is_expected(pid):
    # Same 32 hex characters; the pid sits where an offset id's port is, making it no TCP port.
    uid = msgid.UniqueIdGenerator(ip=bytes([10, 0, 0, 7]), pid=pid).next_id()
    with pytest.raises(MessageIdKindError, match="UNIQ_KEY.*unique_key=True") as info:
        msgid.check_offset_msg_id(uid)
    assert info.value.kind == "msgId (UNIQ_KEY)" and isinstance(info.value, InvalidParameterError)


def test_message_properties_and_validation():
    m = Message("Orders", b"x", tags="TagA", keys=["k1", "k2"], properties={"region": "eu"})
    m.validate()
    assert m.all_properties() == {"region": "eu", "TAGS": "TagA", "KEYS": "k1 k2"}
    with pytest.raises(MessageIllegalError, match="reserved"):
        Message("Orders", b"x", properties={"UNIQ_KEY": "x"}).validate()
    with pytest.raises(MessageIllegalError, match="limit"):
        Message("Orders", b"x" * (4 * 1024 * 1024 + 1)).validate()
    with pytest.raises(MessageIllegalError, match="topic"):
        Message("bad topic", b"x").validate()
