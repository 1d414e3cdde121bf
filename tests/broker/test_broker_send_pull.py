"""Send and pull through a real in-process broker over loopback (raw remoting requests)."""
from __future__ import annotations

import zlib

import pytest

from broker_support import bodies, records
from sluice.protocol import properties as P
from sluice.protocol.batch import encode_batch
from sluice.protocol.codes import RequestCode, ResponseCode
from sluice.protocol.headers import SendMessageRequestHeader
from sluice.protocol.msgid import decode_offset_msg_id

R = ResponseCode


@pytest.mark.parametrize("code", [RequestCode.SEND_MESSAGE, RequestCode.SEND_MESSAGE_V2])
def test_send_then_pull_round_trip(rpc, broker, code):
    acks = [rpc.send("Orders", f"m{i}".encode(), tags="TagA", keys=f"k{i}", code=code) for i in range(5)]
    assert [a.code for a in acks] == [R.SUCCESS] * 5
    assert [int(a.ext_fields["queueOffset"]) for a in acks] == list(range(5))
    assert {a.ext_fields["queueId"] for a in acks} == {"0"}
    resp = rpc.pull("Orders")
    assert resp.code == R.SUCCESS
    recs = records(resp)
    assert [bytes(r.body) for r in recs] == [f"m{i}".encode() for i in range(5)]
    assert resp.ext_fields == {"suggestWhichBrokerId": "0", "nextBeginOffset": "5", "minOffset": "0",
                               "maxOffset": "5"}
    # The msgId is the offset message id: store host + the commit-log offset of the record served back.
    for ack, rec in zip(acks, recs):
        mid = decode_offset_msg_id(ack.ext_fields["msgId"])
        assert mid.offset == rec.physical_offset
        assert f"{mid.host}:{mid.port}" == broker.addr
        assert P.decode_properties(rec.properties)[P.TAGS] == "TagA"


def test_batch_send_comma_joined_ids(rpc):
    entries = [(f"b{i}".encode(), {P.KEYS: f"k{i}"}, 0) for i in range(4)]
    ack = rpc.send_batch("Batchy", entries, queue_id=1)
    assert ack.code == R.SUCCESS, ack.remark
    ids = ack.ext_fields["msgId"].split(",")
    assert len(ids) == 4 and len(set(ids)) == 4
    assert ack.ext_fields["queueOffset"] == "0" and ack.ext_fields["queueId"] == "1"
    resp = rpc.pull("Batchy", queue_id=1)
    assert bodies(resp) == [b"b0", b"b1", b"b2", b"b3"]
    assert [P.decode_properties(r.properties)[P.KEYS] for r in records(resp)] == ["k0", "k1", "k2", "k3"]


def test_librocketmq_batch_as_send_message_compressed(rpc):
    # librocketmq 1.0.1: code 10 with batch=true, the whole batch body zlib-compressed (sysFlag bit 0x1).
    raw = encode_batch([(b"z" * 3000, {"TAGS": "T"}, 0), (b"y" * 3000, {}, 7)])
    h = SendMessageRequestHeader(producer_group="PG", topic="Cpp", queue_id=0, sys_flag=0x1)
    ext = {**h.to_ext(), "batch": "1"}  # librocketmq writes "1", not "true"
    ack = rpc.call(RequestCode.SEND_MESSAGE, ext, zlib.compress(raw))
    assert ack.code == R.SUCCESS, ack.remark
    recs = records(rpc.pull("Cpp"))
    assert [bytes(r.body) for r in recs] == [b"z" * 3000, b"y" * 3000]
    assert [r.flag for r in recs] == [0, 7]
    assert all(r.sysflag & 0x1 == 0 for r in recs)


def test_a_negative_queue_id_picks_one(rpc, broker):
    ack = rpc.send("Picky", queue_id=-1)
    assert ack.code == R.SUCCESS
    assert 0 <= int(ack.ext_fields["queueId"]) < broker.broker.topics.get("Picky").write_queue_nums


def test_a_queue_id_past_the_topics_queues_is_refused(rpc, broker):
    assert rpc.send("Picky", queue_id=0).code == R.SUCCESS  # creates the topic (4 queues)
    ack = rpc.send("Picky", queue_id=999)
    assert ack.code == R.SYSTEM_ERROR  # RocketMQ 4.x's msgCheck
    assert "queueId[999] is illegal" in ack.remark and "4 write and 4 read queues" in ack.remark
    assert rpc.pull("Picky", queue_id=0).code == R.SUCCESS  # the broker carries on


@pytest.mark.parametrize("topic,body,needle", [
    ("bad topic", b"x", "contains ' '"),
    ("Fine", b"", "body is empty"),
    ("TBW102", b"x", "auto-create template"),
])
def test_bad_send_is_message_illegal(rpc, topic, body, needle):
    ack = rpc.send(topic, body)
    assert ack.code == R.MESSAGE_ILLEGAL
    assert needle in ack.remark


def test_bad_batch_body_is_message_illegal(rpc):
    h = SendMessageRequestHeader(producer_group="PG", topic="B", queue_id=0, batch=True)
    ack = rpc.call(RequestCode.SEND_BATCH_MESSAGE, h.to_v2_ext(), b"\x00\x00\x00\x40garbage")
    assert ack.code == R.MESSAGE_ILLEGAL and "batch body" in ack.remark


def test_oversized_body_refused(make_broker):
    b = make_broker(max_message_size=1024)
    ack = b.rpc().send("Big", b"x" * 2000)
    assert ack.code == R.MESSAGE_ILLEGAL and "limit" in ack.remark


def test_missing_header_field_is_a_clear_error(rpc):
    ack = rpc.call(RequestCode.SEND_MESSAGE_V2, {"a": "PG"}, b"x")
    assert ack.code == R.INVALID_PARAMETER and "topic: the field is missing" in ack.remark


