"""Unit and property tests of the push consumer's parts and the broker's schedule rules (no servers)."""
from __future__ import annotations

import asyncio
import json
import math
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.broker.config import BrokerConfig
from sluice.broker.controller import BrokerController
from sluice.broker.schedule import (
    MAX_HOP_MS, MAX_TIMER_DELAY_MS, TIMER_BUCKETS, TIMER_TOPIC, parse_delay_levels, timer_bucket, timer_hop_ms,
)
from sluice.broker.topics import SCHEDULE_TOPIC
from sluice.client import consume_service
from sluice.client.consume_service import SPREAD_COST_S, ConcurrentConsumeService, call_listener, job_count
from sluice.client.push_options import (
    ConsumeOrderlyResult, ConsumeResult, PushConsumerOptions, parse_consume_timestamp,
)
from sluice.client.offset_store import LocalFileOffsetStore
from sluice.client.process_queue import ProcessQueue
from sluice.client.results import MessageQueue
from sluice.errors import InvalidParameterError, MessageIllegalError
from sluice.message import Message, MessageExt
from sluice.protocol import properties as P
from sluice.store.types import StoreMessage


def _msg(offset: int, body: bytes = b"x") -> MessageExt:
    return MessageExt(topic="T", body=body, properties={}, queue_id=0, queue_offset=offset, commitlog_offset=0,
                      msg_id=f"id{offset}", offset_msg_id="", sysflag=0, flag=0, born_timestamp=0,
                      born_host=("127.0.0.1", 0), store_timestamp=0, store_host=("127.0.0.1", 1), reconsume_times=0,
                      body_crc=0, store_size=0)


# ------------------------------------------------------------------------------------------ ProcessQueue

@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, 5), min_size=1, max_size=40), st.randoms(use_true_random=False))
def test_process_queue_commits_the_lowest_offset_still_cached(gaps: list[int], rnd) -> None:  # type: ignore[no-untyped-def]
    pq = ProcessQueue()
    offsets, off = [], 100
    for g in gaps:
        off += g
        offsets.append(off)
    msgs = [_msg(o, b"ab") for o in offsets]
    assert pq.put(msgs) == msgs
    assert pq.put(msgs[:3]) == []  # already cached
    assert pq.msg_count == len(msgs) and pq.msg_size == 2 * len(msgs)
    assert pq.max_span == offsets[-1] - offsets[0]
    order = list(msgs)
    rnd.shuffle(order)
    remaining = set(offsets)
    for m in order:
        commit = pq.remove([m])
        remaining.discard(m.queue_offset)
        assert commit == (min(remaining) if remaining else offsets[-1] + 1)
    assert pq.msg_count == 0 and pq.msg_size == 0


def test_process_queue_orderly_take_commit_and_retry_in_place() -> None:
    pq = ProcessQueue()
    pq.put([_msg(o) for o in (5, 6, 7, 8)])
    batch = pq.take(2)
    assert [m.queue_offset for m in batch] == [5, 6] and list(pq.msgs) == [7, 8]
    pq.make_back_to_consume(batch)  # failed: back at the head, in order
    assert list(pq.msgs) == [5, 6, 7, 8] and not pq.consuming
    assert [m.queue_offset for m in pq.take(3)] == [5, 6, 7]
    assert pq.commit() == 8 and pq.msg_count == 1
    assert pq.commit() == -1
    pq.put([_msg(4)])  # an older offset (re-pull after a reset) is kept in order
    assert list(pq.msgs) == [4, 8]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.integers(0, 60), max_size=12), min_size=1, max_size=12),
       st.lists(st.integers(0, 60), max_size=20))
