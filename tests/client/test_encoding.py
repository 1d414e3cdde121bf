"""Send-side encoding: validation, unique ids, compression, request headers, batches, responses."""
from __future__ import annotations

import re
import zlib

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sluice.client.encoding import (
    build_send_request, parse_send_response, prepare_batch, prepare_message,
)
from sluice.client.results import MessageQueue, SendStatus
from sluice.errors import BrokerResponseError, MessageIllegalError, ServiceNotAvailableError
from sluice.message import Message
from sluice.protocol import properties as P
from sluice.protocol.batch import decode_batch
from sluice.protocol.codes import RequestCode, ResponseCode
from sluice.protocol.headers import SendMessageRequestHeader
from sluice.protocol.msgid import decode_unique_id
from sluice.protocol.record import FLAG_COMPRESSED

MQ = MessageQueue(topic="T", broker_name="broker-a", queue_id=3)


def test_small_body_is_sent_as_is():
    p = prepare_message(Message("T", b"x" * 4095))
    assert p.sys_flag & FLAG_COMPRESSED == 0 and p.body == b"x" * 4095


def test_body_of_4_kib_or_more_is_zlib_compressed_and_flagged():
    body = bytes(range(256)) * 20
    p = prepare_message(Message("T", body))
    assert p.sys_flag & FLAG_COMPRESSED and zlib.decompress(p.body) == body and len(p.body) < len(body)


def test_compression_threshold_and_level_are_options():
    p = prepare_message(Message("T", b"a" * 100), compress_over=50, compress_level=9)
    assert p.sys_flag == FLAG_COMPRESSED and p.body == zlib.compress(b"a" * 100, 9)


def test_unique_id_is_set_once_and_decodes():
    p = prepare_message(Message("T", b"x", tags="TagA", keys=["k1", "k2"], properties={"a": "1"}))
    props = P.decode_properties(p.properties)
    assert props == {"a": "1", "TAGS": "TagA", "KEYS": "k1 k2", "UNIQ_KEY": p.msg_id}
    assert len(p.msg_id) == 32 and decode_unique_id(p.msg_id).counter >= 0
    assert prepare_message(Message("T", b"x")).msg_id != p.msg_id


@pytest.mark.parametrize("msg", [
    Message("T", b""), Message("bad topic", b"x"), Message("T", b"x", properties={"UNIQ_KEY": "1"}),
    Message("T", b"x", properties={"a": "b\x01c"}), Message("T" * 128, b"x"),
])
def test_bad_messages_are_refused_before_sending(msg: Message):
    with pytest.raises(MessageIllegalError):
        prepare_message(msg)


def test_body_limit_is_checked_client_side():
    prepare_message(Message("T", b"x" * (4 * 1024 * 1024)))
    with pytest.raises(MessageIllegalError, match="4194305 bytes; the limit is 4194304"):
        prepare_message(Message("T", b"x" * (4 * 1024 * 1024 + 1)))


def test_v2_request_uses_letters_and_round_trips():
    p = prepare_message(Message("T", b"hello", tags="A", flag=7))
    req = build_send_request(p, MQ, group="G")
    assert req.code == RequestCode.SEND_MESSAGE_V2 and req.body == b"hello" and not req.is_oneway
    assert {"a", "b", "c", "d", "e", "f", "g", "i", "n"} <= set(req.ext_fields)
    h = SendMessageRequestHeader.from_command(req)
    assert (h.producer_group, h.topic, h.default_topic, h.default_topic_queue_nums, h.queue_id, h.flag, h.batch,
            h.broker_name) == ("G", "T", "TBW102", 4, 3, 7, False, "broker-a")
    assert P.decode_properties(h.properties)["UNIQ_KEY"] == p.msg_id and h.born_timestamp > 0


def test_v1_request_and_oneway_flag():
    p = prepare_message(Message("T", b"hello"))
    req = build_send_request(p, MQ, group="G", v2=False, oneway=True, default_topic="AUTO", default_topic_queue_nums=8)
    assert req.code == RequestCode.SEND_MESSAGE and req.is_oneway
    assert req.ext_fields["producerGroup"] == "G" and req.ext_fields["defaultTopic"] == "AUTO"
    assert req.ext_fields["defaultTopicQueueNums"] == "8"


