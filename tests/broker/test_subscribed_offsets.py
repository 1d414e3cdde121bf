"""A new push group's start is where it subscribed (broker/queries.py, client_manage.py, offsets.py): messages
stored after its first subscription are never skipped, however late its first rebalance."""
from __future__ import annotations

import json
import time
from pathlib import Path

import orjson
from broker_support import sub_data

from sluice.protocol.codes import RequestCode, ResponseCode as R


def beat(rpc, group: str, topic: str, *, at: int | None = None, where: str = "CONSUME_FROM_LAST_OFFSET",
         kind: str = "CONSUME_PASSIVELY", ordinals: bool = False) -> None:
    sd = sub_data(topic)
    if at is not None:
        sd["subVersion"] = str(at) if ordinals else at  # librocketmq writes it as a string
    consumer = {"groupName": group, "subscriptionDataSet": [sd, sub_data(f"%RETRY%{group}")]}
    if ordinals:  # librocketmq: CONSUME_PASSIVELY, CLUSTERING, CONSUME_FROM_LAST_OFFSET
        consumer.update(consumeType=1, messageModel=1, consumeFromWhere=0)
    else:
        consumer.update(consumeType=kind, messageModel="CLUSTERING", consumeFromWhere=where)
    body = {"clientID": f"c-{group}", "consumerDataSet": [consumer], "producerDataSet": []}
    assert rpc.call(RequestCode.HEART_BEAT, {}, orjson.dumps(body)).code == R.SUCCESS


def query(rpc, group: str, topic: str, queue_id: int = 0) -> int | None:
    resp = rpc.call(RequestCode.QUERY_CONSUMER_OFFSET, {"consumerGroup": group, "topic": topic, "queueId": queue_id})
    if resp.code == R.QUERY_NOT_FOUND:
        return None
    assert resp.code == R.SUCCESS, resp
    return int(resp.ext_fields["offset"])


def tick() -> None:
    time.sleep(0.005)  # store timestamps are milliseconds: keep "before" and "after" apart


def test_messages_after_the_subscription_are_kept_for_a_late_rebalance(rpc):
    rpc.send("T", b"old")
    tick()
    beat(rpc, "G", "T")
    tick()
    rpc.send("T", b"new1")
    rpc.send("T", b"new2")
    assert query(rpc, "G", "T", 0) == 1  # not 3, the end when the first rebalance comes
    assert query(rpc, "G", "T", 1) == 0  # a queue nothing was written to


def test_consumer_before_its_topic_exists(rpc, broker):
    beat(rpc, "Early", "Later", ordinals=True)  # the C++ client's default, CONSUME_FROM_LAST_OFFSET
    assert broker.broker.topics.get("Later") is None
    tick()
    for q in (0, 1):
        rpc.send("Later", b"m", queue_id=q)
    assert [query(rpc, "Early", "Later", q) for q in (0, 1)] == [0, 0]


def test_the_clients_subscription_time_counts(rpc):
    at = int(time.time() * 1000)  # subscribed now; its heartbeat reaches this broker only later
    tick()
    rpc.send("T", b"a")
    rpc.send("T", b"b")
    tick()
    beat(rpc, "Slow", "T", at=at)
    assert query(rpc, "Slow", "T") == 0
    beat(rpc, "Future", "T", at=at + 3_600_000)  # a clock ahead of ours: now
    assert query(rpc, "Future", "T") == 2
    beat(rpc, "NotATime", "T", at=7)  # not a time: now
    assert query(rpc, "NotATime", "T") == 2


def test_the_first_subscription_is_kept_and_survives_a_restart(make_broker, tmp_path: Path):
    store = tmp_path / "s"
    b = make_broker(store)
    rpc = b.rpc()
    beat(rpc, "G", "T")
    tick()
    rpc.send("T", b"after")
    b.broker.offsets.persist()
    doc = json.loads((store / "config" / "consumerOffset.json").read_text())
    assert set(doc["subscribedAt"]) == {"T@G"}
    b.stop()
    b2 = make_broker(store)
    rpc2 = b2.rpc()
    rpc2.send("T", b"later")
    beat(rpc2, "G", "T")  # a later subscription version does not move the first
    assert query(rpc2, "G", "T") == 0


def test_other_groups_keep_the_exact_rule(rpc):
    beat(rpc, "First", "T", where="CONSUME_FROM_FIRST_OFFSET")
    beat(rpc, "Stamp", "T", where="CONSUME_FROM_TIMESTAMP")
    beat(rpc, "Puller", "T", kind="CONSUME_ACTIVELY")
    beat(rpc, "Push", "T")
    tick()
    rpc.send("T", b"m")
    assert [query(rpc, g, "T") for g in ("First", "Stamp", "Puller", "Never")] == [None] * 4
    assert query(rpc, "Push", "%RETRY%Push") is None  # the retry topic starts at 0 on the client
    rpc.call(RequestCode.UPDATE_CONSUMER_OFFSET, {"consumerGroup": "Push", "topic": "T", "queueId": 0,
                                                  "commitOffset": 1})
    assert query(rpc, "Push", "T") == 1  # a committed offset wins