def test_retry_over_max_goes_to_dlq(rpc, broker):
    ack = rpc.send("%RETRY%grp", b"again", reconsume_times=3, max_reconsume_times=2)
    assert ack.code == R.SUCCESS
    assert broker.broker.topics.get("%DLQ%grp") is not None
    assert bodies(rpc.pull("%DLQ%grp")) == [b"again"]
    ok = rpc.send("%RETRY%grp", b"retry", reconsume_times=1, max_reconsume_times=2)
    assert ok.code == R.SUCCESS
    assert bodies(rpc.pull("%RETRY%grp")) == [b"retry"]


def test_delayed_message_waits_in_the_schedule_topic(rpc):
    # Level 3 is 10 s: the message is parked, not delivered at once (tests/client/test_delays.py covers delivery).
    assert rpc.send("Later", b"d", props={"DELAY": "3"}).code == R.SUCCESS
    assert records(rpc.pull("Later")) == []
    [rec] = records(rpc.pull("SCHEDULE_TOPIC_XXXX", queue_id=2))
    props = P.decode_properties(rec.properties)
    assert props["REAL_TOPIC"] == "Later" and props["DELAY"] == "3"


def test_auto_create_off(make_broker):
    b = make_broker(auto_create_topic=False)
    r = b.rpc()
    ack = r.send("Nope")
    assert ack.code == R.TOPIC_NOT_EXIST and "auto-creation is off" in ack.remark
    created = r.call(RequestCode.UPDATE_AND_CREATE_TOPIC, dict(topic="Nope", readQueueNums=2, writeQueueNums=2,
                                                                 perm=6))
    assert created.code == R.SUCCESS
    assert r.send("Nope").code == R.SUCCESS


def test_auto_create_uses_requested_queue_count(rpc, broker):
    rpc.send("Fresh", default_topic_queue_nums=3)
    cfg = broker.broker.topics.get("Fresh")
    assert (cfg.read_queue_nums, cfg.write_queue_nums) == (3, 3)


def test_unknown_request_code(rpc):
    resp = rpc.call(9999)
    assert resp.code == R.REQUEST_CODE_NOT_SUPPORTED and "9999" in resp.remark


def test_pull_statuses(rpc):
    assert rpc.pull("NoSuchTopic").code == R.TOPIC_NOT_EXIST
    for i in range(3):
        rpc.send("St", f"{i}".encode())
    assert rpc.pull("St", offset=3).code == R.PULL_NOT_FOUND          # OFFSET_OVERFLOW_ONE
    moved = rpc.pull("St", offset=10)                                  # OFFSET_OVERFLOW_BADLY
    # RocketMQ: next = minOffset when it is 0, else maxOffset
    assert moved.code == R.PULL_OFFSET_MOVED and moved.ext_fields["nextBeginOffset"] == "0"
    assert rpc.pull("St", queue_id=1, offset=0).code == R.PULL_NOT_FOUND   # empty queue, offset 0
    assert rpc.pull("St", queue_id=1, offset=5).code == R.PULL_OFFSET_MOVED
    assert rpc.pull("St", queue_id=99).code == R.SYSTEM_ERROR
    two = rpc.pull("St", max_msgs=2)
    assert bodies(two) == [b"0", b"1"] and two.ext_fields["nextBeginOffset"] == "2"


def test_pull_commit_offset_flag(rpc, broker):
    rpc.send("Co")
    rpc.pull("Co", sys_flag=0x4 | 0x1, commit_offset=1, group="cg")
    assert broker.broker.offsets.query("cg", "Co", 0) == 1


def test_not_writable_topic(rpc):
    rpc.call(RequestCode.UPDATE_AND_CREATE_TOPIC, dict(topic="RO", readQueueNums=1, writeQueueNums=1, perm=4))
    assert rpc.send("RO").code == R.NO_PERMISSION
    rpc.call(RequestCode.UPDATE_AND_CREATE_TOPIC, dict(topic="WO", readQueueNums=1, writeQueueNums=1, perm=2))
    assert rpc.pull("WO").code == R.NO_PERMISSION


def test_concurrent_sends_are_merged_and_a_bad_one_fails_alone(make_broker):
    import asyncio

    from sluice.transport.client import RemotingClient
    from sluice.protocol.command import RemotingCommand
    b = make_broker(max_message_size=2048)

    def req(body: bytes) -> RemotingCommand:
        h = SendMessageRequestHeader(producer_group="PG", topic="Merge", queue_id=0)
        return RemotingCommand.request(RequestCode.SEND_MESSAGE_V2, h.to_v2_ext(), body)

    async def burst():
        client = RemotingClient()
        try:
            bodies_ = [f"ok{i}".encode() for i in range(20)]
            bodies_.insert(7, b"x" * 4096)  # over the limit: refused by the store's validation
            return await asyncio.gather(*(client.invoke(b.addr, req(x)) for x in bodies_))
        finally:
            await client.close()

    acks = b.loop.run(burst(), 30)
    assert [a.code for a in acks].count(R.MESSAGE_ILLEGAL) == 1 and acks[7].code == R.MESSAGE_ILLEGAL
    good = [a for a in acks if a.code == R.SUCCESS]
    assert sorted(int(a.ext_fields["queueOffset"]) for a in good) == list(range(20))
    assert b.broker.appender.jobs < len(acks)  # requests shared store calls
    assert sorted(bodies(b.rpc().pull("Merge"))) == sorted(f"ok{i}".encode() for i in range(20))


def test_pulls_on_the_thread_pool_too(make_broker):
    b = make_broker(pull_on_event_loop=False)
    r = b.rpc()
    r.send("Pool", b"p")
    assert bodies(r.pull("Pool")) == [b"p"]
