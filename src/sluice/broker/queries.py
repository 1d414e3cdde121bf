"""Offsets and message lookups: committed offsets, queue bounds, time search, query by key, view by id.

QUERY_CONSUMER_OFFSET answers QUERY_NOT_FOUND (22) for a group/queue that never
committed, so the client applies its consume-from-where exactly — except for a
push group consuming from the last offset whose first subscription of the topic
this broker saw (client_manage.py): it gets the queue's first offset stored
after that moment (its millisecond). A new group still starts at the end of what was there
when it subscribed, and what was stored after is never skipped, however late its
first rebalance (RocketMQ's quickstart order: consumer first, then the topic
and its messages; RocketMQ answers 0 while the queue head is in memory, which
makes such a group read the whole queue).
"""
from __future__ import annotations

from sluice.broker.consumers import ConsumerManager
from sluice.broker.offsets import ConsumerOffsetManager
from sluice.broker.pool import BlockingPool
from sluice.broker.topics import RETRY_PREFIX
from sluice.errors import CorruptRecordError, SluiceError
from sluice.protocol import headers as H
from sluice.protocol.codes import ResponseCode
from sluice.protocol.command import RemotingCommand
from sluice.store import MessageStore
from sluice.transport.connection import RemotingConnection

__all__ = ["QueryProcessor"]

#: The consume-from-where values that start a new group at the end (the two deprecated ones act so in 4.x
#: clients): these groups start where they subscribed.
FROM_LAST = frozenset({"CONSUME_FROM_LAST_OFFSET", "CONSUME_FROM_LAST_OFFSET_AND_FROM_MIN_WHEN_BOOT_FIRST",
                       "CONSUME_FROM_MAX_OFFSET"})


class QueryProcessor:
    def __init__(self, *, store: MessageStore, pool: BlockingPool, offsets: ConsumerOffsetManager,
                 consumers: ConsumerManager | None = None) -> None:
        self.store = store
        self.pool = pool
        self.offsets = offsets
        self.consumers = consumers

    # ---- consumer offsets --------------------------------------------------------------------------
    async def query_consumer_offset(self, conn: RemotingConnection, request: RemotingCommand) -> RemotingCommand:
        h = H.QueryConsumerOffsetRequestHeader.from_command(request)
        offset = self.offsets.query(h.consumer_group, h.topic, h.queue_id)
        if offset < 0:
            offset = await self._where_subscribed(h.consumer_group, h.topic, h.queue_id)
        if offset < 0:
            return request.make_response(
                ResponseCode.QUERY_NOT_FOUND,
                f"Not found: group {h.consumer_group!r} committed no offset for {h.topic}:{h.queue_id}")
        return request.make_response(ext_fields={"offset": offset})

    async def _where_subscribed(self, group: str, topic: str, queue_id: int) -> int:
        """A new push group from the last offset: the queue's first message stored after the millisecond the
        group first subscribed in (the queue's end when none is); -1 when the rule does not apply. Messages of
        that same millisecond count as before: a consumer that subscribes right after sending gets none of
        its own sends, as with RocketMQ's exact CONSUME_FROM_LAST_OFFSET."""
        info = self.consumers.get(group) if self.consumers is not None else None
        if info is None or info.consume_type != "CONSUME_PASSIVELY" or info.consume_from_where not in FROM_LAST \
                or topic.startswith(RETRY_PREFIX):
            return -1
        when = self.offsets.subscribed_at(group, topic)
        if when is None:
            return -1
        return await self.pool.run(self.store.get_offset_by_timestamp, topic, queue_id, when + 1)

    async def update_consumer_offset(self, conn: RemotingConnection, request: RemotingCommand) -> RemotingCommand:
        h = H.UpdateConsumerOffsetRequestHeader.from_command(request)
        self.offsets.commit(h.consumer_group, h.topic, h.queue_id, h.commit_offset)
        return request.make_response()

    # ---- queue bounds ------------------------------------------------------------------------------
    async def get_max_offset(self, conn: RemotingConnection, request: RemotingCommand) -> RemotingCommand:
        h = H.GetMaxOffsetRequestHeader.from_command(request)
        return request.make_response(ext_fields={"offset": self.store.get_max_offset(h.topic, h.queue_id)})

    async def get_min_offset(self, conn: RemotingConnection, request: RemotingCommand) -> RemotingCommand:
        h = H.GetMinOffsetRequestHeader.from_command(request)
        return request.make_response(ext_fields={"offset": self.store.get_min_offset(h.topic, h.queue_id)})

    async def search_offset(self, conn: RemotingConnection, request: RemotingCommand) -> RemotingCommand:
        h = H.SearchOffsetRequestHeader.from_command(request)
        off = await self.pool.run(self.store.get_offset_by_timestamp, h.topic, h.queue_id,
                                             h.timestamp)
        return request.make_response(ext_fields={"offset": off})

    async def earliest_time(self, conn: RemotingConnection, request: RemotingCommand) -> RemotingCommand:
        h = H.GetEarliestMsgStoretimeRequestHeader.from_command(request)
        ts = await self.pool.run(self.store.get_earliest_message_time, h.topic, h.queue_id)
        return request.make_response(ext_fields={"timestamp": ts})

    # ---- messages ----------------------------------------------------------------------------------
    async def query_message(self, conn: RemotingConnection, request: RemotingCommand) -> RemotingCommand:
        h = H.QueryMessageRequestHeader.from_command(request)
        body, ts, phy = await self.pool.run(self._query_by_key, h)
        fields = {"indexLastUpdateTimestamp": ts, "indexLastUpdatePhyoffset": phy}
        if not body:
            return request.make_response(ResponseCode.QUERY_NOT_FOUND,
                                         f"can not find message with key {h.key!r} in topic {h.topic!r}, "
                                         "maybe time range not correct", ext_fields=fields)
        return request.make_response(ext_fields=fields, body=body)

    def _query_by_key(self, h: H.QueryMessageRequestHeader) -> tuple[bytes, int, int]:
        store = self.store
        end_ts = h.end_timestamp if h.end_timestamp > 0 else (1 << 63) - 1
        msgs = store.query_messages_by_key(h.topic, h.key, max(1, min(h.max_num, 64)), max(0, h.begin_timestamp),
                                           end_ts)
        parts = []
        for m in msgs:  # newest first, as the index chains them
            try:
                rec = store.read_record(m.commitlog_offset)
            except CorruptRecordError:
                continue
            if rec is not None:
                parts.append(rec)
        ts = phy = 0
        index = store.index
        if index is not None and index.files:
            last = index.files[-1]
            ts, phy = last.end_ts, last.end_phy
        return b"".join(parts), ts, phy

    async def view_message(self, conn: RemotingConnection, request: RemotingCommand) -> RemotingCommand:
        h = H.ViewMessageRequestHeader.from_command(request)
        if h.offset < 0:
            raise SluiceError(f"can not find message by the offset {h.offset}")
        rec = await self.pool.run(self.store.read_record, h.offset)
        if rec is None:
            raise SluiceError(f"can not find message by the offset {h.offset}")
        return request.make_response(body=rec)
