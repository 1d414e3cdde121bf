"""The broker's Prometheus metrics (``--metrics-listen``), gathered when scraped.

Names are rocketmq-exporter's where it has one
(rocketmq-exporter: src/main/java/org/apache/rocketmq/exporter/collector/RMQMetricsCollector.java),
with its labels, so its Grafana dashboards read a Sluice broker; Sluice's own
figures are ``sluice_*``. The table is in docs/broker.md.

Nothing here runs between scrapes except :class:`PutLatency`'s one
observation per store call (the appender's ``latency``, set only when metrics
are served). A scrape gathers everything on the broker's event loop, where the
put/get statistics (stats.py), offsets and filter metrics live without locks;
the lag counts, which read consume queues, run on the store pool with
consumerProgress's own code (admin.py ``consume_stats_of``, filter_lag.py).
"""
from __future__ import annotations

import shutil
from bisect import bisect_left
from typing import Any

from prometheus_client.core import (CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric)
from prometheus_client.registry import Collector

from sluice import __version__
from sluice.broker.stats import (BROKER_GET_NUMS, BROKER_PUT_NUMS, GROUP_GET_NUMS, GROUP_GET_SIZE, TOPIC_PUT_NUMS,
                                 TOPIC_PUT_SIZE)
from sluice.broker.topics import DLQ_PREFIX, RETRY_PREFIX
from sluice.metrics_http import LoopGathered

__all__ = ["PutLatency", "BrokerCollector", "PUT_LATENCY_BOUNDS"]

#: Upper bounds (seconds) of the put latency buckets: an append to the mapped log takes tens of microseconds,
#: a cold page or a full disk's refusal milliseconds; RocketMQ's putMessageDistributeTime starts at 0 ms too.
PUT_LATENCY_BOUNDS = (0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                      0.5, 1.0, 2.5, 5.0, 10.0)
#: RocketMQ's MessageModel ordinals, as rocketmq-exporter writes them in rocketmq_group_diff's msgModel.
_MSG_MODEL = {"BROADCASTING": "0", "CLUSTERING": "1"}


class PutLatency:
    """A histogram of store-call durations: one ``observe`` per append call (not per message), on the loop."""

    __slots__ = ("counts", "sum")

    def __init__(self) -> None:
        self.counts = [0] * (len(PUT_LATENCY_BOUNDS) + 1)  # the last is +Inf
        self.sum = 0.0

    def observe(self, seconds: float) -> None:
        self.counts[bisect_left(PUT_LATENCY_BOUNDS, seconds)] += 1  # the first bucket whose bound is >= it
        self.sum += seconds

    def cumulative(self) -> list[tuple[str, int]]:
        out, n = [], 0
        for bound, c in zip((*map(repr, PUT_LATENCY_BOUNDS), "+Inf"), self.counts):
            n += c
            out.append((bound, n))
        return out