def test_process_queue_batch_put_matches_message_by_message(pulls: list[list[int]], consumed: list[int]) -> None:
    """put() takes a whole ascending pull in one step; re-pulls, overlaps and out-of-order pulls end exactly
    as the message-by-message model says (fresh ones returned, offsets kept sorted, gauges right)."""
    pq = ProcessQueue()
    model: dict[int, int] = {}
    for pull in [sorted(set(p)) for p in pulls] + [[3, 1, 2]]:
        consumed_now = sorted({o for o in consumed if o in model})
        pq.remove([pq.msgs[o] for o in consumed_now])
        for o in consumed_now:
            del model[o]
        fresh = pq.put([_msg(o, b"x" * (o % 3)) for o in pull])
        want = []
        for o in pull:
            if o not in model:
                model[o] = o % 3
                want.append(o)
        assert [m.queue_offset for m in fresh] == want
        assert list(pq.msgs) == sorted(model)
        assert pq.msg_count == len(model) and pq.msg_size == sum(model.values())
        assert pq.queue_offset_max == max([pq.queue_offset_max, *pull])


def test_process_queue_remove_of_a_whole_batch_keeps_the_lowest_uncommitted() -> None:
    pq = ProcessQueue()
    msgs = [_msg(o) for o in range(10, 20)]
    pq.put(msgs)
    assert pq.remove([m for m in msgs if m.queue_offset != 13]) == 13  # one failed message holds the offset
    assert pq.msg_count == 1 and pq.remove([msgs[3]]) == 20


def test_pull_size_grows_with_the_backlog_within_bounds() -> None:
    o = PushConsumerOptions()
    assert o.pull_batch_size_max == 256
    assert [o.next_pull_size(b) for b in (0, 10, 32, 33, 100, 256, 257, 100_000)] == \
        [32, 32, 32, 33, 100, 256, 256, 256]  # caught up: back to pull_batch_size
    assert PushConsumerOptions(pull_threshold_for_queue=100).next_pull_size(10**6) == 100
    assert PushConsumerOptions(pull_batch_size_max=32).next_pull_size(10**6) == 32  # growth off
    assert PushConsumerOptions(pull_batch_size=512).next_pull_size(10**6) == 512  # never below the base
    for bad in (0, 1025):
        with pytest.raises(InvalidParameterError):
            PushConsumerOptions(pull_batch_size_max=bad)


def test_a_pulls_batches_spread_over_threads_only_as_far_as_the_listener_is_slow() -> None:
    assert job_count(32, 20, SPREAD_COST_S) == 20  # unmeasured (the initial estimate): every free thread
    assert job_count(32, 20, 1.0) == 20 and job_count(5, 20, 1.0) == 5  # slow: one batch per thread
    assert job_count(256, 20, 1e-6) == 1  # fast: a hand-off would cost more than the calls
    assert job_count(8, 20, 3 * SPREAD_COST_S / 8) == 3  # each job holds at least SPREAD_COST_S of work
    assert job_count(32, 0, 1.0) == 1 and job_count(32, -3, 1.0) == 1  # a busy pool: one job


# ------------------------------------------------------------------------------------------ options, results

class _Offsets:
    def __init__(self) -> None:
        self.updates: list[tuple[MessageQueue, int]] = []

    def update(self, mq: MessageQueue, offset: int, increase_only: bool = False) -> None:
        self.updates.append((mq, offset))


def test_a_pulled_batch_reaches_the_listener_without_waiting_for_the_loop() -> None:
    """submit() hands the batch to the pool itself: the listener runs while the loop is still busy (the pull
    loop sends its next pull meanwhile) instead of after a task started in the next loop iteration. Its answer
    is applied on the loop afterwards: the offset moves past the batch and nothing stays busy."""
    mq = MessageQueue(topic="T", broker_name="b", queue_id=0)
    pq = ProcessQueue()
    called = threading.Event()

    def listener(msgs: list[MessageExt]) -> ConsumeResult:
        called.set()
        return ConsumeResult.SUCCESS

    async def main() -> None:
        offsets = _Offsets()
        consumer = SimpleNamespace(group="g", options=PushConsumerOptions(consume_message_batch_max_size=32),
                                   offset_store=offsets,
                                   rebalancer=SimpleNamespace(process_queues={mq: pq}))
        service = ConcurrentConsumeService(consumer, listener)  # type: ignore[arg-type]
        msgs = pq.put([_msg(7), _msg(8)])
        service.submit(mq, pq, msgs)
        assert called.wait(30)  # the loop has not run since submit()
        assert pq.busy == 1 and service.jobs == 1
        await service.shutdown(30)
        assert offsets.updates == [(mq, 9)] and pq.msg_count == 0
        assert pq.busy == 0 and service.jobs == 0 and service.consumed == 2
    asyncio.run(main())


