"""The lite pull consumer (RocketMQ's DefaultLitePullConsumer): you poll, Sluice pulls in the background.

::

    c = LitePullConsumer("audit", namesrv="127.0.0.1:9876", consume_from_where="CONSUME_FROM_FIRST_OFFSET")
    c.subscribe("Orders", "TagA")          # queues shared by the group's members (rebalance), or
    # c.assign([mq, ...])                  # queues you choose (no rebalance)
    c.start()
    while running:
        for m in c.poll(timeout=1.0):      # a list, empty when nothing arrived in time
            handle(m)
    c.shutdown()                           # auto-commit commits what poll returned

With ``subscribe`` the queues are decided by the push consumer's own machinery:
the :class:`~sluice.client.rebalance.Rebalancer` (allocation strategies, the
hand-off pause, committed offsets else ``consume_from_where``) run by the
client instance's RebalanceService on its timer and on NOTIFY_CONSUMER_IDS_CHANGED,
the heartbeats of the client instance (CONSUME_ACTIVELY) and the same offset
stores. One pull task per owned queue long-polls the broker into that queue's
cache (a ProcessQueue) within the push consumer's flow-control thresholds plus
``pull_threshold_for_all`` over every queue; ``poll`` hands out one pulled batch
of one queue at a time, as Java's consumeRequestCache does.

Offsets: the consume offset of a queue is the offset after what ``poll`` returned
(the lowest offset still cached). ``commit_sync`` writes every owned queue's
consume offset to the broker now, ``commit_async`` in the background. With
``auto_commit`` (default on) each ``poll`` first commits, in memory, what the
previous polls returned (so a batch counts as consumed once the application asks
for more: at-least-once) and writes it to the broker every ``auto_commit_interval``
seconds, on a queue's release by a rebalance, and at shutdown. ``seek`` moves a
queue's consume and pull position (its cache is dropped); ``pause`` stops pulling
a queue and keeps its cached batches out of ``poll`` until ``resume``.
"""
from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from sluice.client.facade import _Facade
from sluice.client.lifecycle import AsyncClient
from sluice.client.offset_store import LocalFileOffsetStore, OffsetStore, RemoteBrokerOffsetStore
from sluice.client.process_queue import ProcessQueue
from sluice.client.pull_consumer import process_pull_response
from sluice.client.push_options import LitePullConsumerOptions, MessageModel, parse_consume_timestamp
from sluice.client.rebalance import RETRY_PREFIX, RebalanceService, Rebalancer
from sluice.client.results import MessageQueue, PullResult, PullStatus, queue_sort_key
from sluice.client.routing import subscribe_queues
from sluice.client.selector import MessageSelector, as_selector
from sluice.client.producer import started_trace
from sluice.client.trace import TraceDispatcher
from sluice.errors import ClientError, InvalidParameterError, SluiceError, TopicNotExistError
from sluice.message import MessageExt
from sluice.protocol import headers as H
from sluice.protocol.bodies import ConsumerData
from sluice.protocol.codes import RequestCode
from sluice.protocol.command import RemotingCommand
from sluice.protocol.headers import FLAG_SUBSCRIPTION, FLAG_SUSPEND
from sluice.protocol.record import check_topic
from sluice.protocol.trace import ConsumeReturnType

__all__ = ["AsyncLitePullConsumer", "LitePullConsumer"]

log = logging.getLogger(__name__)


def _polled(msgs: list[MessageExt]) -> ConsumeReturnType:
    """What a poll's SubAfter trace says: a polled batch counts consumed (Java sets success, no context code)."""
    return ConsumeReturnType.SUCCESS

#: A queue over a flow-control threshold looks again after this (RocketMQ: 50 ms).
FLOW_CONTROL_DELAY_S = 0.05
#: A paused queue's pull task looks again after this (PULL_TIME_DELAY_MILLS_WHEN_PAUSE is 1 s; resume is
#: noticed sooner here).
PAUSE_DELAY_S = 0.1
MIB = 1024 * 1024


