"""Push consumer against a real namesrv + broker (subprocesses): consumption, filters, start positions,
offsets, orderly, broadcasting, retries and dead letters."""
from __future__ import annotations

import threading
import time
from collections import Counter
from pathlib import Path

import orjson
import pytest
from push_support import Cluster, cluster, start_consumer, unique, wait_for  # noqa: F401 (a fixture)

from sluice import (
    ConsumeOrderlyResult, ConsumeResult, Message, MessageExt, MessageSelector, Producer, PullConsumer, PushConsumer,
    select_by_hash,
)
from sluice.client.results import MessageQueue
from sluice.errors import ClientError, InvalidParameterError, SluiceError
from sluice.protocol.codes import RequestCode
from sluice.protocol.command import RemotingCommand
from sluice.transport.blocking import SyncRemotingClient
from sluice.protocol import properties as P

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


class Sink:
    """A listener that records what it saw (thread-safe) and can fail chosen messages."""

    def __init__(self, fail: frozenset[str] = frozenset(), result: object = ConsumeResult.SUCCESS) -> None:
        self.lock = threading.Lock()
        self.msgs: list[MessageExt] = []
        self.fail = fail
        self.result = result
        self.threads: set[str] = set()  # names of the threads the listener ran on

    def __call__(self, msgs: list[MessageExt]) -> object:
        with self.lock:
            self.msgs.extend(msgs)
            self.threads.add(threading.current_thread().name)
        if any(m.body.decode() in self.fail for m in msgs):
            return ConsumeResult.RECONSUME_LATER
        return self.result

    def bodies(self) -> list[str]:
        with self.lock:
            return [m.body.decode() for m in self.msgs]


def _producer(c: Cluster) -> Producer:
    return Producer(unique("pg"), namesrv=c.ns, default_topic_queue_nums=8)


def _create_topic(p: Producer, topic: str) -> None:
    """Create the topic (8 queues) with one send; its route is then known to the namesrv."""
    p.send(Message(topic, b"create"))
    wait_for(lambda: len(p.fetch_publish_queues(topic)) == 8, 10, f"8 queues of {topic}")


def test_api_refuses_misuse(cluster: Cluster) -> None:
    with pytest.raises(InvalidParameterError):
        PushConsumer("g", namesrv=cluster.ns, message_model="SOMETIMES")
    with pytest.raises(InvalidParameterError):
        PushConsumer("g", namesrv=cluster.ns, consume_from_where="CONSUME_FROM_NOWHERE")
    with pytest.raises(InvalidParameterError):
        PushConsumer("g", namesrv=cluster.ns, allocate_strategy="RANDOM")
    with pytest.raises(InvalidParameterError):
        PushConsumer("g", namesrv=cluster.ns, no_such_option=1)
    c = PushConsumer("g", namesrv=cluster.ns)
    with pytest.raises(ClientError):
        c.start()  # no listener, no subscription
    c.register_listener(Sink())
    with pytest.raises(ClientError):
        c.start()  # no subscription
    with pytest.raises(InvalidParameterError):
        c.subscribe("%RETRY%g")


@pytest.mark.parametrize("inline", [False, True], ids=["consume-threads", "consume-inline"])
def test_consumes_everything_with_tag_filter_and_resumes_from_committed_offsets(cluster: Cluster,
                                                                                inline: bool) -> None:
    topic, group = unique("PushT"), unique("cg")
    with _producer(cluster) as p:
        _create_topic(p, topic)
        sink = Sink()
        cons = start_consumer(cluster, group, topic, sink, "A || B",
                              consume_from_where="CONSUME_FROM_LAST_OFFSET", consume_inline=inline)
        try:
            wait_for(lambda: len([q for q in cons.owned_queues() if q.topic == topic]) == 8, 10, "8 queues owned")
            for i in range(120):
                p.send(Message(topic, f"m{i}".encode(), tags="ABC"[i % 3]))
            want = {f"m{i}" for i in range(120) if i % 3 != 2}
            wait_for(lambda: set(sink.bodies()) >= want, 20, "tagged messages")
            time.sleep(0.3)
            assert Counter(sink.bodies()) == Counter(want)  # each once; C never; "create" predates the group
            assert all(m.topic == topic and m.tags in ("A", "B") for m in sink.msgs)
            # consume_inline: on the client's loop thread, never a consume thread; else only consume threads
            on_pool = {name.startswith(f"sluice-consume-{group}") for name in sink.threads}
            assert on_pool == ({False} if inline else {True}), sink.threads
        finally:
            cons.shutdown()
        # Offsets were committed at shutdown: a new member of the group continues after them.
        for i in range(120, 130):
            p.send(Message(topic, f"m{i}".encode(), tags="A"))
        sink2 = Sink()
        cons2 = start_consumer(cluster, group, topic, sink2, "A || B",
                               consume_from_where="CONSUME_FROM_FIRST_OFFSET")
        try:
            want2 = {f"m{i}" for i in range(120, 130)}
            wait_for(lambda: set(sink2.bodies()) >= want2, 20, "messages sent while nobody consumed")
            time.sleep(0.3)
            assert Counter(sink2.bodies()) == Counter(want2)
        finally:
            cons2.shutdown()