def test_a_small_delivery_to_an_idle_pool_is_handed_over(monkeypatch: pytest.MonkeyPatch) -> None:
    """A delivery of at most HANDOFF_MAX_MESSAGES to an idle pool: submit() returns once a consume thread has
    taken it (with the bound raised here, never late). A larger one, or one while a job is in flight, is
    queued without waiting. Every message reaches the listener once and the offset moves past them all."""
    monkeypatch.setattr(consume_service, "HANDOFF_WAIT_S", 30.0)
    mq = MessageQueue(topic="T", broker_name="b", queue_id=0)
    pq = ProcessQueue()
    release = threading.Event()
    seen: list[int] = []

    def listener(msgs: list[MessageExt]) -> ConsumeResult:
        seen.extend(m.queue_offset for m in msgs)
        if msgs[0].queue_offset == 0:  # the first job stays in flight until released
            release.wait(30)
        return ConsumeResult.SUCCESS

    async def main() -> None:
        offsets = _Offsets()
        consumer = SimpleNamespace(group="g", options=PushConsumerOptions(consume_message_batch_max_size=32),
                                   offset_store=offsets, rebalancer=SimpleNamespace(process_queues={mq: pq}))
        service = ConcurrentConsumeService(consumer, listener)  # type: ignore[arg-type]
        small = consume_service.HANDOFF_MAX_MESSAGES
        service.submit(mq, pq, pq.put([_msg(i) for i in range(small)]))
        assert (service.handoffs, service.handoffs_late) == (1, 0)  # taken by a thread before submit returned
        service.submit(mq, pq, pq.put([_msg(small)]))  # a job is in flight: queued
        release.set()
        while service.jobs:
            await asyncio.sleep(0.01)
        service.submit(mq, pq, pq.put([_msg(i) for i in range(small + 1, 2 * small + 2)]))  # too many to wait
        assert service.handoffs == 1
        await service.shutdown(30)
        assert sorted(seen) == list(range(2 * small + 2)) and service.consumed == 2 * small + 2
        assert offsets.updates[-1] == (mq, 2 * small + 2) and pq.msg_count == 0 and service.handoffs_late == 0
    asyncio.run(main())


