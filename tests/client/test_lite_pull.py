"""The lite pull consumer end to end against real ``sluice namesrv`` / ``sluice broker`` subprocesses:
subscribe with rebalance (two members of a group get every message once), assign with seek, pause and resume,
commit_sync and auto-commit persisting where a new consumer resumes, and the refusals (unknown topic, a seek to
a queue not assigned, a seek out of range, subscribe and assign together)."""
from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest
from servers import Cluster, running_cluster, wait_for, wait_for_route

from sluice import AsyncLitePullConsumer, LitePullConsumer, Message, MessageExt, MessageQueue, Producer
from sluice.client import LitePullConsumerOptions
from sluice.errors import ClientError, InvalidParameterError, TopicNotExistError

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

QUEUES = 4
_n = 0


def unique(prefix: str) -> str:
    global _n
    _n += 1
    return f"{prefix}{_n}_{time.monotonic_ns() % 10**8}"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with running_cluster(tmp_path_factory.mktemp("lite")) as c:
        yield c


@pytest.fixture
def producer(cluster: Cluster) -> Iterator[Producer]:
    with Producer(unique("PG"), cluster.ns, default_topic_queue_nums=QUEUES, instance_name=unique("prod")) as p:
        yield p


def make_topic(p: Producer, topic: str) -> list[MessageQueue]:
    """``topic`` created with QUEUES queues by one untagged message, "create", in queue 0."""
    broker = p.fetch_publish_queues("TBW102")[0].broker_name
    p.send(Message(topic, b"create"), queue=MessageQueue(topic=topic, broker_name=broker, queue_id=0))
    ns = p.async_producer.namesrv
    wait_for_route(ns if isinstance(ns, str) else ns[0], topic)  # registered: consumers find its route
    return wait_for(lambda: (qs := p.fetch_publish_queues(topic)) and len(qs) == QUEUES and qs, 15,
                    f"{QUEUES} queues of {topic}")


def consumer(cluster: Cluster, group: str, **options: object) -> LitePullConsumer:
    options.setdefault("consume_from_where", "CONSUME_FROM_FIRST_OFFSET")
    return LitePullConsumer(group, cluster.ns, instance_name=unique("lite"), **options)


def poll_until(c: LitePullConsumer, count: int, limit: float = 30.0) -> list[MessageExt]:
    got: list[MessageExt] = []
    deadline = time.monotonic() + limit
    while len(got) < count and time.monotonic() < deadline:
        got += c.poll(0.5)
    return got


def bodies(msgs: list[MessageExt]) -> list[str]:
    return [m.body.decode() for m in msgs]


# ------------------------------------------------------------------------------------------------ options

def test_options_have_lite_pull_defaults_and_refuse_bad_values() -> None:
    o = LitePullConsumerOptions()
    assert (o.pull_batch_size, o.auto_commit, o.auto_commit_interval, o.poll_timeout, o.pull_threshold_for_all) == \
        (10, True, 5.0, 5.0, 10000)
    with pytest.raises(InvalidParameterError, match="auto_commit_interval"):
        LitePullConsumerOptions(auto_commit_interval=0.1)
    with pytest.raises(InvalidParameterError, match="pull_threshold_for_all"):
        LitePullConsumerOptions(pull_threshold_for_all=0)
    with pytest.raises(InvalidParameterError, match="unknown option"):
        LitePullConsumer("g", "127.0.0.1:1", no_such_option=1)


def test_subscribe_and_assign_are_mutually_exclusive() -> None:
    c = LitePullConsumer("g", "127.0.0.1:1")
    c.subscribe("T", "*")
    with pytest.raises(ClientError, match="mutually exclusive"):
        c.assign([MessageQueue(topic="T", broker_name="b", queue_id=0)])
    d = LitePullConsumer("g", "127.0.0.1:1")
    d.assign([MessageQueue(topic="T", broker_name="b", queue_id=0)])
    with pytest.raises(ClientError, match="mutually exclusive"):
        d.subscribe("T")


# ------------------------------------------------------------------------------------------------ end to end

