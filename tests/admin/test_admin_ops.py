"""mqadmin's operator commands run as ``python -m sluice admin ...`` subprocesses against a real namesrv and
broker with a live producer and push consumer: getBrokerConfig, updateBrokerConfig, statsAll,
brokerConsumeStats, producerConnection, consumerStatus, updateTopicPerm, topicClusterList, allocateMQ,
queryMsgByOffset, printMsg, printMsgByQueue, cloneGroupOffset, skipAccumulatedMessage; each with an error case."""
from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import orjson
import pytest
from admin_support import running_cluster, wait_for, wait_for_route

from sluice import Message, Producer, PushConsumer
from sluice.admin import ExitStatus
from sluice.client.push_options import ConsumeResult

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

TOPIC, GROUP, PGROUP = "AdminOpsTopic", "AdminOpsGroup", "AdminOpsProducer"
N = 8


@dataclass
class Proc:
    status: int
    stdout: str
    stderr: str

    @property
    def json(self) -> Any:
        return orjson.loads(self.stdout)


def admin(ns: str, *argv: str) -> Proc:
    p = subprocess.run([sys.executable, "-m", "sluice", "admin", *argv, "-n", ns], capture_output=True, text=True,
                       timeout=60, env={**os.environ, "COLUMNS": "200"})
    return Proc(p.returncode, p.stdout, p.stderr)


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    with running_cluster(tmp_path_factory.mktemp("adminops")) as c:
        r = admin(c.ns, "updateTopic", "-t", TOPIC, "-c", "DefaultCluster", "-r", "2", "-w", "2")
        assert r.status == 0, r.stderr
        wait_for_route(c.ns, TOPIC)
        seen: list[bytes] = []
        lock = threading.Lock()

        def listener(msgs: list[Any]) -> ConsumeResult:
            with lock:
                seen.extend(m.body for m in msgs)
            return ConsumeResult.SUCCESS
        producer = Producer(PGROUP, namesrv=c.ns)
        producer.start()
        results = [producer.send(Message(TOPIC, f"admin-{i}".encode(), tags="TagA" if i % 2 else "TagB"))
                   for i in range(N)]
        consumer = PushConsumer(GROUP, namesrv=c.ns, consume_from_where="CONSUME_FROM_FIRST_OFFSET")
        consumer.subscribe(TOPIC, "*")
        consumer.register_listener(listener)
        consumer.start()
        wait_for(lambda: len(seen) >= N, 30, "the push consumer got every message")
        try:
            yield {"ns": c.ns, "broker": c.broker.addr, "results": results}
        finally:
            consumer.shutdown()
            producer.shutdown()


def ok(r: Proc) -> Any:
    assert r.status == 0, (r.status, r.stdout, r.stderr)
    return r.json


def test_get_and_update_broker_config(world: dict[str, Any]) -> None:
    ns, addr = world["ns"], world["broker"]
    doc = ok(admin(ns, "getBrokerConfig", "-b", addr, "--json"))
    cfg = doc["brokers"][0]["config"]
    assert cfg["brokerName"] == "broker-a" and cfg["maxReconsumeTimes"] == "16"
    counter = doc["brokers"][0]["version"]["counter"]
    ok(admin(ns, "updateBrokerConfig", "-c", "DefaultCluster", "-k", "maxReconsumeTimes", "-v", "7", "--json"))
    doc = ok(admin(ns, "getBrokerConfig", "-c", "DefaultCluster", "--json"))
    assert doc["brokers"][0]["config"]["maxReconsumeTimes"] == "7"
    assert doc["brokers"][0]["version"]["counter"] == counter + 1
    text = admin(ns, "getBrokerConfig", "-b", addr)
    assert text.status == 0 and "brokerClusterName" in text.stdout
    r = admin(ns, "updateBrokerConfig", "-b", addr, "-k", "brokerName", "-v", "other")
    assert r.status == ExitStatus.REFUSED and "brokerName" in r.stderr and "cannot change" in r.stderr
    r = admin(ns, "getBrokerConfig", "-c", "NoSuchCluster")
    assert r.status == ExitStatus.NOT_FOUND and "NoSuchCluster" in r.stderr