@pytest.mark.parametrize("where", ["CONSUME_FROM_FIRST_OFFSET", "CONSUME_FROM_LAST_OFFSET", "CONSUME_FROM_TIMESTAMP"])
def test_new_group_starts_exactly_where_asked(cluster: Cluster, where: str) -> None:
    topic, group = unique("StartT"), unique("cg")
    with _producer(cluster) as p:
        _create_topic(p, topic)
        for i in range(16):
            p.send(Message(topic, f"old{i}".encode()))
        time.sleep(0.05)
        cut = int(time.time() * 1000)
        time.sleep(0.05)
        for i in range(16):
            p.send(Message(topic, f"mid{i}".encode()))
        sink = Sink()
        cons = start_consumer(cluster, group, topic, sink, consume_from_where=where, consume_timestamp=cut)
        try:
            wait_for(lambda: len([q for q in cons.owned_queues() if q.topic == topic]) == 8, 10, "8 queues owned")
            for i in range(16):
                p.send(Message(topic, f"new{i}".encode()))
            expected = {f"new{i}" for i in range(16)}
            if where != "CONSUME_FROM_LAST_OFFSET":
                expected |= {f"mid{i}" for i in range(16)}
            if where == "CONSUME_FROM_FIRST_OFFSET":
                expected |= {f"old{i}" for i in range(16)} | {"create"}
            wait_for(lambda: set(sink.bodies()) >= expected, 20, f"messages for {where}")
            time.sleep(0.3)
            assert set(sink.bodies()) == expected
        finally:
            cons.shutdown()


def test_consumer_started_before_its_topic_exists_gets_what_is_sent_then(cluster: Cluster) -> None:
    # RocketMQ's quickstart order (issue #16): the consumer first, with the default CONSUME_FROM_LAST_OFFSET;
    # the topic is created by the first send. Its first rebalance comes after the sends, and the broker starts
    # the new group where it subscribed, so nothing sent after is skipped.
    topic, group = unique("FirstT"), unique("cg")
    sink = Sink()
    cons = start_consumer(cluster, group, topic, sink, poll_namesrv_interval=0.5, rebalance_interval=1.0,
                          instance_name=unique("early"))
    try:
        with _producer(cluster) as p:
            sent = {f"m{i}" for i in range(20)}
            for body in sorted(sent):
                p.send(Message(topic, body.encode()))
        wait_for(lambda: set(sink.bodies()) >= sent, 30, "every message sent after the consumer started")
        time.sleep(0.3)
        assert sorted(sink.bodies()) == sorted(sent)
    finally:
        cons.shutdown()


def test_retry_ladder_then_dead_letter_keeps_identity(cluster: Cluster) -> None:
    topic, group = unique("RetryT"), unique("cg")
    with _producer(cluster) as p:
        _create_topic(p, topic)
        sink = Sink(fail=frozenset({"bad"}))
        cons = start_consumer(cluster, group, topic, sink, max_reconsume_times=3)
        try:
            wait_for(lambda: len([q for q in cons.owned_queues() if q.topic == topic]) == 8, 10, "8 queues owned")
            sent = p.send(Message(topic, b"bad", tags="T1", keys=["k-bad"], properties={"color": "red"}))
            p.send(Message(topic, b"good"))
            wait_for(lambda: sink.bodies().count("bad") >= 4, 30, "the original and 3 retries")
            time.sleep(1.0)  # a 5th delivery would come within this (the shrunk levels are <= 1 s)
            bad = [m for m in sink.msgs if m.body == b"bad"]
            assert [m.reconsume_times for m in bad] == [0, 1, 2, 3]
            assert sink.bodies().count("good") == 1
            for m in bad:  # retries look like the original to the listener
                assert m.topic == topic and m.msg_id == sent.msg_id and m.tags == "T1" and m.keys == ["k-bad"]
                assert m.properties["color"] == "red"
            times = [m.store_timestamp for m in bad]
            # delay levels 3, 4, 5 are 0.3, 0.4, 0.5 s: each retry is stored no earlier than its delay
            for gap, level_ms in zip([b - a for a, b in zip(times, times[1:])], [300, 400, 500]):
                assert gap >= level_ms - 50, (times, gap, level_ms)
        finally:
            cons.shutdown()
        # The dead letter is readable and still names the original topic and id.
        with PullConsumer(unique("inspect"), namesrv=cluster.ns) as pc:
            dlq = f"%DLQ%{group}"
            [mq] = pc.fetch_message_queues(dlq)
            res = pc.pull(mq, "*", 0, 32)
            assert [m.body for m in res.msg_found_list] == [b"bad"]
            dead = res.msg_found_list[0]
            assert dead.msg_id == sent.msg_id and dead.keys == ["k-bad"] and dead.tags == "T1"
            assert dead.properties[P.RETRY_TOPIC] == topic
            assert dead.properties[P.DLQ_ORIGIN_TOPIC] == topic
            assert dead.properties["color"] == "red"
            assert dead.reconsume_times == 4


