"""The SDK against real `sluice namesrv` + `sluice broker` subprocesses over TCP."""
from __future__ import annotations

import asyncio
import threading
import time

import pytest
from sdk_support import Cluster, cluster, needs_broker, topic, wait_for, wait_for_route  # noqa: F401 (fixtures)

from sluice import (
    AsyncProducer, AsyncPullConsumer, Message, MessageExt, MessageQueue, MessageSelector, Producer, PullConsumer,
    PullStatus, SendStatus, select_by_hash,
)
from sluice.errors import BrokerResponseError, ClientError, MessageIdKindError, MessageIllegalError, SelectorSyntaxError, TopicNotExistError
from sluice.protocol.bodies import ConsumerListBody, decode_body
from sluice.protocol.codes import RequestCode, ResponseCode
from sluice.protocol.command import RemotingCommand
from sluice.protocol.record import FLAG_COMPRESSED
from sluice.transport.blocking import SyncRemotingClient

pytestmark = [pytest.mark.integration, needs_broker]


def pull_all(c: PullConsumer, topic: str, selector: MessageSelector | str | None = "*",
             expect: int | None = None, timeout: float = 15.0) -> list[MessageExt]:
    """Every message of every queue from offset 0 (waiting, bounded, until ``expect`` are there)."""
    queues = c.fetch_message_queues(topic)
    deadline = time.monotonic() + timeout
    while True:
        out: list[MessageExt] = []
        for q in queues:
            offset = 0
            while True:
                r = c.pull(q, selector, offset, 32)
                out += r.msg_found_list
                if r.status in (PullStatus.NO_NEW_MSG, PullStatus.OFFSET_ILLEGAL) or r.next_begin_offset == offset:
                    break
                offset = r.next_begin_offset
        if expect is None or len(out) >= expect or time.monotonic() > deadline:
            return out
        time.sleep(0.1)


def test_send_sync_async_oneway_batch_and_pull_everything_back(cluster: Cluster, topic: str):
    big = bytes(range(256)) * 40  # 10 KiB: compressed on the way
    sent: dict[str, Message] = {}
    callbacks: list[tuple[object, object]] = []
    with Producer("PG_all", cluster.ns) as p:
        for i in range(5):
            m = Message(topic, f"sync-{i}".encode(), tags=f"T{i % 2}", keys=[f"k{i}", "common"],
                        properties={"i": str(i), "kind": "sync"})
            r = p.send(m)
            assert r.status is SendStatus.SEND_OK and r.queue.topic == topic and len(r.msg_id) == 32
            sent[r.msg_id] = m
        futs = []
        for i in range(5):
            m = Message(topic, f"async-{i}".encode(), tags="TA", properties={"i": str(i)})
            futs.append((p.send_async(m, callback=lambda res, exc: callbacks.append((res, exc))), m))
        for fut, m in futs:
            sent[fut.result(10).msg_id] = m
        for i in range(3):
            p.send_oneway(Message(topic, f"oneway-{i}".encode(), tags="TO"))
        batch = [Message(topic, f"batch-{i}".encode(), tags="TB", keys=f"b{i}", properties={"i": str(i)})
                 for i in range(4)]
        br = p.send_batch(batch)
        assert br.status is SendStatus.SEND_OK and len(br.msg_ids) == 4 and len(br.offset_msg_ids) == 4
        sent.update(zip(br.msg_ids, batch))
        rc = p.send(Message(topic, big, tags="TZ"))
        sent[rc.msg_id] = Message(topic, big, tags="TZ")
    wait_for(lambda: len(callbacks) == 5, 5, "async callbacks")
    assert all(res is not None and exc is None for res, exc in callbacks)

    with PullConsumer("CG_all", cluster.ns) as c:
        got = pull_all(c, topic, expect=len(sent) + 3)
    by_id = {m.msg_id: m for m in got}
    assert len(got) == len(sent) + 3 and len(by_id) == len(got)
    for msg_id, m in sent.items():
        g = by_id[msg_id]
        assert (g.body, g.tags, g.keys, g.user_properties) == (m.body, m.tags, m.key_list(), m.properties)
    assert sorted(m.body for m in got if m.tags == "TO") == [b"oneway-0", b"oneway-1", b"oneway-2"]
    assert by_id[rc.msg_id].sysflag & FLAG_COMPRESSED and by_id[rc.msg_id].body == big


