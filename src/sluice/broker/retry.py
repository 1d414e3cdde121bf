"""Consumer retries and dead letters: CONSUMER_SEND_MSG_BACK (36) and the retry-topic pull filter.

A consumer whose listener failed a message sends back its commit-log offset.
The broker reads the stored message and appends a copy — same body, flag,
keys, tags, properties, UNIQ_KEY (so the same message id), born time and host
— with RETRY_TOPIC (the original topic), ORIGIN_MESSAGE_ID and reconsume times
+ 1:

* to ``%RETRY%<group>`` (1 queue, perm 6), delayed by level ``3 + reconsume
  times`` when the consumer asked for level 0 (capped at the last level), or
* to ``%DLQ%<group>`` (1 queue, perm 6: readable, so dead letters can be
  inspected and resent) once the message was already consumed
  ``maxReconsumeTimes`` times (the header's value, else the broker's
  ``max_reconsume_times``) or when the consumer asks for a negative level.
  Dead letters also carry DLQ_ORIGIN_TOPIC and DLQ_ORIGIN_MESSAGE_ID.

A pull of ``%RETRY%<group>`` is filtered like the original topics
(RocketMQ's filterSupportRetry, extended to TAG subscriptions): each retried
message must match the group's current subscription of its RETRY_TOPIC, so a
subscription narrowed since the first delivery is honoured on retries too.
"""
from __future__ import annotations

import logging
import random
from typing import TYPE_CHECKING

import numpy as np

from sluice.broker.topics import RETRY_PREFIX, dlq_topic, retry_topic
from sluice.errors import SluiceError
from sluice.protocol import properties as P
from sluice.protocol.codes import RequestCode
from sluice.protocol.command import RemotingCommand
from sluice.transport.connection import RemotingConnection
from sluice.protocol.headers import ConsumerSendMsgBackRequestHeader
from sluice.protocol.msgid import create_offset_msg_id
from sluice.protocol.record import check_topic, decode_record
from sluice.store.types import MessageFilter, StoreMessage

if TYPE_CHECKING:
    from sluice.broker.consumers import ConsumerManager
    from sluice.broker.controller import BrokerController

__all__ = ["RetryProcessor", "RetryTopicFilter", "retry_filter"]

log = logging.getLogger(__name__)

#: The first retry's delay level when the consumer leaves it to the broker (level = 3 + reconsume times).
BASE_RETRY_LEVEL = 3


class RetryProcessor:
    def __init__(self, broker: BrokerController) -> None:
        self.broker = broker
        self.retried = 0
        self.dead_lettered = 0

    def register(self) -> None:
        self.broker.register(RequestCode.CONSUMER_SEND_MSG_BACK, self.handle)

    async def handle(self, conn: RemotingConnection, request: RemotingCommand) -> RemotingCommand:
        h = ConsumerSendMsgBackRequestHeader.from_command(request)
        b = self.broker
        rt = retry_topic(h.group)
        check_topic(rt)  # a group name that cannot make a topic name is refused here
        data = await b.run_blocking(b.store.read_record, h.offset)
        if data is None:
            raise SluiceError(f"look message by offset failed, {h.offset}")
        rec = decode_record(data, check_crc=False, where=f"commit-log offset {h.offset}")
        props = P.decode_properties(rec.properties)
        props.setdefault(P.RETRY_TOPIC, h.origin_topic or rec.topic)
        offset_id = create_offset_msg_id(rec.store_host[0], rec.store_host[1], rec.physical_offset)
        props.setdefault(P.ORIGIN_MESSAGE_ID, h.origin_msg_id or props.get(P.UNIQ_KEY) or offset_id)
        props.pop(P.DELAY, None)
        limit = h.max_reconsume_times if h.max_reconsume_times is not None else b.config.max_reconsume_times
        created = False
        if rec.reconsume_times >= limit or h.delay_level < 0:
            topic = dlq_topic(h.group)
            props[P.DLQ_ORIGIN_TOPIC] = props[P.RETRY_TOPIC]
            props[P.DLQ_ORIGIN_MESSAGE_ID] = props.get(P.UNIQ_KEY) or props[P.ORIGIN_MESSAGE_ID]
            self.dead_lettered += 1
        else:
            topic = rt
            props[P.DELAY] = str(h.delay_level if h.delay_level > 0 else BASE_RETRY_LEVEL + rec.reconsume_times)
            self.retried += 1
        cfg = b.topics.get(topic)
        if cfg is None:
            cfg = b.topics.create_retry_or_dlq(topic, 1)
            created = True
        msg = StoreMessage(topic, rec.body, random.randrange(cfg.write_queue_nums), props, rec.flag, rec.sysflag,
                           rec.born_timestamp, rec.born_host, rec.reconsume_times + 1)
        b.schedule.divert([msg])
        await b.appender.put([msg])
        if created:
            b.topics_changed()
        return request.make_response()


class RetryTopicFilter:
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


def retry_filter(broker: BrokerController, group: str, topic: str,
                 current: MessageFilter | None) -> MessageFilter | None:
    """The filter a pull of ``topic`` uses: for the group's own retry topic, RetryTopicFilter."""
    if topic != RETRY_PREFIX + group:
        return current
    return RetryTopicFilter(broker.consumers, group)
