"""The lag side of the broker's metrics (metrics.py): what consumerProgress and topicStatus would show.

rocketmq-exporter gathers these with GET_CONSUME_STATS, GET_TOPIC_STATS_INFO and a
queryMsgByOffset per queue (its MetricsCollectTask.collectConsumerOffset and
collectTopicOffset), once a minute. Here they are counted on the store pool by
consumerProgress's own code (admin.py ``consume_stats_of``, filter_lag.py),
which reads consume queues and evaluates every group's selector for the
filtered lag: too much work to repeat on every scrape of a broker with many
groups. :class:`RefreshLimited` bounds it: one computation per
``metrics_lag_refresh_s`` however often Prometheus scrapes (and however many
scrapes arrive together); scrapes in between get the last figures, whose age
``sluice_metrics_lag_age_seconds`` reports, and a scrape that finds them due
starts the next count and is answered with the last one, so only the first
scrape waits for a count.
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from prometheus_client.core import GaugeMetricFamily, Metric

from sluice.broker.topics import DLQ_PREFIX, RETRY_PREFIX

__all__ = ["GroupPlan", "LagCounts", "RefreshLimited", "count_lag", "lag_families", "plan_groups"]

T = TypeVar("T")

log = logging.getLogger(__name__)

#: RocketMQ's MessageModel ordinals, as rocketmq-exporter writes them in rocketmq_group_diff's msgModel.
_MSG_MODEL = {"BROADCASTING": "0", "CLUSTERING": "1"}


class RefreshLimited(Generic[T]):
    """The last result of an async computation, run again only when it is ``every_s`` old. Once there is a
    result, a caller never waits: one that finds it stale starts the next run and gets the last result
    (so a slow count never makes a scrape time out). The first caller, and every caller when ``every_s``
    is 0, waits for a run; callers that arrive while one runs share it. Runs on one event loop (no locks)."""

    def __init__(self, every_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.every_s = every_s
        self._clock = clock
        self._value: T | None = None
        self._started = 0.0  # when the computation behind _value began: its figures are that old at least
        self._running: asyncio.Future[T] | None = None
        self.runs = 0

    def age(self) -> float:
        """Seconds since the served figures began to be computed (0 before the first)."""
        return 0.0 if self._value is None else max(0.0, self._clock() - self._started)

    async def get(self, compute: Callable[[], Awaitable[T]]) -> T:
        if self._value is not None and self._clock() - self._started < self.every_s:
            return self._value
        if self._running is None:
            started = self._clock()
            self._running = asyncio.ensure_future(compute())
            self._running.add_done_callback(lambda f, t0=started: self._done(f, t0))  # type: ignore[misc]
        if self._value is not None and self.every_s > 0:
            return self._value  # stale by less than one run: served while the next run counts
        # shield: a scrape that gives up (its timeout) does not cancel the run others wait on.
        return await asyncio.shield(self._running)

    def _done(self, fut: asyncio.Future[T], started: float) -> None:
        self._running = None
        if fut.cancelled():
            return
        if (exc := fut.exception()) is not None:  # retrieved here: a background run has no awaiting caller
            log.warning("metrics lag count failed, serving the last one: %s", exc)
            return
        self._value, self._started = fut.result(), started
        self.runs += 1


@dataclass(frozen=True, slots=True)
class GroupPlan:
    """A group to count, as the loop saw it: its topics, online consumers and message model ordinal."""

    group: str
    topics: list[str]
    online: int
    model: str


def plan_groups(offsets: Any, consumers: Any) -> list[GroupPlan]:
    """Every group with committed offsets or online consumers (read on the loop, where they live)."""
    plan = []
    for group in sorted(set(offsets.groups()) | set(consumers.groups)):
        topics = set(offsets.topics_of_group(group))
        info = consumers.get(group)
        if info is not None:
            topics |= set(info.subscriptions)
        online = len(info.channels) if info is not None else 0
        model = _MSG_MODEL.get(info.message_model, "1") if info is not None else "1"
        plan.append(GroupPlan(group, sorted(topics), online, model))
    return plan


@dataclass
class LagCounts:
    """What one computation found; ``lag_families`` turns it into metric families."""

    #: (group, topic, online, model) -> messages behind; and the filtered count with its exactness
    diff: dict[tuple[str, str, int, str], int] = field(default_factory=dict)
    filtered: dict[tuple[str, str], tuple[int, bool]] = field(default_factory=dict)
    #: (group, topic) -> the sum of the group's committed offsets (rocketmq-exporter's rocketmq_consumer_offset)
    consumer_offset: dict[tuple[str, str], int] = field(default_factory=dict)
    #: (group, topic) -> ms since the oldest unconsumed message was stored (clustering groups)
    latency_ms: dict[tuple[str, str], int] = field(default_factory=dict)
    #: topic -> the sum of its queues' max offsets (rocketmq_producer_offset and the retry / DLQ ones)
    topic_offset: dict[str, int] = field(default_factory=dict)


def count_lag(admin: Any, store: Any, plan: list[GroupPlan], topic_queues: dict[str, int],
              now_ms: int) -> LagCounts:
    """The counts for ``plan`` and the topics ``topic_queues`` (topic -> its queue count); blocking (reads
    consume queues and records): the store pool's job."""
    out = LagCounts()
    for topic, queues in topic_queues.items():
        out.topic_offset[topic] = sum(store.get_max_offset(topic, q) for q in range(queues))
    for p in plan:
        body = admin.consume_stats_of(p.group, p.topics, 0.0)
        for e in body["offsetTable"]:
            t = e["topic"]
            key = (p.group, t, p.online, p.model)
            out.diff[key] = out.diff.get(key, 0) + e["lag"]
            if "filteredLag" in e:  # not for a class-filter topic (counted in the filter servers)
                n, exact = out.filtered.get((p.group, t), (0, True))
                out.filtered[(p.group, t)] = (n + e["filteredLag"], exact and e["filteredLagExact"])
            if t.startswith(DLQ_PREFIX):  # rocketmq-exporter leaves dead-letter topics out of these two
                continue
            consumer = max(e["consumerOffset"], 0)  # RocketMQ's ConsumeStats shows an uncommitted queue at 0
            out.consumer_offset[(p.group, t)] = out.consumer_offset.get((p.group, t), 0) + consumer
            if p.model == "1":
                behind = _behind_ms(admin, store, t, e["queueId"], consumer, e["brokerOffset"], now_ms)
                out.latency_ms[(p.group, t)] = max(out.latency_ms.get((p.group, t), 0), behind)
    return out


