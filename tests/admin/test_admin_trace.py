"""Message trace end to end against real ``sluice namesrv`` / ``sluice broker`` subprocesses: a producer and a
push consumer with ``enable_trace=True`` write Pub, SubBefore and SubAfter records into the broker-created
RMQ_SYS_TRACE_TOPIC, and ``sluice admin queryMsgTraceById`` (run as a real ``sluice`` process too) shows the
message's path; clients without tracing send nothing there; a trace body as RocketMQ's Java client writes it
is read the same way."""
from __future__ import annotations

import itertools
import os
import subprocess
import sys
import threading
from collections.abc import Iterator

import pytest
from admin_support import Cluster, ExitStatus, running_cluster, wait_for, wait_for_route

from sluice import ConsumeResult, Message, Producer, PullConsumer, PushConsumer
from sluice.protocol.trace import TRACE_TOPIC

_n = itertools.count()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """One namesrv and one broker with traceTopicEnable."""
    with running_cluster(tmp_path_factory.mktemp("trace"), ("broker-a",), config="trace_topic_enable = true\n",
                         cls=Cluster) as c:
        yield c  # type: ignore[misc]


def _name(prefix: str) -> str:
    return f"{prefix}{next(_n)}_{os.getpid()}"


def _trace_count(ns: str, topic: str = TRACE_TOPIC) -> int:
    with PullConsumer(_name("TraceCounter"), ns) as pc:
        return sum(pc.max_offset(mq) for mq in pc.fetch_message_queues(topic))


def _produce_and_consume(ns: str, topic: str, trace: bool, pgroup: str, cgroup: str) -> str:
    """Send one message, consume it with a push consumer, shut both down (which flushes traces); its msgId."""
    got = threading.Event()

    def listener(msgs: list) -> ConsumeResult:
        got.set()
        return ConsumeResult.SUCCESS

    consumer = PushConsumer(cgroup, ns, enable_trace=trace, consume_from_where="CONSUME_FROM_FIRST_OFFSET")
    consumer.subscribe(topic, "*")
    consumer.register_listener(listener)
    with Producer(pgroup, ns, enable_trace=trace) as producer:
        msg_id = producer.send(Message(topic, b"traced body", tags="TagA", keys=["order-7"])).msg_id
        consumer.start()
        try:
            assert got.wait(30), "the push consumer never got the message"
        finally:
            consumer.shutdown()
    return msg_id


def test_producer_and_push_consumer_traces_show_the_path(cluster: Cluster) -> None:
    topic = _name("Traced")
    cluster.admin("updateTopic", "-t", topic, "-c", "DefaultCluster", "-r", "1", "-w", "1")
    wait_for_route(cluster.ns, topic)
    msg_id = _produce_and_consume(cluster.ns, topic, True, "PG_trace", "CG_trace")
    wait_for(lambda: cluster.admin("queryMsgTraceById", "-i", msg_id, "--json").status is ExitStatus.SUCCESS,
             what="the traces to be queryable")
    run = cluster.admin("queryMsgTraceById", "-i", msg_id, "--json")
    traces = run.json["traces"]
    assert [t["type"] for t in traces] == ["Pub", "SubBefore", "SubAfter"]
    pub, before, after = traces
    assert (pub["group"], pub["topic"], pub["tags"], pub["keys"], pub["status"]) == (
        "PG_trace", topic, "TagA", "order-7", "success")
    assert pub["storeHost"] == cluster.broker.addr and pub["bodyLength"] == len(b"traced body")
    assert pub["offsetMsgId"] and pub["msgType"] == 0 and pub["costTime"] >= 0
    assert (before["group"], before["retryTimes"], before["keys"], before["status"]) == (
        "CG_trace", 0, "order-7", None)
    assert (after["group"], after["status"], after["contextCode"], after["requestId"]) == (
        "CG_trace", "success", 0, before["requestId"])
    assert after["timestamp"] >= before["timestamp"] >= pub["timestamp"]
    # The same through a real `sluice admin` process, as a table: the producer row, then the group's rows.
    out = subprocess.run([sys.executable, "-m", "sluice", "admin", "queryMsgTraceById", "-i", msg_id, "-n",
                          cluster.ns], capture_output=True, text=True, timeout=120, env={**os.environ,
                                                                                           "COLUMNS": "200"})
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    pub_row = next(i for i, line in enumerate(lines) if line.split()[:2] == ["Pub", "PG_trace"])
    sub_rows = [i for i, line in enumerate(lines) if line.split()[:2] in (["SubBefore", "CG_trace"],
                                                                          ["SubAfter", "CG_trace"])]
    assert len(sub_rows) == 2 and pub_row < sub_rows[0]
    assert "success" in lines[pub_row] and "success" in lines[sub_rows[1]]


