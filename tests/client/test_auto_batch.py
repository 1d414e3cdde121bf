"""Producer auto-batching (``auto_batch``, RocketMQ 5's autoBatch) against a real namesrv + broker: a burst of
sends made while one is in flight goes in batches, yet every message gets its own result (its id, its broker
id, the queue and offset it really has), a bad message fails alone, ineligible messages go alone, and
shutdown sends what still waits."""
from __future__ import annotations

import asyncio
import threading

import pytest
from sdk_support import Cluster, cluster, needs_broker, topic  # noqa: F401 (fixtures)
from test_sdk_integration import pull_all

from sluice import AsyncProducer, Message, Producer, PullConsumer, SendStatus
from sluice.client.options import ProducerOptions
from sluice.errors import InvalidParameterError, MessageIllegalError

pytestmark = [pytest.mark.integration, needs_broker]


def _check_against_store(cluster: Cluster, topic: str, results: dict[bytes, object], expect: int) -> None:
    """Each result names exactly where its message is: same msg_id, offset_msg_id, queue and queue offset."""
    with PullConsumer("CG_" + topic, cluster.ns) as c:
        stored = {m.body: m for m in pull_all(c, topic, expect=expect)}
    assert set(results) <= set(stored)
    for body, r in results.items():
        m = stored[body]
        assert (r.msg_id, r.offset_msg_id, r.queue.queue_id, r.queue_offset) == (  # type: ignore[attr-defined]
            m.msg_id, m.offset_msg_id, m.queue_id, m.queue_offset), body


def test_a_burst_goes_in_batches_and_each_message_gets_its_own_result(cluster: Cluster, topic: str) -> None:
    with Producer("PG_auto", cluster.ns, auto_batch=True, batch_max_delay_ms=50) as p:
        p.send(Message(topic, b"warm-up"))
        msgs = [Message(topic, f"auto-{i}".encode(), tags="T", keys=f"k{i}", properties={"i": str(i)})
                for i in range(300)]
        bad = Message(topic, b"")  # refused on its own, before it could join a batch
        futs = [p.send_async(m) for m in msgs[:150]] + [p.send_async(bad)] + [p.send_async(m) for m in msgs[150:]]
        results = [f.result(30) for f in futs[:150] + futs[151:]]
        with pytest.raises(MessageIllegalError, match="empty"):
            futs[150].result(30)
        acc = p.async_producer.accumulator
        assert acc is not None and acc.batches >= 1 and acc.batched_messages >= 2
    assert all(r.status is SendStatus.SEND_OK for r in results)
    assert len({r.msg_id for r in results}) == 300 and len({r.offset_msg_id for r in results}) == 300
    _check_against_store(cluster, topic, {m.body: r for m, r in zip(msgs, results)}, expect=301)


def test_blocking_sends_from_threads_coalesce_and_ineligible_ones_go_alone(cluster: Cluster, topic: str) -> None:
    results: dict[bytes, object] = {}
    with Producer("PG_auto_threads", cluster.ns, auto_batch=True) as p:
        def work(k: int) -> None:
            for i in range(40):
                body = f"t{k}-{i}".encode()
                results[body] = p.send(Message(topic, body))
        threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        queue = results[b"t0-0"].queue  # type: ignore[attr-defined]
        pinned = p.send(Message(topic, b"pinned"), queue=queue)  # a pinned queue: never batched
        delayed = p.send(Message(topic, b"delayed", delay_level=1))
        big = p.send(Message(topic, b"z" * 5000))  # would be compressed: never batched
    assert pinned.queue == queue and len(results) == 160
    results |= {b"pinned": pinned, b"z" * 5000: big}
    assert all(r.status is SendStatus.SEND_OK for r in results.values())  # type: ignore[attr-defined]
    _check_against_store(cluster, topic, results, expect=162)
    assert delayed.status is SendStatus.SEND_OK


def test_shutdown_sends_what_waits_and_async_sends_batch_too(cluster: Cluster, topic: str) -> None:
    async def main() -> tuple[list[object], int]:
        p = AsyncProducer("PG_auto_async", cluster.ns, auto_batch=True, batch_max_delay_ms=10_000)
        await p.start()
        await p.send(Message(topic, b"warm-up"))
        tasks = [asyncio.ensure_future(p.send(Message(topic, f"a{i}".encode()))) for i in range(50)]
        await asyncio.sleep(0)  # the first goes at once; the others wait for it (and the long max delay)
        await p.shutdown()  # sends them now, and waits for the answers
        assert p.accumulator is not None
        return [t.result() for t in tasks], p.accumulator.batches
    results, batches = asyncio.run(main())
    assert batches >= 1 and all(r.status is SendStatus.SEND_OK for r in results)  # type: ignore[attr-defined]
    _check_against_store(cluster, topic, {f"a{i}".encode(): r for i, r in enumerate(results)}, expect=51)


def test_auto_batch_options_are_checked() -> None:
    with pytest.raises(InvalidParameterError, match="batch_max_bytes"):
        ProducerOptions(batch_max_bytes=0)
    with pytest.raises(InvalidParameterError, match="batch_max_delay_ms"):
        ProducerOptions(batch_max_delay_ms=-1)


def test_a_send_with_nothing_in_flight_leaves_from_the_callers_thread(cluster: Cluster, topic: str) -> None:
    with Producer("PG_auto_direct", cluster.ns, auto_batch=True) as p:
        p.send(Message(topic, b"warm-up"))  # route cached and connection open
        conn = p.async_producer.instance.remoting._conns[cluster.broker.addr]
        loop_thread = p._loop
        assert loop_thread is not None
        before, wakeups = conn.thread_writes, loop_thread.wakeups
        results = {f"one-{i}".encode(): p.send(Message(topic, f"one-{i}".encode())) for i in range(20)}
        # One at a time, nothing is ever in flight: each leaves from here, none waits for a batch.
        assert conn.thread_writes - before >= 10 and loop_thread.wakeups - wakeups < 10
        acc = p.async_producer.accumulator
        assert acc is not None and acc.batches == 0
        big = p.send(Message(topic, b"y" * 5000))  # not batched, still written from here
    assert all(r.status is SendStatus.SEND_OK for r in [*results.values(), big])
    _check_against_store(cluster, topic, {**results, b"y" * 5000: big}, expect=22)


def test_async_sends_from_several_threads_each_get_their_own_result(cluster: Cluster, topic: str) -> None:
    """Caller-thread claims and the loop's waiting sends interleave: nothing is lost, duplicated or misnamed."""
    futs: dict[bytes, object] = {}
    lock = threading.Lock()
    with Producer("PG_auto_mt", cluster.ns, auto_batch=True, batch_max_bytes=2048) as p:
        def work(k: int) -> None:
            for i in range(150):
                body = f"mt{k}-{i}".encode()
                f = p.send_async(Message(topic, body))
                with lock:
                    futs[body] = f
        threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        results = {body: f.result(30) for body, f in futs.items()}  # type: ignore[attr-defined]
    assert len(results) == 600 and all(r.status is SendStatus.SEND_OK for r in results.values())
    assert len({r.msg_id for r in results.values()}) == 600
    _check_against_store(cluster, topic, results, expect=600)