def test_two_members_of_a_group_receive_every_message_exactly_once(cluster: Cluster, producer: Producer) -> None:
    topic, group = unique("Lite"), unique("LG")
    queues = make_topic(producer, topic)
    with consumer(cluster, group) as a, consumer(cluster, group) as b:
        a.subscribe(topic, "D")
        b.subscribe(topic, "D")

        def settled() -> bool:
            qa, qb = set(a.assignment()), set(b.assignment())
            return bool(qa) and bool(qb) and not qa & qb and qa | qb == set(queues)
        wait_for(settled, 30, "the rebalance to split the queues")
        time.sleep(2.0)  # the hand-off pause of a queue taken while the group has other members
        sent = [f"m{i}" for i in range(60)]
        for s in sent:
            producer.send(Message(topic, s.encode(), tags="D"))
        got: dict[str, list[str]] = {"a": [], "b": []}
        deadline = time.monotonic() + 60
        while len(got["a"]) + len(got["b"]) < len(sent) and time.monotonic() < deadline:
            got["a"] += bodies(a.poll(0.2))
            got["b"] += bodies(b.poll(0.2))
        got["a"] += bodies(a.poll(0.5))  # nothing more comes
        got["b"] += bodies(b.poll(0.5))
        assert got["a"] and got["b"]
        assert sorted(got["a"] + got["b"]) == sorted(sent)  # every message, once, "create" filtered out by tag
        # A member leaves: its shutdown commits what it polled, the other takes its queues from there.
        a.shutdown()
        wait_for(lambda: set(b.assignment()) == set(queues), 30, "the survivor to own every queue")
        later = [f"n{i}" for i in range(20)]
        for s in later:
            producer.send(Message(topic, s.encode(), tags="D"))
        rest = poll_until(b, len(later))
        rest += b.poll(1.0)
        assert sorted(bodies(rest)) == sorted(later)


def test_subscribing_an_unknown_topic_is_refused(cluster: Cluster) -> None:
    c = consumer(cluster, unique("LG"))
    c.subscribe(unique("Missing"), "*")
    with pytest.raises(TopicNotExistError, match="does not exist"):
        c.start()
    c.shutdown()  # not started: nothing to do
    with consumer(cluster, unique("LG")) as d:
        d.assign([MessageQueue(topic="TBW102", broker_name="broker-a", queue_id=0)])
    e = consumer(cluster, unique("LG"))
    e.assign([MessageQueue(topic="TBW102", broker_name="broker-a", queue_id=0)])
    with e:
        with pytest.raises(ClientError, match="mutually exclusive"):
            e.subscribe(unique("Missing"))


def test_assign_and_seek(cluster: Cluster, producer: Producer) -> None:
    topic = unique("LiteSeek")
    queues = make_topic(producer, topic)
    q1 = queues[1]
    for i in range(6):
        producer.send(Message(topic, f"s{i}".encode()), queue=q1)
    with consumer(cluster, unique("LG"), pull_batch_size=4) as c:
        c.assign([q1])
        assert c.assignment() == [q1]
        first = poll_until(c, 6)
        assert bodies(first) == [f"s{i}" for i in range(6)]
        assert [m.queue_offset for m in first] == list(range(6))
        c.seek(q1, 2)
        assert bodies(poll_until(c, 4)) == ["s2", "s3", "s4", "s5"]
        c.seek_to_begin(q1)
        assert bodies(poll_until(c, 6)) == [f"s{i}" for i in range(6)]
        c.seek_to_end(q1)
        assert c.poll(0.5) == []
        producer.send(Message(topic, b"after-end"), queue=q1)
        assert bodies(poll_until(c, 1)) == ["after-end"]
        with pytest.raises(ClientError, match="not in assigned list"):
            c.seek(queues[2], 0)
        with pytest.raises(InvalidParameterError, match="Seek offset illegal"):
            c.seek(q1, 1000)


def test_pause_keeps_a_queue_out_until_resume(cluster: Cluster, producer: Producer) -> None:
    topic = unique("LitePause")
    queues = make_topic(producer, topic)
    q1, q2 = queues[1], queues[2]
    with consumer(cluster, unique("LG")) as c:
        c.assign([q1, q2])
        c.pause([q1])
        for i in range(3):
            producer.send(Message(topic, f"p{i}".encode()), queue=q1)
            producer.send(Message(topic, f"r{i}".encode()), queue=q2)
        got = poll_until(c, 3)
        got += c.poll(1.0)
        assert sorted(bodies(got)) == ["r0", "r1", "r2"]  # nothing of the paused queue
        c.resume([q1])
        assert bodies(poll_until(c, 3)) == ["p0", "p1", "p2"]


