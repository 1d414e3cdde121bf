"""Rebalance: which queues a push consumer (or a subscribing lite pull consumer, lite_pull.py) owns, and the
service that re-decides it (RebalanceImpl, RebalanceService).

Every ``rebalance_interval`` (20 s), and at once when a broker sends
NOTIFY_CONSUMER_IDS_CHANGED, each push consumer of a client instance reads
its topics' queues (routes) and, in CLUSTERING, the group's members from a
broker; both lists are sorted and the allocation strategy picks this member's
share. A queue no longer ours is dropped (pulling stops), its in-flight
listener calls get a short grace, its offset is committed, and — orderly —
its broker lock is released; a queue newly ours starts at the committed
offset, or where consume_from_where says when the group has none (that start
is committed at once, so a member dying before its first commit cannot make
the group skip messages). Orderly consumers take a queue only with its broker
lock, and re-run the rebalance after a second when a lock was refused.

An online offset reset (RESET_CONSUMER_CLIENT_OFFSET, sent by a broker after
``sluice admin resetOffsetByTime``) drops the affected queues' process queues
(cached messages gone, in-flight batches commit nothing), writes and persists
the new offsets, and starts the queues again from them (MQClientInstance.resetOffset).
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import orjson

from sluice.client.allocate import STRATEGIES
from sluice.client.broker_api import decode_messages
from sluice.client.consume_directly import consume_directly
from sluice.client.push_options import ConsumeFromWhere, MessageModel
from sluice.client.offset_store import RemoteBrokerOffsetStore
from sluice.client.process_queue import ProcessQueue
from sluice.client.push_requests import consumer_id_list, lock_batch, unlock_batch
from sluice.client.results import MessageQueue, queue_sort_key
from sluice.client.routing import subscribe_queues
from sluice.client.running_info import consumer_running_info, encode_running_info
from sluice.errors import ClientError, SluiceError
from sluice.protocol import headers as H
from sluice.protocol.codes import RequestCode
from sluice.protocol.command import RemotingCommand
from sluice.transport.connection import RemotingConnection
from sluice.protocol.offset_table import decode_offset_table

if TYPE_CHECKING:
    from sluice.client.instance import ClientInstance
    from sluice.client.push_view import PushConsumerView

__all__ = ["RebalanceService", "Rebalancer", "resolve_strategy"]

log = logging.getLogger(__name__)

RETRY_PREFIX = "%RETRY%"
#: A released queue waits this long for its in-flight listener calls before committing (fewer duplicates).
RELEASE_GRACE_S = 1.0
#: After a refused orderly lock (the previous owner has not let go yet), rebalance again this soon.
REBALANCE_LATER_S = 1.0
#: Concurrent CLUSTERING hand-off: a queue taken while the group has other members is started this long
#: after the rebalance, so its previous owner (released at the same notification) has committed first.
HANDOFF_DELAY_S = RELEASE_GRACE_S + 0.5


def resolve_strategy(strategy: str | Callable[..., Any]) -> Callable[[str, Sequence[MessageQueue], Sequence[str]],
                                                                     list[MessageQueue]]:
    return strategy if callable(strategy) else STRATEGIES[strategy]


class Rebalancer:
    """The queue table of one push consumer and the rules to change it."""

    def __init__(self, consumer: PushConsumerView) -> None:
        self.consumer = consumer
        self.process_queues: dict[MessageQueue, ProcessQueue] = {}
        self.strategy = resolve_strategy(consumer.options.allocate_strategy)
        self._lock = asyncio.Lock()
        self._failing: set[str] = set()
        #: The latest allocation per topic, queues waiting out the hand-off pause, and those waits.
        self._wanted: dict[str, set[MessageQueue]] = {}
        self._pending: set[MessageQueue] = set()
        self._later_tasks: set[asyncio.Task[None]] = set()
        #: Start offsets being committed while their queues already pull (_take).
        self._commits: set[asyncio.Task[None]] = set()

    @property
    def _inst(self) -> ClientInstance:
        return self.consumer.instance

    async def do_rebalance(self) -> bool:
        """One pass over every subscribed topic; False when it should run again soon (an orderly lock was
        refused, or a topic could not be rebalanced)."""
        async with self._lock:
            ok = True
            topics = self.consumer.topics()
            for topic in topics:
                try:
                    ok &= await self._rebalance_topic(topic)
                    self._failing.discard(topic)
                except SluiceError as exc:
                    # Soon again (a retry topic's route appears a moment after the first heartbeat);
                    # warn once per failing spell, and only of the user's topics: the group's retry topic
                    # fails with them (no broker yet) or briefly at start, which says nothing new.
                    ok = False
                    level = (logging.DEBUG if topic in self._failing else
                             logging.INFO if topic.startswith(RETRY_PREFIX) else logging.WARNING)
                    log.log(level, "rebalance of %s for group %s failed: %s", topic, self.consumer.group, exc)
                    self._failing.add(topic)
            for mq in [mq for mq in self.process_queues if mq.topic not in topics]:
                await self._release(mq, self.process_queues[mq])
            for topic in [t for t in self._wanted if t not in topics]:
                del self._wanted[topic]
            return ok

    async def _rebalance_topic(self, topic: str) -> bool:
        route = await self._inst.topic_route(topic)
        queues = sorted(subscribe_queues(topic, route), key=queue_sort_key)
        if self.consumer.options.model is MessageModel.BROADCASTING:
            return await self._update(topic, set(queues))
        cids = await self._consumer_ids(topic)
        if not queues or not cids:
            log.debug("rebalance %s/%s: %d queues, %d members", self.consumer.group, topic, len(queues), len(cids))
            return True
        mine = self.strategy(self._inst.client_id, queues, sorted(cids))
        return await self._update(topic, set(mine), handoff=len(cids) > 1)

    async def _consumer_ids(self, topic: str) -> list[str]:
        route = await self._inst.topic_route(topic)
        addrs = [a for a in (bd.select_broker_addr() for bd in sorted(route.broker_datas,
                                                                      key=lambda b: b.broker_name)) if a]
        last: SluiceError | None = None
        for addr in addrs:
            try:
                return await consumer_id_list(self._inst.api, addr, self.consumer.group,
                                              self.consumer.options.request_timeout)
            except SluiceError as exc:
                last = exc
        if last is not None:
            raise last
        return []

    async def _update(self, topic: str, allocated: set[MessageQueue], *, handoff: bool = False) -> bool:
        """updateProcessQueueTableInRebalance."""
        self._wanted[topic] = allocated
        for mq, pq in list(self.process_queues.items()):
            # A queue dropped earlier but still here (its release was busy) is released first, even
            # when it is ours again: it then starts afresh from the committed offset.
            if mq.topic == topic and (mq not in allocated or pq.dropped):
                await self._release(mq, pq)
        c = self.consumer
        new = sorted(allocated - set(self.process_queues) - self._pending, key=queue_sort_key)
        if new and handoff and not c.orderly:
            # Orderly queues hand over through broker locks; concurrent ones through a pause, taken in the
            # background so this member's own releases at the next notification are not held up.
            self._pending.update(new)
            task = asyncio.get_running_loop().create_task(self._take_later(topic, new))
            self._later_tasks.add(task)
            task.add_done_callback(self._later_tasks.discard)
            return True
        if not c.orderly:
            # Each take is a few broker round trips (committed offset, start offset, commit): taken together,
            # the last queue starts pulling as soon as the first, not after all the others' round trips.
            await asyncio.gather(*(self._take(mq) for mq in new))
            return True
        all_locked = True
        for mq in new:
            all_locked &= await self._take(mq)
        return all_locked

    async def _take_later(self, topic: str, mqs: list[MessageQueue]) -> None:
        await asyncio.sleep(HANDOFF_DELAY_S)
        async with self._lock:
            self._pending.difference_update(mqs)
            for mq in mqs:  # still ours after the pause, by the latest rebalance?
                if mq in self._wanted.get(topic, ()) and mq not in self.process_queues and self.consumer.running:
                    await self._take(mq)

    async def _take(self, mq: MessageQueue) -> bool:
        """Start consuming a queue newly allocated to us; False when its orderly lock was refused."""
        c = self.consumer
        if c.orderly and c.options.model is MessageModel.CLUSTERING and not await self._lock_one(mq):
            log.info("group %s: queue %s is still locked by another member; retrying soon", c.group, mq)
            return False
        c.offset_store.remove(mq)
        try:
            offset, fresh = await self.start_offset(mq)
        except SluiceError as exc:
            log.warning("group %s: no start offset for %s (%s); not taking it this round", c.group, mq, exc)
            await self._unlock_quietly(mq)
            return True
        if fresh:
            # The start is committed at once (compute_pull_from_where's rule), but the first pull need not
            # wait for the answer: the commit is written to the broker's connection first, a failed one is
            # retried by the periodic persist (the offset stays dirty), and the first pull commits no lower.
            task = asyncio.get_running_loop().create_task(c.offset_store.persist(mq))
            self._commits.add(task)
            task.add_done_callback(self._commits.discard)
        pq = ProcessQueue()
        pq.locked = True
        pq.last_lock_time = time.monotonic()
        self.process_queues[mq] = pq
        log.info("group %s takes %s from offset %d", c.group, mq, offset)
        c.start_pulling(mq, pq, offset)
        return True

    async def cancel_pending(self) -> None:
        """Cancel the hand-off waits; let start commits on their way finish (never lost to a shutdown)."""
        tasks = list(self._later_tasks)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, *self._commits, return_exceptions=True)

    async def _release(self, mq: MessageQueue, pq: ProcessQueue) -> None:
        """removeUnnecessaryMessageQueue: stop pulling, let in-flight work finish briefly, commit, unlock."""
        c = self.consumer
        pq.dropped = True
        pq.arrived.set()  # wakes an orderly consume task so it sees the drop
        orderly_locked = c.orderly and c.options.model is MessageModel.CLUSTERING
        if orderly_locked:
            try:
                # The batch with the listener finishes (and commits) before the lock is given up.
                await asyncio.wait_for(pq.consume_lock.acquire(), RELEASE_GRACE_S)
            except TimeoutError:
                log.info("group %s: %s is busy; releasing it at the next rebalance", c.group, mq)
                self._inst_later()
                return
        else:
            deadline = time.monotonic() + RELEASE_GRACE_S
            while pq.busy and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
        try:
            await c.offset_store.persist(mq)
            c.offset_store.remove(mq)
            self.process_queues.pop(mq, None)
            pq.clear()
            if orderly_locked:
                await self._unlock_quietly(mq)
            log.info("group %s released %s", c.group, mq)
        finally:
            if orderly_locked:
                pq.consume_lock.release()

    def _inst_later(self) -> None:
        RebalanceService.of(self._inst).wakeup_later(REBALANCE_LATER_S)

    async def reset_offsets(self, topic: str, offsets: Mapping[MessageQueue, int]) -> list[MessageQueue]:
        """Apply an online offset reset of ``topic``; returns the queues restarted from their new offset.

        CLUSTERING applies it to the queues this member owns (the broker committed every queue already);
        BROADCASTING to every queue in ``offsets`` (the offsets live only in this member's file)."""
        c = self.consumer
        offsets = {mq: off for mq, off in offsets.items() if mq.topic == topic and off >= 0}
        async with self._lock:  # no rebalance takes or releases a queue meanwhile
            owned = {mq: pq for mq, pq in self.process_queues.items() if mq in offsets}
            targets = sorted(offsets if c.options.model is MessageModel.BROADCASTING else owned, key=queue_sort_key)
            # A queue dropped by a release that was busy is not restarted: the next rebalance releases it,
            # committing the reset offset set below.
            restart = {mq: pq for mq, pq in owned.items() if not pq.dropped}
            for pq in restart.values():
                pq.dropped = True  # pulls stop, queued listener batches are skipped
                pq.arrived.set()
            held = await self._hold_orderly_batches(list(restart.values())) if c.orderly else []
            try:
                for mq, pq in restart.items():
                    # Out of the table first: an old batch finishing later is not owned and commits nothing.
                    self.process_queues.pop(mq, None)
                    pq.clear()
                for mq in targets:
                    c.offset_store.update(mq, offsets[mq])  # not increase-only: a reset may move back
                # Persist even an unchanged value: a pull carrying the old commit offset may have reached the
                # broker after its reset and moved it back.
                await asyncio.gather(*(c.offset_store.persist(mq) for mq in targets))
                started = sorted(restart, key=queue_sort_key) if c.running else []  # not while shutting down
                for mq in started:
                    old = restart[mq]
                    pq = ProcessQueue()
                    pq.locked, pq.last_lock_time = old.locked, old.last_lock_time  # orderly: the lock is kept
                    self.process_queues[mq] = pq
                    c.start_pulling(mq, pq, offsets[mq])
            finally:
                for pq in held:
                    pq.consume_lock.release()
        log.info("group %s reset %d queue(s) of %s: %s", c.group, len(targets), topic,
                 ", ".join(f"{mq.broker_name}/{mq.queue_id} -> {offsets[mq]}" for mq in targets))
        return started

    async def _hold_orderly_batches(self, pqs: list[ProcessQueue]) -> list[ProcessQueue]:
        """Wait briefly for the orderly batches with the listener (their commit lands before the reset);
        returns the process queues whose consume lock is now held."""
        async def grab(pq: ProcessQueue) -> bool:
            try:
                await asyncio.wait_for(pq.consume_lock.acquire(), RELEASE_GRACE_S)
                return True
            except TimeoutError:
                return False  # still busy: its commit is skipped, the queue is no longer owned by then
        got = await asyncio.gather(*(grab(pq) for pq in pqs))  # one grace for all, not one per queue
        return [pq for pq, ok in zip(pqs, got) if ok]

    async def compute_pull_from_where(self, mq: MessageQueue) -> int:
        """The committed offset, else consume_from_where, exactly (RebalancePushImpl.computePullFromWhere
        without its fall-backs to 0), which is then committed. Retry topics start at 0: every retry of the
        group is wanted."""
        offset, fresh = await self.start_offset(mq)
        if fresh:
            await self.consumer.offset_store.persist(mq)
        return offset

    async def start_offset(self, mq: MessageQueue) -> tuple[int, bool]:
        """compute_pull_from_where without the commit: (offset, True when it is not the committed one and
        must be committed; it is in the offset store's memory already)."""
        c = self.consumer
        where = c.options.from_where
        first = None
        if where is ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET and not mq.topic.startswith(RETRY_PREFIX) \
                and isinstance(c.offset_store, RemoteBrokerOffsetStore):
            # Asked beside the committed offset (a read either way): a group new to the queue, whose
            # committed offset the broker does not have, starts a round trip sooner.
            first = asyncio.ensure_future(self._first_offset(mq))
        try:
            committed = await c.offset_store.read_store(mq)
        except BaseException:
            if first is not None:
                first.cancel()
                await asyncio.gather(first, return_exceptions=True)
            raise
        if committed >= 0:
            if first is not None:
                first.cancel()
                await asyncio.gather(first, return_exceptions=True)
            return committed, False
        if mq.topic.startswith(RETRY_PREFIX):
            offset = 0
        elif first is not None:
            offset = await first
        else:
            api, rt = self._inst.api, c.options.request_timeout
            addr = await self._inst.broker_addr_for(mq.topic, mq.broker_name, master_only=False)
            if where is ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET:
                offset = await api.max_offset(addr, mq, rt)
            elif where is ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET:
                offset = await api.min_offset(addr, mq, rt)
            else:
                offset = await api.search_offset(addr, mq, c.consume_timestamp_ms, rt)
        c.offset_store.update(mq, offset)
        return offset, True

    async def _first_offset(self, mq: MessageQueue) -> int:
        addr = await self._inst.broker_addr_for(mq.topic, mq.broker_name, master_only=False)
        return await self._inst.api.min_offset(addr, mq, self.consumer.options.request_timeout)

    # ------------------------------------------------------------------------------ orderly locks

    async def _lock_batch(self, mqs: list[MessageQueue]) -> set[MessageQueue]:
        """LOCK_BATCH_MQ for queues of one broker; the queues this client holds now."""
        c = self.consumer
        addr = await self._inst.broker_addr_for(mqs[0].topic, mqs[0].broker_name)
        return await lock_batch(self._inst.api, addr, c.group, self._inst.client_id, mqs, c.options.request_timeout)

    async def _unlock_batch(self, mqs: list[MessageQueue]) -> None:
        """UNLOCK_BATCH_MQ for queues of one broker."""
        c = self.consumer
        addr = await self._inst.broker_addr_for(mqs[0].topic, mqs[0].broker_name)
        await unlock_batch(self._inst.api, addr, c.group, self._inst.client_id, mqs, c.options.request_timeout)

    def _owned_by_broker(self) -> dict[str, list[MessageQueue]]:
        by_broker: dict[str, list[MessageQueue]] = {}
        for mq in self.process_queues:
            by_broker.setdefault(mq.broker_name, []).append(mq)
        return by_broker

    async def _lock_one(self, mq: MessageQueue) -> bool:
        try:
            got = await self._lock_batch([mq])
        except SluiceError as exc:
            log.warning("locking %s failed: %s", mq, exc)
            return False
        return mq in got

    async def _unlock_quietly(self, mq: MessageQueue) -> None:
        c = self.consumer
        if not (c.orderly and c.options.model is MessageModel.CLUSTERING):
            return
        try:
            await self._unlock_batch([mq])
        except SluiceError as exc:
            log.info("unlocking %s failed (the broker expires it): %s", mq, exc)

    async def lock_all(self) -> None:
        """Renew the locks of every owned queue, per broker (RebalanceImpl.lockAll)."""
        for broker, mqs in self._owned_by_broker().items():
            try:
                got = await self._lock_batch(mqs)
            except SluiceError as exc:
                log.warning("renewing locks on %s failed: %s", broker, exc)
                continue
            now = time.monotonic()
            for mq in mqs:
                pq = self.process_queues.get(mq)
                if pq is None:
                    continue
                pq.locked = mq in got
                if pq.locked:
                    pq.last_lock_time = now
                else:
                    log.warning("group %s lost the lock of %s", self.consumer.group, mq)

    async def unlock_all(self) -> None:
        for broker, mqs in self._owned_by_broker().items():
            try:
                await self._unlock_batch(mqs)
            except SluiceError as exc:
                log.info("unlocking queues on %s failed (the broker expires them): %s", broker, exc)


class RebalanceService:
    """One per client instance: runs every push and lite pull consumer's rebalance on a timer and on notification."""

    def __init__(self, inst: ClientInstance) -> None:
        self.inst = inst
        self.consumers: dict[str, PushConsumerView] = {}
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._later: asyncio.TimerHandle | None = None
        inst.remoting.register(RequestCode.NOTIFY_CONSUMER_IDS_CHANGED, self._on_notify)
        inst.remoting.register(RequestCode.RESET_CONSUMER_CLIENT_OFFSET, self._on_reset_offset)
        inst.remoting.register(RequestCode.GET_CONSUMER_RUNNING_INFO, self._on_running_info)
        inst.remoting.register(RequestCode.CONSUME_MESSAGE_DIRECTLY, self._on_consume_directly)

    @classmethod
    def of(cls, inst: ClientInstance) -> RebalanceService:
        return inst.service(cls, cls)

    def attach(self, consumer: PushConsumerView) -> None:
        self.consumers[consumer.group] = consumer
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run(), name="sluice-rebalance")
        self.wakeup()

    async def detach(self, consumer: PushConsumerView) -> None:
        if self.consumers.get(consumer.group) is consumer:
            del self.consumers[consumer.group]
        if not self.consumers and self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
            if self._later is not None:
                self._later.cancel()

    def wakeup(self) -> None:
        self._wake.set()

    def wakeup_later(self, delay: float) -> None:
        if self._later is None or self._later.cancelled() or self._later.when() <= asyncio.get_running_loop().time():
            self._later = asyncio.get_running_loop().call_later(delay, self.wakeup)

    async def _on_notify(self, conn: RemotingConnection, request: RemotingCommand) -> RemotingCommand | None:
        group = request.ext_fields.get("consumerGroup", "")
        log.info("broker %s says the members of group %s changed; rebalancing", conn.peer, group)
        if group in self.consumers or not group:
            self.wakeup()
        return None

    async def _on_reset_offset(self, conn: RemotingConnection, request: RemotingCommand) -> RemotingCommand | None:
        """RESET_CONSUMER_CLIENT_OFFSET (ClientRemotingProcessor.resetOffset): the broker committed new offsets
        for a group of ours; apply them before our next commit overwrites them."""
        try:
            h = H.ResetOffsetRequestHeader.from_command(request)
            offsets = decode_offset_table(request.body or b"")
        except SluiceError as exc:  # a oneway request gets no error reply: say it here
            log.warning("ignoring a malformed RESET_CONSUMER_CLIENT_OFFSET from %s: %s", conn.peer, exc)
            raise
        consumer = self.consumers.get(h.group)
        if consumer is None:
            log.info("broker %s reset offsets of group %s, which has no push consumer here", conn.peer, h.group)
        else:
            log.info("broker %s reset offsets of group %s on %s (timestamp %d)", conn.peer, h.group, h.topic,
                     h.timestamp)
            await consumer.reset_offsets(h.topic, offsets)
        return request.make_response()

    async def _on_running_info(self, conn: RemotingConnection, request: RemotingCommand) -> RemotingCommand:
        """GET_CONSUMER_RUNNING_INFO (ClientRemotingProcessor.getConsumerRunningInfo), for a push consumer here."""
        h = H.GetConsumerRunningInfoRequestHeader.from_command(request)
        consumer = self.consumers.get(h.consumer_group)
        if consumer is None or not consumer.running:
            raise ClientError(f"The Consumer Group <{h.consumer_group}> not exist in this consumer")
        return request.make_response(body=encode_running_info(*consumer_running_info(consumer)))

    async def _on_consume_directly(self, conn: RemotingConnection, request: RemotingCommand) -> RemotingCommand:
        """CONSUME_MESSAGE_DIRECTLY (ClientRemotingProcessor.consumeMessageDirectly): client/consume_directly.py."""
        h = H.ConsumeMessageDirectlyResultRequestHeader.from_command(request)
        consumer = self.consumers.get(h.consumer_group)
        if consumer is None or not consumer.running:
            raise ClientError(f"The Consumer Group <{h.consumer_group}> not exist in this consumer")
        msgs = decode_messages(request.body)
        if len(msgs) != 1:
            raise ClientError(f"CONSUME_MESSAGE_DIRECTLY carries {len(msgs)} messages; it takes one")
        result = await consume_directly(consumer, msgs[0])
        return request.make_response(body=orjson.dumps(result))

    async def _run(self) -> None:
        while self.consumers:
            interval = min(c.options.rebalance_interval for c in self.consumers.values())
            try:
                await asyncio.wait_for(self._wake.wait(), interval)
            except TimeoutError:
                pass
            self._wake.clear()
            for consumer in list(self.consumers.values()):
                try:
                    if not await consumer.do_rebalance():
                        self.wakeup_later(REBALANCE_LATER_S)
                except asyncio.CancelledError:
                    raise
                except Exception:  # one consumer's failure must not stop the others' rebalances
                    log.exception("rebalance of group %s failed", consumer.group)