def _behind_ms(admin: Any, store: Any, topic: str, qid: int, consumer: int, broker: int, now_ms: int) -> int:
    """rocketmq-exporter's lag time of one queue: now minus the store time of the message at the consumer
    offset (at the queue's first kept message when the offset is below it); 0 when caught up."""
    if consumer >= broker:
        return 0
    offset = max(consumer, store.get_min_offset(topic, qid))
    stored = admin.store_time(topic, qid, offset) if offset < broker else 0
    return max(0, now_ms - stored) if stored else 0


def lag_families(cluster: str, broker: str, c: LagCounts) -> list[Metric]:
    diff_labels = ["group", "topic", "countOfOnlineConsumers", "msgModel"]
    diff = GaugeMetricFamily("rocketmq_group_diff", "Messages between the group's committed offsets and the "
                             "queues' ends (consumerProgress's Diff)", labels=diff_labels)
    # rocketmq-exporter's addGroupDiffMetric: retry and dead-letter topics have families of their own.
    retry_diff = GaugeMetricFamily("rocketmq_group_retrydiff", "The same for the group's %RETRY% topic",
                                   labels=diff_labels)
    dlq_diff = GaugeMetricFamily("rocketmq_group_dlqdiff", "The same for the group's %DLQ% topic",
                                 labels=diff_labels)
    for (group, t, online, model), n in c.diff.items():
        fam = retry_diff if t.startswith(RETRY_PREFIX) else dlq_diff if t.startswith(DLQ_PREFIX) else diff
        fam.add_metric([group, t, str(online), model], n)
    fdiff = GaugeMetricFamily("sluice_group_filtered_diff", "Of those, the messages the group's subscription "
                              "matches (consumerProgress's filtered lag; a lower bound when not exact)",
                              labels=["group", "topic"])
    fexact = GaugeMetricFamily("sluice_group_filtered_diff_exact",
                               "1 when sluice_group_filtered_diff is exact, 0 when the count stopped at its "
                               "work bound", labels=["group", "topic"])
    for (group, t), (n, exact) in c.filtered.items():
        fdiff.add_metric([group, t], n)
        fexact.add_metric([group, t], 1.0 if exact else 0.0)
    g_labels = ["cluster", "broker", "topic", "group"]
    offset = GaugeMetricFamily("rocketmq_consumer_offset", "Sum of the group's committed offsets over the "
                               "topic's queues on this broker", labels=g_labels)
    for (group, t), n in c.consumer_offset.items():
        offset.add_metric([cluster, broker, t, group], n)
    latency = GaugeMetricFamily("rocketmq_group_get_latency_by_storetime",
                                "Milliseconds since the oldest message the group has not consumed was stored "
                                "(0 when caught up; clustering groups)", labels=g_labels)
    for (group, t), ms in c.latency_ms.items():
        latency.add_metric([cluster, broker, t, group], ms)
    t_labels = ["cluster", "broker", "topic"]
    produced = GaugeMetricFamily("rocketmq_producer_offset", "Sum of the topic's queues' max offsets (messages "
                                 "ever put, while the queues are kept)", labels=t_labels)
    retry_off = GaugeMetricFamily("rocketmq_topic_retry_offset", "The same for a %RETRY% topic", labels=t_labels)
    dlq_off = GaugeMetricFamily("rocketmq_topic_dlq_offset", "The same for a group's %DLQ% topic (dead letters "
                                "ever stored)", labels=["cluster", "broker", "group"])
    for t, n in c.topic_offset.items():
        if t.startswith(RETRY_PREFIX):
            retry_off.add_metric([cluster, broker, t], n)
        elif t.startswith(DLQ_PREFIX):
            dlq_off.add_metric([cluster, broker, t[len(DLQ_PREFIX):]], n)
        else:
            produced.add_metric([cluster, broker, t], n)
    return [diff, retry_diff, dlq_diff, fdiff, fexact, offset, latency, produced, retry_off, dlq_off]
