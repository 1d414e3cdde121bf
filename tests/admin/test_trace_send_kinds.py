"""Message trace for every way a producer sends, end to end against real ``sluice namesrv`` / ``sluice broker``
subprocesses, each read back with ``sluice admin queryMsgTraceById``: a batch (one Pub per message), a request
(its Pub, and the replier's consumption), a transactional half message (Pub with msgType Trans_Msg_Half) with
its EndTransaction records after the local transaction and after the broker's check, and oneway sends, which
RocketMQ's hook cannot trace (no send result) and neither does Sluice."""
from __future__ import annotations

import itertools
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from admin_support import Cluster, ExitStatus, running_cluster, wait_for, wait_for_route

import sluice
from sluice import (ConsumeResult, LocalTransactionState, Message, Producer, PullConsumer, PushConsumer,
                    TransactionProducer)
from sluice.message import MessageExt

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

_n = itertools.count()
FAST_CHECK = "transaction_check_interval_ms = 300\ntransaction_timeout_ms = 200\n"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """One namesrv and one broker with traceTopicEnable and a quick transaction check."""
    with running_cluster(tmp_path_factory.mktemp("tracekinds"), ("broker-a",),
                         config="trace_topic_enable = true\n" + FAST_CHECK, cls=Cluster) as c:
        yield c  # type: ignore[misc]


def _name(prefix: str) -> str:
    return f"{prefix}{next(_n)}_{os.getpid()}"


def _topic(cluster: Cluster, queues: int = 1) -> str:
    topic = _name("Kinds")
    cluster.admin("updateTopic", "-t", topic, "-c", "DefaultCluster", "-r", str(queues), "-w", str(queues))
    wait_for_route(cluster.ns, topic)
    return topic


def _traces(cluster: Cluster, msg_id: str, count: int) -> list[dict[str, Any]]:
    """The trace records of ``msg_id`` once there are ``count`` of them."""
    def ready() -> list[dict[str, Any]] | None:
        run = cluster.admin("queryMsgTraceById", "-i", msg_id, "--json")
        if run.status is not ExitStatus.SUCCESS:
            return None
        traces = run.json["traces"]
        return traces if len(traces) >= count else None
    return wait_for(ready, what=f"{count} trace record(s) of {msg_id}")


def _stored(ns: str, topic: str) -> list[MessageExt]:
    out: list[MessageExt] = []
    with PullConsumer(_name("Reader"), ns) as pc:
        for mq in pc.fetch_message_queues(topic):
            out += pc.pull(mq, "*", 0).msg_found_list
    return out


def test_a_batch_is_one_pub_per_message(cluster: Cluster) -> None:
    topic = _topic(cluster)
    batch = [Message(topic, b"first", tags="A", keys=["b-1"]), Message(topic, b"second!", tags="B")]
    with Producer(_name("PG_batch"), cluster.ns, enable_trace=True) as p:
        result = p.send_batch(batch)
    assert len(result.msg_ids) == 2
    for msg, msg_id, offset_id in zip(batch, result.msg_ids, result.offset_msg_ids):
        (pub,) = _traces(cluster, msg_id, 1)
        assert (pub["type"], pub["topic"], pub["tags"], pub["bodyLength"], pub["offsetMsgId"], pub["status"],
                pub["msgType"]) == ("Pub", topic, msg.tags, len(msg.body), offset_id, "success", 0)
        assert pub["storeHost"] == cluster.broker.addr
    assert _traces(cluster, result.msg_ids[0], 1)[0]["keys"] == "b-1"
    assert _traces(cluster, result.msg_ids[1], 1)[0]["keys"] == "null"


def test_oneway_sends_are_not_traced(cluster: Cluster) -> None:
    topic = _topic(cluster)
    with Producer(_name("PG_oneway"), cluster.ns, enable_trace=True) as p:
        p.send_oneway(Message(topic, b"fire and forget"))
        wait_for(lambda: _stored(cluster.ns, topic), what="the oneway message to be stored")
        synced = p.send(Message(topic, b"answered")).msg_id
    # Shutdown flushed every record queued, the sync send's and anything queued before it.
    assert [t["type"] for t in _traces(cluster, synced, 1)] == ["Pub"]
    (oneway,) = [m for m in _stored(cluster.ns, topic) if m.body == b"fire and forget"]
    run = cluster.admin("queryMsgTraceById", "-i", oneway.msg_id)
    assert run.status is ExitStatus.NOT_FOUND


class Replier:
    """A traced push consumer answering each request with ``b"re:" + body``."""

    def __init__(self, ns: str, topic: str) -> None:
        self.group = _name("CG_replier")
        self.producer = Producer(_name("PG_replier"), ns)
        self.consumer = PushConsumer(self.group, ns, consume_from_where="CONSUME_FROM_FIRST_OFFSET",
                                     enable_trace=True)
        self.consumer.subscribe(topic, "*")
        self.consumer.register_listener(self.on_messages)
        self.seen: list[MessageExt] = []
        self.lock = threading.Lock()

    def on_messages(self, msgs: list[MessageExt]) -> ConsumeResult:
        for m in msgs:
            with self.lock:
                self.seen.append(m)
            self.producer.send(sluice.reply_to(m, b"re:" + m.body))
        return ConsumeResult.SUCCESS

    def __enter__(self) -> Replier:
        self.producer.start()
        self.consumer.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.consumer.shutdown()
        self.producer.shutdown()


