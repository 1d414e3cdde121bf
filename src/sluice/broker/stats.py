"""Put and get counters with minute, hour and day figures (RocketMQ's BrokerStatsManager, a small part of it).

Kept per statistic name and key, as RocketMQ names them
(store/src/main/java/org/apache/rocketmq/store/stats/BrokerStatsManager.java):
``TOPIC_PUT_NUMS`` / ``TOPIC_PUT_SIZE`` by topic, ``GROUP_GET_NUMS`` /
``GROUP_GET_SIZE`` by ``topic@group``, ``BROKER_PUT_NUMS`` /
``BROKER_GET_NUMS`` by cluster name, ``SNDBCK_PUT_NUMS`` (messages a consumer
sent back, to retry or dead-letter: SendMessageProcessor.consumerSendMsgBack's
incSendBackNums) by ``originTopic@group``, and ``DLQ_PUT_NUMS`` (of those, the
ones dead-lettered) by ``originTopic@group`` too (RocketMQ 5 has the name, keyed
by its commercial owner key; 4.x has no dead-letter count). Each item counts a
value (messages or bytes) and the requests that added it (``times``);
VIEW_BROKER_STATS_DATA (315) reads its snapshots and GET_CONSUME_STATS its
minute TPS. rocketmq-dashboard asks TOPIC_PUT_NUMS and GROUP_GET_NUMS;
rocketmq-exporter those, the two sizes, SNDBCK_PUT_NUMS and the two BROKER_*
(its MetricsCollectTask.java). RocketMQ 4.x creates GROUP_GET_FROM_DISK_* and
BROKER_GET_FROM_DISK_* but never adds to them, so it answers "not exist" for
them as Sluice does.

Counting is per request, never per message: an append or a pull adds its
message count once. Samples are taken lazily, with no thread: RocketMQ samples
every 10 s (minute window), 10 min (hour) and 1 h (day); here an item notes the
sample points it passed the next time it is touched or read, all with the value
it had then, which is exact because nothing was added in between. A snapshot
spans its window's oldest sample to now (RocketMQ's
``StatsItem.computeStatsData``: ``sum`` the value added, ``tps`` per second,
``avgpt`` value per request).
"""
from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["BrokerStats", "StatsItem", "StatsSnapshot", "STATS_NAMES", "TOPIC_PUT_NUMS", "TOPIC_PUT_SIZE",
           "GROUP_GET_NUMS", "GROUP_GET_SIZE", "BROKER_PUT_NUMS", "BROKER_GET_NUMS", "SNDBCK_PUT_NUMS",
           "DLQ_PUT_NUMS"]

TOPIC_PUT_NUMS = "TOPIC_PUT_NUMS"
TOPIC_PUT_SIZE = "TOPIC_PUT_SIZE"
GROUP_GET_NUMS = "GROUP_GET_NUMS"
GROUP_GET_SIZE = "GROUP_GET_SIZE"
BROKER_PUT_NUMS = "BROKER_PUT_NUMS"
BROKER_GET_NUMS = "BROKER_GET_NUMS"
SNDBCK_PUT_NUMS = "SNDBCK_PUT_NUMS"
DLQ_PUT_NUMS = "DLQ_PUT_NUMS"
STATS_NAMES = (TOPIC_PUT_NUMS, TOPIC_PUT_SIZE, GROUP_GET_NUMS, GROUP_GET_SIZE, BROKER_PUT_NUMS, BROKER_GET_NUMS,
               SNDBCK_PUT_NUMS, DLQ_PUT_NUMS)

#: (seconds between samples, samples kept): a window spans its oldest sample to now, so the minute
#: window covers the last 50..60 s.
MINUTE = (10.0, 6)
HOUR = (600.0, 6)
DAY = (3600.0, 24)
_WINDOWS = (MINUTE, HOUR, DAY)
#: Items not touched for this long are dropped (RocketMQ cleans deleted topics' and groups' stats).
IDLE_DROP_S = 2 * 86400.0


@dataclass(frozen=True, slots=True)
class StatsSnapshot:
    """RocketMQ's StatsSnapshot / BrokerStatsItem: what a window added, per second and per request."""

    sum: int
    tps: float
    avgpt: float

    def to_wire(self) -> dict[str, object]:
        return {"sum": self.sum, "tps": self.tps, "avgpt": self.avgpt}


