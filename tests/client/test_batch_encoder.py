"""The producer's batch body: C's encode_send_batch against its Python twin (_encode_batch_py), bulk unique ids,
and prepare_batch's results on either path (this file runs with and without the extension)."""
from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import sluice.speedups
from sluice.client.encoding import _encode_batch_py, prepare_batch
from sluice.errors import MessageIllegalError
from sluice.message import Message
from sluice.protocol import properties as P
from sluice.protocol.batch import decode_batch
from sluice.protocol.msgid import UniqueIdGenerator, decode_unique_id, new_unique_ids

C = sluice.speedups.C
needs_c = pytest.mark.skipif(C is None, reason="sluice._speedups is not built")

# Text that includes the separators, spaces, non-ASCII and lone surrogates (not UTF-8 encodable).
_text = st.text(st.sampled_from(["a", "b", "é", "中", " ", "\x01", "\x02", "\ud800", "_"]), max_size=6)
_names = st.one_of(_text, st.sampled_from(["TAGS", "UNIQ_KEY", "__RMQ.TRANSIENT.x", "region", "a"]))
_message = st.builds(
    Message,
    topic=st.sampled_from(["T", "T", "T", "U"]),
    body=st.one_of(st.binary(max_size=40), st.binary(min_size=1, max_size=5).map(bytearray)),
    tags=st.one_of(st.none(), _text),
    keys=st.one_of(st.none(), _text, st.lists(_text, max_size=2)),
    properties=st.dictionaries(_names, st.one_of(_text, st.integers(-5, 5)), max_size=4),
    flag=st.one_of(st.integers(-2**31, 2**31 - 1), st.just(2**40)),
    delay_level=st.sampled_from([0, 0, 0, 2, -1]),
    deliver_at=st.sampled_from([None, None, None, 5]),
    delay=st.sampled_from([None, None, None, 1.5]),
)


def _common(n: int, topic: str = "BenchCommon") -> list[Message]:
    return [Message(topic, b"x" * (100 + i), tags=f"Tag{'ABCDEFGHIJ'[i % 10]}", keys=f"k{i}" if i % 2 else None,
                    properties={"region": "eu", "a": str(i % 100), "名": "值"}, flag=i - 3) for i in range(n)]


def _ids(n: int) -> list[str]:
    return [f"{i:032X}" for i in range(n)]


@needs_c
@settings(max_examples=400, deadline=None)
@given(st.lists(_message, min_size=1, max_size=5), st.integers(1, 200))
def test_c_encoder_equals_the_python_twin_or_declines(msgs: list[Message], max_size: int):
    ids = _ids(len(msgs))
    try:
        expected: bytes | None = _encode_batch_py(msgs, msgs[0].topic, ids, max_size)
    except (MessageIllegalError, UnicodeError, OverflowError, ValueError, TypeError):
        expected = None  # the Python twin raises: C must leave the error to it
    except Exception as exc:  # struct.error for an out-of-range flag
        expected = None
        assert type(exc).__name__ == "error"
    got = C.encode_send_batch(msgs, Message, msgs[0].topic, ids, max_size, P.SYSTEM_NAMES)
    if got is not None:
        assert got == expected


@needs_c
def test_c_encoder_takes_the_common_shape():
    msgs = _common(40)
    ids = _ids(40)
    got = C.encode_send_batch(msgs, Message, "BenchCommon", ids, 1 << 20, P.SYSTEM_NAMES)
    assert got is not None and got == _encode_batch_py(msgs, "BenchCommon", ids, 1 << 20)


@needs_c
@pytest.mark.parametrize("change", [
    {"body": bytearray(b"x")}, {"keys": "a b"}, {"keys": ["a"]}, {"properties": {"a": 1}},
    {"properties": {"__RMQ.TRANSIENT.x": "v"}}, {"properties": {"TAGS": "v"}}, {"tags": "a\x01"},
    {"topic": "Other"}, {"flag": 2**31}, {"delay_level": 1}, {"delay": 1.0}, {"deliver_at": 1},
    {"properties": {"k": "\ud800"}}, {"body": b""}, {"properties": {"k": "v" * 40000}},
])
def test_c_encoder_declines_anything_else(change: dict):
    msgs = _common(3)
    for k, v in change.items():
        setattr(msgs[1], k, v)
    assert C.encode_send_batch(msgs, Message, "BenchCommon", _ids(3), 1 << 20, P.SYSTEM_NAMES) is None
    over_max_size = C.encode_send_batch(_common(3), Message, "BenchCommon", _ids(3), 300, P.SYSTEM_NAMES)
    assert over_max_size is None