def test_batch_body_carries_each_message_and_its_id():
    msgs = [Message("T", f"m{i}".encode(), tags=f"t{i}", keys=f"k{i}", properties={"i": str(i)}) for i in range(5)]
    p = prepare_batch(msgs)
    ids = p.msg_id.split(",")
    assert p.batch and p.sys_flag == 0 and len(set(ids)) == 5
    entries = decode_batch(p.body)
    assert [e.body for e in entries] == [m.body for m in msgs]
    assert [e.properties["UNIQ_KEY"] for e in entries] == ids
    assert entries[3].properties == {"i": "3", "TAGS": "t3", "KEYS": "k3", "UNIQ_KEY": ids[3]}
    req = build_send_request(p, MQ, group="G")
    assert req.code == RequestCode.SEND_BATCH_MESSAGE and req.ext_fields["m"] == "true"


def test_batch_is_never_compressed():
    p = prepare_batch([Message("T", b"z" * 10000)])
    assert p.sys_flag == 0 and decode_batch(p.body)[0].body == b"z" * 10000


@pytest.mark.parametrize(("msgs", "match"), [
    ([], "at least one"),
    ([Message("T", b"a"), Message("U", b"b")], "one topic"),
    ([Message("T", b"a", delay_level=2)], "delayed"),
    ([Message("T", b"")], "empty"),
    ([Message("T", b"x" * (3 * 1024 * 1024)), Message("T", b"x" * (2 * 1024 * 1024))], "batch body"),
])
def test_bad_batches(msgs: list[Message], match: str):
    with pytest.raises(MessageIllegalError, match=match):
        prepare_batch(msgs)


def _response(code: int, **ext: str):
    req = build_send_request(prepare_message(Message("T", b"x")), MQ, group="G")
    return req.make_response(code, "why", ext or {"msgId": "7F0000010000270F0000000000000010", "queueId": "3",
                                                   "queueOffset": "42"})


@pytest.mark.parametrize(("code", "status"), [
    (ResponseCode.SUCCESS, SendStatus.SEND_OK), (ResponseCode.FLUSH_DISK_TIMEOUT, SendStatus.FLUSH_DISK_TIMEOUT),
    (ResponseCode.FLUSH_SLAVE_TIMEOUT, SendStatus.FLUSH_SLAVE_TIMEOUT),
    (ResponseCode.SLAVE_NOT_AVAILABLE, SendStatus.SLAVE_NOT_AVAILABLE),
])
def test_storing_codes_give_a_result(code: int, status: SendStatus):
    p = prepare_message(Message("T", b"x"))
    r = parse_send_response(_response(code), p, MQ)
    assert (r.status, r.msg_id, r.offset_msg_id, r.queue, r.queue_offset) == (
        status, p.msg_id, "7F0000010000270F0000000000000010", MQ, 42)


def test_error_codes_raise_their_class_with_the_remark():
    p = prepare_message(Message("T", b"x"))
    with pytest.raises(ServiceNotAvailableError, match="why"):
        parse_send_response(_response(ResponseCode.SERVICE_NOT_AVAILABLE), p, MQ)
    with pytest.raises(BrokerResponseError) as info:
        parse_send_response(_response(ResponseCode.SYSTEM_BUSY), p, MQ)
    assert info.value.code == ResponseCode.SYSTEM_BUSY


@settings(max_examples=60, deadline=None)
@given(st.binary(min_size=1, max_size=9000), st.integers(min_value=1, max_value=10000))
def test_compression_decision_and_round_trip(body: bytes, threshold: int):
    p = prepare_message(Message("T", body), compress_over=threshold)
    compressed = bool(p.sys_flag & FLAG_COMPRESSED)
    assert compressed == (len(body) >= threshold)
    assert (zlib.decompress(p.body) if compressed else p.body) == body


@pytest.mark.parametrize(("v2", "batch"), [(True, False), (False, False), (True, True)])
def test_ext_fields_equal_the_typed_header_rendering(v2: bool, batch: bool):
    p = prepare_batch([Message("T", b"a")]) if batch else prepare_message(Message("T", b"a", tags="X", flag=3))
    req = build_send_request(p, MQ, group="G", v2=v2, default_topic_queue_nums=6)
    h = SendMessageRequestHeader(
        producer_group="G", topic="T", default_topic="TBW102", default_topic_queue_nums=6, queue_id=3,
        sys_flag=p.sys_flag, born_timestamp=int(req.ext_fields["g" if v2 else "bornTimestamp"]), flag=p.flag,
        properties=p.properties, reconsume_times=0, unit_mode=False, batch=batch, broker_name="broker-a")
    assert req.ext_fields == (h.to_v2_ext() if v2 else h.to_ext())