def test_the_groups_retry_max_times_sends_to_the_dlq(cluster: Cluster) -> None:
    # The subscription group's retryMaxTimes decides (the consumer's max_reconsume_times is left at -1, so its
    # send-backs name no limit): 1 retry, then the dead letter.
    topic, group = unique("SubGrpT"), unique("cg")
    with SyncRemotingClient() as rc:
        resp = rc.invoke(cluster.broker.addr, RemotingCommand.request(
            RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, {},
            orjson.dumps({"groupName": group, "retryMaxTimes": 1})), 5.0)
        assert resp.code == 0, resp.remark
    with _producer(cluster) as p:
        _create_topic(p, topic)
        sink = Sink(fail=frozenset({"bad"}))
        cons = start_consumer(cluster, group, topic, sink)
        try:
            wait_for(lambda: len([q for q in cons.owned_queues() if q.topic == topic]) == 8, 10, "8 queues owned")
            p.send(Message(topic, b"bad"))
            wait_for(lambda: sink.bodies().count("bad") >= 2, 30, "the original and 1 retry")
            with PullConsumer(unique("inspect"), namesrv=cluster.ns) as pc:
                dlq = f"%DLQ%{group}"
                wait_for(lambda: wait_route_ok(pc, dlq), 20, "the dead-letter topic")
                [mq] = pc.fetch_message_queues(dlq)
                dead = wait_for(lambda: pc.pull(mq, "*", 0, 32).msg_found_list, 20, "the dead letter")
                assert [m.body for m in dead] == [b"bad"] and dead[0].reconsume_times == 2
            time.sleep(1.0)  # a third delivery would come within this (the shrunk levels are <= 1 s)
            assert sink.bodies().count("bad") == 2
        finally:
            cons.shutdown()


def wait_route_ok(pc: PullConsumer, topic: str) -> bool:
    try:
        return bool(pc.fetch_message_queues(topic))
    except SluiceError:
        return False


@pytest.mark.parametrize("first,second,kind", [
    ("a > 5", "a > 50", "SQL92"),
    ("TagA || TagB", "TagB", "TAG"),
])
def test_retries_follow_the_groups_current_subscription(cluster: Cluster, first: str, second: str,
                                                        kind: str) -> None:
    """A retried message is filtered by the subscription of its original topic, like a first delivery."""
    topic, group = unique("FiltT"), unique("cg")

    def sel(expr: str) -> MessageSelector:
        return MessageSelector.by_sql(expr) if kind == "SQL92" else MessageSelector.by_tag(expr)
    with _producer(cluster) as p:
        _create_topic(p, topic)
        failing = Sink(fail=frozenset({"x", "y"}))
        cons = start_consumer(cluster, group, topic, failing, sel(first))
        try:
            wait_for(lambda: len([q for q in cons.owned_queues() if q.topic == topic]) == 8, 10, "8 queues owned")
            p.send(Message(topic, b"x", tags="TagA", properties={"a": "10"}))
            p.send(Message(topic, b"y", tags="TagB", properties={"a": "100"}))
            wait_for(lambda: {"x", "y"} <= set(failing.bodies()), 20, "first deliveries")
        finally:
            cons.shutdown()  # the retries are stored while nobody of the group pulls
        sink = Sink()
        cons2 = start_consumer(cluster, group, topic, sink, sel(second))
        try:
            wait_for(lambda: "y" in sink.bodies(), 20, "the retry that still matches")
            time.sleep(1.5)
            assert sink.bodies().count("y") == 1 and "x" not in sink.bodies()
            assert [m.reconsume_times for m in sink.msgs] == [1]
        finally:
            cons2.shutdown()


