"""The push consumer (DefaultMQPushConsumer): subscribe, register a listener, start; Sluice pulls for you.

::

    def on_messages(msgs):
        for m in msgs:
            handle(m)
        return ConsumeResult.SUCCESS          # or ConsumeResult.RECONSUME_LATER

    c = PushConsumer("orders-app", namesrv="127.0.0.1:9876", consume_from_where="CONSUME_FROM_FIRST_OFFSET")
    c.subscribe("Orders", "TagA || TagB")     # or MessageSelector.by_sql("amount > 100")
    c.register_listener(on_messages)          # register_listener(fn, orderly=True) for per-queue order
    c.start()
    ...
    c.shutdown()

Parts: :class:`Rebalancer` decides the queues (rebalance.py); one pull task
per owned queue long-polls the broker (here), with flow control; a consume
service runs the listener on a thread pool (consume_service.py); an offset
store keeps progress (offset_store.py). In CLUSTERING the group's
``%RETRY%<group>`` topic is subscribed too, and a retried message reaches the
listener with its original topic restored. A topic subscribed with
``MessageSelector.by_class`` is pulled through the filter servers of its brokers
(client/class_filter.py); a class error is logged at WARNING, kept as
:meth:`AsyncPushConsumer.class_filter_error` and shown by consumerProgress.
"""
from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from sluice.client.class_filter import ClassFilters
from sluice.client.consume_service import ConcurrentConsumeService, Listener, OrderlyConsumeService
from sluice.client.push_options import MessageModel, PushConsumerOptions, parse_consume_timestamp
from sluice.client.facade import _SLACK, _Facade, _release_loop
from sluice.client.offset_store import LocalFileOffsetStore, OffsetStore, RemoteBrokerOffsetStore
from sluice.client.lifecycle import AsyncClient
from sluice.client.process_queue import ProcessQueue
from sluice.client.pull_consumer import process_pull_response
from sluice.client.push_requests import PullTemplate
from sluice.client.rebalance import RETRY_PREFIX, RebalanceService, Rebalancer
from sluice.client.producer import started_trace
from sluice.client.trace import TraceDispatcher
from sluice.client.results import MessageQueue, PullResult, PullStatus
from sluice.client.selector import MessageSelector, as_selector
from sluice.errors import ClientError, FilterClassError, InvalidParameterError, SluiceError
from sluice.message import MessageExt
from sluice.protocol import headers as H
from sluice.protocol.headers import FLAG_COMMIT_OFFSET, FLAG_SUBSCRIPTION, FLAG_SUSPEND
from sluice.protocol import properties as P
from sluice.protocol.bodies import ConsumerData, SubscriptionData
from sluice.protocol.codes import RequestCode
from sluice.protocol.command import RemotingCommand
from sluice.protocol.record import check_topic

__all__ = ["AsyncPushConsumer", "PushConsumer"]

log = logging.getLogger(__name__)

#: Flow control: the longest a queue over its thresholds waits before looking again (RocketMQ: 50 ms); it looks
#: again as soon as consumed messages leave it (ProcessQueue.wait_for_room).
FLOW_CONTROL_DELAY_S = 0.05
MIB = 1024 * 1024
#: The group's retry topic's subscription: everything (the broker applies the original topic's filter).
_RETRY_SUB = (MessageSelector.by_tag("*"), 0)


