"""Consume services: hand pulled messages to the listener on a thread pool and act on its answer
(ConsumeMessageConcurrentlyService / ConsumeMessageOrderlyService).

Listeners are plain functions run on the consumer's thread pool; everything
else (process queues, offsets, send-backs) stays on the consumer's event loop,
so the listener's answer is applied there and no state is shared with threads.

Concurrent: the listener gets batches of up to ``consume_message_batch_max_size``
messages; a pull's batches are spread over the free threads (all in one pool
job when none is free, so a backlog costs one thread hand-off per pull). SUCCESS removes the batch from its process queue and moves the
queue's offset to the lowest message still cached. RECONSUME_LATER sends each
message back to the broker (CONSUMER_SEND_MSG_BACK → %RETRY%<group>, or the DLQ
once retries are used up) and then counts it consumed; a message whose
send-back fails stays cached (holding the offset) and is consumed again
locally after ``consume_later_delay``. In BROADCASTING a failed batch is
dropped with a warning, as RocketMQ does.

A small delivery (HANDOFF_MAX_MESSAGES or fewer) given while every consume
thread is idle (parked, whether or not the loop has yet seen its last job end)
is handed over: submit wakes one parked thread directly (consume_threads.py)
and the loop thread waits, at most HANDOFF_WAIT_S, until it has taken the job,
so the GIL passes to that thread at once. Otherwise the thread, woken while the
loop goes on (building the next pull), would wait for the loop's next release
of the GIL before the listener runs. A hand-over taken late (busy cores) stops
the waiting for a while (HandoffBackoff): briefly after one late hand-over (a
moment's load), up to HANDOFF_BACKOFF_S while they keep coming late (a loaded
machine).

With ``consume_inline`` the listener runs on the loop thread itself, each pull's batches one after another
(no hand-over, no thread); everything after the call is the same. A call longer than INLINE_SLOW_S is
logged (at most once per INLINE_WARN_EVERY_S), naming the option: it held up the client's I/O.

Orderly: one task per queue takes the next batch in offset order, only while
the queue's broker lock is held, and keeps the queue's consume lock during the
listener call, so a rebalance releases the queue only between batches and
after committing. A failed batch goes back to the head of the queue and the
queue pauses ``suspend_current_queue_time``; a message failing more than
``max_reconsume_times`` is sent to the DLQ and passed.
"""
from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from sluice.client.consume_threads import ConsumeThreads
from sluice.client.push_options import ConsumeOrderlyResult, ConsumeResult, MessageModel
from sluice.client.process_queue import ProcessQueue
from sluice.client.push_requests import send_message_back
from sluice.client.results import MessageQueue
from sluice.client.trace import TraceDispatcher
from sluice.errors import SluiceError
from sluice.message import MessageExt
from sluice.protocol import properties as P
from sluice.protocol.trace import ConsumeReturnType

if TYPE_CHECKING:
    from sluice.client.push_view import PushConsumerView

__all__ = ["ConcurrentConsumeService", "HandoffBackoff", "OrderlyConsumeService", "Listener", "call_listener",
           "job_count", "listener_outcome"]

log = logging.getLogger(__name__)

Listener = Callable[[list[MessageExt]], Any]
_SUCCESS = (ConsumeResult.SUCCESS, ConsumeOrderlyResult.SUCCESS)
#: Expected listener time per pool job: a pull's batches are spread over threads only in jobs of at least
#: this much work; below it a thread hand-off (future, wake-up, callback on the loop) costs more than
#: running the calls one after another.
SPREAD_COST_S = 0.001
#: Deliveries of at most this many messages to idle consume threads are handed over (the module doc): a live stream's
#: pulls, each a few messages, where the wait is the thread's wake-up; a backlog's pulls are larger and keep
#: the loop going.
HANDOFF_MAX_MESSAGES = 8
#: The longest the loop thread waits for an idle consume thread to take a hand-over (a thread not scheduled
#: by then takes it later, as any job).
HANDOFF_WAIT_S = 0.001
#: After a hand-over the thread took late (the cores are busy: waiting does not start the listener sooner),
#: deliveries are queued without waiting for this long at first (HandoffBackoff); a delivery so queued waits
#: for the loop's next release of the GIL, so a short first pause keeps a moment's load from slowing many.
HANDOFF_BACKOFF_MIN_S = 0.01
#: ... doubled per late hand-over in a row up to this, so a loaded machine never stalls the loop per delivery.
HANDOFF_BACKOFF_S = 0.1
#: A listener call on the loop thread (consume_inline) longer than this is logged: the client did no I/O
#: meanwhile.
INLINE_SLOW_S = 0.05
INLINE_WARN_EVERY_S = 60.0