def test_commit_sync_persists_where_a_new_consumer_resumes(cluster: Cluster, producer: Producer) -> None:
    topic, group = unique("LiteCommit"), unique("LG")
    q1 = make_topic(producer, topic)[1]
    sent = [f"c{i}" for i in range(8)]
    for s in sent:
        producer.send(Message(topic, s.encode()), queue=q1)
    with consumer(cluster, group, auto_commit=False, pull_batch_size=3) as a:
        a.assign([q1])
        first = poll_until(a, 1)
        assert first and bodies(first) == sent[:len(first)]
        a.commit_sync()
        assert a.committed(q1) == len(first)
        more = a.poll(5.0)  # polled, never committed: the next consumer gets these again
        assert more
    with consumer(cluster, group, auto_commit=False) as b:
        b.assign([q1])
        rest = poll_until(b, len(sent) - len(first))
        assert bodies(rest) == sent[len(first):]
        b.commit_sync({q1: 2})  # an explicit offset, even backwards
        assert b.committed(q1) == 2
        with pytest.raises(ClientError, match="not in assigned list"):
            b.commit_sync({MessageQueue(topic=topic, broker_name=q1.broker_name, queue_id=3): 0})


def test_auto_commit_writes_what_poll_returned(cluster: Cluster, producer: Producer) -> None:
    topic, group = unique("LiteAuto"), unique("LG")
    q2 = make_topic(producer, topic)[2]
    for i in range(5):
        producer.send(Message(topic, f"a{i}".encode()), queue=q2)
    with consumer(cluster, group, auto_commit_interval=1.0) as a:
        a.assign([q2])
        got = poll_until(a, 5)
        assert bodies(got) == [f"a{i}" for i in range(5)]
        # The next polls count the batch as consumed; one after the interval writes it to the broker.
        wait_for(lambda: a.poll(0.2) == [] and a.committed(q2) == 5, 20, "the auto-commit of offset 5")
    producer.send(Message(topic, b"a5"), queue=q2)
    with consumer(cluster, group) as b:
        b.assign([q2])
        assert bodies(poll_until(b, 1)) == ["a5"]
        assert b.poll(0.5) == []


def test_the_async_consumer_polls_too(cluster: Cluster, producer: Producer) -> None:
    topic = unique("LiteAsync")
    q0 = make_topic(producer, topic)[0]  # holds "create"

    async def main() -> list[str]:
        c = AsyncLitePullConsumer(unique("LG"), cluster.ns, consume_from_where="CONSUME_FROM_FIRST_OFFSET",
                                  instance_name=unique("lite"))
        await c.subscribe(topic)
        await c.start()
        try:
            assert q0 in await c.fetch_message_queues(topic)
            out: list[str] = []
            deadline = time.monotonic() + 30
            while not out and time.monotonic() < deadline:
                out += bodies(await c.poll(0.5))
            return out
        finally:
            await c.shutdown()
    assert asyncio.run(main()) == ["create"]


def test_the_cache_is_bounded_by_the_flow_control_thresholds(cluster: Cluster, producer: Producer) -> None:
    topic = unique("LiteFlow")
    q3 = make_topic(producer, topic)[3]
    sent = [f"f{i}" for i in range(30)]
    for s in sent:
        producer.send(Message(topic, s.encode()), queue=q3)
    with consumer(cluster, unique("LG"), pull_batch_size=2, pull_threshold_for_queue=3) as c:
        c.assign([q3])
        impl = c.async_consumer
        wait_for(lambda: impl.flow_control_times > 0, 20, "flow control of the full cache")
        pq = impl.rebalancer.process_queues[q3]
        assert pq.msg_count <= 3 + 2  # over the threshold by at most one pull
        assert bodies(poll_until(c, len(sent))) == sent  # nothing lost while pulling waited
