"""AsyncPullConsumer: pull from queues you choose, at offsets you keep (DefaultMQPullConsumer).

Pulls carry their subscription inline (the SUBSCRIPTION sysflag), so the
broker filters by the selector given to each pull; a TAG selector's result is
re-checked on the exact tag strings as PullAPIWrapper.processPullResult does.
Offsets set with :meth:`update_consumer_offset` are kept locally and sent to
the broker by :meth:`commit`, every 5 s by the client instance, and at shutdown
(RemoteBrokerOffsetStore). A class-filter selector (``MessageSelector.by_class``)
pulls through a filter server of the queue's broker (client/class_filter.py);
its failures raise :class:`sluice.errors.FilterClassError`, naming the class and
the cause.
"""
from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Iterable
from typing import Any

from sluice.client.broker_api import decode_messages
from sluice.client.class_filter import ClassFilters
from sluice.client.lifecycle import AsyncClient
from sluice.client.options import PullConsumerOptions
from sluice.client.results import MessageQueue, PullResult, PullStatus, queue_sort_key
from sluice.client.routing import subscribe_queues
from sluice.client.selector import MessageSelector, as_selector
from sluice.errors import ClientError, FilterClassError, InvalidParameterError, SluiceError, TopicNotExistError
from sluice.message import MessageExt
from sluice.protocol import fields
from sluice.protocol import headers as H
from sluice.protocol import properties as P
from sluice.protocol.bodies import ConsumerData, SubscriptionData
from sluice.protocol.codes import RequestCode, ResponseCode
from sluice.protocol.command import RemotingCommand, error_for_response
from sluice.protocol.msgid import check_offset_msg_id

__all__ = ["AsyncPullConsumer", "process_pull_response"]

log = logging.getLogger(__name__)

# PullSysFlag bits (common/src/main/java/org/apache/rocketmq/common/sysflag/PullSysFlag.java).
from sluice.protocol.headers import FLAG_SUBSCRIPTION, FLAG_SUSPEND  # noqa: E402

# PullMessageResponseHeader.from_command's compiled reader itself (keyed by the wire names: from_ext's reader),
# without the two calls in front of it: one runs per pull.
_read_pull_response = fields.keyed_reader(H.PullMessageResponseHeader, {})

_STATUS_BY_CODE = {
    ResponseCode.SUCCESS: PullStatus.FOUND,
    ResponseCode.PULL_NOT_FOUND: PullStatus.NO_NEW_MSG,
    ResponseCode.PULL_RETRY_IMMEDIATELY: PullStatus.NO_MATCHED_MSG,
    ResponseCode.PULL_OFFSET_MOVED: PullStatus.OFFSET_ILLEGAL,
}


def process_pull_response(response: RemotingCommand, selector: MessageSelector, *,
                          check_crc: bool = True) -> PullResult:
    """A PULL_MESSAGE response to a PullResult (MQClientAPIImpl.processPullResponse +
    PullAPIWrapper.processPullResult): records decoded, TAG results re-checked on the tag strings,
    MIN_OFFSET / MAX_OFFSET set on each message."""
    status = _STATUS_BY_CODE.get(response.code)  # type: ignore[call-overload]
    if status is None:
        raise error_for_response(response)
    header = _read_pull_response(response.ext_fields)
    msgs: list[MessageExt] = []
    if status is PullStatus.FOUND:
        msgs = decode_messages(response.body, check_crc=check_crc,
                               extra={P.MIN_OFFSET: str(header.min_offset), P.MAX_OFFSET: str(header.max_offset)})
        tags = selector.tags
        if tags:
            # Drops hash-collision false positives and untagged messages, exactly as Java does.
            msgs = [m for m in msgs if m.properties.get(P.TAGS) in tags]
    return PullResult(status=status, next_begin_offset=header.next_begin_offset, min_offset=header.min_offset,
                      max_offset=header.max_offset, msg_found_list=msgs,
                      suggest_which_broker_id=header.suggest_which_broker_id)