class HandoffBackoff:
    """When small deliveries are handed over: always, until one is taken late; then not for a pause that
    starts at HANDOFF_BACKOFF_MIN_S, doubles per late hand-over in a row up to HANDOFF_BACKOFF_S, and is
    back at the start after a hand-over taken in time. Times are time.monotonic() seconds."""

    __slots__ = ("pause", "until")

    def __init__(self) -> None:
        #: The pause the next late hand-over starts.
        self.pause = HANDOFF_BACKOFF_MIN_S
        #: No hand-over before this time.
        self.until = 0.0

    def allows(self, now: float) -> bool:
        return now >= self.until

    def taken(self, late: bool, now: float) -> None:
        """A hand-over's outcome: taken within HANDOFF_WAIT_S or not."""
        if late:
            self.until = now + self.pause
            self.pause = min(self.pause * 2, HANDOFF_BACKOFF_S)
        else:
            self.pause = HANDOFF_BACKOFF_MIN_S


def job_count(batches: int, free_threads: int, call_cost: float) -> int:
    """Pool jobs for a pull's ``batches`` listener calls, each expected to take ``call_cost`` seconds: every
    job carries at least SPREAD_COST_S of work, and there are no more jobs than free threads (at least 1)."""
    return max(1, min(batches, free_threads, int(call_cost * batches / SPREAD_COST_S)))


def listener_outcome(listener: Listener, msgs: list[MessageExt]) -> ConsumeReturnType:
    """call_listener for a traced consumer: how the call ended, as a SubAfter's context code says it
    (ConsumeMessageConcurrentlyService's returnType: EXCEPTION, RETURNNULL, FAILED or SUCCESS)."""
    try:
        result = listener(msgs)
    except Exception:
        log.exception("the message listener raised; its %d message(s) will be consumed again", len(msgs))
        return ConsumeReturnType.EXCEPTION
    if result in _SUCCESS:
        return ConsumeReturnType.SUCCESS
    return ConsumeReturnType.RETURNNULL if result is None else ConsumeReturnType.FAILED


def call_listener(listener: Listener, msgs: list[MessageExt]) -> bool:
    """Run the listener (on a pool thread); True for success. An exception or None means 'later'."""
    try:
        result = listener(msgs)
    except Exception:
        log.exception("the message listener raised; its %d message(s) will be consumed again", len(msgs))
        return False
    return result in _SUCCESS