class BrokerCollector(LoopGathered, Collector):
    """A prometheus_client collector over a running broker (its loop is taken at ``bind``).

    ``broker`` is the BrokerController, typed loosely: the controller imports this module."""

    def __init__(self, broker: Any) -> None:
        self.broker = broker

    async def gather(self) -> list[Metric]:
        """Every family, built on the broker's loop (the lag counts on its store pool)."""
        b = self.broker
        out = self._stats()
        out += await self._lag()
        out += self._store()
        out += self._filters()
        if b.appender.latency is not None:
            h = HistogramMetricFamily("sluice_put_latency_seconds",
                                      "Duration of each append call to the store (one per request or merged "
                                      "requests, whatever their message count)")
            lat = b.appender.latency
            h.add_metric([], lat.cumulative(), lat.sum)
            out.append(h)
        return out

    # ---- put / get statistics (stats.py) -------------------------------------------------------------
    def _stats(self) -> list[Metric]:
        b = self.broker
        cluster, name = b.config.cluster_name, b.config.broker_name
        tables = b.stats.tables
        t_labels = ["cluster", "broker", "topic"]
        g_labels = ["cluster", "broker", "topic", "group"]
        put_tps = GaugeMetricFamily("rocketmq_producer_tps", "Messages put per second, last minute (TOPIC_PUT_NUMS)",
                                    labels=t_labels)
        put_size = GaugeMetricFamily("rocketmq_producer_message_size",
                                     "Bytes put per second, last minute (TOPIC_PUT_SIZE)", labels=t_labels)
        put_total = CounterMetricFamily("sluice_topic_put_messages", "Messages put since the broker started",
                                        labels=t_labels)
        for topic, item in tables[TOPIC_PUT_NUMS].items():
            put_tps.add_metric([cluster, name, topic], item.snapshot(0).tps)
            put_total.add_metric([cluster, name, topic], item.value)
        for topic, item in tables[TOPIC_PUT_SIZE].items():
            put_size.add_metric([cluster, name, topic], item.snapshot(0).tps)
        get_tps = GaugeMetricFamily("rocketmq_consumer_tps",
                                    "Messages pulled per second by the group, last minute (GROUP_GET_NUMS)",
                                    labels=g_labels)
        get_size = GaugeMetricFamily("rocketmq_consumer_message_size",
                                     "Bytes pulled per second by the group, last minute (GROUP_GET_SIZE)",
                                     labels=g_labels)
        get_total = CounterMetricFamily("sluice_group_get_messages",
                                        "Messages pulled by the group since the broker started", labels=g_labels)
        for key, item in tables[GROUP_GET_NUMS].items():
            topic, _, group = key.partition("@")
            get_tps.add_metric([cluster, name, topic, group], item.snapshot(0).tps)
            get_total.add_metric([cluster, name, topic, group], item.value)
        for key, item in tables[GROUP_GET_SIZE].items():
            topic, _, group = key.partition("@")
            get_size.add_metric([cluster, name, topic, group], item.snapshot(0).tps)
        b_labels = ["cluster", "brokerIP", "broker"]
        broker_tps = GaugeMetricFamily("rocketmq_broker_tps", "Messages put per second on the broker, last minute",
                                       labels=b_labels)
        broker_qps = GaugeMetricFamily("rocketmq_broker_qps",
                                       "Messages pulled per second from the broker, last minute", labels=b_labels)
        for fam, table in ((broker_tps, BROKER_PUT_NUMS), (broker_qps, BROKER_GET_NUMS)):
            item = b.stats.get(table, cluster)
            fam.add_metric([cluster, b.address, name], item.snapshot(0).tps if item is not None else 0.0)
        return [put_tps, put_size, put_total, get_tps, get_size, get_total, broker_tps, broker_qps]

    # ---- lag: consumerProgress's figures --------------------------------------------------------------
    async def _lag(self) -> list[Metric]:
        b = self.broker
        plan: list[tuple[str, list[str], str, str]] = []
        for group in sorted(set(b.offsets.groups()) | set(b.consumers.groups)):
            topics = set(b.offsets.topics_of_group(group))
            info = b.consumers.get(group)
            if info is not None:
                topics |= set(info.subscriptions)
            online = str(len(info.channels)) if info is not None else "0"
            model = _MSG_MODEL.get(info.message_model, "1") if info is not None else "1"
            plan.append((group, sorted(topics), online, model))
        admin = b.admin

        def count() -> list[tuple[str, str, str, dict[str, Any]]]:
            return [(g, online, model, admin.consume_stats_of(g, topics, 0.0)) for g, topics, online, model in plan]

        bodies = await b.pool.run(count)
        diff_labels = ["group", "topic", "countOfOnlineConsumers", "msgModel"]
        diff = GaugeMetricFamily("rocketmq_group_diff", "Messages between the group's committed offsets and the "
                                 "queues' ends (consumerProgress's Diff)", labels=diff_labels)
        # rocketmq-exporter's addGroupDiffMetric: retry and dead-letter topics have families of their own.
        retry_diff = GaugeMetricFamily("rocketmq_group_retrydiff", "The same for the group's %RETRY% topic",
                                       labels=diff_labels)
        dlq_diff = GaugeMetricFamily("rocketmq_group_dlqdiff", "The same for the group's %DLQ% topic",
                                     labels=diff_labels)
        fdiff = GaugeMetricFamily("sluice_group_filtered_diff", "Of those, the messages the group's subscription "
                                  "matches (consumerProgress's filtered lag; a lower bound when not exact)",
                                  labels=["group", "topic"])
        fexact = GaugeMetricFamily("sluice_group_filtered_diff_exact",
                                   "1 when sluice_group_filtered_diff is exact, 0 when the count stopped at its "
                                   "work bound", labels=["group", "topic"])
        for group, online, model, body in bodies:
            lag: dict[str, int] = {}
            filtered: dict[str, int] = {}
            exact: dict[str, bool] = {}
            for e in body["offsetTable"]:
                t = e["topic"]
                lag[t] = lag.get(t, 0) + e["lag"]
                if "filteredLag" in e:  # not for a class-filter topic (counted in the filter servers)
                    filtered[t] = filtered.get(t, 0) + e["filteredLag"]
                    exact[t] = exact.get(t, True) and e["filteredLagExact"]
            for t, n in lag.items():
                fam = retry_diff if t.startswith(RETRY_PREFIX) else dlq_diff if t.startswith(DLQ_PREFIX) else diff
                fam.add_metric([group, t, online, model], n)
            for t, n in filtered.items():
                fdiff.add_metric([group, t], n)
                fexact.add_metric([group, t], 1.0 if exact[t] else 0.0)
        return [diff, retry_diff, dlq_diff, fdiff, fexact]

    # ---- the store --------------------------------------------------------------------------------------
    def _runtime_labels(self) -> tuple[list[str], list[str]]:
        b = self.broker
        return (["cluster", "brokerIP", "brokerHost", "des", "boottime", "broker_version"],
                [b.config.cluster_name, b.address, b.config.broker_name, f"Sluice {__version__}",
                 str(int(b.started_at * 1000)), __version__])

    def _store(self) -> list[Metric]:
        b = self.broker
        names, values = self._runtime_labels()
        s = b.store.stats()
        lo, hi = int(s["commitlog_min_offset"]), int(s["commitlog_max_offset"])  # type: ignore[call-overload]
        out = []

        def gauge(name: str, doc: str, value: float) -> None:
            g = GaugeMetricFamily(name, doc, labels=names)
            g.add_metric(values, value)
            out.append(g)

        gauge("rocketmq_brokeruntime_commitlog_maxoffset", "Commit-log offset the next message is written at", hi)
        gauge("rocketmq_brokeruntime_commitlog_minoffset", "Lowest commit-log offset still kept", lo)
        gauge("rocketmq_brokeruntime_dispatch_behind_bytes", "Commit-log bytes not yet in consume queues",
              int(s["dispatch_behind_bytes"]))  # type: ignore[call-overload]
        gauge("rocketmq_brokeruntime_msg_put_total_today_now", "Messages stored since the broker started",
              b.appender.messages)
        gauge("rocketmq_brokeruntime_msg_gettotal_today_now", "Messages pulled since the broker started",
              b.pull_processor.pulled_messages)
        gauge("sluice_store_commitlog_bytes", "Bytes of messages the commit log holds (max offset - min offset)",
              hi - lo)
        try:
            du = shutil.disk_usage(b.config.store)
        except OSError:
            return out
        gauge("rocketmq_brokeruntime_commitlog_disk_ratio", "Used fraction of the disk the store is on",
              du.used / du.total if du.total else 0.0)
        gauge("rocketmq_brokeruntime_commitlogdir_capacity_total", "Bytes of the disk the store is on", du.total)
        gauge("rocketmq_brokeruntime_commitlogdir_capacity_free", "Free bytes of the disk the store is on", du.free)
        return out

    # ---- server-side filtering (filter_data.py FilterMetrics) --------------------------------------------
    def _filters(self) -> list[Metric]:
        labels = ["group", "topic"]
        fams = {
            "evaluated": CounterMetricFamily("sluice_filter_evaluations",
                                             "Records the group's selector was evaluated on in pulls", labels=labels),
            "matched": CounterMetricFamily("sluice_filter_matched", "Of those, records it matched", labels=labels),
            "errors": CounterMetricFamily("sluice_filter_errors", "Evaluations that raised", labels=labels),
            "bitmap_skipped": CounterMetricFamily("sluice_filter_bitmap_skipped",
                                                  "Messages ruled out by their Bloom bitmap, unread", labels=labels),
            "bitmap_hits": CounterMetricFamily("sluice_filter_bitmap_hits",
                                               "Messages whose bitmap passed and whose record matched", labels=labels),
            "bitmap_false_positives": CounterMetricFamily(
                "sluice_filter_bitmap_false_positives", "Messages whose bitmap passed but whose record did not match",
                labels=labels),
        }
        for (group, topic), m in list(self.broker.filter_data.metrics.items()):
            for attr, fam in fams.items():
                fam.add_metric([group, topic], getattr(m, attr))
        return list(fams.values())