def test_tag_and_sql_pulls(cluster: Cluster, topic: str):
    with Producer("PG_filter", cluster.ns) as p:
        for i in range(12):
            p.send(Message(topic, f"m{i}".encode(), tags="ABC"[i % 3], properties={"a": str(i)}))
        p.send(Message(topic, b"untagged", properties={"a": "100"}))
    with PullConsumer("CG_filter", cluster.ns) as c:
        assert len(pull_all(c, topic, expect=13)) == 13
        tagged = pull_all(c, topic, MessageSelector.by_tag("A || C"))
        assert sorted(m.body for m in tagged) == sorted(f"m{i}".encode() for i in range(12) if i % 3 != 1)
        sql = pull_all(c, topic, MessageSelector.by_sql("a > 5 AND a < 100"))
        assert sorted(m.body for m in sql) == sorted(f"m{i}".encode() for i in range(6, 12))
        both = pull_all(c, topic, MessageSelector.by_sql("TAGS = 'B' OR a >= 100"))
        assert sorted(m.body for m in both) == sorted([b"m1", b"m4", b"m7", b"m10", b"untagged"])
        with pytest.raises(SelectorSyntaxError):
            c.pull(c.fetch_message_queues(topic)[0], MessageSelector.by_sql("a >"), 0)


def test_pull_consumer_changes_its_selector_after_a_heartbeat(cluster: Cluster, topic: str):
    # Issue #16: pull TagA, heartbeat (the broker holds TagA for this client), pull TagB. The pull carries its
    # own subscription (FLAG_SUBSCRIPTION), which RocketMQ uses: one client never conflicts with itself.
    with Producer("PG_resel", cluster.ns) as p:
        for tag in ("TagA", "TagB", "TagA", "TagB"):
            p.send(Message(topic, tag.encode(), tags=tag))
    with PullConsumer("CG_resel", cluster.ns) as c:
        assert [m.body for m in pull_all(c, topic, "TagA", expect=2)] == [b"TagA", b"TagA"]
        c._run(c.async_consumer.instance.send_heartbeat_to_all(), 10)
        assert [m.body for m in pull_all(c, topic, "TagB", expect=2)] == [b"TagB", b"TagB"]
        c._run(c.async_consumer.instance.send_heartbeat_to_all(), 10)  # the new selector is the group's now
        assert len(pull_all(c, topic, "TagA", expect=2)) == 2
        # Another member of the group, subscribed by heartbeat to TagA, still refuses a third client's TagB pull
        # (Sluice's conflict guard between clients is unchanged).
        with PullConsumer("CG_resel", cluster.ns, instance_name="other") as c2:
            with pytest.raises(BrokerResponseError, match="subscription conflict") as info:
                c2.pull(c2.fetch_message_queues(topic)[0], "TagC", 0)
            assert info.value.code == ResponseCode.SUBSCRIPTION_NOT_LATEST


def test_offsets_committed_and_read_back(cluster: Cluster, topic: str):
    with Producer("PG_off", cluster.ns) as p:
        results = [p.send(Message(topic, b"x"), queue=MessageQueue(topic=topic, broker_name="broker-a", queue_id=0))
                   for _ in range(3)]
    mq = results[0].queue
    assert [r.queue_offset for r in results] == [0, 1, 2]
    with PullConsumer("CG_off", cluster.ns) as c:
        assert c.fetch_consume_offset(mq) == -1
        wait_for(lambda: c.max_offset(mq) == 3, 10, "three messages dispatched")
        assert c.min_offset(mq) == 0
        c.update_consumer_offset(mq, 2)
        assert c.fetch_consume_offset(mq, from_store=False) == 2
        c.commit()
        assert c.fetch_consume_offset(mq) == 2
        c.update_consumer_offset(mq, 3)  # committed by shutdown
    with PullConsumer("CG_off", cluster.ns, instance_name="other") as c2:
        assert c2.fetch_consume_offset(mq) == 3
        assert c2.search_offset(mq, 0) == 0
        assert c2.search_offset(mq, int(time.time() * 1000) + 60_000) in (2, 3)