class _Service:
    def __init__(self, consumer: PushConsumerView, listener: Listener, trace: TraceDispatcher | None = None) -> None:
        self.consumer = consumer
        self.listener = listener
        #: SubBefore / SubAfter records around each listener call (enable_trace); None: not traced.
        self.trace = trace
        opts = consumer.options
        #: The consume threads; an idle one is woken directly by a job (consume_threads.py).
        self.threads = ConsumeThreads(opts.consume_thread_max, f"sluice-consume-{consumer.group}")
        self._tasks: set[asyncio.Task[None]] = set()
        self._idle = asyncio.Event()
        self._idle.set()
        self.stopping = False
        self.consumed = 0
        self.failed = 0
        #: Pool jobs submitted and not finished.
        self.jobs = 0
        #: Small deliveries handed over to an idle consume thread (the module doc), and those of them the
        #: thread did not take within HANDOFF_WAIT_S.
        self.handoffs = 0
        self.handoffs_late = 0
        self.handoff_backoff = HandoffBackoff()
        #: Seconds per listener call (moving average); unknown (high) until measured, so a slow listener's
        #: first batches already run in parallel.
        self.call_cost = SPREAD_COST_S
        #: consume_inline: listener calls run on the loop thread (the module doc).
        self.inline = opts.consume_inline
        #: Inline calls over INLINE_SLOW_S, and when one was last logged (time.monotonic()).
        self.inline_slow = 0
        self._inline_warned = -INLINE_WARN_EVERY_S
        self._shut_down = False

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        self._idle.clear()
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not self._tasks:
            self._idle.set()
        if not task.cancelled() and task.exception() is not None:
            log.error("consume task failed", exc_info=task.exception())

    def _call(self, pq: ProcessQueue, batches: list[list[MessageExt]],
              gate: threading.Lock | None = None) -> list[bool | None]:
        # On a pool thread, one listener call per batch. A batch whose queue was released meanwhile is
        # skipped: the queue's new owner starts from the committed offset, which does not include it.
        if gate is not None:  # a hand-over: the loop thread waits for this, holding no GIL
            gate.release()
        started = time.perf_counter()
        if self.trace is None:
            oks = [None if pq.dropped else call_listener(self.listener, b) for b in batches]
        else:
            trace, group, call = self.trace, self.consumer.group, self._outcome
            oks = [None if pq.dropped else trace.traced_call(group, call, b) for b in batches]
        # What one listener call costs, smoothed: submit() spreads a pull over threads only when the calls
        # cost more than the hand-offs would (a float store is atomic; a lost update only blurs the average).
        self.call_cost += ((time.perf_counter() - started) / len(batches) - self.call_cost) * 0.25
        return oks

    def _outcome(self, msgs: list[MessageExt]) -> ConsumeReturnType:
        return listener_outcome(self.listener, msgs)

    def _start(self, pq: ProcessQueue, batches: list[list[MessageExt]]) -> asyncio.Future[list[bool | None]]:
        """Hand the batches to the pool now, as one job (a thread hand-off costs more than a fast listener
        call); counted busy until the job is done, however its waiter ends. A small delivery while every
        consume thread is idle is handed over (the module doc). With consume_inline the calls run here
        (_run_inline)."""
        if self.inline:
            if self._shut_down:  # as the shut-down threads' submit raises
                raise RuntimeError("the consume service is shut down")
            job = self._run_inline(pq, batches)
        else:
            gate = None
            if self.threads.all_idle and sum(map(len, batches)) <= HANDOFF_MAX_MESSAGES \
                    and self.handoff_backoff.allows(time.monotonic()):
                gate = threading.Lock()
                gate.acquire()
            submitted = self.threads.submit(self._call, pq, batches, gate)
            if gate is not None:
                self.handoffs += 1
                late = not gate.acquire(timeout=HANDOFF_WAIT_S)
                self.handoffs_late += late
                self.handoff_backoff.taken(late, time.monotonic())
            job = asyncio.wrap_future(submitted)
        pq.busy += 1
        self.jobs += 1

        def done(_job: object) -> None:
            pq.busy -= 1
            self.jobs -= 1
        job.add_done_callback(done)
        return job

    def _run_inline(self, pq: ProcessQueue, batches: list[list[MessageExt]]) -> asyncio.Future[list[bool | None]]:
        """_start for consume_inline: the calls run here, on the loop thread; the job is done when it returns."""
        job: asyncio.Future[list[bool | None]] = asyncio.get_running_loop().create_future()
        started = time.perf_counter()
        try:
            job.set_result(self._call(pq, batches))
        except Exception as exc:  # _call catches the listener's errors; anything else fails the job, as in a pool
            job.set_exception(exc)
        took = time.perf_counter() - started
        if took > INLINE_SLOW_S:
            self.inline_slow += 1
            now = time.monotonic()
            if now - self._inline_warned >= INLINE_WARN_EVERY_S:
                self._inline_warned = now
                log.warning("consumer %s: a listener call took %.0f ms on the client's I/O thread (consume_inline),"
                            " which did no I/O meanwhile; %d call(s) over %.0f ms so far. A listener that can be "
                            "slow belongs on consume threads (consume_inline=False)", self.consumer.group,
                            took * 1000, self.inline_slow, INLINE_SLOW_S * 1000)
        return job

    async def _listen_many(self, pq: ProcessQueue, batches: list[list[MessageExt]],
                           job: asyncio.Future[list[bool | None]] | None = None) -> list[bool | None]:
        """The listener's verdict per batch (True / False), None for a batch skipped (queue released), from
        ``job`` (:meth:`_start`) or a pool job started now."""
        oks = await (job if job is not None else self._start(pq, batches))
        for b, ok in zip(batches, oks):
            if ok:
                self.consumed += len(b)
            elif ok is not None:
                self.failed += len(b)
        return oks

    async def _listen(self, pq: ProcessQueue, msgs: list[MessageExt]) -> bool | None:
        return (await self._listen_many(pq, [msgs]))[0]

    def _owned(self, mq: MessageQueue, pq: ProcessQueue) -> bool:
        return self.consumer.rebalancer.process_queues.get(mq) is pq

    async def _send_back(self, msg: MessageExt, delay_level: int, orderly: bool) -> bool:
        c = self.consumer
        try:
            await send_message_back(c.instance.api, msg, c.group, delay_level=delay_level,
                                    max_reconsume_times=c.options.send_back_max_reconsume(orderly),
                                    timeout=c.options.request_timeout)
            return True
        except SluiceError as exc:
            log.warning("sending message %s back to the broker failed: %s", msg.msg_id, exc)
            return False

    async def shutdown(self, timeout: float) -> None:
        """Stop taking work, wait up to ``timeout`` for listener calls in flight, stop the pool."""
        self.stopping = True
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
        except TimeoutError:
            log.warning("%d consume task(s) still running after %.1f s; not waiting longer",
                        len(self._tasks), timeout)
            for t in list(self._tasks):
                t.cancel()
        self._shut_down = True
        self.threads.shutdown(cancel_futures=True)


