"""The operators' request codes rocketmq-dashboard and rocketmq-exporter send, against a real ``sluice broker``
subprocess, asked the way a Java client asks (hand-built JSON frames with language JAVA, so queue-keyed maps
come back in fastjson's form). The expected field names are RocketMQ's classes'
(remoting/src/main/java/org/apache/rocketmq/remoting/protocol/body/*.java): BrokerStatsData / BrokerStatsItem,
ConsumeStatsList, ConsumeStats / OffsetWrapper, TopicStatsTable / TopicOffset, GroupList, ProducerConnection /
Connection, ConsumeMessageDirectlyResult; GetBrokerConfigResponseHeader's ``version``."""
from __future__ import annotations

import json
import re
import socket
import struct
import threading
from collections.abc import Iterator
from typing import Any

import orjson
import pytest
from servers import running_cluster, wait_for, wait_for_route

from sluice import Message, Producer, PushConsumer
from sluice.client.push_options import ConsumeResult
from sluice.protocol.offset_table import decode_queue_table

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

TOPIC, GROUP, PGROUP = "OpsTopic", "OpsGroup", "OpsProducer"
N = 6

# RocketMQ's field names, from its classes.
BROKER_STATS_DATA = {"statsMinute", "statsHour", "statsDay"}
BROKER_STATS_ITEM = {"sum", "tps", "avgpt"}
CONSUME_STATS_LIST = {"consumeStatsList", "brokerAddr", "totalDiff", "totalInflightDiff"}
CONSUME_STATS = {"offsetTable", "consumeTps"}
OFFSET_WRAPPER = {"brokerOffset", "consumerOffset", "lastTimestamp"}
TOPIC_OFFSET = {"minOffset", "maxOffset", "lastUpdateTimestamp"}
MESSAGE_QUEUE = ["brokerName", "queueId", "topic"]  # fastjson writes keys in sorted field order
CONNECTION = {"clientId", "clientAddr", "language", "version"}
DIRECT_RESULT = {"order", "autoCommit", "consumeResult", "spentTimeMills"}  # and "remark" when there is one


class JavaWire:
    """One connection framed as Java's NettyEncoder with JSON headers and language JAVA."""

    def __init__(self, addr: str) -> None:
        host, port = addr.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=15)
        self.opaque = 0

    def close(self) -> None:
        self.sock.close()

    def _exact(self, n: int) -> bytes:
        out = b""
        while len(out) < n:
            chunk = self.sock.recv(n - len(out))
            if not chunk:
                raise ConnectionError("the broker closed the connection")
            out += chunk
        return out

    def call(self, code: int, ext: dict[str, str] | None = None, body: bytes = b"") -> tuple[dict[str, Any], bytes]:
        self.opaque += 1
        header = {"code": code, "extFields": ext or {}, "flag": 0, "language": "JAVA", "opaque": self.opaque,
                  "serializeTypeCurrentRPC": "JSON", "version": 399}
        raw = json.dumps(header).encode()
        self.sock.sendall(struct.pack(">ii", 4 + len(raw) + len(body), len(raw)) + raw + body)
        while True:
            total, mark = struct.unpack(">ii", self._exact(8))
            hlen = mark & 0xFFFFFF
            head = json.loads(self._exact(hlen))
            rest = self._exact(total - 4 - hlen)
            if head["flag"] & 1 and head["opaque"] == self.opaque:
                return head, rest


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    with running_cluster(tmp_path_factory.mktemp("ops")) as c:
        seen: list[bytes] = []
        lock = threading.Lock()

        def listener(msgs: list[Any]) -> ConsumeResult:
            with lock:
                seen.extend(m.body for m in msgs)
            return ConsumeResult.SUCCESS
        producer = Producer(PGROUP, namesrv=c.ns)
        producer.start()
        results = [producer.send(Message(TOPIC, f"ops-{i}".encode())) for i in range(N)]
        wait_for_route(c.ns, TOPIC)
        consumer = PushConsumer(GROUP, namesrv=c.ns, consume_from_where="CONSUME_FROM_FIRST_OFFSET")
        consumer.subscribe(TOPIC, "*")
        consumer.register_listener(listener)
        consumer.start()
        wait_for(lambda: len(seen) >= N, 30, "the push consumer got every message")
        wire = JavaWire(c.broker.addr)
        try:
            yield {"cluster": c, "wire": wire, "results": results, "seen": seen, "lock": lock}
        finally:
            wire.close()
            consumer.shutdown()
            producer.shutdown()