def test_view_and_query_message(cluster: Cluster, topic: str):
    with Producer("PG_view", cluster.ns) as p:
        r1 = p.send(Message(topic, b"one", tags="A", keys=["order-1", "shared"]))
        r2 = p.send(Message(topic, b"two", keys="shared"))
    with PullConsumer("CG_view", cluster.ns) as c:
        m = c.view_message(r1.offset_msg_id)
        assert (m.body, m.msg_id, m.tags, m.offset_msg_id) == (b"one", r1.msg_id, "A", r1.offset_msg_id)
        now = int(time.time() * 1000)
        found = wait_for(lambda: c.query_message(topic, "shared", 32, now - 60_000, now + 60_000), 10, "key index")
        assert sorted(x.body for x in found) == [b"one", b"two"]
        assert [x.body for x in c.query_message(topic, "order-1", 32, 0, now + 60_000)] == [b"one"]
        assert c.query_message(topic, "nope", 32, 0, now + 60_000) == []
        uniq = c.query_message(topic, r2.msg_id, 32, 0, now + 60_000, unique_key=True)
        assert [x.body for x in uniq] == [b"two"]
        # A client msgId where the offset msgId belongs: named, with the lookup that takes it (was OverflowError).
        with pytest.raises(MessageIdKindError, match="client msgId \\(UNIQ_KEY") as info:
            c.view_message(r2.msg_id)
        assert info.value.kind == "msgId (UNIQ_KEY)"


def test_ordered_sends_keep_key_order(cluster: Cluster, topic: str):
    keys = ("alpha", "beta", "gamma")
    sends = [(key, i) for i in range(6) for key in keys]
    with Producer("PG_order", cluster.ns) as p:
        results = [p.send(Message(topic, f"{key}:{i}".encode()), selector=select_by_hash, arg=key) for key, i in sends]
        queues = p.fetch_publish_queues(topic)
    for key in keys:
        assert {r.queue for (k, _), r in zip(sends, results) if k == key} == {
            select_by_hash(queues, Message(topic, b"x"), key)}
    with PullConsumer("CG_order", cluster.ns) as c:
        got = pull_all(c, topic, expect=18)
    for key in keys:
        mine = [m for m in got if m.body.startswith(key.encode())]
        assert [m.body for m in mine] == [f"{key}:{i}".encode() for i in range(6)]
        assert len({m.queue_id for m in mine}) == 1


def test_long_polling_pull_wakes_on_arrival(cluster: Cluster, topic: str):
    with Producer("PG_poll", cluster.ns) as p, PullConsumer("CG_poll", cluster.ns) as c:
        mq = p.send(Message(topic, b"first"), queue=MessageQueue(topic=topic, broker_name="broker-a",
                                                                 queue_id=1)).queue
        wait_for(lambda: c.max_offset(mq) == 1, 10, "first message dispatched")
        box: list[object] = []
        t = threading.Thread(target=lambda: box.append(c.pull_block_if_not_found(mq, "*", 1, suspend_timeout=15)))
        t.start()
        time.sleep(0.5)
        p.send(Message(topic, b"second"), queue=mq)
        t.join(20)
        assert not t.is_alive()
        (r,) = box
        assert r.status is PullStatus.FOUND and [m.body for m in r.msg_found_list] == [b"second"]