class ConcurrentConsumeService(_Service):
    orderly = False

    def submit(self, mq: MessageQueue, pq: ProcessQueue, msgs: list[MessageExt]) -> None:
        """Split into listener batches and spread them over pool jobs (``job_count``): slow listeners run
        in parallel, a fast one gets the whole pull in one job, and a busy pool gets one job (a backlog
        costs one hand-off per pull, not per message)."""
        n = self.consumer.options.consume_message_batch_max_size
        batches = [msgs[i:i + n] for i in range(0, len(msgs), n)] if len(msgs) > n else [msgs]
        jobs = 1 if self.inline else job_count(len(batches), self.consumer.options.consume_thread_max - self.jobs,
                                                self.call_cost)
        per = -(-len(batches) // jobs)
        if pq.dropped and not self._owned(mq, pq):
            return
        for i in range(0, len(batches), per):
            # The pool job starts here, before the pull loop sends its next pull: a task that started it
            # would first wait for the next loop iteration.
            part = batches[i:i + per]
            try:
                job = self._start(pq, part)
            except RuntimeError as exc:  # the pool is shut down: the consumer is stopping
                log.warning("%d message(s) not handed to the listener: %s", sum(map(len, part)), exc)
                return
            self._spawn(self._consume(mq, pq, part, job))

    async def _consume(self, mq: MessageQueue, pq: ProcessQueue, batches: list[list[MessageExt]],
                       job: asyncio.Future[list[bool | None]]) -> None:
        oks = await self._listen_many(pq, batches, job)
        done: list[MessageExt] = []
        for batch, ok in zip(batches, oks):
            if ok:
                done += batch
            elif ok is not None:
                done += await self._failed(mq, pq, batch)
        if len(done) == 0 and all(ok is None for ok in oks):
            return  # every batch skipped (queue released): nothing consumed, no progress
        # One removal and one offset update for the whole job: the offset is the lowest still cached, so
        # it never passes a message of another job (or a failed one kept for a local retry).
        offset = pq.remove(done)
        if offset >= 0 and self._owned(mq, pq):
            self.consumer.offset_store.update(mq, offset, increase_only=True)

    async def _failed(self, mq: MessageQueue, pq: ProcessQueue, batch: list[MessageExt]) -> list[MessageExt]:
        c = self.consumer
        if c.options.model is MessageModel.BROADCASTING:
            log.warning("broadcast consumer %s dropped %d message(s) its listener failed", c.group, len(batch))
            return batch
        sent = await asyncio.gather(*(self._send_back(m, 0, False) for m in batch))
        later = [m for m, ok in zip(batch, sent) if not ok]
        if later:
            for m in later:
                m.reconsume_times += 1
            asyncio.get_running_loop().call_later(c.options.consume_later_delay, self._again, mq, pq, later)
        return [m for m, ok in zip(batch, sent) if ok]

    def _again(self, mq: MessageQueue, pq: ProcessQueue, msgs: list[MessageExt]) -> None:
        if not self.stopping and not pq.dropped:
            self.submit(mq, pq, msgs)


class OrderlyConsumeService(_Service):
    orderly = True

    def start_queue(self, mq: MessageQueue, pq: ProcessQueue) -> None:
        self._spawn(self._queue_loop(mq, pq))

    def submit(self, mq: MessageQueue, pq: ProcessQueue, msgs: list[MessageExt]) -> None:
        """Nothing to do: the queue's task takes what arrives (ProcessQueue.put sets ``arrived``)."""

    def _lock_ok(self, pq: ProcessQueue) -> bool:
        c = self.consumer
        if c.options.model is MessageModel.BROADCASTING:
            return True
        return pq.locked and not pq.lock_expired(c.options.lock_max_live)

    async def _queue_loop(self, mq: MessageQueue, pq: ProcessQueue) -> None:
        c = self.consumer
        n = c.options.consume_message_batch_max_size
        while not pq.dropped and not self.stopping:
            if not pq.msgs:
                await pq.arrived.wait()
                if not pq.msgs:
                    pq.arrived.clear()
                continue
            if not self._lock_ok(pq):
                await asyncio.sleep(0.1)  # tryLockLaterAndReconsume: the 20 s renewal or a rebalance re-locks
                continue
            suspend = False
            async with pq.consume_lock:
                if pq.dropped or self.stopping:
                    break
                batch = pq.take(n)
                ok = await self._listen(pq, batch)
                if ok is None:
                    pq.make_back_to_consume(batch)
                    break
                if not ok:
                    suspend = await self._check_reconsume(batch)
                    if suspend:
                        pq.make_back_to_consume(batch)
                if not suspend:
                    offset = pq.commit()
                    if offset >= 0 and self._owned(mq, pq):  # not after an offset reset replaced the queue
                        c.offset_store.update(mq, offset)
            if suspend:
                await asyncio.sleep(c.options.suspend_current_queue_time)

    async def _check_reconsume(self, batch: list[MessageExt]) -> bool:
        """checkReconsumeTimes: True to retry the batch in place; messages over the limit go to the DLQ."""
        c = self.consumer
        limit = c.options.effective_max_reconsume(True)
        suspend = False
        for m in batch:
            if m.reconsume_times >= limit and c.options.model is MessageModel.CLUSTERING:
                m.properties[P.RECONSUME_TIME] = str(m.reconsume_times)
                if not await self._send_back(m, -1, True):
                    suspend = True
                    m.reconsume_times += 1
            else:
                suspend = True
                m.reconsume_times += 1
        return suspend