class AsyncLitePullConsumer(AsyncClient):
    """The asyncio lite pull consumer; :class:`LitePullConsumer` runs it on the client loop thread.

    Options (keywords): :class:`LitePullConsumerOptions` and :class:`sluice.client.instance.ClientConfig`."""

    _kind = "consumer"
    _role = "lite pull consumer"

    def __init__(self, group: str, namesrv: str | Iterable[str], **options: Any) -> None:
        self.options: LitePullConsumerOptions = self._setup(group, namesrv, LitePullConsumerOptions, options)
        self.consume_timestamp_ms = parse_consume_timestamp(self.options.consume_timestamp)
        self._subs: dict[str, tuple[MessageSelector, int]] = {}
        self._assigned: list[MessageQueue] | None = None  # assign mode: the queues asked for
        self.rebalancer = Rebalancer(self)  # its process_queues is the owned-queue table in both modes
        self.offset_store: OffsetStore = RemoteBrokerOffsetStore(self._query_offset, self._commit_offset)
        self.orderly = False  # for the rebalancer and running info: no broker locks
        self._consume: dict[MessageQueue, int] = {}  # next offset after what poll returned, per queue
        self._ready: collections.deque[tuple[MessageQueue, ProcessQueue, list[MessageExt]]] = collections.deque()
        self._arrived: asyncio.Event | None = None
        self._paused: set[MessageQueue] = set()
        self._pull_tasks: dict[MessageQueue, asyncio.Task[None]] = {}
        self._bg: set[asyncio.Task[None]] = set()
        self._assign_lock = asyncio.Lock()
        self._running = False
        self._next_commit = 0.0
        #: Times a queue waited because a cache was over a threshold (flow control).
        self.flow_control_times = 0
        self.start_timestamp_ms = 0
        #: The trace dispatcher while started with enable_trace.
        self.trace: TraceDispatcher | None = None

    def _check_group(self, group: str) -> None:
        super()._check_group(group)
        check_topic(RETRY_PREFIX + group)

    # ------------------------------------------------------------------------------ configuration

    async def subscribe(self, topic: str, selector: MessageSelector | str | None = "*") -> None:
        """Consume ``topic``'s messages matching ``selector`` on the queues the group's rebalance gives this
        member. A topic without a route is refused (TopicNotExistError), now or at start()."""
        if self._assigned is not None:
            raise ClientError("Subscribe and assign are mutually exclusive.")
        check_topic(topic)
        if topic.startswith(RETRY_PREFIX):
            raise InvalidParameterError("a lite pull consumer does not consume retry topics")
        sel = as_selector(selector)
        if sel.is_class:
            raise InvalidParameterError("class filters are for push and pull consumers; use a tag or SQL92 selector")
        if self._instance is not None:
            await self._check_route(topic)
        old = self._subs.get(topic)
        if old is None or old[0] != sel:
            self._subs[topic] = (sel, int(time.time() * 1000))
        if self._instance is not None:
            await self._instance.send_heartbeat_to_all()
            RebalanceService.of(self._instance).wakeup()

    async def unsubscribe(self, topic: str) -> None:
        self._subs.pop(topic, None)
        if self._instance is not None:
            RebalanceService.of(self._instance).wakeup()

    async def assign(self, queues: Iterable[MessageQueue]) -> None:
        """Consume exactly these queues (no rebalance); replaces an earlier assignment."""
        if self._subs:
            raise ClientError("Subscribe and assign are mutually exclusive.")
        mqs = sorted(set(queues), key=queue_sort_key)
        if not mqs:
            raise InvalidParameterError("Message queues can not be null or empty.")
        for mq in mqs:
            if not isinstance(mq, MessageQueue):
                raise InvalidParameterError(f"assign takes MessageQueues, not {type(mq).__name__}")
        self._assigned = mqs
        if self._running:
            await self._apply_assignment()

    async def _check_route(self, topic: str) -> None:
        try:
            route = await self.instance.topic_route(topic, refresh=True)
        except TopicNotExistError:
            raise TopicNotExistError(f"topic {topic!r} does not exist: the namesrv has no route for it") from None
        if not subscribe_queues(topic, route):
            raise TopicNotExistError(f"topic {topic!r} has no readable queue")

    async def fetch_message_queues(self, topic: str) -> list[MessageQueue]:
        """The topic's readable queues, sorted (fetchMessageQueues), for ``assign``."""
        await self._check_route(topic)
        return subscribe_queues(topic, self.instance.routes[topic])

    # ------------------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        inst = await self._join()  # subscribe or assign may come before or after start, as in RocketMQ
        try:
            for topic in self._subs:
                await self._check_route(topic)
            if self.options.model is MessageModel.BROADCASTING:
                name = self.client_config.instance_name or "DEFAULT"
                root = Path(self.options.offset_store_dir).expanduser()
                self.offset_store = LocalFileOffsetStore(root / name / self.group / "offsets.json")
            await self.offset_store.load()
            self.trace = await started_trace(self.namesrv, self.client_config, self.options.enable_trace,
                                             self.options.trace_topic)
        except BaseException:
            await self._leave(inst)
            raise
        self._arrived = asyncio.Event()
        self._running = True
        self.start_timestamp_ms = int(time.time() * 1000)
        self._next_commit = time.monotonic() + self.options.auto_commit_interval
        await inst.send_heartbeat_to_all()
        if self._assigned is not None:
            await self._apply_assignment()
        else:
            RebalanceService.of(inst).attach(self)

    async def shutdown(self) -> None:
        """Stop pulling, commit (auto-commit: what poll returned), leave the group."""
        inst = self._instance
        if inst is None:
            return
        self._running = False
        try:
            await RebalanceService.of(inst).detach(self)
            await self.rebalancer.cancel_pending()
            tasks = [*self._pull_tasks.values(), *self._bg]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            if self.options.auto_commit:
                self._mark_consumed()
            await self.offset_store.persist_all(list(self.rebalancer.process_queues))
            for pq in self.rebalancer.process_queues.values():
                pq.dropped = True
        finally:
            trace, self.trace = self.trace, None
            if trace is not None:
                await trace.shutdown()
            await self._leave(inst)

    # ------------------------------------------------------------------------------ what the rebalancer uses

    @property
    def running(self) -> bool:
        return self._running

    def topics(self) -> list[str]:
        return sorted(self._subs)

    def consumer_data(self) -> ConsumerData:
        if self._assigned is not None:  # assign mode pulls everything ('*'), as Java's SUB_ALL
            subs = [MessageSelector.by_tag("*").subscription_data(t, 0)
                    for t in sorted({mq.topic for mq in self._assigned})]
        else:
            subs = [sel.subscription_data(topic, version) for topic, (sel, version) in sorted(self._subs.items())]
        return ConsumerData(group_name=self.group, consume_type="CONSUME_ACTIVELY",
                            message_model=self.options.message_model,
                            consume_from_where=self.options.consume_from_where, subscription_data_set=subs)

    async def persist_offsets(self) -> None:
        await self.offset_store.persist_all(list(self.rebalancer.process_queues))

    async def do_rebalance(self) -> bool:
        if not self._running or self._assigned is not None:
            return True
        return await self.rebalancer.do_rebalance()

    async def reset_offsets(self, topic: str, offsets: Mapping[MessageQueue, int]) -> list[MessageQueue]:
        """A broker's RESET_CONSUMER_CLIENT_OFFSET: the owned queues restart from the new offsets."""
        if not self._running:
            return []
        return await self.rebalancer.reset_offsets(topic, offsets)

    def start_pulling(self, mq: MessageQueue, pq: ProcessQueue, offset: int) -> None:
        """Pull ``mq`` into ``pq`` from ``offset``, which is also its consume offset now."""
        old = self._pull_tasks.get(mq)
        if old is not None and not old.done():
            old.cancel()
        self._consume[mq] = offset
        task = asyncio.get_running_loop().create_task(self._pull_loop(mq, pq, offset), name=f"sluice-lite-pull-{mq}")
        self._pull_tasks[mq] = task
        task.add_done_callback(lambda t, mq=mq: self._pull_tasks.pop(mq) if self._pull_tasks.get(mq) is t else None)

    # ------------------------------------------------------------------------------ assign mode

    async def _apply_assignment(self) -> None:
        assert self._assigned is not None
        async with self._assign_lock:
            wanted = set(self._assigned)
            table = self.rebalancer.process_queues
            for mq in [mq for mq in table if mq not in wanted]:
                pq = table.pop(mq)
                pq.dropped = True
                await self.offset_store.persist(mq)
                self.offset_store.remove(mq)
                self._consume.pop(mq, None)
            for mq in sorted(wanted - set(table), key=queue_sort_key):
                self.offset_store.remove(mq)
                offset = await self.rebalancer.compute_pull_from_where(mq)
                pq = table[mq] = ProcessQueue()
                self.start_pulling(mq, pq, offset)

    # ------------------------------------------------------------------------------ polling

    def assignment(self) -> list[MessageQueue]:
        """The queues this consumer owns now (assigned, or given by the rebalance)."""
        return sorted((mq for mq, pq in self.rebalancer.process_queues.items() if not pq.dropped),
                      key=queue_sort_key)

    async def poll(self, timeout: float | None = None) -> list[MessageExt]:
        """The next pulled batch (of one queue, offsets ascending); [] when none arrives within ``timeout``
        (default ``poll_timeout``)."""
        if not self._running or self._arrived is None:
            raise ClientError(f"lite pull consumer {self.group!r} is not started")
        timeout = self.options.poll_timeout if timeout is None else timeout
        if timeout < 0:
            raise InvalidParameterError(f"timeout must be >= 0, got {timeout}")
        if self.options.auto_commit:
            self._mark_consumed()
            if time.monotonic() >= self._next_commit:
                self._next_commit = time.monotonic() + self.options.auto_commit_interval
                self._background(self.persist_offsets())
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            msgs = self._take()
            if msgs:
                if self.trace is not None:  # DefaultLitePullConsumerImpl.poll: the hooks around a successful poll
                    self.trace.traced_call(self.group, _polled, msgs)
                return msgs
            self._arrived.clear()
            remaining = deadline - loop.time()
            if remaining <= 0 or not self._running:
                return []
            try:
                await asyncio.wait_for(self._arrived.wait(), remaining)
            except TimeoutError:
                return []

    def _take(self) -> list[MessageExt] | None:
        """The first cached batch of a current, unpaused queue; stale batches (queue released or sought) met
        on the way are discarded, paused ones kept in order."""
        table = self.rebalancer.process_queues
        ready, kept = self._ready, collections.deque()
        chosen = None
        while ready:
            entry = ready.popleft()
            mq, pq, _ = entry
            if pq.dropped or table.get(mq) is not pq:
                continue
            if mq in self._paused:
                kept.append(entry)
                continue
            chosen = entry
            break
        kept.extend(ready)
        self._ready = kept
        if chosen is None:
            return None
        mq, pq, msgs = chosen
        self._consume[mq] = pq.remove(msgs)
        return msgs

    def _mark_consumed(self) -> None:
        """Commit, in memory, the consume offset of every owned queue."""
        table = self.rebalancer.process_queues
        for mq, offset in list(self._consume.items()):
            if mq not in table:
                del self._consume[mq]
            elif offset >= 0:
                self.offset_store.update(mq, offset)

    def _background(self, coro: Any) -> None:
        async def quietly() -> None:
            try:
                await coro
            except SluiceError as exc:
                log.warning("lite pull consumer %s: committing offsets failed: %s", self.group, exc)
        task = asyncio.get_running_loop().create_task(quietly())
        self._bg.add(task)
        task.add_done_callback(self._bg.discard)

    # ------------------------------------------------------------------------------ offsets

    def _owned_or_raise(self, mq: MessageQueue) -> ProcessQueue:
        if not self._running:
            raise ClientError(f"lite pull consumer {self.group!r} is not started")
        pq = self.rebalancer.process_queues.get(mq)
        if pq is None or pq.dropped:
            raise ClientError(f"The message queue is not in assigned list, may be rebalancing: {mq}")
        return pq

    async def commit_sync(self, offsets: Mapping[MessageQueue, int] | None = None) -> None:
        """Write the consume offsets of every owned queue (or these offsets of owned queues) to the broker
        now. A failed write is logged and retried at the next persist, as RocketMQ's offset store does."""
        if offsets is None:
            self._owned_or_raise_running()
            self._mark_consumed()
            mqs = list(self.rebalancer.process_queues)
        else:
            for mq, off in offsets.items():
                self._owned_or_raise(mq)
                if off < 0:
                    raise InvalidParameterError(f"offset of {mq} must be >= 0, got {off}")
            for mq, off in offsets.items():
                self.offset_store.update(mq, off)
                self._consume[mq] = off
            mqs = list(offsets)
        await asyncio.gather(*(self.offset_store.persist(mq) for mq in mqs))

    def commit_async(self, offsets: Mapping[MessageQueue, int] | None = None) -> None:
        """:meth:`commit_sync` in the background (checked now, written later)."""
        if offsets is not None:
            for mq in offsets:
                self._owned_or_raise(mq)
        else:
            self._owned_or_raise_running()
        self._background(self.commit_sync(offsets))

    def _owned_or_raise_running(self) -> None:
        if not self._running:
            raise ClientError(f"lite pull consumer {self.group!r} is not started")

    async def committed(self, mq: MessageQueue) -> int:
        """The offset committed on the broker (or the local file) for ``mq``; -1 when there is none."""
        self._owned_or_raise_running()
        return await self.offset_store.read_store(mq)

    async def seek(self, mq: MessageQueue, offset: int) -> None:
        """Consume ``mq`` from ``offset`` on (within the queue's [min, max] offsets); its cache is dropped."""
        self._owned_or_raise(mq)
        lo, hi = await self._bounds(mq)
        if not lo <= offset <= hi:
            raise InvalidParameterError(f"Seek offset illegal: {offset} is outside [{lo}, {hi}] of {mq}")
        self._restart(mq, offset)

    async def seek_to_begin(self, mq: MessageQueue) -> None:
        self._owned_or_raise(mq)
        self._restart(mq, (await self._bounds(mq))[0])

    async def seek_to_end(self, mq: MessageQueue) -> None:
        self._owned_or_raise(mq)
        self._restart(mq, (await self._bounds(mq))[1])

    async def _bounds(self, mq: MessageQueue) -> tuple[int, int]:
        inst, rt = self.instance, self.options.request_timeout
        addr = await inst.broker_addr_for(mq.topic, mq.broker_name, master_only=False)
        return await inst.api.min_offset(addr, mq, rt), await inst.api.max_offset(addr, mq, rt)

    def _restart(self, mq: MessageQueue, offset: int) -> None:
        old = self._owned_or_raise(mq)  # owned still, after the broker round trips?
        old.dropped = True  # its pull task stops, its cached batches are discarded
        old.clear()
        pq = self.rebalancer.process_queues[mq] = ProcessQueue()
        self.start_pulling(mq, pq, offset)

    def pause(self, queues: Iterable[MessageQueue]) -> None:
        """Stop pulling these queues and keep their cached messages out of poll until :meth:`resume`."""
        self._paused.update(queues)

    def resume(self, queues: Iterable[MessageQueue]) -> None:
        self._paused.difference_update(queues)
        if self._arrived is not None:
            self._arrived.set()

    def is_paused(self, mq: MessageQueue) -> bool:
        return mq in self._paused

    # ------------------------------------------------------------------------------ pulling

    def _flow_controlled(self, pq: ProcessQueue) -> bool:
        o = self.options
        if pq.msg_count > o.pull_threshold_for_queue or pq.msg_size > o.pull_threshold_size_for_queue * MIB:
            return True
        if pq.max_span > o.consume_concurrently_max_span:
            return True
        return sum(p.msg_count for p in self.rebalancer.process_queues.values()) > o.pull_threshold_for_all

    async def _pull_loop(self, mq: MessageQueue, pq: ProcessQueue, offset: int) -> None:
        o = self.options
        while self._running and not pq.dropped:
            if mq in self._paused:
                await asyncio.sleep(PAUSE_DELAY_S)
                continue
            if self._flow_controlled(pq):
                self.flow_control_times += 1
                await asyncio.sleep(FLOW_CONTROL_DELAY_S)
                continue
            try:
                result = await self._pull_once(mq, offset, o.pull_batch_size)
            except asyncio.CancelledError:
                raise
            except SluiceError as exc:
                if not pq.dropped:
                    log.warning("pull of %s at offset %d failed: %s", mq, offset, exc)
                await asyncio.sleep(o.pull_time_delay_when_exception)
                continue
            if pq.dropped:
                break
            pq.last_pull_time = time.monotonic()
            nxt = result.next_begin_offset
            if result.status is PullStatus.FOUND and result.msg_found_list:
                fresh = pq.put(result.msg_found_list)
                if fresh:
                    self._ready.append((mq, pq, fresh))
                    if self._arrived is not None:
                        self._arrived.set()
            elif result.status is PullStatus.OFFSET_ILLEGAL:
                log.warning("group %s: offset %d of %s is out of range [%d, %d]; moving to %d", self.group,
                            offset, mq, result.min_offset, result.max_offset, nxt)
            if pq.msg_count == 0:
                self._consume[mq] = nxt  # nothing cached: progress is the pull position (filtered messages)
            offset = nxt

    async def _pull_once(self, mq: MessageQueue, offset: int, size: int) -> PullResult:
        o = self.options
        inst = self.instance
        got = self._subs.get(mq.topic)
        sel, version = got if got is not None else (MessageSelector.by_tag("*"), 0)
        header = H.PullMessageRequestHeader(
            consumer_group=self.group, topic=mq.topic, queue_id=mq.queue_id, queue_offset=offset,
            max_msg_nums=size, sys_flag=FLAG_SUSPEND | FLAG_SUBSCRIPTION, commit_offset=0,
            suspend_timeout_millis=int(o.broker_suspend_max * 1000), subscription=sel.expression,
            sub_version=version, expression_type=sel.wire_expression_type)
        addr = await inst.broker_addr_for(mq.topic, mq.broker_name, master_only=False)
        request = RemotingCommand.request(RequestCode.PULL_MESSAGE, header.to_ext())
        response = await inst.remoting.invoke(addr, request, o.consumer_timeout_when_suspend)
        return process_pull_response(response, sel, check_crc=o.check_crc)

    # ------------------------------------------------------------------------------ offsets on the broker

    async def _query_offset(self, mq: MessageQueue) -> int:
        addr = await self.instance.broker_addr_for(mq.topic, mq.broker_name)
        return await self.instance.api.query_consumer_offset(addr, self.group, mq, self.options.request_timeout)

    async def _commit_offset(self, mq: MessageQueue, offset: int) -> None:
        addr = await self.instance.broker_addr_for(mq.topic, mq.broker_name)
        await self.instance.api.update_consumer_offset(addr, self.group, mq, offset, self.options.request_timeout)