def call(world: dict[str, Any], code: int, ext: dict[str, str] | None = None,
         body: bytes = b"") -> tuple[dict[str, Any], bytes]:
    return world["wire"].call(code, ext, body)


def fastjson_keys(body: bytes) -> list[list[str]]:
    """The field names of every object used as a map key (fastjson's MessageQueue keys)."""
    return [list(json.loads(k)) for k in re.findall(rb"[{,](\{[^{}]*\}):", body)]


# ---------------------------------------------------------------------------------------- configuration

def config_of(world: dict[str, Any]) -> tuple[dict[str, str], dict[str, Any]]:
    head, body = call(world, 26)
    assert head["code"] == 0, head
    props = dict(line.split("=", 1) for line in body.decode().splitlines() if line)
    return props, json.loads(head["extFields"]["version"])


def test_get_broker_config_is_properties_text_with_data_version(world: dict[str, Any]) -> None:
    props, version = config_of(world)
    assert props["brokerName"] == "broker-a" and props["brokerClusterName"] == "DefaultCluster"
    assert props["flushDiskType"] == "ASYNC_FLUSH"
    assert props["autoCreateTopicEnable"] in ("true", "false")
    assert props["listenPort"] == world["cluster"].broker.addr.rsplit(":", 1)[1]
    assert "aclSecretKey" not in props and "acl_secret_key" not in props
    assert set(version) >= {"timestamp", "counter"}


def test_update_broker_config_changes_live_settings_and_bumps_the_version(world: dict[str, Any]) -> None:
    _, before = config_of(world)
    head, _ = call(world, 25, body=b"# from mqadmin\nautoCreateTopicEnable=false\nmaxReconsumeTimes=3\n")
    assert head["code"] == 0, head
    props, after = config_of(world)
    assert props["autoCreateTopicEnable"] == "false" and props["maxReconsumeTimes"] == "3"
    assert after["counter"] == before["counter"] + 1
    # Live: a send to a topic nobody created is refused now.
    with Producer("OpsProducer2", namesrv=world["cluster"].ns) as p, pytest.raises(Exception, match="auto"):
        p.send(Message("OpsNeverCreated", b"x"))
    head, _ = call(world, 25, body=b"auto_create_topic=true\n")  # Sluice's own name works too
    assert head["code"] == 0
    assert config_of(world)[0]["autoCreateTopicEnable"] == "true"


def test_update_broker_config_refuses_settings_that_need_a_restart(world: dict[str, Any]) -> None:
    props, before = config_of(world)
    head, _ = call(world, 25, body=b"maxReconsumeTimes=5\nflushDiskType=SYNC_FLUSH\n")
    assert head["code"] == 16, head  # NO_PERMISSION, as RocketMQ answers a black-listed setting
    assert "flushDiskType" in head["remark"] and "maxReconsumeTimes" in head["remark"]  # and what can change
    head, _ = call(world, 25, body=b"noSuchSetting=1\n")
    assert head["code"] == 29 and "noSuchSetting" in head["remark"]
    head, _ = call(world, 25, body=b"maxReconsumeTimes=many\n")
    assert head["code"] == 29 and "maxReconsumeTimes" in head["remark"]
    after_props, after = config_of(world)
    assert after_props == props and after == before  # nothing of a refused update is applied


# ---------------------------------------------------------------------------------------- statistics