class _Tagged(Message):
    """A subclass that changes what travels: the C encoder must leave it to the Python path."""

    __slots__ = ()

    def all_properties(self) -> dict[str, str]:
        return {**Message.all_properties(self), "via": "subclass"}


def test_a_message_subclass_keeps_its_own_properties():
    msgs = [*_common(2), _Tagged("BenchCommon", b"x", tags="TagZ")]
    if C is not None:
        assert C.encode_send_batch(msgs, Message, "BenchCommon", _ids(3), 1 << 20, P.SYSTEM_NAMES) is None
    assert decode_batch(prepare_batch(msgs).body)[2].properties["via"] == "subclass"


def test_prepare_batch_round_trips_with_fresh_consecutive_ids():
    msgs = _common(33)
    p = prepare_batch(msgs)
    ids = p.msg_id.split(",")
    assert len(set(ids)) == 33
    counters = [decode_unique_id(i).counter for i in ids]
    assert all((b - a) & 0xFFFF == 1 for a, b in zip(counters, counters[1:]))
    entries = decode_batch(p.body)
    assert [e.body for e in entries] == [m.body for m in msgs]
    assert [e.flag for e in entries] == [m.flag for m in msgs]
    assert entries[1].properties == {"region": "eu", "a": "1", "名": "值", "TAGS": "TagB", "KEYS": "k1",
                                     "UNIQ_KEY": ids[1]}
    assert "KEYS" not in entries[0].properties
    assert p.body == _encode_batch_py(msgs, "BenchCommon", ids, 1 << 22)
    assert set(prepare_batch(msgs).msg_id.split(",")).isdisjoint(ids)  # a resend of the same list gets new ids


def test_prepare_batch_keeps_its_errors_for_a_bad_topic_and_a_tuple():
    with pytest.raises(MessageIllegalError, match="contains"):
        prepare_batch([Message("bad topic", b"x")])
    with pytest.raises(MessageIllegalError, match="reserved"):
        prepare_batch((Message("T", b"x"), Message("T", b"y", properties={"UNIQ_KEY": "x"})))
    with pytest.raises(MessageIllegalError, match="message 1: delayed"):
        prepare_batch([Message("T", b"x"), Message("T", b"y", delay_level=3)])


def test_bulk_ids_share_the_time_and_count_on():
    gen = UniqueIdGenerator(ip=b"\x0a\x00\x00\x01", pid=7)
    one = gen.next_id()
    many = gen.next_ids(5)
    after = gen.next_id()
    infos = [decode_unique_id(i) for i in [one, *many, after]]
    assert [i.counter for i in infos] == [(infos[0].counter + k) & 0xFFFF for k in range(7)]
    assert {i.ip for i in infos} == {"10.0.0.1"} and {i.pid for i in infos} == {7}
    assert len({i.timestamp_ms_in_month for i in infos[1:6]}) == 1
    assert gen.next_ids(0) == [] and len(gen.next_ids(1)) == 1
    assert len(set(new_unique_ids(1000))) == 1000


@given(st.integers(0, 0xFFFF), st.integers(2, 600))
def test_bulk_ids_end_in_the_counter_as_four_hex_digits_across_its_wrap(start, n):
    gen = UniqueIdGenerator(ip=b"\x0a\x00\x00\x01", pid=7)
    gen._counter = itertools.count(start)  # where a process's random start may put it, wrap included
    ids = gen.next_ids(n)
    assert [i[-4:] for i in ids] == [f"{(start + k) & 0xFFFF:04X}" for k in range(n)]
    assert len({i[:-4] for i in ids}) == 1 and all(len(i) == 32 for i in ids)
