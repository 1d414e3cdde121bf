"""Send failure policy: the latency fault strategy (MQFaultStrategy) and which failures are retried.

Pure and clock-injectable. With ``enabled`` (RocketMQ's sendLatencyFaultEnable,
off by default) every send charges its broker a latency; a latency at or
above ``latency_max[i]`` makes the broker unavailable for
``not_available_duration[i]`` ms (the largest matching i wins); a connection
error or timeout charges the isolation latency. Queue choice then prefers
available brokers. With it off, a retry only avoids the broker that just failed.
"""
from __future__ import annotations

import itertools
import random
import time
from collections.abc import Callable
from dataclasses import dataclass

from sluice.client.results import MessageQueue
from sluice.client.routing import TopicPublishInfo
from sluice.errors import RemotingError, SluiceError
from sluice.protocol.codes import ResponseCode

__all__ = [
    "LATENCY_TABLES", "FaultItem", "LatencyFaultTolerance", "MQFaultStrategy", "RETRY_RESPONSE_CODES",
    "is_retriable", "not_available_duration",
]


@dataclass(frozen=True, slots=True)
class LatencyTable:
    latency_max: tuple[int, ...]
    not_available_duration: tuple[int, ...]
    isolation_latency: int


#: MQFaultStrategy's tables (client/src/main/java/org/apache/rocketmq/client/latency/MQFaultStrategy.java):
#: 4.9.7's (Sluice speaks 4.x, so it is the default) and HEAD's.
LATENCY_TABLES: dict[str, LatencyTable] = {
    "4.9": LatencyTable((50, 100, 550, 1000, 2000, 3000, 15000),
                        (0, 0, 30000, 60000, 120000, 180000, 600000), 30000),
    "5": LatencyTable((50, 100, 550, 1800, 3000, 5000, 15000),
                      (0, 0, 2000, 5000, 6000, 10000, 30000), 10000),
}

#: DefaultMQProducer.retryResponseCodes (NO_BUYER_ID = 204, NOT_IN_CURRENT_UNIT = 205).
RETRY_RESPONSE_CODES = frozenset({
    ResponseCode.TOPIC_NOT_EXIST, ResponseCode.SERVICE_NOT_AVAILABLE, ResponseCode.SYSTEM_ERROR,
    ResponseCode.SYSTEM_BUSY, ResponseCode.NO_PERMISSION, 204, 205, ResponseCode.GO_AWAY,
})


def is_retriable(exc: BaseException) -> bool:
    """A send failure worth another attempt on another broker: a network failure or timeout, or a
    broker answer whose code RocketMQ retries. Anything else (a bad message...) is final."""
    if isinstance(exc, RemotingError):
        return True
    return isinstance(exc, SluiceError) and int(exc.code) in RETRY_RESPONSE_CODES


def not_available_duration(latency_ms: float, table: LatencyTable) -> int:
    """computeNotAvailableDuration: scan from the largest threshold down; 0 when none is reached."""
    for lat, dur in zip(reversed(table.latency_max), reversed(table.not_available_duration)):
        if latency_ms >= lat:
            return dur
    return 0


@dataclass(slots=True)
class FaultItem:
    name: str
    current_latency: float
    start_timestamp: float  # ms: the broker is available again from this time

    def is_available(self, now_ms: float) -> bool:
        return now_ms - self.start_timestamp >= 0


class LatencyFaultTolerance:
    """LatencyFaultToleranceImpl: broker name -> fault item."""

    def __init__(self, clock: Callable[[], float] | None = None) -> None:
        self._clock = clock or (lambda: time.monotonic() * 1000.0)
        self.items: dict[str, FaultItem] = {}
        self._worst = itertools.count(random.getrandbits(16))

    def now(self) -> float:
        return self._clock()

    def update(self, name: str, latency_ms: float, not_available_ms: float) -> None:
        self.items[name] = FaultItem(name, latency_ms, self.now() + not_available_ms)

    def is_available(self, name: str) -> bool:
        item = self.items.get(name)
        return item is None or item.is_available(self.now())

    def remove(self, name: str) -> None:
        self.items.pop(name, None)

    def pick_one_at_least(self) -> str | None:
        """Of the faulty brokers, one of the better half (available first, then lower latency,
        then sooner available), rotating among them."""
        if not self.items:
            return None
        now = self.now()
        ranked = list(self.items.values())
        random.shuffle(ranked)
        ranked.sort(key=lambda it: (not it.is_available(now), it.current_latency, it.start_timestamp))
        half = len(ranked) // 2
        if half <= 0:
            return ranked[0].name
        return ranked[next(self._worst) % half].name


class MQFaultStrategy:
    def __init__(self, enabled: bool = False, table: LatencyTable | str = "4.9",
                 clock: Callable[[], float] | None = None) -> None:
        self.enabled = enabled
        self.table = LATENCY_TABLES[table] if isinstance(table, str) else table
        self.tolerance = LatencyFaultTolerance(clock)

    def select_one_message_queue(self, info: TopicPublishInfo, last_broker_name: str | None) -> MessageQueue:
        if not self.enabled:
            return info.select_one(last_broker_name)
        n = len(info.queues)
        index = info.next_index()
        for i in range(n):
            mq = info.queues[(index + i) % n]
            if self.tolerance.is_available(mq.broker_name):
                return mq
        # Every broker of the topic is in fault: take the least bad one that still has queues.
        not_best = self.tolerance.pick_one_at_least()
        if not_best is not None:
            nums = info.write_queue_nums(not_best)
            if nums > 0:
                return MessageQueue(topic=info.topic, broker_name=not_best, queue_id=info.next_index() % nums)
            self.tolerance.remove(not_best)
        return info.select_one()

    def update_fault_item(self, broker_name: str, latency_ms: float, isolation: bool) -> None:
        """Charge a send's latency to its broker; ``isolation`` (a network failure) charges the maximum."""
        if self.enabled:
            charged = self.table.isolation_latency if isolation else latency_ms
            self.tolerance.update(broker_name, latency_ms, not_available_duration(charged, self.table))