@pytest.mark.parametrize("inline", [False, True], ids=["consume-threads", "consume-inline"])
def test_orderly_consumer_keeps_queue_order_and_retries_in_place(cluster: Cluster, inline: bool) -> None:
    topic, group = unique("OrderT"), unique("cg")
    seen: dict[int, list[int]] = {}
    failed_once: set[str] = set()
    threads: set[str] = set()
    lock = threading.Lock()

    def listener(msgs: list[MessageExt]) -> ConsumeOrderlyResult:
        m = msgs[0]
        key, seq = m.body.decode().split(":")
        with lock:
            threads.add(threading.current_thread().name)
            if int(seq) % 7 == 3 and m.body.decode() not in failed_once:
                failed_once.add(m.body.decode())
                return ConsumeOrderlyResult.SUSPEND_CURRENT_QUEUE_A_MOMENT
            seen.setdefault(int(key), []).append(int(seq))
        return ConsumeOrderlyResult.SUCCESS

    with _producer(cluster) as p:
        _create_topic(p, topic)
        cons = start_consumer(cluster, group, topic, listener, orderly=True, suspend_current_queue_time=0.05,
                              consume_inline=inline)
        try:
            wait_for(lambda: len([q for q in cons.owned_queues() if q.topic == topic]) == 8, 10, "8 queues owned")
            for seq in range(30):
                for key in range(4):
                    p.send(Message(topic, f"{key}:{seq}".encode()), selector=select_by_hash, arg=str(key))
            wait_for(lambda: sum(len(v) for v in seen.values()) >= 120, 30, "all ordered messages")
            assert {k: v for k, v in seen.items()} == {k: list(range(30)) for k in range(4)}
            assert len(failed_once) == 4 * 4  # seq 3, 10, 17, 24 of each key failed once, then passed
            assert {t.startswith(f"sluice-consume-{group}") for t in threads} == ({False} if inline else {True})
        finally:
            cons.shutdown()


def test_orderly_gives_up_to_the_dlq_after_max_reconsume_times(cluster: Cluster) -> None:
    topic, group = unique("OrderDlq"), unique("cg")
    sink = Sink(fail=frozenset({"poison"}))
    with _producer(cluster) as p:
        _create_topic(p, topic)
        q0 = MessageQueue(topic=topic, broker_name=p.fetch_publish_queues(topic)[0].broker_name, queue_id=0)
        cons = start_consumer(cluster, group, topic, sink, orderly=True, max_reconsume_times=2,
                              suspend_current_queue_time=0.05)
        try:
            wait_for(lambda: len([q for q in cons.owned_queues() if q.topic == topic]) == 8, 10, "8 queues owned")
            p.send(Message(topic, b"poison"), queue=q0)
            p.send(Message(topic, b"after"), queue=q0)
            wait_for(lambda: "after" in sink.bodies(), 20, "the queue to move past the poison message")
            assert sink.bodies() == ["poison", "poison", "poison", "after"]
        finally:
            cons.shutdown()
        with PullConsumer(unique("inspect"), namesrv=cluster.ns) as pc:
            [mq] = pc.fetch_message_queues(f"%DLQ%{group}")
            assert [m.body for m in pc.pull(mq, "*", 0, 8).msg_found_list] == [b"poison"]


def test_broadcasting_offsets_live_in_a_local_file(cluster: Cluster, tmp_path: Path) -> None:
    topic, group = unique("BcastT"), unique("cg")
    with _producer(cluster) as p:
        _create_topic(p, topic)
        sinks = [Sink(), Sink()]
        members = []
        for i, s in enumerate(sinks):
            c = PushConsumer(group, namesrv=cluster.ns, message_model="BROADCASTING", instance_name=f"m{i}",
                             offset_store_dir=str(tmp_path))
            c.subscribe(topic)
            c.register_listener(s)
            members.append(c)
        for c in members:
            c.start()
        try:
            for c in members:
                wait_for(lambda c=c: len([q for q in c.owned_queues() if q.topic == topic]) == 8, 10, "all queues")
            for i in range(40):
                p.send(Message(topic, f"b{i}".encode()))
            want = Counter(f"b{i}" for i in range(40))
            for s in sinks:
                wait_for(lambda s=s: Counter(s.bodies()) == want, 20, "every message at every member")
        finally:
            for c in members:
                c.shutdown()
        assert (tmp_path / "m0" / group / "offsets.json").exists()
        # A member that comes back continues from its file: only what was sent meanwhile.
        p.send(Message(topic, b"later"))
        again = Sink()
        c = PushConsumer(group, namesrv=cluster.ns, message_model="BROADCASTING", instance_name="m0",
                         offset_store_dir=str(tmp_path), consume_from_where="CONSUME_FROM_FIRST_OFFSET")
        c.subscribe(topic)
        c.register_listener(again)
        c.start()
        try:
            wait_for(lambda: "later" in again.bodies(), 20, "the message sent while away")
            time.sleep(0.3)
            assert again.bodies() == ["later"]
        finally:
            c.shutdown()