def test_view_broker_stats_data_counts_puts_and_gets(world: dict[str, Any]) -> None:
    head, body = call(world, 315, {"statsName": "TOPIC_PUT_NUMS", "statsKey": TOPIC})
    assert head["code"] == 0, head
    data = orjson.loads(body)
    assert set(data) == BROKER_STATS_DATA
    for item in data.values():
        assert set(item) == BROKER_STATS_ITEM
    assert data["statsMinute"]["sum"] == N and data["statsDay"]["sum"] == N
    assert data["statsMinute"]["tps"] > 0
    assert data["statsMinute"]["avgpt"] == 1.0  # one message per send
    head, body = call(world, 315, {"statsName": "GROUP_GET_NUMS", "statsKey": f"{TOPIC}@{GROUP}"})
    assert head["code"] == 0, head
    assert orjson.loads(body)["statsMinute"]["sum"] >= N
    head, _ = call(world, 315, {"statsName": "TOPIC_PUT_NUMS", "statsKey": "NoSuchTopic"})
    assert head["code"] == 1 and "not exist" in head["remark"]


def test_send_backs_and_dead_letters_are_counted_by_origin_topic_and_group(world: dict[str, Any]) -> None:
    """SNDBCK_PUT_NUMS (rocketmq-exporter's rocketmq_send_back_nums asks it) and DLQ_PUT_NUMS, keyed topic@group."""
    from sluice.protocol.msgid import decode_offset_msg_id
    group = "OpsBackGroup"  # no consumer: the retried message stays in %RETRY%OpsBackGroup
    for i, max_times in ((0, "16"), (1, "16"), (2, "0")):  # the last is over its limit: dead-lettered
        target = world["results"][i]
        head, _ = call(world, 36, {"offset": str(decode_offset_msg_id(target.offset_msg_id).offset),
                                   "group": group, "delayLevel": "0", "originMsgId": target.msg_id,
                                   "originTopic": TOPIC, "maxReconsumeTimes": max_times})
        assert head["code"] == 0, head
    key = f"{TOPIC}@{group}"
    head, body = call(world, 315, {"statsName": "SNDBCK_PUT_NUMS", "statsKey": key})
    assert head["code"] == 0, head
    data = orjson.loads(body)
    assert set(data) == BROKER_STATS_DATA and all(set(v) == BROKER_STATS_ITEM for v in data.values())
    assert data["statsMinute"]["sum"] == 3 and data["statsDay"]["sum"] == 3 and data["statsMinute"]["avgpt"] == 1.0
    head, body = call(world, 315, {"statsName": "DLQ_PUT_NUMS", "statsKey": key})
    assert head["code"] == 0, head
    assert orjson.loads(body)["statsMinute"]["sum"] == 1
    # A name RocketMQ creates but never adds to: "not exist" as RocketMQ answers, with what is kept.
    head, _ = call(world, 315, {"statsName": "GROUP_GET_FROM_DISK_NUMS", "statsKey": key})
    assert head["code"] == 1 and "not exist" in head["remark"] and "SNDBCK_PUT_NUMS" in head["remark"]


def test_consume_stats_in_fastjson_form_with_real_tps(world: dict[str, Any]) -> None:
    head, body = call(world, 208, {"consumerGroup": GROUP, "topic": TOPIC})
    assert head["code"] == 0, head
    assert body.startswith(b'{"offsetTable":{{"brokerName":')
    assert all(k == MESSAGE_QUEUE for k in fastjson_keys(body))
    doc, entries = decode_queue_table(body)
    assert CONSUME_STATS <= set(doc)
    assert doc["consumeTps"] > 0
    for e in entries:
        assert OFFSET_WRAPPER <= set(e)
    assert sum(e["brokerOffset"] for e in entries) == N


def test_topic_stats_in_fastjson_form(world: dict[str, Any]) -> None:
    head, body = call(world, 202, {"topic": TOPIC})
    assert head["code"] == 0, head
    assert all(k == MESSAGE_QUEUE for k in fastjson_keys(body))
    doc, entries = decode_queue_table(body)
    assert set(doc) == {"offsetTable"}
    assert entries and all(set(e) == TOPIC_OFFSET | set(MESSAGE_QUEUE) for e in entries)


