"""Admin requests: topics, runtime info, topic and consume statistics, connections, orderly queue locks.

Bodies are JSON. Where RocketMQ keys a map by a MessageQueue object (which
fastjson writes as an object used as a key, not valid JSON), Sluice sends a
list of flat entries instead (``offsetTable`` of GET_TOPIC_STATS_INFO and
GET_CONSUME_STATS); docs/broker.md shows the shapes.
"""
from __future__ import annotations

from collections.abc import Callable

import orjson

from sluice.broker.consumers import ConsumerManager
from sluice.broker.filter_data import ConsumerFilterManager
from sluice.broker.filter_lag import consume_stats_extras
from sluice.broker.locks import RebalanceLockManager
from sluice.broker.offsets import ConsumerOffsetManager
from sluice.broker.pool import BlockingPool
from sluice.broker.stats import BrokerStats
from sluice.broker.sub_conflicts import SubscriptionGuard
from sluice.broker.topics import TopicConfig, TopicConfigManager
from sluice.errors import SluiceError, TopicNotExistError
from sluice.protocol import headers as H
from sluice.protocol.bodies import (LockBatchRequestBody, LockBatchResponseBody, MessageQueue,
                                    UnlockBatchRequestBody, decode_body, encode_body)
from sluice.protocol.command import RemotingCommand
from sluice.protocol.offset_table import fastjson_queue_table
from sluice.store import MessageStore
from sluice.transport.connection import RemotingConnection

__all__ = ["AdminProcessor", "CONSUMER_NOT_ONLINE", "queue_table_body"]

CONSUMER_NOT_ONLINE = 206  # ResponseCode.CONSUMER_NOT_ONLINE


def queue_table_body(doc: dict, java: bool, key: str = "offsetTable") -> bytes:
    """``doc`` with its queue table ``key`` in Sluice's list form, or for a Java caller (rocketmq-dashboard,
    rocketmq-exporter, mqadmin: fastjson cannot read the list) in fastjson's MessageQueue-keyed form."""
    if not java:
        return orjson.dumps(doc)
    rest = orjson.dumps({k: v for k, v in doc.items() if k != key})
    return b'{"' + key.encode() + b'":' + fastjson_queue_table(doc[key]) + (b"," + rest[1:] if len(rest) > 2
                                                                             else b"}")