def test_lite_pull_polls_are_traced(cluster: Cluster) -> None:
    from sluice import LitePullConsumer
    topic = _name("LiteTraced")
    cluster.admin("updateTopic", "-t", topic, "-c", "DefaultCluster", "-r", "1", "-w", "1")
    wait_for_route(cluster.ns, topic)
    with Producer("PG_lite", cluster.ns) as p:  # an untraced producer: only the consumer's records
        msg_id = p.send(Message(topic, b"polled")).msg_id
    with LitePullConsumer("CG_lite", cluster.ns, enable_trace=True,
                          consume_from_where="CONSUME_FROM_FIRST_OFFSET") as c:
        c.subscribe(topic, "*")
        got: list = []
        wait_for(lambda: got.extend(c.poll(timeout=1.0)) or got, what="the lite pull consumer to poll the message")
    assert [m.msg_id for m in got] == [msg_id]
    wait_for(lambda: cluster.admin("queryMsgTraceById", "-i", msg_id).status is ExitStatus.SUCCESS,
             what="the traces to be queryable")
    traces = cluster.admin("queryMsgTraceById", "-i", msg_id, "--json").json["traces"]
    assert [(t["type"], t["group"], t["status"]) for t in traces] == [
        ("SubBefore", "CG_lite", None), ("SubAfter", "CG_lite", "success")]


def test_without_trace_nothing_goes_to_the_trace_topic(cluster: Cluster) -> None:
    topic = _name("Untraced")
    cluster.admin("updateTopic", "-t", topic, "-c", "DefaultCluster", "-r", "1", "-w", "1")
    wait_for_route(cluster.ns, topic)
    before = _trace_count(cluster.ns)
    msg_id = _produce_and_consume(cluster.ns, topic, False, "PG_plain", "CG_plain")
    assert _trace_count(cluster.ns) == before
    run = cluster.admin("queryMsgTraceById", "-i", msg_id)
    assert run.status is ExitStatus.NOT_FOUND and msg_id in run.stderr


def test_a_trace_written_by_a_rocketmq_client_is_read_the_same_way(cluster: Cluster) -> None:
    # The body and keys AsyncTraceDispatcher sends for a Java producer's Pub and a Java consumer's SubBefore /
    # SubAfter (RocketMQ 4.9's TraceDataEncoder; "null" where the message had no tags), in a custom trace topic.
    trace_topic = _name("JavaTrace")
    mid = "0A0000010BB818B4AAC2123456780000"
    body = (f"Pub\x011700000000000\x01DefaultRegion\x01JavaPG\x01Orders\x01{mid}\x01null\x01k1\x0110.0.0.9:10911"
            f"\x015\x012\x010\x010A00000900002A9F0000000000000000\x01true\x02"
            f"SubBefore\x011700000001000\x01DefaultRegion\x01JavaCG\x01R1\x01{mid}\x010\x01k1\x02"
            f"SubAfter\x01R1\x01{mid}\x013\x01false\x01k1\x014\x02").encode()
    with Producer(_name("JavaTraceWriter"), cluster.ns) as p:
        p.send(Message(trace_topic, body, keys=[mid, "k1"]))
    run = cluster.admin("queryMsgTraceById", "-i", mid, "-t", trace_topic, "--json")
    assert run.status is ExitStatus.SUCCESS, run.stderr
    pub, before, after = run.json["traces"]
    assert (pub["type"], pub["group"], pub["storeHost"], pub["tags"], pub["costTime"]) == (
        "Pub", "JavaPG", "10.0.0.9:10911", "null", 2)
    # This SubAfter has the 7 fields of a 4.x writer: no group or time of its own, taken from its SubBefore.
    assert (after["type"], after["group"], after["timestamp"], after["status"], after["contextCode"]) == (
        "SubAfter", "JavaCG", 1700000001000, "failed", 4)
    assert before["type"] == "SubBefore"


def test_a_trace_message_that_does_not_decode_is_a_warning(cluster: Cluster) -> None:
    trace_topic = _name("BadTrace")
    mid = "0A0000010BB818B4AAC2123456780001"
    with Producer(_name("BadTraceWriter"), cluster.ns) as p:
        p.send(Message(trace_topic, f"SubBefore\x01soon\x01r\x01g\x01R\x01{mid}\x010\x01k\x02".encode(), keys=[mid]))
        p.send(Message(trace_topic, f"SubAfter\x01R\x01{mid}\x011\x01true\x01k\x010\x011\x01G\x02".encode(),
                       keys=[mid]))
    run = cluster.admin("queryMsgTraceById", "-i", mid, "-t", trace_topic, "--json")
    assert run.status is ExitStatus.SUCCESS
    assert [t["type"] for t in run.json["traces"]] == ["SubAfter"]
    assert "field 1 (timestamp) 'soon' is not an integer" in run.stderr
