"""The operators' requests rocketmq-dashboard, rocketmq-exporter and mqadmin send (RocketMQ's AdminBrokerProcessor).

broker/src/main/java/org/apache/rocketmq/broker/processor/AdminBrokerProcessor.java:
GET_BROKER_CONFIG (26) and UPDATE_BROKER_CONFIG (25) (live_config.py),
VIEW_BROKER_STATS_DATA (315, stats.py), GET_BROKER_CONSUME_STATS (317),
QUERY_TOPIC_CONSUME_BY_WHO (300), GET_PRODUCER_CONNECTION_LIST (204), and the
two relayed to a consumer client: GET_CONSUMER_RUNNING_INFO (307) and
CONSUME_MESSAGE_DIRECTLY (309, with the stored message as the body). Bodies
carry RocketMQ's field names; a queue-keyed map is in fastjson's form for a
Java caller and Sluice's list form otherwise (admin.py, docs/broker.md).
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import orjson

from sluice.broker.admin import AdminProcessor, queue_table_body
from sluice.broker.consumers import ConsumerManager
from sluice.broker.live_config import (
    ConfigVersion,
    LiveConfigFile,
    LiveTargets,
    apply_checked,
    check_update,
    config_properties,
    parse_properties,
)
from sluice.broker.offsets import ConsumerOffsetManager
from sluice.broker.pool import BlockingPool
from sluice.broker.stats import STATS_NAMES, BrokerStats
from sluice.broker.topics import TopicConfigManager
from sluice.errors import InvalidParameterError, RemotingTimeoutError, SluiceError
from sluice.protocol import headers as H
from sluice.protocol.command import RemotingCommand
from sluice.protocol.msgid import decode_offset_msg_id
from sluice.store import MessageStore
from sluice.transport.connection import RemotingConnection

__all__ = ["OpsProcessor", "CALL_CLIENT_TIMEOUT_S", "CONSUME_MSG_TIMEOUT"]

log = logging.getLogger(__name__)

#: Broker2Client.callClient waits 10 s for the client's answer.
CALL_CLIENT_TIMEOUT_S = 10.0
#: ResponseCode.CONSUME_MSG_TIMEOUT: the relayed call timed out.
CONSUME_MSG_TIMEOUT = 207


class OpsProcessor:
    def __init__(self, *, broker_name: str, address: str, store: MessageStore, pool: BlockingPool,
                 topics: TopicConfigManager, offsets: ConsumerOffsetManager, consumers: ConsumerManager,
                 stats: BrokerStats, admin: AdminProcessor, live: Callable[[], LiveTargets],
                 live_file: LiveConfigFile) -> None:
        self.broker_name = broker_name
        self.address = address
        self.store = store
        self.pool = pool
        self.topics = topics
        self.offsets = offsets
        self.consumers = consumers
        self.stats = stats
        self.admin = admin
        self._live = live  # the broker itself (its config and the parts that read live settings)
        self.version = ConfigVersion()
        self.live_file = live_file  # where accepted updates are kept across restarts
        self._updating = asyncio.Lock()  # one update at a time: check, persist, apply against the same config

    # ---- configuration -----------------------------------------------------------------------------
    async def get_broker_config(self, conn: RemotingConnection, request: RemotingCommand) -> RemotingCommand:
        text = "".join(f"{k}={v}\n" for k, v in config_properties(self._live().config).items())
        return request.make_response(ext_fields={"version": orjson.dumps(self.version.to_wire()).decode()},
                                     body=text.encode())

    async def update_broker_config(self, conn: RemotingConnection, request: RemotingCommand) -> RemotingCommand:
        try:
            text = request.body.decode("utf-8")
        except UnicodeDecodeError:
            raise InvalidParameterError("the config update is not UTF-8 text") from None
        props = parse_properties(text)
        if props:
            async with self._updating:
                target = self._live()
                changes, new = check_update(target.config, props)
                # Kept first: an update the disk refuses (full, read-only) changes nothing.
                await self.pool.run(self.live_file.save, changes)
                apply_checked(target, changes, new)
            self.version.next()
            log.info("broker settings changed by %s: %s", conn.peer,
                     ", ".join(f"{k}={v}" for k, v in sorted(changes.items())))
        return request.make_response()

    # ---- statistics --------------------------------------------------------------------------------
    async def view_stats_data(self, conn: RemotingConnection, request: RemotingCommand) -> RemotingCommand:
        h = H.ViewBrokerStatsDataRequestHeader.from_command(request)
        item = self.stats.get(h.stats_name, h.stats_key)
        if item is None:
            if h.stats_name not in STATS_NAMES:
                raise SluiceError(f"The stats <{h.stats_name}> <{h.stats_key}> not exist (statistics kept: "
                                  f"{', '.join(STATS_NAMES)})")
            raise SluiceError(f"The stats <{h.stats_name}> <{h.stats_key}> not exist")
        body = {"statsMinute": item.snapshot(0).to_wire(), "statsHour": item.snapshot(1).to_wire(),
                "statsDay": item.snapshot(2).to_wire()}
        return request.make_response(body=orjson.dumps(body))

    async def broker_consume_stats(self, conn: RemotingConnection, request: RemotingCommand) -> RemotingCommand:
        h = H.GetConsumeStatsInBrokerHeader.from_command(request)
        groups = sorted(set(self.offsets.groups()) | set(self.consumers.groups))
        # The stats are the event loop's (no locks): read here, not on the pool thread.
        tps = {(g, t): self.stats.consume_tps(g, t) for g in groups for t in self.offsets.topics_of_group(g)}
        per_group = await self.pool.run(self._all_consume_stats, groups, h.is_order, tps)
        total = sum(e["lag"] for _, stats in per_group for s in stats for e in s["offsetTable"])
        java = request.language == "JAVA"
        items = []
        for group, stats in per_group:
            bodies = [queue_table_body(s, java) for s in stats]
            items.append(b"{" + orjson.dumps(group) + b":[" + b",".join(bodies) + b"]}")
        body = (b'{"consumeStatsList":[' + b",".join(items) + b"],"
                + orjson.dumps({"brokerAddr": self.address, "totalDiff": total, "totalInflightDiff": 0})[1:])
        return request.make_response(body=body)

    def _all_consume_stats(self, groups: list[str], order_only: bool, tps: dict[tuple[str, str], float],
                           ) -> list[tuple[str, list[dict[str, Any]]]]:
        """fetchAllConsumeStatsInBroker: per group, one ConsumeStats per topic it has offsets in."""
        out = []
        for group in groups:
            stats = []
            info = self.consumers.get(group)
            for topic in sorted(self.offsets.topics_of_group(group)):
                cfg = self.topics.get(topic)
                if cfg is None or (order_only and not cfg.order):
                    continue
                if info is not None and info.subscriptions and topic not in info.subscriptions:
                    continue  # as RocketMQ: a live group's offsets in topics it no longer subscribes to
                entries = self.admin.queue_entries(group, topic, cfg)
                stats.append({"offsetTable": entries, "consumeTps": tps.get((group, topic), 0.0)})
            out.append((group, stats))
        return out

    # ---- who uses a topic, producers ---------------------------------------------------------------
    async def topic_consumed_by(self, conn: RemotingConnection, request: RemotingCommand) -> RemotingCommand:
        h = H.QueryTopicConsumeByWhoRequestHeader.from_command(request)
        groups = {g for g, info in self.consumers.groups.items() if h.topic in info.subscriptions}
        groups |= set(self.offsets.groups_of_topic(h.topic))
        return request.make_response(body=orjson.dumps({"groupList": sorted(groups)}))

    async def producer_connections(self, conn: RemotingConnection, request: RemotingCommand) -> RemotingCommand:
        h = H.GetProducerConnectionListRequestHeader.from_command(request)
        pg = self.consumers.producers.get(h.producer_group)
        if pg is None:
            raise SluiceError(f"the producer group[{h.producer_group}] not exist")
        return request.make_response(body=orjson.dumps(
            {"connectionSet": [ch.to_wire() for ch in pg.channels.values()]}))

    # ---- calls relayed to a consumer ---------------------------------------------------------------
    async def consumer_running_info(self, conn: RemotingConnection, request: RemotingCommand) -> RemotingCommand:
        h = H.GetConsumerRunningInfoRequestHeader.from_command(request)
        return await self._call_consumer(request, h.consumer_group, h.client_id, dict(request.ext_fields),
                                         request.body)

    async def consume_message_directly(self, conn: RemotingConnection, request: RemotingCommand) -> RemotingCommand:
        h = H.ConsumeMessageDirectlyResultRequestHeader.from_command(request)
        if not h.msg_id:
            raise InvalidParameterError("CONSUME_MESSAGE_DIRECTLY needs msgId (an offset message id)")
        offset = decode_offset_msg_id(h.msg_id).offset
        record = await self.pool.run(self.store.read_record, offset)
        if record is None:
            raise SluiceError(f"no message with id {h.msg_id} in this broker's store")
        ext = dict(request.ext_fields)
        ext["brokerName"] = self.broker_name
        if h.topic and (cfg := self.topics.get(h.topic)) is not None:
            ext["topicSysFlag"] = str(cfg.topic_sys_flag)
        return await self._call_consumer(request, h.consumer_group, h.client_id or "", ext, record)

    async def _call_consumer(self, request: RemotingCommand, group: str, client_id: str, ext: dict[str, str],
                             body: bytes) -> RemotingCommand:
        """Broker2Client.callClient: the client's own answer, under this request's opaque."""
        info = self.consumers.get(group)
        ch = info.channels.get(client_id) if info is not None else None
        if ch is None or ch.conn.is_closed:
            raise SluiceError(f"The Consumer <{group}> <{client_id}> not online")
        call = RemotingCommand.request(request.code, ext, body)
        try:
            answer = await ch.conn.request(call, CALL_CLIENT_TIMEOUT_S)
        except (TimeoutError, RemotingTimeoutError) as exc:
            raise SluiceError(f"consumer <{group}> <{client_id}> Timeout: {exc}", code=CONSUME_MSG_TIMEOUT) from None
        except SluiceError as exc:
            raise SluiceError(f"invoke consumer <{group}> <{client_id}> Exception: {exc}") from None
        return request.make_response(answer.code, answer.remark, ext_fields=answer.ext_fields, body=answer.body)


