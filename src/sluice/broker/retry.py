"""Consumer retries and dead letters: CONSUMER_SEND_MSG_BACK (36) and the retry-topic pull filter.

A consumer whose listener failed a message sends back its commit-log offset.
The broker reads the stored message and appends a copy — same body, flag,
keys, tags, properties, UNIQ_KEY (so the same message id), born time and host
— with RETRY_TOPIC (the original topic), ORIGIN_MESSAGE_ID and reconsume times
+ 1:

* to ``%RETRY%<group>`` (the group's retryQueueNums queues, perm 6), delayed by
  level ``3 + reconsume times`` when the consumer asked for level 0 (capped at
  the last level), or
* to ``%DLQ%<group>`` (1 queue, perm 6: readable, so dead letters can be
  inspected and resent) once the message was already consumed
  ``maxReconsumeTimes`` times (the header's value, as RocketMQ takes it from
  clients since 3.4.9, else the subscription group's retryMaxTimes), when the
  consumer asks for a negative level, or when the group has retryQueueNums 0
  (RocketMQ drops the message then; Sluice keeps it as a dead letter).
  Dead letters also carry DLQ_ORIGIN_TOPIC and DLQ_ORIGIN_MESSAGE_ID.

A pull of ``%RETRY%<group>`` is filtered like the original topics
(RocketMQ's filterSupportRetry, extended to TAG subscriptions): each retried
message must match the group's current subscription of its RETRY_TOPIC, so a
subscription narrowed since the first delivery is honoured on retries too.
"""
from __future__ import annotations

import logging
import random
from collections.abc import Callable

import numpy as np

from sluice.broker.appender import Appender, Prepare, stored
from sluice.broker.consumers import ConsumerManager
from sluice.broker.pool import BlockingPool
from sluice.broker.subgroups import SubscriptionGroupManager
from sluice.broker.topics import RETRY_PREFIX, TopicConfigManager, dlq_topic, retry_topic
from sluice.errors import SluiceError
from sluice.protocol import properties as P
from sluice.protocol.command import RemotingCommand
from sluice.protocol.headers import ConsumerSendMsgBackRequestHeader
from sluice.protocol.msgid import create_offset_msg_id
from sluice.protocol.record import check_topic, decode_record
from sluice.store import MessageStore
from sluice.store.types import MessageFilter, StoreMessage, TagCodeFilter
from sluice.transport.connection import RemotingConnection

__all__ = ["RetryProcessor", "RetryTopicFilter", "retry_filter"]

log = logging.getLogger(__name__)

#: The first retry's delay level when the consumer leaves it to the broker (level = 3 + reconsume times).
BASE_RETRY_LEVEL = 3


class RetryProcessor:
    def __init__(self, *, store: MessageStore, pool: BlockingPool, topics: TopicConfigManager,
                 topics_changed: Callable[[], None], appender: Appender, divert: Prepare,
                 subgroups: SubscriptionGroupManager) -> None:
        self.store = store  # read only: the message sent back
        self.pool = pool
        self.topics = topics
        self.topics_changed = topics_changed
        self.appender = appender
        self.divert = divert  # the retry's delay level (ScheduleService.divert)
        self.subgroups = subgroups  # the group's retryMaxTimes and retryQueueNums
        self.retried = 0
        self.dead_lettered = 0
        self.on_send_back: Callable[[str, str, bool], None] = lambda topic, group, dead: None  # stats.py

    async def handle(self, conn: RemotingConnection, request: RemotingCommand) -> RemotingCommand:
        h = ConsumerSendMsgBackRequestHeader.from_command(request)
        rt = retry_topic(h.group)
        check_topic(rt)  # a group name that cannot make a topic name is refused here
        sg = self.subgroups.require(h.group)  # SUBSCRIPTION_GROUP_NOT_EXIST unless it exists or is auto-created
        data = await self.pool.run(self.store.read_record, h.offset)
        if data is None:
            raise SluiceError(f"look message by offset failed, {h.offset}")
        rec = decode_record(data, check_crc=False, where=f"commit-log offset {h.offset}")
        props = P.decode_properties(rec.properties)
        props.setdefault(P.RETRY_TOPIC, h.origin_topic or rec.topic)
        offset_id = create_offset_msg_id(rec.store_host[0], rec.store_host[1], rec.physical_offset)
        props.setdefault(P.ORIGIN_MESSAGE_ID, h.origin_msg_id or props.get(P.UNIQ_KEY) or offset_id)
        props.pop(P.DELAY, None)
        limit = h.max_reconsume_times if h.max_reconsume_times is not None else sg.retry_max_times
        created = False
        if rec.reconsume_times >= limit or h.delay_level < 0 or sg.retry_queue_nums <= 0:
            topic = dlq_topic(h.group)
            props[P.DLQ_ORIGIN_TOPIC] = props[P.RETRY_TOPIC]
            props[P.DLQ_ORIGIN_MESSAGE_ID] = props.get(P.UNIQ_KEY) or props[P.ORIGIN_MESSAGE_ID]
            self.dead_lettered += 1
        else:
            topic = rt
            props[P.DELAY] = str(h.delay_level if h.delay_level > 0 else BASE_RETRY_LEVEL + rec.reconsume_times)
            self.retried += 1
        cfg = self.topics.get(topic)
        if cfg is None:
            cfg = self.topics.create_retry_or_dlq(topic, sg.retry_queue_nums if topic == rt else 1)
            created = True
        queue_id = random.randrange(cfg.write_queue_nums)
        msg = StoreMessage(topic, rec.body, queue_id, props, rec.flag, rec.sysflag, rec.born_timestamp, rec.born_host,
                           rec.reconsume_times + 1)
        await stored(self.appender.put(topic, queue_id, [msg], prepare=self.divert))
        self.on_send_back(props[P.RETRY_TOPIC], h.group, topic != rt)
        if created:
            self.topics_changed()
        return request.make_response()


class RetryTopicFilter(TagCodeFilter):
    """A %RETRY%<group> pull's filter: the group's subscription of each message's original topic."""

    needs_record = True
    passes_all = False

    def __init__(self, consumers: ConsumerManager, group: str) -> None:
        self.consumers = consumers
        self.group = group

    def match_units(self, tag_codes: np.ndarray) -> np.ndarray | None:
        return None

    def match_record(self, properties: dict[str, str]) -> bool:
        original = properties.get(P.RETRY_TOPIC)
        if not original:
            return True
        sub = self.consumers.find_subscription(self.group, original)
        if sub is None:  # the group's heartbeat does not say (yet): deliver rather than drop
            return True
        return sub.filter.match_record(properties)

    def match_dispatch(self, tag_code: int, properties: dict[str, str]) -> bool:
        return self.match_record(properties)

    def dispatch_verdict(self, tag_code: int, properties: dict[str, str]) -> int:
        """Never 0 or 1: the verdict follows the group's subscriptions, which may change before the pull reads."""
        return 3 if self.match_record(properties) else 2


def retry_filter(consumers: ConsumerManager, group: str, topic: str,
                 current: MessageFilter | None) -> MessageFilter | None:
    """The filter a pull of ``topic`` uses: for the group's own retry topic, RetryTopicFilter."""
    if topic != RETRY_PREFIX + group:
        return current
    return RetryTopicFilter(consumers, group)