def test_stats_all_and_broker_consume_stats(world: dict[str, Any]) -> None:
    ns = world["ns"]
    rows = ok(admin(ns, "statsAll", "-t", TOPIC, "--json"))["stats"]
    mine = [r for r in rows if r["group"] == GROUP]
    assert mine and mine[0]["inMsg24Hour"] == N and mine[0]["outMsg24Hour"] >= N
    assert mine[0]["inTps"] > 0 and mine[0]["outTps"] > 0
    assert ok(admin(ns, "statsAll", "-a", "--json"))["stats"]  # active topics: ours at least
    r = admin(ns, "statsAll", "-t", "NoSuchTopicHere")
    assert r.status == ExitStatus.NOT_FOUND
    wait_for(lambda: sum(e["consumerOffset"] for e in ok(admin(ns, "brokerConsumeStats", "-b", world["broker"],
                                                                   "--json"))["offsetTable"]
                         if e["group"] == GROUP) == N, 20, "offsets committed")
    doc = ok(admin(ns, "brokerConsumeStats", "-b", world["broker"], "-l", "1", "--json"))
    assert all(e["diff"] >= 1 for e in doc["offsetTable"])
    r = admin(ns, "brokerConsumeStats", "-b", "127.0.0.1:1", "--timeout", "1")
    assert r.status == ExitStatus.UNAVAILABLE


def test_consume_tps_in_consumer_progress(world: dict[str, Any]) -> None:
    doc = ok(admin(world["ns"], "consumerProgress", "-g", GROUP, "--json"))
    assert doc["consumeTps"] > 0


def test_producer_connection_and_consumer_status(world: dict[str, Any]) -> None:
    ns = world["ns"]
    doc = ok(admin(ns, "producerConnection", "-g", PGROUP, "-t", TOPIC, "--json"))
    assert doc["connectionSet"] and {"clientId", "clientAddr", "language", "version"} <= set(doc["connectionSet"][0])
    r = admin(ns, "producerConnection", "-g", "NoSuchProducer", "-t", TOPIC)
    assert r.status == ExitStatus.NOT_FOUND and "'NoSuchProducer' has no live connection" in r.stderr
    doc = ok(admin(ns, "consumerStatus", "-g", GROUP, "--json"))
    client = doc["clients"][0]
    assert client["properties"]["consumerGroup"] == GROUP
    assert {q["topic"] for q in client["mqTable"]} >= {TOPIC}
    one = ok(admin(ns, "consumerStatus", "-g", GROUP, "-i", client["clientId"], "--json"))
    assert [c["clientId"] for c in one["clients"]] == [client["clientId"]]
    r = admin(ns, "consumerStatus", "-g", "NoSuchGroup")
    assert r.status == ExitStatus.NOT_FOUND and "NoSuchGroup" in r.stderr


def test_update_topic_perm_cluster_list_and_allocate(world: dict[str, Any]) -> None:
    ns = world["ns"]
    doc = ok(admin(ns, "updateTopicPerm", "-t", TOPIC, "-p", "4", "-c", "DefaultCluster", "--json"))
    assert doc["perm"] == 4 and doc["brokers"][0]["oldPerm"] == 6
    wait_for(lambda: ok(admin(ns, "topicRoute", "-t", TOPIC, "--json"))["queueDatas"][0]["perm"] == 4, 20,
             "the new perm registered")
    text = admin(ns, "updateTopicPerm", "-t", TOPIC, "-p", "6", "-b", world["broker"])
    assert text.status == 0 and "R-" in text.stdout and "RW" in text.stdout
    wait_for(lambda: ok(admin(ns, "topicRoute", "-t", TOPIC, "--json"))["queueDatas"][0]["perm"] == 6, 20,
             "the perm restored")
    r = admin(ns, "updateTopicPerm", "-t", "NoSuchTopicHere", "-p", "6", "-c", "DefaultCluster")
    assert r.status == ExitStatus.NOT_FOUND
    assert ok(admin(ns, "topicClusterList", "-t", TOPIC, "--json"))["clusters"] == ["DefaultCluster"]
    assert admin(ns, "topicClusterList", "-t", "NoSuchTopicHere").status == ExitStatus.NOT_FOUND
    alloc = ok(admin(ns, "allocateMQ", "-t", TOPIC, "-i", "10.0.0.1,10.0.0.2", "--json"))["result"]
    assert sorted(len(v) for v in alloc.values()) == [1, 1]
    assert admin(ns, "allocateMQ", "-t", "NoSuchTopicHere", "-i", "a").status == ExitStatus.NOT_FOUND


