"""Resetting a group's committed offsets (INVOKE_BROKER_TO_RESET_OFFSET, 222).

RocketMQ 4.x's broker only computes the new offsets and asks the group's
online clients to apply them (RESET_CONSUMER_CLIENT_OFFSET, 220), and refuses
a queue the group never committed; a reset of an offline group then has no
effect. Sluice commits the new offsets itself (so offline and brand-new groups
are reset too), persists them at once, and then tells the online clients, whose
in-memory offsets would otherwise overwrite the reset on their next commit.

The response body (Sluice's list form, docs/broker.md) reports each queue's
offset before and after::

    {"offsetTable": [{"topic","brokerName","queueId","offset","previousOffset"}], "notifiedClients": [...]}

``previousOffset`` -1 means the group had committed nothing for that queue.
"""
from __future__ import annotations

import logging

import orjson

from sluice.broker.consumers import ConsumerManager
from sluice.broker.offsets import ConsumerOffsetManager
from sluice.broker.pool import BlockingPool
from sluice.broker.topics import TopicConfigManager
from sluice.errors import InvalidParameterError, SluiceError, TopicNotExistError
from sluice.protocol import headers as H
from sluice.protocol.bodies import MessageQueue
from sluice.protocol.codes import RequestCode
from sluice.protocol.command import RemotingCommand
from sluice.protocol.offset_table import encode_fastjson_offset_table
from sluice.store import MessageStore
from sluice.transport.connection import RemotingConnection

__all__ = ["OffsetResetProcessor", "RESET_TO_MAX"]

log = logging.getLogger(__name__)

#: A reset timestamp of -1 means "the end of each queue" (Broker2Client.resetOffset).
RESET_TO_MAX = -1


class OffsetResetProcessor:
    def __init__(self, *, broker_name: str, store: MessageStore, pool: BlockingPool, topics: TopicConfigManager,
                 offsets: ConsumerOffsetManager, consumers: ConsumerManager) -> None:
        self.broker_name = broker_name
        self.store = store
        self.pool = pool
        self.topics = topics
        self.offsets = offsets
        self.consumers = consumers

    async def reset_offset(self, conn: RemotingConnection, request: RemotingCommand) -> RemotingCommand:
        h = H.ResetOffsetRequestHeader.from_command(request)
        cfg = self.topics.get(h.topic)
        if cfg is None:
            raise TopicNotExistError(f"topic[{h.topic}] not exist")
        if not h.group:
            raise InvalidParameterError("a reset needs a consumer group")
        queues = list(range(cfg.write_queue_nums))
        if h.queue_id is not None and h.queue_id >= 0:
            if h.queue_id not in queues:
                raise InvalidParameterError(
                    f"topic {h.topic} has queues 0..{cfg.write_queue_nums - 1}, not {h.queue_id}")
            queues = [h.queue_id]
        entries = await self.pool.run(self._reset, h, queues)
        notified = await self._notify_clients(h, entries)
        body = {"offsetTable": entries, "notifiedClients": notified}
        return request.make_response(body=orjson.dumps(body))

    def _target(self, h: H.ResetOffsetRequestHeader, qid: int) -> int:
        store = self.store
        lo, hi = store.get_min_offset(h.topic, qid), store.get_max_offset(h.topic, qid)
        if h.offset is not None:
            target = h.offset
        elif h.timestamp == RESET_TO_MAX:
            target = hi
        else:
            target = store.get_offset_by_timestamp(h.topic, qid, h.timestamp)
        # Outside [min, max] a pull would only be answered OFFSET_MOVED: keep the reset where data is.
        return min(max(target, lo), hi)

    def _reset(self, h: H.ResetOffsetRequestHeader, queues: list[int]) -> list[dict]:
        offsets = self.offsets
        out = []
        for qid in queues:
            target = self._target(h, qid)
            old = offsets.query(h.group, h.topic, qid)
            # Not forced: only move back (RocketMQ's rule); a queue with nothing committed takes the target.
            new = target if (h.is_force or old < 0 or target < old) else old
            offsets.commit(h.group, h.topic, qid, new)
            out.append({"topic": h.topic, "brokerName": self.broker_name, "queueId": qid,
                        "offset": new, "previousOffset": old})
        offsets.persist()
        log.info("offsets of group %s on %s reset (%s): %s", h.group, h.topic,
                 f"offset {h.offset}" if h.offset is not None else f"timestamp {h.timestamp}",
                 ", ".join(f"{e['queueId']}: {e['previousOffset']} -> {e['offset']}" for e in out))
        return out

    async def _notify_clients(self, h: H.ResetOffsetRequestHeader, entries: list[dict]) -> list[str]:
        """RESET_CONSUMER_CLIENT_OFFSET (oneway, as Broker2Client does) to each online member of the group."""
        info = self.consumers.get(h.group)
        if info is None or not info.channels:
            return []
        table = {MessageQueue(topic=e["topic"], broker_name=e["brokerName"], queue_id=e["queueId"]): e["offset"]
                 for e in entries}
        header = H.ResetOffsetRequestHeader(topic=h.topic, group=h.group, timestamp=h.timestamp, is_force=h.is_force)
        body = encode_fastjson_offset_table(table)
        notified = []
        for cid, ch in sorted(info.channels.items()):
            if ch.conn.is_closed:
                continue
            req = RemotingCommand.request(RequestCode.RESET_CONSUMER_CLIENT_OFFSET, header.to_ext(), body,
                                          oneway=True)
            try:
                await ch.conn.send_oneway(req)
                notified.append(cid)
            except SluiceError as exc:
                log.warning("RESET_CONSUMER_CLIENT_OFFSET to %s (%s) failed: %s", cid, ch.conn.peer, exc)
        return notified