class StatsItem:
    """One counter with its sample windows; ``add`` is the hot path (one clock read, two additions)."""

    __slots__ = ("value", "times", "_samples", "_next", "_clock", "touched")

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        now = clock()
        self.value = 0
        self.times = 0
        self.touched = now
        # Each window starts with a sample at creation: the first figures span creation to now.
        self._samples: list[deque[tuple[float, int, int]]] = [deque([(now, 0, 0)], maxlen=keep)
                                                              for _, keep in _WINDOWS]
        self._next = [now + every for every, _ in _WINDOWS]

    def add(self, value: int, times: int = 1) -> None:
        now = self._clock()
        if now >= self._next[0]:  # the minute window's sample point comes first
            self._roll(now)
        self.touched = now
        self.value += value
        self.times += times

    def _roll(self, now: float) -> None:
        for i, (every, keep) in enumerate(_WINDOWS):
            due = self._next[i]
            if now < due:
                continue
            passed = int((now - due) // every) + 1
            samples = self._samples[i]
            # Only the last ``keep`` points can matter; each carries the value as it was (nothing added since).
            for k in range(max(0, passed - keep), passed):
                samples.append((due + k * every, self.value, self.times))
            self._next[i] = due + passed * every

    def snapshot(self, window: int) -> StatsSnapshot:
        """Window 0 (minute), 1 (hour) or 2 (day): from its oldest sample to now."""
        now = self._clock()
        self._roll(now)
        t0, v0, n0 = self._samples[window][0]
        value = self.value - v0
        times = self.times - n0
        span = now - t0
        return StatsSnapshot(value, value / span if span > 0 else 0.0, value / times if times > 0 else 0.0)


class BrokerStats:
    """The broker's counters by statistic name and key; runs on the event loop (no locks)."""

    def __init__(self, cluster_name: str, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.cluster_name = cluster_name
        self._clock = clock
        self.tables: dict[str, dict[str, StatsItem]] = {name: {} for name in STATS_NAMES}

    def _item(self, name: str, key: str) -> StatsItem:
        table = self.tables[name]
        item = table.get(key)
        if item is None:
            item = table[key] = StatsItem(self._clock)
        return item

    def on_put(self, topic: str, messages: int, size: int) -> None:
        """One append of ``messages`` messages (``size`` bytes) to ``topic``."""
        self._item(TOPIC_PUT_NUMS, topic).add(messages)
        self._item(TOPIC_PUT_SIZE, topic).add(size)
        self._item(BROKER_PUT_NUMS, self.cluster_name).add(messages)

    def on_get(self, topic: str, group: str, messages: int, size: int) -> None:
        """One pull answered with ``messages`` messages (``size`` bytes) for ``group``."""
        key = f"{topic}@{group}"
        self._item(GROUP_GET_NUMS, key).add(messages)
        self._item(GROUP_GET_SIZE, key).add(size)
        self._item(BROKER_GET_NUMS, self.cluster_name).add(messages)

    def on_send_back(self, origin_topic: str, group: str, dead_letter: bool) -> None:
        """One message ``group`` sent back (CONSUMER_SEND_MSG_BACK) from ``origin_topic``, stored in its retry
        topic or, when ``dead_letter``, its %DLQ% topic."""
        key = f"{origin_topic}@{group}"
        self._item(SNDBCK_PUT_NUMS, key).add(1)
        if dead_letter:
            self._item(DLQ_PUT_NUMS, key).add(1)

    def get(self, name: str, key: str) -> StatsItem | None:
        table = self.tables.get(name)
        return None if table is None else table.get(key)

    def consume_tps(self, group: str, topic: str) -> float:
        """Messages per second ``group`` pulled from ``topic`` over the last minute (tpsGroupGetNums)."""
        item = self.get(GROUP_GET_NUMS, f"{topic}@{group}")
        return 0.0 if item is None else item.snapshot(0).tps

    def put_tps(self, topic: str) -> float:
        item = self.get(TOPIC_PUT_NUMS, topic)
        return 0.0 if item is None else item.snapshot(0).tps

    def drop_idle(self) -> int:
        """Forget items untouched for IDLE_DROP_S (deleted topics, departed groups); how many went."""
        limit = self._clock() - IDLE_DROP_S
        gone = 0
        for table in self.tables.values():
            for key in [k for k, it in table.items() if it.touched < limit]:
                del table[key]
                gone += 1
        return gone