def test_errors(cluster: Cluster, topic: str):
    with Producer("PG_err", cluster.ns) as p:
        with pytest.raises(MessageIllegalError):
            p.send(Message("bad topic!", b"x"))
        with pytest.raises(MessageIllegalError, match="limit"):
            p.send(Message(topic, b"x" * (4 * 1024 * 1024 + 1)))
        with pytest.raises(ClientError, match="already started"):
            p.start()
        with pytest.raises(ClientError, match="already started in this client instance"):
            Producer("PG_err", cluster.ns).start()
        p.send(Message(topic, b"ok"))
    with PullConsumer("CG_err", cluster.ns) as c:
        with pytest.raises(TopicNotExistError):
            c.fetch_message_queues("NoSuchTopic_xyz")
        # Broker error answers raise the class of their code, with the broker's remark as message.
        c.fetch_message_queues(topic)  # the sends above created it: now broker-a's address is known
        with pytest.raises(TopicNotExistError, match="NoSuchTopic_xyz.*apply first") as info:
            c.pull(MessageQueue(topic="NoSuchTopic_xyz", broker_name="broker-a", queue_id=0), "*", 0)
        assert info.value.code == ResponseCode.TOPIC_NOT_EXIST
        with pytest.raises(BrokerResponseError) as info2:  # an offset id whose commit-log offset holds nothing
            c.view_message(f"7F000001{int(cluster.brokers[0].port):08X}00000000FFFFFF00")
        assert info2.value.code == ResponseCode.SYSTEM_ERROR and str(info2.value)


def test_heartbeat_registers_the_consumer_group(cluster: Cluster, topic: str):
    with Producer("PG_hb", cluster.ns) as p:
        p.send(Message(topic, b"x"))
    with PullConsumer("CG_hb", cluster.ns) as c:
        c.fetch_message_queues(topic)  # learns the broker, which gets a heartbeat at once
        client_id = c.async_consumer.instance.client_id
        with SyncRemotingClient() as rc:
            def ids() -> list[str]:
                resp = rc.invoke(cluster.brokers[0].addr, RemotingCommand.request(
                    RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": "CG_hb"}))
                return decode_body(ConsumerListBody, resp.body).consumer_id_list if resp.code == 0 and resp.body else []
            assert client_id in wait_for(ids, 10, "consumer registered")


def test_async_producer_and_consumer(cluster: Cluster, topic: str):
    async def main() -> list[bytes]:
        async with AsyncProducer("PG_aio", cluster.ns) as p:
            results = await asyncio.gather(*(p.send(Message(topic, f"a{i}".encode())) for i in range(20)))
            assert len({r.msg_id for r in results}) == 20
        async with AsyncPullConsumer("CG_aio", cluster.ns) as c:
            queues = await c.fetch_message_queues(topic)
            deadline = time.monotonic() + 10
            while True:  # the broker makes messages pullable shortly after storing them
                out = []
                for q in queues:
                    r = await c.pull(q, None, 0, 64)
                    out += [m.body for m in r.msg_found_list]
                if len(out) >= 20 or time.monotonic() > deadline:
                    return sorted(out)
                await asyncio.sleep(0.05)

    assert asyncio.run(main()) == sorted(f"a{i}".encode() for i in range(20))


def test_new_topic_is_created_through_tbw102_then_routed_for_real(cluster: Cluster, topic: str):
    with Producer("PG_auto", cluster.ns, poll_namesrv_interval=0.3, instance_name="auto") as p:
        inst = p.async_producer.instance
        r = p.send(Message(topic, b"first"))
        assert r.status is SendStatus.SEND_OK and topic in inst.from_default
        wait_for_route(cluster.ns, topic)  # the broker registered the topic it created
        wait_for(lambda: topic not in inst.from_default, 10, "route refresh timer")
        assert len(p.fetch_publish_queues(topic)) == 4  # defaultTopicQueueNums
        assert p.send(Message(topic, b"second")).status is SendStatus.SEND_OK


def test_send_message_v1_header(cluster: Cluster, topic: str):
    with Producer("PG_v1", cluster.ns, use_v2_header=False, compress_over=64) as p:
        r = p.send(Message(topic, b"v1" * 100, tags="V1", properties={"p": "q"}))
    with PullConsumer("CG_v1", cluster.ns) as c:
        (m,) = pull_all(c, topic, expect=1)
    assert (m.msg_id, m.body, m.tags, m.user_properties) == (r.msg_id, b"v1" * 100, "V1", {"p": "q"})
    assert m.sysflag & FLAG_COMPRESSED