@pytest.mark.parametrize("flag", [2**31, -2**31 - 1, "1"])
def test_a_flag_that_is_not_a_java_int_is_a_precise_error(flag):
    """FLAG is a Java int on the wire and in the record: out of range is MessageIllegalError, not struct.error."""
    with pytest.raises(MessageIllegalError, match="flag"):
        prepare_message(Message("T", b"x", flag=flag))
    with pytest.raises(MessageIllegalError, match="flag"):
        prepare_batch([Message("T", b"x"), Message("T", b"y", flag=flag)])
    prepare_message(Message("T", b"x", flag=2**31 - 1))  # the edges fit
    prepare_message(Message("T", b"x", flag=-2**31))


def test_a_batch_keeps_the_id_a_message_carries():
    """MessageClientIDSetter.setUniqID only sets an id a message lacks: a subclass that supplies its own
    UNIQ_KEY (the Spark writer's content-derived ids) keeps it, in the body and in the reported ids."""
    import dataclasses

    @dataclasses.dataclass(slots=True)
    class Keyed(Message):
        uniq_key: str = ""

        def all_properties(self) -> dict[str, str]:
            props = Message.all_properties(self)
            props[P.UNIQ_KEY] = self.uniq_key
            return props

    own = "0123456789ABCDEF0123456789ABCDEF"
    p = prepare_batch([Message("T", b"a"), Keyed("T", b"b", uniq_key=own)])
    ids = p.msg_id.split(",")
    assert ids[1] == own and ids[0] != own
    stored = decode_batch(p.body)
    assert [m.properties[P.UNIQ_KEY] for m in stored] == ids


@settings(max_examples=60, deadline=None)
@given(st.text(st.characters(blacklist_characters="\x01\x02", blacklist_categories=("Cs",)), min_size=1, max_size=8),
       st.integers(min_value=-2**31, max_value=2**31 - 1), st.integers(min_value=0, max_value=64),
       st.booleans())
def test_a_single_v2_request_is_the_command_the_typed_header_makes(tag: str, flag: int, queue_id: int, oneway: bool):
    """build_send_request writes a single send's V2 dict directly: the same command as from the typed header."""
    from sluice.protocol.command import FLAG_ONEWAY, RemotingCommand
    p = prepare_message(Message("T", b"a", tags=tag, flag=flag, properties={"k": tag}))
    mq = MessageQueue(topic="T", broker_name="broker-b", queue_id=queue_id)
    req = build_send_request(p, mq, group="G", default_topic_queue_nums=5, oneway=oneway)
    h = SendMessageRequestHeader(
        producer_group="G", topic="T", default_topic="TBW102", default_topic_queue_nums=5, queue_id=queue_id,
        sys_flag=p.sys_flag, born_timestamp=int(req.ext_fields["g"]), flag=flag, properties=p.properties,
        reconsume_times=0, unit_mode=False, batch=False, broker_name="broker-b")
    assert req == RemotingCommand(code=RequestCode.SEND_MESSAGE_V2, ext_fields=h.to_v2_ext(), body=b"a",
                                  flag=FLAG_ONEWAY if oneway else 0)
    assert list(req.ext_fields) == list(h.to_v2_ext())  # the order Java writes them in, too


def test_the_result_names_the_queue_the_broker_stored_in():
    p = prepare_message(Message("T", b"x"))
    same = parse_send_response(_response(ResponseCode.SUCCESS), p, MQ)
    assert same.queue is MQ
    other = parse_send_response(_response(ResponseCode.SUCCESS, msgId="7F0000010000270F0000000000000010",
                                          queueId="1", queueOffset="5", transactionId="tx"), p, MQ)
    assert (other.queue, other.queue_offset, other.transaction_id) == (
        MessageQueue(topic="T", broker_name="broker-a", queue_id=1), 5, "tx")
    assert other == type(other)(status=SendStatus.SEND_OK, msg_id=p.msg_id,
                                offset_msg_id="7F0000010000270F0000000000000010", queue=other.queue, queue_offset=5,
                                transaction_id="tx")


_NAMES = st.sampled_from(["region", "a", "region", "a", "", "TAGS", "UNIQ_KEY", "KEYS", "__RMQ.TRANSIENT.x", "b\x01c", "d\x02",
                          "é"])
_VALUES = st.one_of(st.sampled_from(["eu", "", "1", "x\x01y", "z\x02", "ü"]), st.sampled_from(["eu", "7"]),
                    st.integers(-3, 3))
