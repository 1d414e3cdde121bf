"""Offsets and message lookups: committed offsets, queue bounds, time search, query by key, view by id.

QUERY_CONSUMER_OFFSET answers QUERY_NOT_FOUND (22) for a group/queue that never
committed, always: the client then applies its consume-from-where exactly
(RocketMQ answers 0 while the queue head is in memory, which makes a new group
with CONSUME_FROM_LAST_OFFSET read the whole queue).
"""
from __future__ import annotations

from sluice.broker.offsets import ConsumerOffsetManager
from sluice.broker.pool import BlockingPool
from sluice.errors import CorruptRecordError, SluiceError
from sluice.protocol import headers as H
from sluice.protocol.codes import ResponseCode
from sluice.protocol.command import RemotingCommand
from sluice.store import MessageStore
from sluice.transport.connection import RemotingConnection

__all__ = ["QueryProcessor"]


class QueryProcessor:
    def __init__(self, *, store: MessageStore, pool: BlockingPool, offsets: ConsumerOffsetManager) -> None:
        self.store = store
        self.pool = pool
        self.offsets = offsets

    # ---- consumer offsets --------------------------------------------------------------------------
    async def query_consumer_offset(self, conn: RemotingConnection, request: RemotingCommand) -> RemotingCommand:
        h = H.QueryConsumerOffsetRequestHeader.from_command(request)
        offset = self.offsets.query(h.consumer_group, h.topic, h.queue_id)
        if offset < 0:
            return request.make_response(
                ResponseCode.QUERY_NOT_FOUND,
                f"Not found: group {h.consumer_group!r} committed no offset for {h.topic}:{h.queue_id}")
        return request.make_response(ext_fields={"offset": offset})

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
