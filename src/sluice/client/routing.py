"""Pure routing policy: the queues of a route, round-robin queue choice, queue selectors for ordered sends.

Follows RocketMQ's MQClientInstance.topicRouteData2TopicPublishInfo /
topicRouteData2TopicSubscribeInfo and TopicPublishInfo.selectOneMessageQueue.
No I/O here, so every rule is unit-tested without a broker.
"""
from __future__ import annotations

import dataclasses
import itertools
import random
from collections.abc import Callable, Sequence
from typing import Any

from sluice.filter import java_string_hash
from sluice.message import Message
from sluice.protocol.bodies import MASTER_ID, PERM_READ, PERM_WRITE, TopicRouteData
from sluice.client.results import MessageQueue, queue_sort_key

__all__ = [
    "QueueSelector", "TopicPublishInfo", "default_topic_route", "java_hash_code", "publish_queues",
    "select_by_hash", "select_by_random", "subscribe_queues",
]

#: ``fn(queues, message, arg) -> queue``: MessageQueueSelector.select.
QueueSelector = Callable[[list[MessageQueue], Message, Any], MessageQueue]


def publish_queues(topic: str, route: TopicRouteData) -> list[MessageQueue]:
    """The writable queues, ordered by broker name, only on brokers with a known master."""
    if route.order_topic_conf:
        # "broker-a:4;broker-b:4": an ordered topic's queues as configured, in that order.
        out = []
        for item in route.order_topic_conf.split(";"):
            name, _, num = item.partition(":")
            if name and num.strip().isdigit():
                out += [MessageQueue(topic=topic, broker_name=name, queue_id=i) for i in range(int(num))]
        return out
    masters = {bd.broker_name for bd in route.broker_datas if MASTER_ID in bd.broker_addrs}
    out = []
    for qd in sorted(route.queue_datas, key=lambda q: q.broker_name):
        if qd.perm & PERM_WRITE and qd.broker_name in masters:
            out += [MessageQueue(topic=topic, broker_name=qd.broker_name, queue_id=i)
                    for i in range(qd.write_queue_nums)]
    return out


def subscribe_queues(topic: str, route: TopicRouteData) -> list[MessageQueue]:
    """The readable queues, sorted as RocketMQ sorts MessageQueue."""
    out = [MessageQueue(topic=topic, broker_name=qd.broker_name, queue_id=i)
           for qd in route.queue_datas if qd.perm & PERM_READ for i in range(qd.read_queue_nums)]
    return sorted(out, key=queue_sort_key)


def default_topic_route(route: TopicRouteData, queue_nums: int) -> TopicRouteData:
    """The TBW102 route used for a topic the namesrv does not know yet, capped at ``queue_nums`` queues
    per broker (MQClientInstance.updateTopicRouteInfoFromNameServer with isDefault)."""
    qds = [dataclasses.replace(qd, read_queue_nums=min(queue_nums, qd.read_queue_nums),
                               write_queue_nums=min(queue_nums, qd.read_queue_nums))
           for qd in route.queue_datas]
    return dataclasses.replace(route, queue_datas=qds)


class TopicPublishInfo:
    """A topic's writable queues and its round-robin index (RocketMQ's sendWhichQueue)."""

    def __init__(self, topic: str, route: TopicRouteData, *, start_index: int | None = None) -> None:
        self.topic = topic
        self.route = route
        self.queues = publish_queues(topic, route)
        self.order_topic = bool(route.order_topic_conf)
        # RocketMQ starts each index at a random value so producers do not all begin on queue 0.
        self._index = itertools.count(random.getrandbits(31) if start_index is None else start_index)

    @property
    def ok(self) -> bool:
        return bool(self.queues)

    def next_index(self) -> int:
        return next(self._index)

    def select_one(self, last_broker_name: str | None = None) -> MessageQueue:
        """The next queue round robin, skipping ``last_broker_name`` (the broker that just failed)
        when another broker has a queue; falls back to plain round robin."""
        n = len(self.queues)
        if last_broker_name is not None:
            index = self.next_index()
            for i in range(n):
                mq = self.queues[(index + i) % n]
                if mq.broker_name != last_broker_name:
                    return mq
        return self.queues[self.next_index() % n]

    def write_queue_nums(self, broker_name: str) -> int:
        """TopicPublishInfo.getQueueIdByBroker: the broker's write queue count, -1 if it has none."""
        for qd in self.route.queue_datas:
            if qd.broker_name == broker_name:
                return qd.write_queue_nums
        return -1


# -------------------------------------------------------------------------------- queue selectors

def java_hash_code(arg: Any) -> int:
    """Java's hashCode for the argument types ordered sends use, so Python and Java producers
    put the same key on the same queue: String, Integer/Long (by value), Boolean; other objects
    hash their ``str``."""
    if isinstance(arg, bool):
        return 1231 if arg else 1237
    if isinstance(arg, int):
        if -(2**31) <= arg < 2**31:
            return arg
        v = arg & 0xFFFFFFFFFFFFFFFF
        h = (v ^ (v >> 32)) & 0xFFFFFFFF  # Long.hashCode
        return h - 2**32 if h & 0x80000000 else h
    return java_string_hash(arg if isinstance(arg, str) else str(arg))


def select_by_hash(queues: Sequence[MessageQueue], msg: Message, arg: Any) -> MessageQueue:
    """SelectMessageQueueByHash: ``abs(arg.hashCode() % n)`` — the same key always lands on the same queue."""
    return queues[abs(java_hash_code(arg)) % len(queues)]


def select_by_random(queues: Sequence[MessageQueue], msg: Message, arg: Any) -> MessageQueue:
    """SelectMessageQueueByRandom."""
    return queues[random.randrange(len(queues))]