def test_flow_control_stops_pulling_a_full_queue(cluster: Cluster) -> None:
    topic, group = unique("FlowT"), unique("cg")
    gate = threading.Event()
    seen: list[int] = []

    def slow(msgs: list[MessageExt]) -> ConsumeResult:
        gate.wait(20)
        seen.extend(m.queue_offset for m in msgs)
        return ConsumeResult.SUCCESS

    with _producer(cluster) as p:
        _create_topic(p, topic)
        q0 = MessageQueue(topic=topic, broker_name=p.fetch_publish_queues(topic)[0].broker_name, queue_id=0)
        cons = PushConsumer(group, namesrv=cluster.ns, pull_threshold_for_queue=20, pull_batch_size=8,
                            consume_thread_max=2)
        cons.subscribe(topic)
        cons.register_listener(slow)
        cons.start()
        try:
            wait_for(lambda: len([q for q in cons.owned_queues() if q.topic == topic]) == 8, 10, "8 queues owned")
            for i in range(200):
                p.send(Message(topic, f"f{i}".encode()), queue=q0)
            impl = cons.async_consumer
            wait_for(lambda: impl.flow_control_times > 0, 10, "flow control to kick in")
            cached = impl.rebalancer.process_queues[q0].msg_count
            assert 20 < cached <= 20 + 8  # the pull that crossed the threshold, then no more
            gate.set()
            wait_for(lambda: len(seen) == 200, 30, "the backlog once the listener is free")
            first = min(seen)
            assert sorted(seen) == list(range(first, first + 200))  # each once, none skipped
        finally:
            gate.set()
            cons.shutdown()


def test_backlog_drain_in_batches_grows_pulls_retries_failed_batches_and_commits_everything(
        cluster: Cluster) -> None:
    """A stored backlog in one queue, drained with batch listener calls: pulls grow past pull_batch_size (a
    listener batch of 1024 holds one pull), a failed batch comes back through %RETRY% (each of its messages
    once more), nothing is lost or doubled otherwise, and the committed offset ends at the queue's end."""
    topic, group = unique("BatchT"), unique("cg")
    with _producer(cluster) as p:
        _create_topic(p, topic)
        mq = sorted(p.fetch_publish_queues(topic), key=lambda q: q.queue_id)[3]
        for start in range(0, 1500, 50):
            p.send_batch([Message(topic, f"m{i}".encode()) for i in range(start, start + 50)], queue=mq)
        sizes: list[int] = []
        failed: set[str] = set()
        lock = threading.Lock()
        sink = Sink()

        def listener(msgs: list[MessageExt]) -> ConsumeResult:
            sink(msgs)
            with lock:
                sizes.append(len(msgs))
                if any(m.body == b"m700" for m in msgs) and not failed:  # fail the whole batch holding m700
                    failed.update(m.body.decode() for m in msgs)
                    return ConsumeResult.RECONSUME_LATER
            return ConsumeResult.SUCCESS

        cons = start_consumer(cluster, group, topic, listener, consume_from_where="CONSUME_FROM_FIRST_OFFSET",
                              consume_message_batch_max_size=1024)
        try:
            want = Counter({f"m{i}": 1 for i in range(1500)} | {"create": 1})
            wait_for(lambda: Counter(sink.bodies()) >= want + Counter(failed), 30, "the backlog and the retries")
            time.sleep(0.3)
            assert failed and "m700" in failed
            assert Counter(sink.bodies()) == want + Counter(failed)  # the failed batch exactly twice, others once
            assert max(sizes) > 32  # one pull's messages exceeded pull_batch_size: the pull size grew
            retried = [m for m in sink.msgs if m.reconsume_times == 1]
            assert {m.body.decode() for m in retried} == failed and all(m.topic == topic for m in retried)
        finally:
            cons.shutdown()
        with PullConsumer(group, namesrv=cluster.ns) as pc:  # the group's offset as the broker keeps it
            assert pc.fetch_consume_offset(mq, from_store=True) == pc.max_offset(mq) >= 1500