def test_query_by_offset_and_print(world: dict[str, Any]) -> None:
    ns = world["ns"]
    sent = world["results"][3]
    doc = ok(admin(ns, "queryMsgByOffset", "-t", TOPIC, "-b", sent.queue.broker_name, "-i",
                   str(sent.queue.queue_id), "-o", str(sent.queue_offset), "--json"))
    assert doc["body"] == "admin-3" and doc["msgId"] == sent.msg_id
    r = admin(ns, "queryMsgByOffset", "-t", TOPIC, "-b", sent.queue.broker_name, "-i", str(sent.queue.queue_id),
              "-o", "999999")
    assert r.status == ExitStatus.NOT_FOUND and "999999" in r.stderr
    msgs = ok(admin(ns, "printMsg", "-t", TOPIC, "--json"))["messages"]
    assert sorted(m["body"] for m in msgs) == sorted(f"admin-{i}" for i in range(N))
    tag_a = ok(admin(ns, "printMsg", "-t", TOPIC, "-s", "TagA", "--json"))["messages"]
    assert {m["tags"] for m in tag_a} == {"TagA"} and len(tag_a) == N // 2
    assert admin(ns, "printMsg", "-t", "NoSuchTopicHere").status == ExitStatus.NOT_FOUND
    q = sent.queue
    doc = ok(admin(ns, "printMsgByQueue", "-t", TOPIC, "-a", q.broker_name, "-i", str(q.queue_id), "-f", "true",
                   "-p", "true", "--json"))
    in_queue = [r for r in world["results"] if r.queue == q]
    assert len(doc["messages"]) == len(in_queue) and sum(doc["tags"].values()) == len(in_queue)
    r = admin(ns, "printMsgByQueue", "-t", TOPIC, "-a", q.broker_name, "-i", "77")
    assert r.status == ExitStatus.NOT_FOUND


def test_clone_group_offset_and_skip_accumulated(world: dict[str, Any]) -> None:
    ns = world["ns"]
    wait_for(lambda: sum(e["consumerOffset"] for e in ok(admin(ns, "consumerProgress", "-g", GROUP, "-t", TOPIC,
                                                               "--json"))["offsetTable"]) == N, 20, "committed")
    doc = ok(admin(ns, "cloneGroupOffset", "-s", GROUP, "-d", "AdminOpsClone", "-t", TOPIC, "--json"))
    assert sum(r["offset"] for r in doc["offsetTable"]) == N
    progress = ok(admin(ns, "consumerProgress", "-g", "AdminOpsClone", "-t", TOPIC, "--json"))
    assert sum(e["consumerOffset"] for e in progress["offsetTable"]) == N
    r = admin(ns, "cloneGroupOffset", "-s", "NoSuchGroup", "-d", "x", "-t", TOPIC)
    assert r.status == ExitStatus.NOT_FOUND and "NoSuchGroup" in r.stderr
    # A group that read nothing yet skips its whole backlog.
    with Producer("AdminOpsProducer3", namesrv=ns) as p:
        p.send(Message(TOPIC, b"late"))
    ok(admin(ns, "resetOffsetByTime", "-g", "AdminOpsSkip", "-t", TOPIC, "-s", "earliest", "--json"))
    doc = ok(admin(ns, "skipAccumulatedMessage", "-g", "AdminOpsSkip", "-t", TOPIC, "--json"))
    assert sum(e["offset"] for e in doc["offsetTable"]) == N + 1
    r = admin(ns, "skipAccumulatedMessage", "-g", "AdminOpsSkip", "-t", "NoSuchTopicHere")
    assert r.status == ExitStatus.NOT_FOUND


def test_wipe_and_add_write_perm(world: dict[str, Any]) -> None:
    ns = world["ns"]

    def perm() -> int:
        return ok(admin(ns, "topicRoute", "-t", TOPIC, "--json"))["queueDatas"][0]["perm"]
    doc = ok(admin(ns, "wipeWritePerm", "-b", "broker-a", "--json"))
    assert doc["namesrvs"][0]["topicCount"] >= 1
    assert perm() & 2 == 0  # the namesrv routes the topic read-only now
    doc = ok(admin(ns, "addWritePerm", "-b", "broker-a", "--json"))
    assert doc["namesrvs"][0]["topicCount"] >= 1 and perm() & 2
    r = admin(ns, "wipeWritePerm", "-b", "no-such-broker")
    assert r.status == ExitStatus.NOT_FOUND and "no-such-broker" in r.stderr