def test_a_request_is_traced_as_its_send_and_its_consumption(cluster: Cluster) -> None:
    topic = _topic(cluster, queues=2)
    group = _name("PG_request")
    with Replier(cluster.ns, topic) as replier, Producer(group, cluster.ns, enable_trace=True) as p:
        queue = p.fetch_publish_queues(topic)[1]
        assert p.request(Message(topic, b"ping", tags="Q"), timeout=15.0, queue=queue).body == b"re:ping"
        (request,) = [m for m in replier.seen if m.body == b"ping"]
    assert request.queue_id == 1
    pub, before, after = _traces(cluster, request.msg_id, 3)
    assert (pub["type"], pub["group"], pub["topic"], pub["tags"], pub["status"], pub["msgType"]) == (
        "Pub", group, topic, "Q", "success", 0)
    assert (before["type"], before["group"], after["type"], after["group"], after["status"]) == (
        "SubBefore", replier.group, "SubAfter", replier.group, "success")


def test_transactions_trace_the_half_message_and_each_end(cluster: Cluster) -> None:
    topic = _topic(cluster)
    group = _name("PG_tx")
    states = {b"commit": LocalTransactionState.COMMIT_MESSAGE, b"later": LocalTransactionState.UNKNOW}
    with TransactionProducer(group, namesrv=cluster.ns, enable_trace=True,
                             execute=lambda m, a: states[m.body],
                             check=lambda m: LocalTransactionState.COMMIT_MESSAGE) as p:
        committed = p.send_in_transaction(Message(topic, b"commit", tags="T", keys=["tx-1"]))
        checked = p.send_in_transaction(Message(topic, b"later"))
        wait_for(lambda: len(_stored(cluster.ns, topic)) == 2, what="the checked transaction to commit")
    pub, end = _traces(cluster, committed.msg_id, 2)
    assert (pub["type"], pub["group"], pub["msgType"], pub["tags"], pub["keys"], pub["status"]) == (
        "Pub", group, 1, "T", "tx-1", "success")
    assert (end["type"], end["group"], end["transactionState"], end["fromTransactionCheck"], end["msgType"],
            end["transactionId"], end["topic"], end["storeHost"], end["tags"]) == (
        "EndTransaction", group, "COMMIT_MESSAGE", False, 2, committed.msg_id, topic, cluster.broker.addr, "T")
    traces = _traces(cluster, checked.msg_id, 3)
    assert traces[0]["type"] == "Pub" and traces[0]["msgType"] == 1
    ends = [(t["transactionState"], t["fromTransactionCheck"]) for t in traces[1:]]
    assert ends[0] == ("UNKNOW", False) and ("COMMIT_MESSAGE", True) in ends[1:]
    # The same through a real `sluice admin` process: the producer's table shows each end's state.
    out = subprocess.run([sys.executable, "-m", "sluice", "admin", "queryMsgTraceById", "-i", checked.msg_id, "-n",
                          cluster.ns], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "COLUMNS": "200"})
    assert out.returncode == 0, out.stderr
    rows = [line.split() for line in out.stdout.splitlines() if line.split()[:2] in (
        ["Pub", group], ["EndTransaction", group])]
    assert rows[0][-2:] == ["success", "Trans_Msg_Half"]
    assert rows[1][-2:] == ["UNKNOW", "Trans_msg_Commit"]
    assert any(r[-4:] == ["COMMIT_MESSAGE", "by", "check", "Trans_msg_Commit"] for r in rows[2:])


def test_a_java_transactional_producers_trace_is_read_the_same_way(cluster: Cluster) -> None:
    # What a Java TransactionMQProducer with enableMsgTrace sends (RocketMQ 4.9.8's TraceDataEncoder): the half
    # message's Pub (msgType 1), its UNKNOW end, then the COMMIT_MESSAGE answering the broker's check.
    trace_topic = _name("JavaTxTrace")
    mid = "0A0000010BB818B4AAC2123456780002"
    head = f"\x01DefaultRegion\x01JavaTxPG\x01Orders\x01{mid}\x01TagT\x01null\x0110.0.0.9:10911"
    body = (f"Pub\x011700000000000{head}\x015\x013\x011\x010A00000900002A9F0000000000000100\x01true\x02"
            f"EndTransaction\x011700000000010{head}\x012\x01{mid}\x01UNKNOW\x01false\x02"
            f"EndTransaction\x011700000060000{head}\x012\x01{mid}\x01COMMIT_MESSAGE\x01true\x02").encode()
    with Producer(_name("JavaTxTraceWriter"), cluster.ns) as p:
        p.send(Message(trace_topic, body, keys=[mid]))
    run = cluster.admin("queryMsgTraceById", "-i", mid, "-t", trace_topic, "--json")
    assert run.status is ExitStatus.SUCCESS, run.stderr
    pub, unknown, commit = run.json["traces"]
    assert (pub["type"], pub["msgType"], pub["status"]) == ("Pub", 1, "success")
    assert [(t["type"], t["transactionState"], t["fromTransactionCheck"], t["transactionId"], t["msgType"])
            for t in (unknown, commit)] == [("EndTransaction", "UNKNOW", False, mid, 2),
                                            ("EndTransaction", "COMMIT_MESSAGE", True, mid, 2)]
    table = cluster.admin("queryMsgTraceById", "-i", mid, "-t", trace_topic)
    assert "3 trace record(s) of " in table.stdout and "1 send(s), 2 transaction end(s)" in table.stdout
