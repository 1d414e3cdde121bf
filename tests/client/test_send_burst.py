"""The blocking Producer's single sends through SendCall against a real broker: unordered sends written from the
caller's thread; a burst of send_async made while the loop thread is busy (after one that must go through it)
reaches it in one wake-up, and every message is still its own request with its own result; sync sends from
several threads; an invalid message fails only its own future."""
from __future__ import annotations

import threading

import pytest
from sdk_support import Cluster, cluster, needs_broker, topic  # noqa: F401 (fixtures)
from test_sdk_integration import pull_all

from sluice import Message, Producer, PullConsumer, SendStatus
from sluice.errors import MessageIllegalError

pytestmark = [pytest.mark.integration, needs_broker]


def test_a_burst_while_the_loop_is_busy_is_one_wake_up_and_one_result_each(cluster: Cluster, topic: str) -> None:
    with Producer("PG_burst", cluster.ns) as p:
        p.send(Message(topic, b"warm-up"))  # route cached and connection open: the sends below take no task
        loop_thread = p._loop
        assert loop_thread is not None
        busy, release = threading.Event(), threading.Event()
        loop_thread.loop.call_soon_threadsafe(lambda: (busy.set(), release.wait(30)))
        assert busy.wait(30)
        before = loop_thread.wakeups
        msgs = [Message(topic, f"burst-{i}".encode(), properties={"i": str(i)}) for i in range(200)]
        bad = Message(topic, b"")  # empty body: refused before it reaches the wire
        futs = [p.send_async(m) for m in msgs[:100]] + [p.send_async(bad)] + [p.send_async(m) for m in msgs[100:]]
        release.set()
        results = [f.result(30) for f in futs[:100] + futs[101:]]
        with pytest.raises(MessageIllegalError, match="empty"):
            futs[100].result(30)
        assert loop_thread.wakeups == before + 1
        assert all(r.status is SendStatus.SEND_OK for r in results)
        assert len({r.msg_id for r in results}) == 200 and len({r.offset_msg_id for r in results}) == 200
    with PullConsumer("CG_burst", cluster.ns) as c:
        got = {m.msg_id: m.body for m in pull_all(c, topic, expect=201) if m.body != b"warm-up"}
    assert got == {r.msg_id: m.body for r, m in zip(results, msgs)}


def test_sync_sends_from_several_threads_each_get_their_own_result(cluster: Cluster, topic: str) -> None:
    results: dict[int, list[str]] = {}
    with Producer("PG_threads", cluster.ns) as p:
        def work(k: int) -> None:
            results[k] = [p.send(Message(topic, f"t{k}-{i}".encode())).msg_id for i in range(50)]
        threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    ids = [i for part in results.values() for i in part]
    assert len(results) == 4 and len(set(ids)) == 200
    with PullConsumer("CG_threads", cluster.ns) as c:
        got = {m.msg_id: m.body for m in pull_all(c, topic, expect=200)}
    assert set(got) == set(ids)
    assert all(got[msg_id] == f"t{k}-{i}".encode() for k, part in results.items() for i, msg_id in enumerate(part))


def test_unordered_sends_leave_from_the_callers_thread_and_ordered_ones_through_the_loop(cluster: Cluster,
                                                                                      topic: str) -> None:
    with Producer("PG_direct", cluster.ns) as p:
        p.send(Message(topic, b"warm-up"))  # route cached and connection open
        loop_thread = p._loop
        assert loop_thread is not None
        inst = p.async_producer.instance
        conn = inst.remoting._conns[cluster.broker.addr]
        before, wakeups = conn.thread_writes, loop_thread.wakeups
        results = [f.result(30) for f in [p.send_async(Message(topic, f"d{i}".encode())) for i in range(50)]]
        results += [p.send(Message(topic, f"s{i}".encode())) for i in range(10)]
        assert all(r.status is SendStatus.SEND_OK for r in results) and len({r.msg_id for r in results}) == 60
        # The loop thread may be writing something of its own at a send's moment (then that send goes through
        # it); most leave from here, without waking it.
        assert conn.thread_writes - before >= 30 and loop_thread.wakeups - wakeups < 30
        queue = results[0].queue
        ordered_before = conn.thread_writes
        ordered = [p.send(Message(topic, b"q"), queue=queue),
                   p.send(Message(topic, b"s"), selector=lambda qs, m, a: qs[0]),
                   p.send_async(Message(topic, b"qa"), queue=queue).result(30)]
        assert conn.thread_writes == ordered_before and all(r.status is SendStatus.SEND_OK for r in ordered)
    with PullConsumer("CG_direct", cluster.ns) as c:
        got = {m.msg_id: m.body for m in pull_all(c, topic, expect=64)}
    assert {r.msg_id for r in results} <= set(got)


def test_batches_leave_from_the_callers_thread_and_a_bad_one_fails_as_before(cluster: Cluster, topic: str) -> None:
    with Producer("PG_batch_direct", cluster.ns) as p:
        p.send(Message(topic, b"warm-up"))  # route cached and connection open
        loop_thread = p._loop
        assert loop_thread is not None
        conn = p.async_producer.instance.remoting._conns[cluster.broker.addr]
        before, wakeups = conn.thread_writes, loop_thread.wakeups
        batches = [[Message(topic, f"b{k}-{i}".encode(), tags="T") for i in range(8)] for k in range(20)]
        results = [p.send_batch(b) for b in batches]
        assert all(r.status is SendStatus.SEND_OK for r in results)
        assert conn.thread_writes - before >= 10 and loop_thread.wakeups - wakeups < 10
        with pytest.raises(MessageIllegalError, match="empty"):  # refused before the wire, on either road
            p.send_batch([Message(topic, b"ok"), Message(topic, b"")])
        queue = results[0].queue
        pinned_before = conn.thread_writes
        assert p.send_batch([Message(topic, b"pinned")], queue=queue).queue == queue  # pinned: through the loop
        assert conn.thread_writes == pinned_before
    ids = [i for r in results for i in r.msg_id.split(",")]
    assert len(set(ids)) == 160
    with PullConsumer("CG_batch_direct", cluster.ns) as c:
        got = {m.msg_id: m.body for m in pull_all(c, topic, expect=162)}
    assert {i: b for i, b in got.items() if i in set(ids)} == {
        i: m.body for r, b in zip(results, batches) for i, m in zip(r.msg_id.split(","), b)}