def _mostly(common, *others):
    """``common`` in most examples, so most messages are of the common shape but for one or two fields."""
    return st.one_of(st.just(common), st.just(common), st.just(common), st.sampled_from(others))


_PLAIN_SHAPES = st.builds(
    Message,
    topic=_mostly("T", "BenchCommon", "bad topic", "", "T" * 128, "%RETRY%g"),
    body=st.one_of(st.binary(min_size=1, max_size=70), st.binary(max_size=70),
                   st.sampled_from([b"x" * 5000, bytearray(b"ab"), memoryview(b"cd")])),
    tags=st.one_of(st.none(), st.sampled_from(["", "TagA", "a\x01b", "c\x02", "tag with space"])),
    keys=_mostly(None, ["k1"], "k2 k3"),
    properties=st.dictionaries(_NAMES, _VALUES, max_size=4),
    flag=_mostly(0, 1, -1, 2**31 - 1, 2**31, -2**31, -2**31 - 1, True),
    delay_level=_mostly(0, -1, 2),
    deliver_at=_mostly(None, 5),
    delay=_mostly(None, 1.5),
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(_PLAIN_SHAPES, _mostly(4096, 10, 1), _mostly(4 * 1024 * 1024, 40))
def test_the_one_pass_prepare_is_the_general_one(monkeypatch_uid, msg: Message, compress_over: int, max_size: int):
    """_prepare_plain (the common shape in one pass) gives what _prepare_general gives, or None; never a result
    where the general road refuses the message; prepare_message gives the general road's result or error."""
    from sluice.client import encoding as E
    try:
        want = E._prepare_general(msg, max_size, compress_over, 5)
    except Exception as exc:  # noqa: BLE001 - whatever the general road raises, prepare_message raises too
        assert E._prepare_plain(msg, max_size, compress_over) is None
        with pytest.raises(type(exc)) as got:
            prepare_message(msg, max_size=max_size, compress_over=compress_over)
        assert str(got.value) == str(exc)
        return
    fast = E._prepare_plain(msg, max_size, compress_over)
    assert fast is None or fast == want
    assert prepare_message(msg, max_size=max_size, compress_over=compress_over) == want


def test_the_one_pass_prepare_takes_the_common_shape(monkeypatch_uid):
    from sluice.client import encoding as E
    msg = Message("T", b"x" * 100, tags="TagA", properties={"region": "eu", "a": "7"})
    fast = E._prepare_plain(msg, 4 * 1024 * 1024, 4096)
    assert fast is not None and fast == E._prepare_general(msg, 4 * 1024 * 1024, 4096, 5)
    assert P.decode_properties(fast.properties) == {"region": "eu", "a": "7", "TAGS": "TagA", "UNIQ_KEY": "ID"}


@pytest.fixture
def monkeypatch_uid(monkeypatch):
    """A fixed UNIQ_KEY, so the two roads' results compare equal."""
    from sluice.client import encoding as E
    monkeypatch.setattr(E, "new_unique_id", lambda: "ID")


@pytest.mark.parametrize("change", [
    {"properties": {"TAGS": "x"}}, {"properties": {"UNIQ_KEY": "x"}}, {"properties": {"": "x"}},
    {"properties": {"a\x01": "x"}}, {"properties": {"a": "x\x02"}}, {"properties": {"__RMQ.TRANSIENT.a": "x"}},
    {"properties": {"a": 1}}, {"tags": "a\x01"}, {"tags": "a\x02b"}, {"keys": ["k"]}, {"delay_level": 1},
    {"deliver_at": 5}, {"delay": 1.0}, {"flag": 2**31}, {"flag": True}, {"body": bytearray(b"x")}, {"body": b""},
    {"body": b"x" * 5000}, {"topic": "a b"},
])
def test_the_one_pass_prepare_leaves_every_other_shape_to_the_general_one(monkeypatch_uid, change: dict):
    from sluice.client import encoding as E
    fields = {"topic": "T", "body": b"x" * 10, "tags": "TagA", "properties": {"region": "eu"}} | change
    msg = Message(**fields)
    assert E._prepare_plain(msg, 4 * 1024 * 1024, 4096) is None
    try:
        want = E._prepare_general(msg, 4 * 1024 * 1024, 4096, 5)
    except MessageIllegalError as exc:
        with pytest.raises(MessageIllegalError, match="^" + re.escape(str(exc)) + "$"):
            prepare_message(msg)
    else:
        assert prepare_message(msg) == want