def test_a_delivery_after_the_thread_went_idle_is_handed_over_before_the_loop_sees_the_job_end(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The hand-over asks whether every consume thread is parked, not whether the loop has run the last
    job's completion yet: a delivery right behind a finished job (at 10,000 msgs/s most are) is handed
    over too. The loop does not run between the two submits here, so the first job is still counted."""
    monkeypatch.setattr(consume_service, "HANDOFF_WAIT_S", 30.0)
    mq = MessageQueue(topic="T", broker_name="b", queue_id=0)
    pq = ProcessQueue()
    seen: list[tuple[int, str]] = []

    def listener(msgs: list[MessageExt]) -> ConsumeResult:
        seen.append((msgs[0].queue_offset, threading.current_thread().name))
        return ConsumeResult.SUCCESS

    async def main() -> None:
        offsets = _Offsets()
        consumer = SimpleNamespace(group="g", options=PushConsumerOptions(), offset_store=offsets,
                                   rebalancer=SimpleNamespace(process_queues={mq: pq}))
        service = ConcurrentConsumeService(consumer, listener)  # type: ignore[arg-type]
        service.submit(mq, pq, pq.put([_msg(0)]))
        parked = threading.Event()
        while not service.threads.all_idle:  # the thread parks once its job is done; the loop is not run
            parked.wait(0.001)
        assert service.jobs == 1 and pq.busy == 1
        service.submit(mq, pq, pq.put([_msg(1)]))
        assert (service.handoffs, service.handoffs_late) == (2, 0)
        await service.shutdown(30)
        assert seen == [(0, "sluice-consume-g_0"), (1, "sluice-consume-g_0")]  # one thread, woken twice
        assert offsets.updates[-1] == (mq, 2) and pq.msg_count == 0 and service.consumed == 2
        assert service.jobs == 0 and pq.busy == 0
    asyncio.run(main())


def test_a_hand_over_taken_late_stops_the_waiting_for_a_while(monkeypatch: pytest.MonkeyPatch) -> None:
    """A consume thread that does not take a hand-over within HANDOFF_WAIT_S (here: never waited for) counts it
    late and the next small deliveries are queued without waiting until HANDOFF_BACKOFF_S has passed."""
    monkeypatch.setattr(consume_service, "HANDOFF_WAIT_S", 0.0)
    monkeypatch.setattr(consume_service, "HANDOFF_BACKOFF_MIN_S", 3600.0)
    monkeypatch.setattr(consume_service, "HANDOFF_BACKOFF_S", 3600.0)
    mq = MessageQueue(topic="T", broker_name="b", queue_id=0)
    pq = ProcessQueue()

    async def main() -> None:
        consumer = SimpleNamespace(group="g", options=PushConsumerOptions(), offset_store=_Offsets(),
                                   rebalancer=SimpleNamespace(process_queues={mq: pq}))
        service = ConcurrentConsumeService(consumer, lambda msgs: ConsumeResult.SUCCESS)  # type: ignore[arg-type]
        gate = threading.Event()
        real_call = service._call

        def slow_call(*args):  # type: ignore[no-untyped-def]
            gate.wait(30)  # the thread takes the job only once the loop has stopped waiting
            return real_call(*args)
        service._call = slow_call  # type: ignore[method-assign]
        service.submit(mq, pq, pq.put([_msg(0)]))
        assert (service.handoffs, service.handoffs_late) == (1, 1)
        gate.set()
        while service.jobs:
            await asyncio.sleep(0.01)
        service.submit(mq, pq, pq.put([_msg(1)]))  # within the back-off: queued, no wait
        assert (service.handoffs, service.handoffs_late) == (1, 1)
        await service.shutdown(30)
        assert service.consumed == 2 and pq.msg_count == 0
    asyncio.run(main())


def test_consume_inline_calls_the_listener_on_the_loop_thread_and_acts_on_its_answer(
        caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    """consume_inline: submit() runs the listener on the loop's own thread, every batch of the pull in order,
    and no consume thread; success, failure (send-back) and offsets then go as with the pool. A slow call is
    logged once within INLINE_WARN_EVERY_S, naming the option; after shutdown nothing is called."""
    monkeypatch.setattr(consume_service, "INLINE_SLOW_S", 0.02)
    mq = MessageQueue(topic="T", broker_name="b", queue_id=0)
    pq = ProcessQueue()
    calls: list[tuple[int, list[int]]] = []

    def listener(msgs: list[MessageExt]) -> ConsumeResult:
        calls.append((threading.get_ident(), [m.queue_offset for m in msgs]))
        if msgs[0].queue_offset in (9, 19):
            import time
            time.sleep(0.05)
        return ConsumeResult.SUCCESS

    async def main() -> None:
        offsets = _Offsets()
        consumer = SimpleNamespace(group="g", options=PushConsumerOptions(consume_inline=True,
                                                                          consume_message_batch_max_size=2),
                                   offset_store=offsets, rebalancer=SimpleNamespace(process_queues={mq: pq}))
        service = ConcurrentConsumeService(consumer, listener)  # type: ignore[arg-type]
        before = threading.active_count()
        service.submit(mq, pq, pq.put([_msg(o) for o in range(5)]))
        assert calls == [(threading.get_ident(), [0, 1]), (threading.get_ident(), [2, 3]),
                         (threading.get_ident(), [4])]  # all on this (the loop's) thread, before submit returned
        assert threading.active_count() == before and service.handoffs == 0
        await asyncio.sleep(0)
        while service.jobs:
            await asyncio.sleep(0.001)
        assert offsets.updates[-1] == (mq, 5) and pq.msg_count == 0 and service.consumed == 5
        with caplog.at_level("WARNING", logger="sluice.client.consume_service"):
            for o in (9, 10, 19):  # 9 and 19 are slow, twice over the bound: one warning within the minute
                service.submit(mq, pq, pq.put([_msg(o)]))
        slow = [r for r in caplog.records if "consume_inline" in r.getMessage()]
        assert service.inline_slow == 2 and len(slow) == 1 and "took" in slow[0].getMessage()
        await service.shutdown(30)
        n = len(calls)
        service.submit(mq, pq, pq.put([_msg(200)]))  # shut down: logged and not called, as with the pool
        assert len(calls) == n
    asyncio.run(main())


def test_consume_inline_failures_go_back_as_with_the_pool() -> None:
    """A listener raising on the loop thread: the batch is sent back (here the send-back fails: kept and
    consumed again locally), the loop and the service go on."""
    mq = MessageQueue(topic="T", broker_name="b", queue_id=0)
    pq = ProcessQueue()
    seen: list[int] = []

    def listener(msgs: list[MessageExt]) -> ConsumeResult:
        seen.extend(m.queue_offset for m in msgs)
        if len(seen) == 1:
            raise ValueError("first call fails")
        return ConsumeResult.SUCCESS

    async def main() -> None:
        offsets = _Offsets()
        opts = PushConsumerOptions(consume_inline=True, consume_later_delay=0.01)
        consumer = SimpleNamespace(group="g", options=opts, offset_store=offsets,
                                   rebalancer=SimpleNamespace(process_queues={mq: pq}),
                                   instance=SimpleNamespace(api=None))
        service = ConcurrentConsumeService(consumer, listener)  # type: ignore[arg-type]

        async def no_send_back(*_a, **_k):  # type: ignore[no-untyped-def]
            return False
        service._send_back = no_send_back  # type: ignore[method-assign]
        service.submit(mq, pq, pq.put([_msg(3)]))
        for _ in range(3000):
            if offsets.updates and offsets.updates[-1] == (mq, 4):
                break
            await asyncio.sleep(0.001)
        assert seen == [3, 3] and offsets.updates[-1] == (mq, 4) and service.failed == 1 and service.consumed == 1
        await service.shutdown(30)
    asyncio.run(main())


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.floats(0, 0.3)), max_size=30))
def test_the_hand_over_pause_doubles_per_late_one_in_a_row_and_resets_on_one_in_time(
        outcomes: list[tuple[bool, float]]) -> None:
    lo, hi = consume_service.HANDOFF_BACKOFF_MIN_S, consume_service.HANDOFF_BACKOFF_S
    b = consume_service.HandoffBackoff()
    now, in_a_row, until = 100.0, 0, 0.0
    for late, dt in outcomes:
        now += dt
        assert b.allows(now) == (now >= until)
        b.taken(late, now)
        if late:
            until = now + min(lo * 2 ** in_a_row, hi)
            in_a_row += 1
        else:
            in_a_row = 0
        assert b.pause == min(lo * 2 ** in_a_row, hi)
        assert not late or not b.allows(now)
    assert b.allows(until)


def test_one_late_hand_over_pauses_briefly_and_many_pause_up_to_the_bound() -> None:
    b = consume_service.HandoffBackoff()
    assert b.allows(0.0)
    b.taken(True, 10.0)
    assert not b.allows(10.0 + consume_service.HANDOFF_BACKOFF_MIN_S / 2)
    assert b.allows(10.0 + consume_service.HANDOFF_BACKOFF_MIN_S)
    for i in range(10):
        b.taken(True, 20.0 + i)
    assert not b.allows(29.0 + consume_service.HANDOFF_BACKOFF_S * 0.99)
    assert b.allows(29.0 + consume_service.HANDOFF_BACKOFF_S)
    b.taken(False, 40.0)
    b.taken(True, 50.0)
    assert b.allows(50.0 + consume_service.HANDOFF_BACKOFF_MIN_S)


def test_options_validate_and_default_like_rocketmq() -> None:
    o = PushConsumerOptions()
    assert o.consume_inline is False
    with pytest.raises(InvalidParameterError, match="consume_inline"):
        PushConsumerOptions(consume_inline="yes")  # type: ignore[arg-type]
    assert (o.pull_batch_size, o.pull_threshold_for_queue, o.pull_threshold_size_for_queue,
            o.consume_concurrently_max_span, o.consume_thread_max, o.consume_message_batch_max_size) == \
        (32, 1000, 100, 2000, 20, 1)
    assert o.effective_max_reconsume(False) == 16 and o.effective_max_reconsume(True) == 2**31 - 1
    assert PushConsumerOptions(max_reconsume_times=3).effective_max_reconsume(True) == 3
    # A send-back names no limit unless one was set (the group's retryMaxTimes decides); orderly names its own.
    assert (o.send_back_max_reconsume(False), o.send_back_max_reconsume(True)) == (None, 2**31 - 1)
    assert PushConsumerOptions(max_reconsume_times=0).send_back_max_reconsume(False) == 0
    for bad in ({"message_model": "X"}, {"consume_from_where": "X"}, {"pull_batch_size": 0},
                {"consume_message_batch_max_size": 0}, {"broker_suspend_max": 40.0}, {"rebalance_interval": 0.5},
                {"max_reconsume_times": -2}, {"allocate_strategy": "NOPE"}, {"consume_timestamp": "2024"}):
        with pytest.raises(InvalidParameterError):
            PushConsumerOptions(**bad)  # type: ignore[arg-type]
    assert PushConsumerOptions(allocate_strategy=lambda cid, mqs, cids: list(mqs)).allocate_strategy


def test_consume_timestamp_accepts_epoch_ms_and_rocketmq_text() -> None:
    assert parse_consume_timestamp(1_700_000_000_000) == 1_700_000_000_000
    assert parse_consume_timestamp("20240102030405") > 1_700_000_000_000
    with pytest.raises(InvalidParameterError):
        parse_consume_timestamp("2024-01-02")


def test_listener_outcomes() -> None:
    assert call_listener(lambda ms: ConsumeResult.SUCCESS, [])
    assert call_listener(lambda ms: ConsumeOrderlyResult.SUCCESS, [])
    assert not call_listener(lambda ms: ConsumeResult.RECONSUME_LATER, [])
    assert not call_listener(lambda ms: None, [])  # no answer = try later, as RocketMQ
    assert not call_listener(lambda ms: 1 / 0, [])  # a raising listener does not kill the consumer


# ------------------------------------------------------------------------------------------ offset stores

def test_local_file_offset_store_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "DEFAULT" / "g" / "offsets.json"
    mq0, mq1 = (MessageQueue(topic="T", broker_name="b", queue_id=i) for i in (0, 1))

    async def run() -> None:
        s = LocalFileOffsetStore(path)
        await s.load()
        assert await s.read_store(mq0) == -1
        s.update(mq0, 10)
        s.update(mq0, 7, increase_only=True)  # never backwards when asked so
        s.update(mq1, 3)
        await s.persist_all([mq0])
        doc = json.loads(path.read_text())
        assert {(e["queueId"], e["offset"]) for e in doc["offsetTable"]} == {(0, 10), (1, 3)}
        s2 = LocalFileOffsetStore(path)
        await s2.load()
        assert await s2.read_store(mq0) == 10 and s2.read_memory(mq1) == 3
        s2.remove(mq1)
        assert s2.read_memory(mq1) == -1
    asyncio.run(run())


def test_local_file_offset_store_ignores_damaged_entries(tmp_path: Path) -> None:
    path = tmp_path / "offsets.json"
    path.write_text(json.dumps({"offsetTable": [{"topic": "T", "brokerName": "b", "queueId": 0, "offset": 5},
                                                {"topic": "T", "queueId": "x"}]}))

    async def run() -> int:
        s = LocalFileOffsetStore(path)
        await s.load()
        return await s.read_store(MessageQueue(topic="T", broker_name="b", queue_id=0))
    assert asyncio.run(run()) == 5


# ------------------------------------------------------------------------------------------ schedule rules

def test_delay_levels_parse() -> None:
    assert parse_delay_levels(BrokerConfig().message_delay_level)[:5] == [1000, 5000, 10000, 30000, 60000]
    assert len(parse_delay_levels(BrokerConfig().message_delay_level)) == 18
    assert parse_delay_levels("100ms 2s 1m 1h 1d") == [100, 2000, 60000, 3_600_000, 86_400_000]
    for bad in ("", "5", "1x", "s"):
        with pytest.raises(InvalidParameterError):
            parse_delay_levels(bad)


def test_timer_buckets() -> None:
    assert [timer_bucket(ms) for ms in (-5, 0, 999, 1000, 1999, 2000, 3999, 4000)] == [0, 0, 0, 1, 1, 2, 2, 3]
    assert timer_bucket(MAX_TIMER_DELAY_MS) == TIMER_BUCKETS - 1
    assert timer_hop_ms(0) == 0 and timer_hop_ms(1) == 1000 and timer_hop_ms(3) == 4000
    assert timer_hop_ms(TIMER_BUCKETS - 1) == MAX_HOP_MS


@settings(max_examples=500, deadline=None)
@given(st.integers(0, MAX_TIMER_DELAY_MS), st.sampled_from([MAX_HOP_MS, 3_600_000]))
def test_timing_wheel_is_never_early_and_takes_few_hops(delay: int, max_hop: int) -> None:
    """Follow one message through the wheel: looked at again hop(bucket) after each store, delivered from
    bucket 0 at its due time. It is never looked at after it is due, and is rewritten about log2 times."""
    t, due, hops = 0, delay, 0
    while True:
        k = timer_bucket(due - t)
        if k == 0:
            break
        look = min(due, t + timer_hop_ms(k, max_hop))
        assert look > t and look <= due
        t, hops = look, hops + 1
    assert t <= due  # bucket 0 then waits for the due time itself
    assert hops <= 2 * (math.log2(max(delay, 1000) / 1000) + 2) + delay / max_hop


def _broker(tmp_path: Path, **cfg: object) -> BrokerController:
    return BrokerController(BrokerConfig(store=str(tmp_path / "store"), listen="127.0.0.1:0", **cfg))  # type: ignore[arg-type]


def _store_msg(msg: Message) -> StoreMessage:
    return StoreMessage(msg.topic, msg.body, 2, msg.all_properties())


def test_divert_routes_delayed_messages_to_their_schedule_queue(tmp_path: Path) -> None:
    b = _broker(tmp_path, message_delay_level="1s 2s 3s")
    s = b.schedule
    assert b.topics.get(SCHEDULE_TOPIC).read_queue_nums == 3  # one queue per configured level
    now = 1_000_000
    plain, lvl, big, at, rel, past = (_store_msg(m) for m in (
        Message("T", b"a"), Message("T", b"b", delay_level=2), Message("T", b"c", delay_level=99),
        Message("T", b"d", deliver_at=now + 5000), Message("T", b"e", delay=0.5),
        Message("T", b"f", deliver_at=now - 1)))
    for m in (plain, lvl, big, at, rel, past):
        s.divert([m], now_ms=now)
    assert (plain.topic, plain.queue_id) == ("T", 2)
    assert (lvl.topic, lvl.queue_id, lvl.properties[P.REAL_TOPIC], lvl.properties[P.REAL_QID]) == \
        (SCHEDULE_TOPIC, 1, "T", "2")
    assert (big.queue_id, big.properties[P.DELAY]) == (2, "3")  # capped at the last level
    assert (at.topic, at.queue_id, at.properties[P.TIMER_DELIVER_MS]) == (TIMER_TOPIC, 3, str(now + 5000))
    assert (rel.topic, rel.queue_id, rel.properties[P.TIMER_DELIVER_MS]) == (TIMER_TOPIC, 0, str(now + 500))
    assert P.TIMER_DELAY_MS not in rel.properties
    assert past.topic == "T" and P.TIMER_DELIVER_MS not in past.properties  # due already


def test_divert_refuses_bad_delays_and_never_delays_dead_letters(tmp_path: Path) -> None:
    s = _broker(tmp_path).schedule
    for props in ({P.TIMER_DELAY_MS: "abc"}, {P.TIMER_DELAY_SEC: "-1"}, {P.DELAY: "x"},
                  {P.TIMER_DELIVER_MS: str(2**62)}, {P.DELAY: "2", P.TIMER_DELAY_MS: "10"}):
        with pytest.raises(MessageIllegalError):
            s.divert([StoreMessage("T", b"x", 0, dict(props))], now_ms=0)
    with pytest.raises(MessageIllegalError, match="batch"):
        s.divert([StoreMessage("T", b"x", 0, {P.DELAY: "1"}), StoreMessage("T", b"y", 0, {})])
    dead = StoreMessage("%DLQ%g", b"x", 0, {P.DELAY: "4"})
    s.divert([dead])
    assert dead.topic == "%DLQ%g" and P.DELAY not in dead.properties


def test_message_delay_options_are_validated() -> None:
    assert Message("T", b"x", delay=1.25).all_properties()[P.TIMER_DELAY_MS] == "1250"
    assert Message("T", b"x", deliver_at=42).all_properties()[P.TIMER_DELIVER_MS] == "42"
    for m in (Message("T", b"x", delay=-1), Message("T", b"x", deliver_at=1, delay=1.0),
              Message("T", b"x", delay_level=2, deliver_at=5)):
        with pytest.raises(MessageIllegalError):
            m.validate()


def test_flow_control_waits_until_consumed_messages_leave_the_queue_at_most_its_delay() -> None:
    """A pull loop held back by flow control looks again as soon as the listener's batch leaves the queue, not
    after the whole 50 ms (RocketMQ's fixed pause); with nothing consumed it waits the whole delay."""
    async def main() -> tuple[float, float, float]:
        pq = ProcessQueue()
        msgs = [_msg(i) for i in range(4)]
        pq.put(msgs)
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        await pq.wait_for_room(0.05)  # nothing consumed: the whole delay
        idle = loop.time() - t0
        loop.call_later(0.005, pq.remove, msgs[:2])
        t0 = loop.time()
        await pq.wait_for_room(5.0)  # woken by the removal, long before the bound
        woken = loop.time() - t0
        pq.take(2)
        loop.call_later(0.005, pq.commit)  # an orderly batch committed frees room too
        t0 = loop.time()
        await pq.wait_for_room(5.0)
        return idle, woken, loop.time() - t0

    idle, woken, committed = asyncio.run(main())
    assert idle >= 0.045
    assert woken < 2.0 and committed < 2.0