class AsyncPushConsumer(AsyncClient):
    """The asyncio push consumer; :class:`PushConsumer` runs it on a background loop thread.

    Options (keywords): :class:`sluice.client.push_options.PushConsumerOptions` and
    :class:`sluice.client.instance.ClientConfig` (e.g. ``persist_offset_interval``, ``instance_name``).
    """

    _kind = "consumer"
    _role = "push consumer"

    def __init__(self, group: str, namesrv: str | Iterable[str], **options: Any) -> None:
        self.options = self._setup(group, namesrv, PushConsumerOptions, options)
        self.consume_timestamp_ms = parse_consume_timestamp(self.options.consume_timestamp)
        self._subs: dict[str, tuple[MessageSelector, int]] = {}
        self.listener: Listener | None = None
        self.orderly = False
        self.rebalancer = Rebalancer(self)
        self.offset_store: OffsetStore = RemoteBrokerOffsetStore(self._query_offset, self._commit_offset)
        self.service: ConcurrentConsumeService | OrderlyConsumeService | None = None
        self._pull_tasks: dict[MessageQueue, asyncio.Task[None]] = {}
        #: Each pulled queue's PULL_MESSAGE fields that stay put between pulls (_pull_once).
        self._pull_templates: dict[MessageQueue, PullTemplate] = {}
        self._lock_task: asyncio.Task[None] | None = None
        self._running = False
        #: Times a queue waited because its cache was over a threshold (flow control).
        self.flow_control_times = 0
        #: When start() ran, epoch ms (GET_CONSUMER_RUNNING_INFO reports it).
        self.start_timestamp_ms = 0
        #: The trace dispatcher while started with enable_trace.
        self.trace: TraceDispatcher | None = None

    def _check_group(self, group: str) -> None:
        super()._check_group(group)
        check_topic(RETRY_PREFIX + group)  # the group name becomes part of topic names

    # ------------------------------------------------------------------------------ configuration

    def subscribe(self, topic: str, selector: MessageSelector | str | None = "*") -> None:
        """Consume ``topic``'s messages matching ``selector`` (a MessageSelector or a tag expression)."""
        check_topic(topic)
        if topic.startswith(RETRY_PREFIX):
            raise InvalidParameterError("retry topics are subscribed automatically; subscribe the original topic")
        sel = as_selector(selector)
        old = self._subs.get(topic)
        if old is None or old[0] != sel:
            self._subs[topic] = (sel, int(time.time() * 1000))
        if self._instance is not None:
            self._spawn_housekeeping(self._instance.send_heartbeat_to_all())
            if sel.is_class and self._running:
                filters = ClassFilters.of(self._instance)
                filters.attach(self)
                self._spawn_housekeeping(filters.register_everywhere(self.group, topic, sel))
            RebalanceService.of(self._instance).wakeup()

    def unsubscribe(self, topic: str) -> None:
        self._subs.pop(topic, None)
        if self._instance is not None:
            RebalanceService.of(self._instance).wakeup()

    def register_listener(self, listener: Listener, *, orderly: bool = False) -> None:
        """``listener(messages) -> ConsumeResult`` (concurrent) or, with ``orderly=True``, a listener called
        for one queue at a time, in offset order, returning ConsumeOrderlyResult (or ConsumeResult)."""
        if not callable(listener):
            raise InvalidParameterError("the listener must be callable")
        if self._running:
            raise ClientError("register the listener before start()")
        self.listener = listener
        self.orderly = orderly

    @property
    def running(self) -> bool:
        return self._running

    def topics(self) -> list[str]:
        """Every topic rebalanced: the subscriptions, and the group's retry topic in CLUSTERING."""
        out = sorted(self._subs)
        if self.options.model is MessageModel.CLUSTERING and out:
            out.append(RETRY_PREFIX + self.group)
        return out

    def _selector(self, topic: str) -> tuple[MessageSelector, int]:
        got = self._subs.get(topic)
        if got is None:  # the retry topic: everything; the broker applies the original topic's filter
            return _RETRY_SUB
        return got

    # ------------------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        self._check_not_started()
        if self.listener is None:
            raise ClientError("register a message listener before start()")
        if not self._subs:
            raise ClientError("subscribe to at least one topic before start()")
        inst = await self._join()
        if self.options.model is MessageModel.BROADCASTING:
            name = self.client_config.instance_name or "DEFAULT"
            root = Path(self.options.offset_store_dir).expanduser()
            self.offset_store = LocalFileOffsetStore(root / name / self.group / "offsets.json")
        await self.offset_store.load()
        try:
            self.trace = await started_trace(self.namesrv, self.client_config, self.options.enable_trace,
                                             self.options.trace_topic)
        except BaseException:
            await self._leave(inst)
            raise
        self.service = (OrderlyConsumeService if self.orderly else ConcurrentConsumeService)(
            self, self.listener, self.trace)
        self._running = True
        self.start_timestamp_ms = int(time.time() * 1000)
        for topic in self._subs:
            try:
                await inst.topic_route(topic, refresh=True)
            except SluiceError as exc:
                log.warning("no route for %s yet (%s); the rebalance will look again", topic, exc)
        await inst.send_heartbeat_to_all()
        if self.class_filters():  # registered before the first pull; errors are kept, pulls report them
            filters = ClassFilters.of(inst)
            filters.attach(self)
            await filters.upload_all()
        RebalanceService.of(inst).attach(self)
        if self.orderly and self.options.model is MessageModel.CLUSTERING:
            self._lock_task = asyncio.get_running_loop().create_task(self._renew_locks(), name="sluice-lock-renew")

    async def shutdown(self) -> None:
        """Stop pulling, let listener calls in flight finish (``await_termination``), commit, unlock,
        leave the group (the broker tells the others to rebalance)."""
        inst = self._instance
        if inst is None:
            return
        self._running = False
        try:
            await RebalanceService.of(inst).detach(self)
            await self.rebalancer.cancel_pending()
            tasks = [t for t in (self._lock_task, *self._pull_tasks.values()) if t is not None]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            if self.service is not None:
                self.service.stopping = True
                for pq in self.rebalancer.process_queues.values():
                    pq.arrived.set()  # orderly queue tasks waiting for messages see the stop
                await self.service.shutdown(self.options.await_termination)
            await self.offset_store.persist_all(list(self.rebalancer.process_queues))
            if self.orderly and self.options.model is MessageModel.CLUSTERING:
                await self.rebalancer.unlock_all()
            for pq in self.rebalancer.process_queues.values():
                pq.dropped = True
        finally:
            trace, self.trace = self.trace, None
            if trace is not None:  # after the listener calls in flight: their SubAfter records go too
                await trace.shutdown()
            await ClassFilters.of(inst).detach(self)
            await self._leave(inst)

    def _spawn_housekeeping(self, coro: Any) -> None:
        async def quietly() -> None:
            try:
                await coro
            except SluiceError as exc:
                log.info("consumer housekeeping failed: %s", exc)
        asyncio.get_running_loop().create_task(quietly())

    # ------------------------------------------------------------------------------ ConsumerInner

    def consumer_data(self) -> ConsumerData:
        subs = [self._with_class_error(sel.subscription_data(topic, version))
                for topic, (sel, version) in sorted(self._subs.items())]
        if self.options.model is MessageModel.CLUSTERING and subs:
            subs.append(MessageSelector.by_tag("*").subscription_data(RETRY_PREFIX + self.group, 0))
        return ConsumerData(group_name=self.group, consume_type="CONSUME_PASSIVELY",
                            message_model=self.options.message_model,
                            consume_from_where=self.options.consume_from_where, subscription_data_set=subs)

    def _with_class_error(self, sd: SubscriptionData) -> SubscriptionData:
        err = self.class_filter_error(sd.topic) if sd.class_filter_mode else None
        return sd if err is None else dataclasses.replace(sd, filter_class_error=str(err))

    def class_filters(self) -> dict[str, MessageSelector]:
        """The topics subscribed with a class filter, and their selectors (registered with filter servers)."""
        return {topic: sel for topic, (sel, _v) in self._subs.items() if sel.is_class}

    def class_filter_error(self, topic: str) -> FilterClassError | None:
        """The group's current class-filter error on ``topic``: the class and the cause (None while it works)."""
        inst = self._instance
        return None if inst is None else ClassFilters.of(inst).last_error(self.group, topic)

    async def persist_offsets(self) -> None:
        await self.offset_store.persist_all(list(self.rebalancer.process_queues))

    async def do_rebalance(self) -> bool:
        if not self._running:
            return True
        return await self.rebalancer.do_rebalance()

    async def reset_offsets(self, topic: str, offsets: Mapping[MessageQueue, int]) -> list[MessageQueue]:
        """Consume ``topic`` from these offsets now, dropping what is cached (what a broker's
        RESET_CONSUMER_CLIENT_OFFSET does); the offsets are persisted. Returns the owned queues restarted."""
        if not self._running:
            return []
        return await self.rebalancer.reset_offsets(topic, offsets)

    async def _renew_locks(self) -> None:
        while True:
            await asyncio.sleep(self.options.lock_renew_interval)
            try:
                await self.rebalancer.lock_all()
            except SluiceError as exc:
                log.warning("renewing queue locks of %s failed: %s", self.group, exc)

    # ------------------------------------------------------------------------------ offsets on the broker

    async def _query_offset(self, mq: MessageQueue) -> int:
        addr = await self.instance.broker_addr_for(mq.topic, mq.broker_name)
        return await self.instance.api.query_consumer_offset(addr, self.group, mq, self.options.request_timeout)

    async def _commit_offset(self, mq: MessageQueue, offset: int) -> None:
        addr = await self.instance.broker_addr_for(mq.topic, mq.broker_name)
        await self.instance.api.update_consumer_offset(addr, self.group, mq, offset, self.options.request_timeout)

    # ------------------------------------------------------------------------------ pulling

    def start_pulling(self, mq: MessageQueue, pq: ProcessQueue, offset: int) -> None:
        old = self._pull_tasks.get(mq)
        if old is not None and not old.done():
            old.cancel()
        task = asyncio.get_running_loop().create_task(self._pull_loop(mq, pq, offset), name=f"sluice-pull-{mq}")
        self._pull_tasks[mq] = task
        self._pull_templates.pop(mq, None)
        task.add_done_callback(lambda t, mq=mq: self._pull_done(mq, t))
        if isinstance(self.service, OrderlyConsumeService):
            self.service.start_queue(mq, pq)

    def _pull_done(self, mq: MessageQueue, task: asyncio.Task[None]) -> None:
        if self._pull_tasks.get(mq) is task:  # not a newer task of the same queue
            del self._pull_tasks[mq]
            self._pull_templates.pop(mq, None)

    def _flow_controlled(self, pq: ProcessQueue) -> bool:
        o = self.options
        if pq.msg_count > o.pull_threshold_for_queue or pq.msg_size > o.pull_threshold_size_for_queue * MIB:
            return True
        return not self.orderly and pq.max_span > o.consume_concurrently_max_span

    async def _pull_loop(self, mq: MessageQueue, pq: ProcessQueue, offset: int) -> None:
        o = self.options
        assert self.service is not None
        size = o.pull_batch_size
        while self._running and not pq.dropped:
            if self._flow_controlled(pq):
                self.flow_control_times += 1
                await pq.wait_for_room(FLOW_CONTROL_DELAY_S)
                continue
            try:
                result = await self._pull_once(mq, pq, offset, size)
            except FilterClassError as exc:  # logged at WARNING once per new error (class_filter.py)
                log.debug("pull of %s at offset %d failed: %s", mq, offset, exc)
                await asyncio.sleep(o.pull_time_delay_when_exception)
                continue
            except SluiceError as exc:
                log.warning("pull of %s at offset %d failed: %s", mq, offset, exc)
                await asyncio.sleep(o.pull_time_delay_when_exception)
                continue
            except Exception:  # a queue must never stop being pulled: log, wait, try again
                log.exception("pull of %s at offset %d failed", mq, offset)
                await asyncio.sleep(o.pull_time_delay_when_exception)
                continue
            if pq.dropped:
                break
            pq.last_pull_time = time.monotonic()
            status, nxt = result.status, result.next_begin_offset
            size = o.next_pull_size(result.max_offset - nxt)
            if status is PullStatus.FOUND and result.msg_found_list:
                offset = nxt  # the messages went to the consume service as the answer was read (_deliver)
            elif status is PullStatus.OFFSET_ILLEGAL:
                log.warning("group %s: offset %d of %s is out of range [%d, %d]; moving to %d", self.group,
                            offset, mq, result.min_offset, result.max_offset, nxt)
                offset = nxt
                self.offset_store.update(mq, nxt)
                await self.offset_store.persist(mq)
            else:
                offset = nxt
                if pq.msg_count == 0:  # correctTagsOffset: nothing cached, so progress is the pull position
                    self.offset_store.update(mq, nxt, increase_only=True)
            if o.pull_interval > 0:
                await asyncio.sleep(o.pull_interval)

    def _scan_room(self, sel: MessageSelector) -> int | None:
        """The queue offsets a filtered pull may look at (maxScanUnits): consume_concurrently_max_span, so one
        answer never spans more than the span rule allows (the broker's window alone is 800 units, which
        takes a selective catch-up more than twice the round trips); as after any pull, the rule holds the
        next pull while the cached span is over it. None for orderly listeners (no span rule) and
        unfiltered subscriptions: the broker's own window."""
        if self.orderly or (sel.is_tag and not sel.tags):
            return None
        return self.options.consume_concurrently_max_span

    async def _pull_once(self, mq: MessageQueue, pq: ProcessQueue, offset: int, size: int) -> PullResult:
        """One pull of ``mq`` at ``offset``; its FOUND messages are cached in ``pq`` and handed to the consume
        service (:meth:`_deliver`) before this returns: on an open connection as the answer's frame is read
        (_PullWaiter), not a loop iteration later when this task resumes."""
        o = self.options
        inst = self.instance
        sub = self._selector(mq.topic)
        sel = sub[0]
        flags = FLAG_SUSPEND | FLAG_SUBSCRIPTION
        commit = 0
        if o.model is MessageModel.CLUSTERING:
            commit = self.offset_store.read_memory(mq)
            if commit > 0:
                flags |= FLAG_COMMIT_OFFSET
        template = self._pull_templates.get(mq)
        if template is None or template.sub is not sub:  # a new queue, or the topic subscribed anew
            template = self._pull_templates[mq] = PullTemplate(self._pull_header(mq, sub, 0, 0, 0, 0), sub)
        ext = template.ext(offset, size, flags, max(commit, 0))
        if sel.is_class:  # a filter server of mq's broker runs the class; the broker never serves it
            response = await ClassFilters.of(inst).pull(self.group, mq, sel, ext, o.consumer_timeout_when_suspend)
            return self._pulled(mq, pq, sel, response)
        # Looked up on every pull (routes change); the coroutine only when the route must be fetched.
        addr = inst.find_broker_addr(mq.broker_name, master_only=False)
        if addr is None:
            addr = await inst.broker_addr_for(mq.topic, mq.broker_name, master_only=False)
        request = RemotingCommand.request(RequestCode.PULL_MESSAGE, ext)
        remoting = inst.remoting
        conn = remoting.open_connection(addr)
        if conn is None:  # to connect, or the transport's buffer is full: wait as any request does
            response = await remoting.invoke(addr, request, o.consumer_timeout_when_suspend)
            return self._pulled(mq, pq, sel, response)
        fut: asyncio.Future[PullResult] = asyncio.get_running_loop().create_future()
        opaque = remoting.request_with(conn, request, o.consumer_timeout_when_suspend,
                                       _PullWaiter(self, mq, pq, sel, fut))
        try:
            return await fut
        finally:
            conn.forget(opaque)  # a cancelled pull's late answer is dropped

    def _pull_header(self, mq: MessageQueue, sub: tuple[MessageSelector, int], offset: int, size: int, flags: int,
                     commit: int) -> H.PullMessageRequestHeader:
        """The PULL_MESSAGE header of one pull (PullTemplate keeps its fixed fields per queue and subscription)."""
        sel, version = sub
        return H.PullMessageRequestHeader(
            consumer_group=self.group, topic=mq.topic, queue_id=mq.queue_id, queue_offset=offset,
            max_msg_nums=size, sys_flag=flags, commit_offset=commit,
            suspend_timeout_millis=int(self.options.broker_suspend_max * 1000), subscription=sel.expression,
            sub_version=version, expression_type=sel.wire_expression_type,
            max_scan_units=self._scan_room(sel))

    def _pulled(self, mq: MessageQueue, pq: ProcessQueue, sel: MessageSelector,
                response: RemotingCommand) -> PullResult:
        result = process_pull_response(response, sel, check_crc=self.options.check_crc)
        self._deliver(mq, pq, result)
        return result

    def _deliver(self, mq: MessageQueue, pq: ProcessQueue, result: PullResult) -> None:
        """PullCallback.onSuccess's FOUND case: cache the new messages and submit them to the consume service
        (not for a queue released meanwhile)."""
        if result.status is PullStatus.FOUND and result.msg_found_list and not pq.dropped:
            assert self.service is not None
            fresh = pq.put(self._restore_topics(result.msg_found_list))
            if fresh:
                self.service.submit(mq, pq, fresh)

    def _restore_topics(self, msgs: list[MessageExt]) -> list[MessageExt]:
        """resetRetryAndNamespace: a retried message shows its original topic to the listener."""
        retry = RETRY_PREFIX + self.group
        for m in msgs:
            if m.topic == retry:
                original = m.properties.get(P.RETRY_TOPIC)
                if original:
                    m.topic = original
        return msgs

    # ------------------------------------------------------------------------------ introspection

    def owned_queues(self) -> list[MessageQueue]:
        return sorted(self.rebalancer.process_queues, key=lambda q: (q.topic, q.broker_name, q.queue_id))