def test_broker_consume_stats(world: dict[str, Any]) -> None:
    wait_for(lambda: sum(e["consumerOffset"] for e in decode_queue_table(
        call(world, 208, {"consumerGroup": GROUP, "topic": TOPIC})[1])[1]) == N, 20, "offsets committed")
    head, body = call(world, 317, {"isOrder": "false"})
    assert head["code"] == 0, head
    # The nested ConsumeStats carry fastjson-form tables: read the outer document leniently.
    outer = orjson.loads(re.sub(rb'"offsetTable":\{(\{[^{}]*\}:\{[^{}]*\},?)*\}', b'"offsetTable":{}', body))
    assert set(outer) == CONSUME_STATS_LIST
    assert outer["brokerAddr"] == world["cluster"].broker.addr
    groups = {g: stats for entry in outer["consumeStatsList"] for g, stats in entry.items()}
    assert GROUP in groups and all(set(s) == CONSUME_STATS for s in groups[GROUP])
    assert outer["totalDiff"] >= 0
    assert all(k == MESSAGE_QUEUE for k in fastjson_keys(body))


# ---------------------------------------------------------------------------------------- who, and relays

def test_query_topic_consume_by_who(world: dict[str, Any]) -> None:
    head, body = call(world, 300, {"topic": TOPIC})
    assert head["code"] == 0, head
    doc = orjson.loads(body)
    assert set(doc) == {"groupList"} and GROUP in doc["groupList"]


def test_producer_connection_list(world: dict[str, Any]) -> None:
    head, body = call(world, 204, {"producerGroup": PGROUP})
    assert head["code"] == 0, head
    doc = orjson.loads(body)
    assert set(doc) == {"connectionSet"} and doc["connectionSet"]
    assert all(set(c) == CONNECTION for c in doc["connectionSet"])
    head, _ = call(world, 204, {"producerGroup": "NoSuchProducerGroup"})
    assert head["code"] == 1 and "not exist" in head["remark"]


def client_id(world: dict[str, Any]) -> str:
    head, body = call(world, 203, {"consumerGroup": GROUP})
    assert head["code"] == 0, head
    return orjson.loads(body)["connectionSet"][0]["clientId"]


def test_consumer_running_info_is_relayed_to_the_client(world: dict[str, Any]) -> None:
    head, body = call(world, 307, {"consumerGroup": GROUP, "clientId": client_id(world), "jstackEnable": "false"})
    assert head["code"] == 0, head
    assert body.startswith(b"{") and b'"mqTable"' in body and b'"subscriptionSet"' in body
    head, _ = call(world, 307, {"consumerGroup": GROUP, "clientId": "no-such-client"})
    assert head["code"] == 1 and "not online" in head["remark"]


def test_consume_message_directly_runs_the_listener(world: dict[str, Any]) -> None:
    with world["lock"]:
        before = len(world["seen"])
    target = world["results"][2]
    head, body = call(world, 309, {"consumerGroup": GROUP, "clientId": client_id(world),
                                   "msgId": target.offset_msg_id, "topic": TOPIC})
    assert head["code"] == 0, head
    doc = orjson.loads(body)
    assert DIRECT_RESULT <= set(doc) <= DIRECT_RESULT | {"remark"}
    assert doc["consumeResult"] == "CR_SUCCESS" and doc["order"] is False and doc["autoCommit"] is True
    with world["lock"]:
        assert world["seen"][before:] == [b"ops-2"]
    head, _ = call(world, 309, {"consumerGroup": "NoSuchGroup", "clientId": "x", "msgId": target.offset_msg_id})
    assert head["code"] == 1 and "not online" in head["remark"]


def test_a_relay_to_a_client_that_never_answers_times_out(world: dict[str, Any]) -> None:
    from sluice.protocol.bodies import ConsumerData, HeartbeatData, SubscriptionData, encode_body
    hb = HeartbeatData(client_id="silent-client", consumer_data_set=[ConsumerData(
        group_name="SilentGroup", consume_type="CONSUME_PASSIVELY",
        subscription_data_set=[SubscriptionData(topic=TOPIC, sub_string="*")])])
    silent = JavaWire(world["cluster"].broker.addr)  # heartbeats, then never reads what the broker sends it
    try:
        head, _ = silent.call(34, {}, encode_body(hb))
        assert head["code"] == 0, head
        head, _ = call(world, 307, {"consumerGroup": "SilentGroup", "clientId": "silent-client"})
        assert head["code"] == 207 and "Timeout" in head["remark"]  # CONSUME_MSG_TIMEOUT, after 10 s
    finally:
        silent.close()