class AsyncPullConsumer(AsyncClient):
    """``async with AsyncPullConsumer("group", namesrv=...) as c: r = await c.pull(mq, "*", 0)``."""

    _kind = "consumer"
    _role = "pull consumer"

    def __init__(self, group: str, namesrv: str | Iterable[str], **options: Any) -> None:
        self.options = self._setup(group, namesrv, PullConsumerOptions, options)
        self._subscriptions: dict[str, tuple[MessageSelector, int]] = {}
        self._last_heartbeat_sub: dict[str, MessageSelector] = {}
        self._offsets: dict[MessageQueue, int] = {}
        self._dirty: set[MessageQueue] = set()

    # ------------------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        inst = await self._join()
        await inst.send_heartbeat_to_all()

    async def shutdown(self) -> None:
        inst = self._instance
        if inst is None:
            return
        try:
            await self.persist_offsets()
        finally:
            await ClassFilters.of(inst).detach(self)
            await self._leave(inst)

    def consumer_data(self) -> ConsumerData:
        """What heartbeats say about this group: pulling actively, with the selectors last used."""
        return ConsumerData(
            group_name=self.group, consume_type="CONSUME_ACTIVELY", message_model=self.options.message_model,
            consume_from_where="CONSUME_FROM_LAST_OFFSET",
            subscription_data_set=[self._with_class_error(sel.subscription_data(topic, version))
                                   for topic, (sel, version) in sorted(self._subscriptions.items())],
        )

    def _with_class_error(self, sd: SubscriptionData) -> SubscriptionData:
        err = self.class_filter_error(sd.topic) if sd.class_filter_mode else None
        return sd if err is None else dataclasses.replace(sd, filter_class_error=str(err))

    def class_filters(self) -> dict[str, MessageSelector]:
        """The topics pulled with a class filter, and their selectors (registered with filter servers)."""
        return {topic: sel for topic, (sel, _v) in self._subscriptions.items() if sel.is_class}

    def class_filter_error(self, topic: str) -> FilterClassError | None:
        """The group's current class-filter error on ``topic`` (None when its last pull worked)."""
        inst = self._instance
        return None if inst is None else ClassFilters.of(inst).last_error(self.group, topic)

    def _note_subscription(self, topic: str, selector: MessageSelector) -> None:
        old = self._subscriptions.get(topic)
        if old is None or old[0] != selector:
            self._subscriptions[topic] = (selector, int(time.time() * 1000))

    # ------------------------------------------------------------------------------ queues

    async def fetch_message_queues(self, topic: str) -> list[MessageQueue]:
        """The topic's readable queues, sorted (fetchSubscribeMessageQueues)."""
        queues = subscribe_queues(topic, await self.instance.topic_route(topic, refresh=True))
        if not queues:
            raise TopicNotExistError(f"topic {topic!r} has no readable queue")
        return queues

    async def _addr(self, mq: MessageQueue) -> str:
        return await self.instance.broker_addr_for(mq.topic, mq.broker_name, master_only=False)

    # ------------------------------------------------------------------------------ pulling

    async def pull(self, mq: MessageQueue, selector: MessageSelector | str | None, offset: int,
                   max_nums: int = 32, *, timeout: float | None = None) -> PullResult:
        """Pull up to ``max_nums`` messages from ``offset``; answers at once when there are none."""
        return await self._pull(mq, selector, offset, max_nums, suspend=None,
                                timeout=self.options.pull_timeout if timeout is None else timeout)

    async def pull_block_if_not_found(self, mq: MessageQueue, selector: MessageSelector | str | None,
                                      offset: int, max_nums: int = 32, *, suspend_timeout: float | None = None,
                                      timeout: float | None = None) -> PullResult:
        """Long polling: with nothing new at ``offset`` the broker holds the pull up to ``suspend_timeout``
        seconds (20 by default) and answers as soon as a message arrives."""
        suspend = self.options.broker_suspend_max if suspend_timeout is None else suspend_timeout
        net = self.options.consumer_timeout_when_suspend if timeout is None else timeout
        if suspend < 0 or net <= suspend:
            raise InvalidParameterError(f"timeout ({net:g} s) must exceed suspend_timeout ({suspend:g} s)")
        return await self._pull(mq, selector, offset, max_nums, suspend=suspend, timeout=net)

    async def _pull(self, mq: MessageQueue, selector: MessageSelector | str | None, offset: int, max_nums: int,
                    *, suspend: float | None, timeout: float) -> PullResult:
        if not isinstance(mq, MessageQueue):
            raise InvalidParameterError(f"pull takes a MessageQueue, not {type(mq).__name__}")
        if offset < 0:
            raise InvalidParameterError(f"offset must be >= 0, got {offset}")
        if max_nums <= 0:
            raise InvalidParameterError(f"max_nums must be positive, got {max_nums}")
        sel = as_selector(selector)
        self._note_subscription(mq.topic, sel)
        header = H.PullMessageRequestHeader(
            consumer_group=self.group, topic=mq.topic, queue_id=mq.queue_id, queue_offset=offset,
            max_msg_nums=max_nums, sys_flag=FLAG_SUBSCRIPTION | (FLAG_SUSPEND if suspend is not None else 0),
            commit_offset=0, suspend_timeout_millis=int((suspend or 0) * 1000), subscription=sel.expression,
            sub_version=0, expression_type=sel.wire_expression_type,
        )
        if sel.is_class:  # through a filter server of mq's broker, never from the broker itself
            filters = ClassFilters.of(self.instance)
            if self._last_heartbeat_sub.get(mq.topic) != sel:
                # A new class: brokers learn the group's subscription first (conflicts are checked there),
                # and the class stays registered with the filter servers from now on.
                self._last_heartbeat_sub[mq.topic] = sel
                filters.attach(self)
                await self.instance.send_heartbeat_to_all()
            response = await filters.pull(self.group, mq, sel, header.to_ext(), timeout)
        else:
            addr = await self._addr(mq)
            request = RemotingCommand.request(RequestCode.PULL_MESSAGE, header.to_ext())
            response = await self.instance.remoting.invoke(addr, request, timeout)
        return process_pull_response(response, sel, check_crc=self.options.check_crc)

    # ------------------------------------------------------------------------------ offsets

    def update_consumer_offset(self, mq: MessageQueue, offset: int) -> None:
        """Remember ``offset`` as the group's next offset for ``mq``; sent by :meth:`commit` (or within 5 s)."""
        if offset < 0:
            raise InvalidParameterError(f"offset must be >= 0, got {offset}")
        self._offsets[mq] = offset
        self._dirty.add(mq)

    async def commit(self) -> None:
        """Send every offset updated since the last commit (UPDATE_CONSUMER_OFFSET); the first failure
        is raised after all were tried, and the failed ones stay pending."""
        errors = await self._send_offsets()
        if errors:
            raise errors[0]

    async def persist_offsets(self) -> None:
        for exc in await self._send_offsets():
            log.warning("committing offsets of %s failed: %s", self.group, exc)

    async def _send_offsets(self) -> list[SluiceError]:
        pending = sorted(self._dirty, key=queue_sort_key)
        self._dirty.difference_update(pending)

        async def one(mq: MessageQueue) -> SluiceError | None:
            offset = self._offsets[mq]
            try:
                await self.instance.api.update_consumer_offset(await self._addr(mq), self.group, mq, offset,
                                                               self.options.request_timeout)
            except SluiceError as exc:
                self._dirty.add(mq)
                return exc
            return None

        results = await asyncio.gather(*(one(mq) for mq in pending))
        return [r for r in results if r is not None]

    async def fetch_consume_offset(self, mq: MessageQueue, from_store: bool = True) -> int:
        """The group's committed offset (QUERY_CONSUMER_OFFSET), -1 when it has none; with
        ``from_store=False`` a locally updated offset wins."""
        if not from_store and mq in self._offsets:
            return self._offsets[mq]
        offset = await self.instance.api.query_consumer_offset(await self._addr(mq), self.group, mq,
                                                               self.options.request_timeout)
        if offset >= 0 and mq not in self._dirty:
            self._offsets[mq] = offset
        return offset

    async def min_offset(self, mq: MessageQueue) -> int:
        return await self.instance.api.min_offset(await self._addr(mq), mq, self.options.request_timeout)

    async def max_offset(self, mq: MessageQueue) -> int:
        """The offset the next message of ``mq`` will get."""
        return await self.instance.api.max_offset(await self._addr(mq), mq, self.options.request_timeout)

    async def search_offset(self, mq: MessageQueue, timestamp_ms: int) -> int:
        """The offset of the first message stored at or after ``timestamp_ms`` (ms since the epoch)."""
        return await self.instance.api.search_offset(await self._addr(mq), mq, int(timestamp_ms),
                                                     self.options.request_timeout)

    async def earliest_msg_store_time(self, mq: MessageQueue) -> int:
        return await self.instance.api.earliest_msg_store_time(await self._addr(mq), mq,
                                                               self.options.request_timeout)

    # ------------------------------------------------------------------------------ lookups

    async def view_message(self, offset_msg_id: str, topic: str | None = None) -> MessageExt:
        """The message with this offset message id (SendResult.offset_msg_id), from the broker it names.
        A producer's msgId (UNIQ_KEY) raises MessageIdKindError naming the lookup that takes it."""
        where = check_offset_msg_id(offset_msg_id)
        body = await self.instance.api.view_message(where.address, where.offset, self.options.request_timeout,
                                                    topic)
        msgs = decode_messages(body, check_crc=self.options.check_crc)
        if not msgs:
            raise ClientError(f"broker {where.address} returned no message for id {offset_msg_id}")
        return msgs[0]

    async def query_message(self, topic: str, key: str, max_num: int, begin: int, end: int, *,
                            unique_key: bool = False) -> list[MessageExt]:
        """Messages of ``topic`` with ``key`` among their keys (or, with ``unique_key``, whose msg_id is
        ``key``) stored between ``begin`` and ``end`` (ms), asking every broker of the topic."""
        route = await self.instance.topic_route(topic, refresh=True)
        header = H.QueryMessageRequestHeader(topic=topic, key=key, max_num=max_num, begin_timestamp=int(begin),
                                             end_timestamp=int(end))
        addrs = sorted({a for a in (bd.select_broker_addr() for bd in route.broker_datas) if a})
        bodies = await asyncio.gather(*(
            self.instance.api.query_message(a, header, unique_key=unique_key,
                                            timeout=self.options.request_timeout) for a in addrs))
        out: list[MessageExt] = []
        for body in bodies:
            for m in decode_messages(body, check_crc=self.options.check_crc):
                # The key index matches hashes; keep only real matches, as MQAdminImpl.queryMessage does.
                if (m.msg_id == key) if unique_key else (key in m.keys):
                    out.append(m)
        return out