class AdminProcessor:
    def __init__(self, *, cluster_name: str, broker_name: str, store: MessageStore, pool: BlockingPool,
                 topics: TopicConfigManager, topics_changed: Callable[[], None], offsets: ConsumerOffsetManager,
                 consumers: ConsumerManager, locks: RebalanceLockManager, filter_data: ConsumerFilterManager,
                 sub_guard: SubscriptionGuard, runtime_info: Callable[[], dict[str, object]],
                 stats: BrokerStats) -> None:
        self.cluster_name = cluster_name
        self.broker_name = broker_name
        self.store = store
        self.pool = pool
        self.topics = topics
        self.topics_changed = topics_changed
        self.offsets = offsets
        self.consumers = consumers
        self.locks = locks
        self.filter_data = filter_data
        self.sub_guard = sub_guard
        self._runtime_info = runtime_info
        self.stats = stats

    # ---- topics ------------------------------------------------------------------------------------
    async def create_topic(self, conn: RemotingConnection, request: RemotingCommand) -> RemotingCommand:
        h = H.CreateTopicRequestHeader.from_command(request)
        if h.topic == self.cluster_name:
            raise SluiceError(f"the topic[{h.topic}] is conflict with the cluster name")
        self.topics.update(TopicConfig(
            h.topic, h.read_queue_nums, h.write_queue_nums, h.perm, h.topic_filter_type,
            h.topic_sys_flag or 0, h.order), by=conn.peer)
        self.topics_changed()
        return request.make_response()

    async def delete_topic(self, conn: RemotingConnection, request: RemotingCommand) -> RemotingCommand:
        h = H.DeleteTopicRequestHeader.from_command(request)
        self.topics.delete(h.topic, by=conn.peer)
        for group in self.offsets.groups_of_topic(h.topic):
            self.offsets.remove(group, h.topic)
        self.topics_changed()
        return request.make_response()

    async def all_topic_config(self, conn: RemotingConnection, request: RemotingCommand) -> RemotingCommand:
        return request.make_response(body=orjson.dumps(self.topics.to_wire()))

    # ---- statistics --------------------------------------------------------------------------------
    async def runtime_info(self, conn: RemotingConnection, request: RemotingCommand) -> RemotingCommand:
        table = {k: str(v) for k, v in self._runtime_info().items()}
        return request.make_response(body=orjson.dumps({"table": table}))

    async def topic_stats(self, conn: RemotingConnection, request: RemotingCommand) -> RemotingCommand:
        h = H.GetTopicStatsInfoRequestHeader.from_command(request)
        cfg = self.topics.get(h.topic)
        if cfg is None:
            raise TopicNotExistError(f"topic[{h.topic}] not exist")
        body = await self.pool.run(self._topic_stats, cfg)
        return request.make_response(body=queue_table_body(body, request.language == "JAVA"))

    def _topic_stats(self, cfg: TopicConfig) -> dict:
        store, name = self.store, self.broker_name
        entries = []
        for qid in range(cfg.write_queue_nums):
            lo, hi = store.get_min_offset(cfg.topic_name, qid), store.get_max_offset(cfg.topic_name, qid)
            last = self.store_time(cfg.topic_name, qid, hi - 1) if hi > lo else 0
            entries.append({"topic": cfg.topic_name, "brokerName": name, "queueId": qid,
                            "minOffset": lo, "maxOffset": hi, "lastUpdateTimestamp": last})
        return {"offsetTable": entries}

    def store_time(self, topic: str, qid: int, offset: int) -> int:
        """The store timestamp (ms) of the message at ``offset`` of the queue; 0 when there is none."""
        store = self.store
        cq = store.queues.get(topic, qid)
        if cq is None or offset < 0:
            return 0
        u = cq.unit(offset)
        if u is None:
            return 0
        return store.commitlog.store_timestamp_at(u[0]) or 0

    async def consume_stats(self, conn: RemotingConnection, request: RemotingCommand) -> RemotingCommand:
        h = H.GetConsumeStatsRequestHeader.from_command(request)
        topics = {h.topic} if h.topic else set(self.offsets.topics_of_group(h.consumer_group))
        info = self.consumers.get(h.consumer_group)
        if not h.topic and info is not None:
            topics |= set(info.subscriptions)
        # The stats are the event loop's (no locks): read here, not on the pool thread.
        tps = sum(self.stats.consume_tps(h.consumer_group, t) for t in topics)  # RocketMQ: tpsGroupGetNums, summed
        body = await self.pool.run(self._consume_stats, h.consumer_group, sorted(topics), tps)
        return request.make_response(body=queue_table_body(body, request.language == "JAVA"))

    def queue_entries(self, group: str, topic: str, cfg: TopicConfig) -> list[dict]:
        """OffsetWrapper per queue of ``topic`` for ``group`` (plus Sluice's ``lag``), as flat entries."""
        store = self.store
        entries = []
        committed = self.offsets.offsets_of(group, topic)
        for qid in range(cfg.write_queue_nums):
            hi = store.get_max_offset(topic, qid)
            consumer = committed.get(qid, -1)
            lag = max(0, hi - max(consumer, 0)) if consumer >= 0 else hi - store.get_min_offset(topic, qid)
            last = self.store_time(topic, qid, consumer - 1) if consumer > 0 else 0
            entries.append({"topic": topic, "brokerName": self.broker_name, "queueId": qid,
                            "brokerOffset": hi, "consumerOffset": consumer, "lag": lag, "lastTimestamp": last})
        return entries

    def consume_stats_of(self, group: str, topics: list[str], tps: float) -> dict:
        """GET_CONSUME_STATS's body for ``group`` over ``topics`` (blocking: reads consume queues; a pool
        thread's job): per-queue entries with lag and filtered lag, and the totals (metrics.py reads it too)."""
        return self._consume_stats(group, topics, tps)

    def _consume_stats(self, group: str, topics: list[str], tps: float) -> dict:
        entries = []
        for topic in topics:
            cfg = self.topics.get(topic)
            if cfg is None:
                continue
            entries += self.queue_entries(group, topic, cfg)
        total_lag = sum(e["lag"] for e in entries)
        # Filter-aware lag per entry, filter metrics and subscription conflicts (broker/filter_lag.py).
        return {"offsetTable": entries, "consumeTps": tps, "totalLag": total_lag,
                **consume_stats_extras(self.store, self.consumers, self.filter_data, self.sub_guard, group, entries)}

    async def consumer_connections(self, conn: RemotingConnection, request: RemotingCommand) -> RemotingCommand:
        h = H.GetConsumeStatsRequestHeader.from_command(request)
        info = self.consumers.get(h.consumer_group)
        if info is None or not info.channels:
            raise SluiceError(f"the consumer group[{h.consumer_group}] not online", code=CONSUMER_NOT_ONLINE)
        body = {
            "connectionSet": [ch.to_wire() for ch in info.channels.values()],
            "subscriptionTable": {t: s.to_wire() for t, s in info.subscriptions.items()},
            "consumeType": info.consume_type, "messageModel": info.message_model,
            "consumeFromWhere": info.consume_from_where,
        }
        return request.make_response(body=orjson.dumps(body))

    # ---- orderly consumers' queue locks ------------------------------------------------------------
    async def lock_batch(self, conn: RemotingConnection, request: RemotingCommand) -> RemotingCommand:
        body = decode_body(LockBatchRequestBody, request.body)
        keys = {(mq.topic, mq.broker_name, mq.queue_id): mq for mq in body.mq_set}
        got = self.locks.try_lock_batch(body.consumer_group, keys, body.client_id)
        ok = [MessageQueue(topic=t, broker_name=bn, queue_id=q) for (t, bn, q) in sorted(got)]
        return request.make_response(body=encode_body(LockBatchResponseBody(lock_ok_mq_set=ok)))

    async def unlock_batch(self, conn: RemotingConnection, request: RemotingCommand) -> RemotingCommand:
        body = decode_body(UnlockBatchRequestBody, request.body)
        self.locks.unlock_batch(body.consumer_group, [(mq.topic, mq.broker_name, mq.queue_id)
                                                            for mq in body.mq_set], body.client_id)
        return request.make_response()