class _PullWaiter:
    """A pull's response waiter (RemotingConnection.request_with): decodes the answer and delivers its messages
    (AsyncPushConsumer._pulled) as the frame is read, then hands the PullResult, or the error, to the pull task's
    future. A pull whose task was cancelled (its future with it) delivers nothing."""

    __slots__ = ("consumer", "mq", "pq", "sel", "fut")

    def __init__(self, consumer: AsyncPushConsumer, mq: MessageQueue, pq: ProcessQueue, sel: MessageSelector,
                 fut: asyncio.Future[PullResult]) -> None:
        self.consumer = consumer
        self.mq = mq
        self.pq = pq
        self.sel = sel
        self.fut = fut

    def done(self) -> bool:
        return self.fut.done()

    def set_result(self, response: RemotingCommand) -> None:
        if self.fut.done():
            return
        try:
            result = self.consumer._pulled(self.mq, self.pq, self.sel, response)
        except Exception as exc:  # the pull task logs it and pulls again, as for a failed invoke
            self.fut.set_exception(exc)
        else:
            self.fut.set_result(result)

    def set_exception(self, exc: BaseException) -> None:
        if not self.fut.done():
            self.fut.set_exception(exc)


class PushConsumer(_Facade):
    """The blocking push consumer: the listener runs on the consumer's thread pool; the rest on the
    shared client loop thread. See :class:`AsyncPushConsumer` for the options."""

    def __init__(self, group: str, namesrv: str | Iterable[str], **options: Any) -> None:
        super().__init__()
        self._impl: AsyncPushConsumer = AsyncPushConsumer(group, namesrv, **options)  # type: ignore[assignment]

    @property
    def async_consumer(self) -> AsyncPushConsumer:
        return self._impl

    def subscribe(self, topic: str, selector: MessageSelector | str | None = "*") -> None:
        if self._loop is None:
            self._impl.subscribe(topic, selector)
            return

        async def on_loop() -> None:
            self._impl.subscribe(topic, selector)
        self._run(on_loop(), self._impl.options.request_timeout)

    def unsubscribe(self, topic: str) -> None:
        if self._loop is None:
            self._impl.unsubscribe(topic)
            return

        async def on_loop() -> None:
            self._impl.unsubscribe(topic)
        self._run(on_loop(), self._impl.options.request_timeout)

    def register_listener(self, listener: Listener, *, orderly: bool = False) -> None:
        self._impl.register_listener(listener, orderly=orderly)

    def shutdown(self) -> None:
        if self._loop is None:
            return
        o = self._impl.options
        try:
            self._run(self._impl.shutdown(), o.await_termination + 4 * o.request_timeout + _SLACK)
        finally:
            self._loop = None
            _release_loop()

    def owned_queues(self) -> list[MessageQueue]:
        async def on_loop() -> list[MessageQueue]:
            return self._impl.owned_queues()
        return self._run(on_loop(), self._impl.options.request_timeout)

    def class_filter_error(self, topic: str) -> FilterClassError | None:
        """The group's current class-filter error on ``topic`` (None while the class works)."""
        if self._loop is None:
            return None

        async def on_loop() -> FilterClassError | None:
            return self._impl.class_filter_error(topic)
        return self._run(on_loop(), self._impl.options.request_timeout)