class LitePullConsumer(_Facade):
    """The blocking lite pull consumer (DefaultLitePullConsumer): :class:`AsyncLitePullConsumer` on the shared
    client loop thread. ``subscribe`` and ``assign`` may be called before or after ``start``."""

    def __init__(self, group: str, namesrv: str | Iterable[str], **options: Any) -> None:
        super().__init__()
        self._impl: AsyncLitePullConsumer = AsyncLitePullConsumer(group, namesrv, **options)  # type: ignore[assignment]

    @property
    def async_consumer(self) -> AsyncLitePullConsumer:
        return self._impl

    @property
    def _rt(self) -> float:
        return self._impl.options.request_timeout * 4

    def _call(self, coro: Any) -> Any:
        if self._loop is None:  # before start: nothing to wait for on the loop
            return asyncio.run(coro) if asyncio.iscoroutine(coro) else coro
        return self._run(coro, self._rt)

    def subscribe(self, topic: str, selector: MessageSelector | str | None = "*") -> None:
        self._call(self._impl.subscribe(topic, selector))

    def unsubscribe(self, topic: str) -> None:
        self._call(self._impl.unsubscribe(topic))

    def assign(self, queues: Iterable[MessageQueue]) -> None:
        self._call(self._impl.assign(list(queues)))

    def fetch_message_queues(self, topic: str) -> list[MessageQueue]:
        result: list[MessageQueue] = self._run(self._impl.fetch_message_queues(topic), self._rt)
        return result

    def poll(self, timeout: float | None = None) -> list[MessageExt]:
        wait = self._impl.options.poll_timeout if timeout is None else timeout
        result: list[MessageExt] = self._run(self._impl.poll(timeout), max(wait, 0) + self._rt)
        return result

    def _on_loop(self, fn: Any, *args: Any) -> Any:
        async def call() -> Any:
            return fn(*args)
        return self._run(call(), self._rt)

    def assignment(self) -> list[MessageQueue]:
        result: list[MessageQueue] = self._on_loop(self._impl.assignment)
        return result

    def seek(self, mq: MessageQueue, offset: int) -> None:
        self._run(self._impl.seek(mq, offset), self._rt)

    def seek_to_begin(self, mq: MessageQueue) -> None:
        self._run(self._impl.seek_to_begin(mq), self._rt)

    def seek_to_end(self, mq: MessageQueue) -> None:
        self._run(self._impl.seek_to_end(mq), self._rt)

    def pause(self, queues: Iterable[MessageQueue]) -> None:
        self._on_loop(self._impl.pause, list(queues))

    def resume(self, queues: Iterable[MessageQueue]) -> None:
        self._on_loop(self._impl.resume, list(queues))

    def commit_sync(self, offsets: Mapping[MessageQueue, int] | None = None) -> None:
        self._run(self._impl.commit_sync(offsets), self._rt)

    def commit_async(self, offsets: Mapping[MessageQueue, int] | None = None) -> None:
        self._on_loop(self._impl.commit_async, offsets)

    def committed(self, mq: MessageQueue) -> int:
        result: int = self._run(self._impl.committed(mq), self._rt)
        return result
