"""Heartbeats, consumer lists, notifications, offsets, lookups by key and id, admin requests."""
from __future__ import annotations

import time

import orjson

from broker_support import Rpc, records, sub_data
from sluice.protocol.bodies import LockBatchRequestBody, MessageQueue, encode_body
from sluice.protocol.codes import RequestCode, ResponseCode
from sluice.protocol.command import RemotingCommand
from sluice.protocol.msgid import decode_offset_msg_id

R = ResponseCode
C = RequestCode


def _consumer_ids(rpc: Rpc, group: str) -> list[str] | int:
    resp = rpc.call(C.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": group})
    return orjson.loads(resp.body)["consumerIdList"] if resp.code == 0 else resp.code


def test_heartbeat_both_enum_forms_and_consumer_list(broker):
    a, b = broker.rpc(), broker.rpc()
    assert a.heartbeat("cid-a", "grp", [sub_data("T", "TagA")], ordinals=True).code == R.SUCCESS
    assert b.heartbeat("cid-b", "grp", [sub_data("T", "TagA")]).code == R.SUCCESS
    assert _consumer_ids(a, "grp") == ["cid-a", "cid-b"]
    info = broker.broker.consumers.get("grp")
    assert info.consume_from_where == "CONSUME_FROM_FIRST_OFFSET"  # last heartbeat (names) wins
    assert broker.broker.topics.get("%RETRY%grp") is not None
    assert _consumer_ids(a, "nobody") == R.SYSTEM_ERROR


def test_unregister_and_connection_close_drop_clients(broker):
    a, b = broker.rpc(), broker.rpc()
    a.heartbeat("cid-a", "g2", [sub_data("T")])
    b.heartbeat("cid-b", "g2", [sub_data("T")])
    resp = a.call(C.UNREGISTER_CLIENT, {"clientID": "cid-a", "consumerGroup": "g2"})
    assert resp.code == R.SUCCESS
    assert _consumer_ids(b, "g2") == ["cid-b"]
    a.heartbeat("cid-a", "g2", [sub_data("T")])
    b.close()
    deadline = time.monotonic() + 5
    while _consumer_ids(a, "g2") != ["cid-a"]:
        assert time.monotonic() < deadline, "closed connection's client still listed"
        time.sleep(0.02)


def test_notify_consumer_ids_changed_sent_to_members(broker):
    got: list[RemotingCommand] = []
    watcher = broker.rpc()

    async def on_notify(conn, request):
        got.append(request)
        return None

    watcher.client.client.register(C.NOTIFY_CONSUMER_IDS_CHANGED, on_notify)
    watcher.heartbeat("w", "ng", [sub_data("T")])
    joiner = broker.rpc()
    joiner.heartbeat("j", "ng", [sub_data("T")])
    deadline = time.monotonic() + 5
    while not any(r.ext_fields.get("consumerGroup") == "ng" for r in got):
        assert time.monotonic() < deadline, "no NOTIFY_CONSUMER_IDS_CHANGED"
        time.sleep(0.02)
    assert all(r.is_oneway for r in got)


def test_consumer_expiry(broker):
    rpc = broker.rpc()
    rpc.heartbeat("old", "eg", [sub_data("T")])
    cm = broker.broker.consumers
    cm.groups["eg"].channels["old"].last_update -= 1000
    broker.loop.run(broker.broker._expire_clients())
    assert cm.get("eg") is None


def test_consumer_offsets(rpc, broker):
    q = dict(consumerGroup="og", topic="OT", queueId=0)
    resp = rpc.call(C.QUERY_CONSUMER_OFFSET, q)
    assert resp.code == R.QUERY_NOT_FOUND  # never 0 for a group that never committed
    rpc.oneway(C.UPDATE_CONSUMER_OFFSET, {**q, "commitOffset": 42})
    deadline = time.monotonic() + 5
    while (resp := rpc.call(C.QUERY_CONSUMER_OFFSET, q)).code != R.SUCCESS:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    assert resp.ext_fields["offset"] == "42"
    assert rpc.call(C.UPDATE_CONSUMER_OFFSET, {**q, "commitOffset": 43}).code == R.SUCCESS
    assert rpc.call(C.QUERY_CONSUMER_OFFSET, q).ext_fields["offset"] == "43"


def test_queue_bounds_and_time_search(rpc, broker):
    t_before = int(time.time() * 1000) - 1
    for i in range(4):
        rpc.send("QB", f"{i}".encode())
    broker.broker.store.wait_dispatched()
    q = dict(topic="QB", queueId=0)
    assert rpc.call(C.GET_MAX_OFFSET, q).ext_fields["offset"] == "4"
    assert rpc.call(C.GET_MIN_OFFSET, q).ext_fields["offset"] == "0"
    assert rpc.call(C.SEARCH_OFFSET_BY_TIMESTAMP, {**q, "timestamp": t_before}).ext_fields["offset"] == "0"
    far = int(time.time() * 1000) + 60_000
    assert rpc.call(C.SEARCH_OFFSET_BY_TIMESTAMP, {**q, "timestamp": far}).ext_fields["offset"] == "4"
    ts = int(rpc.call(C.GET_EARLIEST_MSG_STORETIME, q).ext_fields["timestamp"])
    assert t_before <= ts <= int(time.time() * 1000)
    assert rpc.call(C.GET_MAX_OFFSET, dict(topic="None", queueId=3)).ext_fields["offset"] == "0"


def test_query_by_key_and_view_by_id(rpc, broker):
    acks = [rpc.send("QK", f"v{i}".encode(), keys=f"order-{i % 2} extra") for i in range(4)]
    broker.broker.store.wait_dispatched()
    resp = rpc.call(C.QUERY_MESSAGE, dict(topic="QK", key="order-1", maxNum=10, beginTimestamp=0,
                                          endTimestamp=int(time.time() * 1000) + 1000))
    assert resp.code == R.SUCCESS
    assert [bytes(r.body) for r in records(resp)] == [b"v3", b"v1"]  # newest first
    assert int(resp.ext_fields["indexLastUpdatePhyoffset"]) > 0
    miss = rpc.call(C.QUERY_MESSAGE, dict(topic="QK", key="nope", maxNum=10, beginTimestamp=0,
                                          endTimestamp=int(time.time() * 1000) + 1000))
    assert miss.code == R.QUERY_NOT_FOUND
    off = decode_offset_msg_id(acks[2].ext_fields["msgId"]).offset
    view = rpc.call(C.VIEW_MESSAGE_BY_ID, dict(topic="QK", offset=off))
    assert view.code == R.SUCCESS and [bytes(r.body) for r in records(view)] == [b"v2"]
    bad = rpc.call(C.VIEW_MESSAGE_BY_ID, dict(topic="QK", offset=10**9))
    assert bad.code != R.SUCCESS and bad.remark
    odd = rpc.call(C.VIEW_MESSAGE_BY_ID, dict(topic="QK", offset=off + 3))  # not a record boundary
    assert odd.code != R.SUCCESS and odd.remark


def test_topic_admin(rpc, broker):
    create = dict(topic="Adm", readQueueNums=3, writeQueueNums=3, perm=6)
    assert rpc.call(C.UPDATE_AND_CREATE_TOPIC, create).code == R.SUCCESS
    table = orjson.loads(rpc.call(C.GET_ALL_TOPIC_CONFIG).body)["topicConfigTable"]
    assert table["Adm"]["writeQueueNums"] == 3 and "TBW102" in table
    assert rpc.call(C.UPDATE_AND_CREATE_TOPIC, {**create, "topic": "bad topic"}).code == R.MESSAGE_ILLEGAL
    rpc.send("Adm", b"x", queue_id=2)
    broker.broker.store.wait_dispatched()
    stats = orjson.loads(rpc.call(C.GET_TOPIC_STATS_INFO, {"topic": "Adm"}).body)["offsetTable"]
    assert [(e["queueId"], e["maxOffset"]) for e in stats] == [(0, 0), (1, 0), (2, 1)]
    assert stats[2]["lastUpdateTimestamp"] > 0
    assert rpc.call(C.DELETE_TOPIC_IN_BROKER, {"topic": "Adm"}).code == R.SUCCESS
    assert broker.broker.topics.get("Adm") is None
    assert rpc.call(C.GET_TOPIC_STATS_INFO, {"topic": "Adm"}).code == R.TOPIC_NOT_EXIST


def test_runtime_info_consume_stats_connections(rpc, broker):
    for _ in range(5):
        rpc.send("CS", b"x")
    rpc.heartbeat("cid", "csg", [sub_data("CS", "*")])
    rpc.call(C.UPDATE_CONSUMER_OFFSET, dict(consumerGroup="csg", topic="CS", queueId=0, commitOffset=2))
    broker.broker.store.wait_dispatched()
    info = orjson.loads(rpc.call(C.GET_BROKER_RUNTIME_INFO).body)["table"]
    assert info["msgPutTotalTodayNow"] == "5" and "commitlog_max_offset" in info
    stats = orjson.loads(rpc.call(C.GET_CONSUME_STATS, {"consumerGroup": "csg"}).body)
    q0 = next(e for e in stats["offsetTable"] if e["topic"] == "CS" and e["queueId"] == 0)
    assert (q0["brokerOffset"], q0["consumerOffset"], q0["lag"]) == (5, 2, 3)
    conns = orjson.loads(rpc.call(C.GET_CONSUMER_CONNECTION_LIST, {"consumerGroup": "csg"}).body)
    assert [c["clientId"] for c in conns["connectionSet"]] == ["cid"]
    assert conns["subscriptionTable"]["CS"]["subString"] == "*"
    assert rpc.call(C.GET_CONSUMER_CONNECTION_LIST, {"consumerGroup": "ghost"}).code == 206


def test_lock_and_unlock_batch(broker):
    a, b = broker.rpc(), broker.rpc()
    mqs = [MessageQueue(topic="O", broker_name="broker-a", queue_id=i) for i in range(2)]

    def lock(rpc, cid):
        body = encode_body(LockBatchRequestBody(consumer_group="og", client_id=cid, mq_set=mqs))
        resp = rpc.call(C.LOCK_BATCH_MQ, {}, body)
        assert resp.code == R.SUCCESS
        return sorted(q["queueId"] for q in orjson.loads(resp.body)["lockOKMQSet"])

    assert lock(a, "A") == [0, 1]
    assert lock(b, "B") == []
    body = encode_body(LockBatchRequestBody(consumer_group="og", client_id="A", mq_set=mqs[:1]))
    assert a.call(C.UNLOCK_BATCH_MQ, {}, body).code == R.SUCCESS
    assert lock(b, "B") == [0]


def test_handler_errors_never_crash_the_broker(rpc):
    assert rpc.call(C.HEART_BEAT, {}, b"{not json").code == R.INVALID_PARAMETER
    assert rpc.call(C.HEART_BEAT, {}, b"").code == R.INVALID_PARAMETER
    assert rpc.call(C.PULL_MESSAGE, {"topic": "x"}).code == R.INVALID_PARAMETER
    assert rpc.call(C.LOCK_BATCH_MQ, {}, b"[]").code == R.INVALID_PARAMETER
    assert rpc.call(C.CHECK_CLIENT_CONFIG, {}, b'{"x":1}').code == R.INVALID_PARAMETER
    assert rpc.send("Alive", b"still").code == R.SUCCESS


def test_graceful_stop_persists_offsets(make_broker, tmp_path):
    b = make_broker(tmp_path / "persist")
    r = b.rpc()
    r.call(C.UPDATE_CONSUMER_OFFSET, dict(consumerGroup="pg", topic="P", queueId=1, commitOffset=7))
    b.stop()
    b2 = make_broker(tmp_path / "persist")
    resp = b2.rpc().call(C.QUERY_CONSUMER_OFFSET, dict(consumerGroup="pg", topic="P", queueId=1))
    assert resp.code == R.SUCCESS and resp.ext_fields["offset"] == "7"


def test_requests_refused_while_stopping(broker):
    rpc = broker.rpc()
    broker.broker.gate.stopping = True
    try:
        assert rpc.send("S", b"x").code == R.SERVICE_NOT_AVAILABLE
    finally:
        broker.broker.gate.stopping = False
