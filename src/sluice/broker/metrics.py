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
consumerProgress's own code, at most once per ``metrics_lag_refresh_s``
(metrics_lag.py).
"""
from __future__ import annotations

import shutil
import time
from bisect import bisect_left
from typing import Any

from prometheus_client.core import (CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric)
from prometheus_client.registry import Collector

from sluice import __version__
from sluice.broker.metrics_lag import RefreshLimited, count_lag, lag_families, plan_groups
from sluice.broker.stats import (BROKER_GET_NUMS, BROKER_PUT_NUMS, DLQ_PUT_NUMS, GROUP_GET_NUMS, GROUP_GET_SIZE,
                                 SNDBCK_PUT_NUMS, TOPIC_PUT_NUMS, TOPIC_PUT_SIZE)
from sluice.metrics_http import LoopGathered

__all__ = ["PutLatency", "BrokerCollector", "PUT_LATENCY_BOUNDS"]

#: Upper bounds (seconds) of the put latency buckets: an append to the mapped log takes tens of microseconds,
#: a cold page or a full disk's refusal milliseconds; RocketMQ's putMessageDistributeTime starts at 0 ms too.
PUT_LATENCY_BOUNDS = (0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                      0.5, 1.0, 2.5, 5.0, 10.0)


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
        self.lag: RefreshLimited[list[Metric]] = RefreshLimited(broker.config.metrics_lag_refresh_s)

    async def gather(self) -> list[Metric]:
        """Every family, built on the broker's loop (the lag counts on its store pool)."""
        b = self.broker
        out = self._stats()
        out += self._clients()
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
        back = GaugeMetricFamily("rocketmq_send_back_nums", "Messages the group sent back for re-consumption, "
                                 "last minute (SNDBCK_PUT_NUMS)", labels=g_labels)
        back_total = CounterMetricFamily("sluice_send_back_messages", "Messages the group sent back (to retry or "
                                         "dead letter) since the broker started", labels=g_labels)
        for key, item in tables[SNDBCK_PUT_NUMS].items():
            topic, _, group = key.partition("@")
            back.add_metric([cluster, name, topic, group], item.snapshot(0).sum)
            back_total.add_metric([cluster, name, topic, group], item.value)
        dead_total = CounterMetricFamily("sluice_dead_letter_messages", "Of those, the messages moved to the "
                                         "group's %DLQ% topic (DLQ_PUT_NUMS)", labels=g_labels)
        for key, item in tables[DLQ_PUT_NUMS].items():
            topic, _, group = key.partition("@")
            dead_total.add_metric([cluster, name, topic, group], item.value)
        return [put_tps, put_size, put_total, get_tps, get_size, get_total, broker_tps, broker_qps, back, back_total,
                dead_total]

    # ---- clients (consumers.py) -----------------------------------------------------------------------
    def _clients(self) -> list[Metric]:
        b = self.broker
        producers = GaugeMetricFamily("rocketmq_producer_count", "Producer instances of the group connected",
                                      labels=["cluster", "broker", "group"])
        for group, pg in b.consumers.producers.items():
            producers.add_metric([b.config.cluster_name, b.config.broker_name, group], len(pg.channels))
        # rocketmq-exporter's buildClientAddresses: the connections' addresses and client ids, comma-joined.
        consumers = GaugeMetricFamily("rocketmq_group_count", "Consumer instances of the group connected",
                                      labels=["caddr", "localaddr", "group"])
        for group, info in b.consumers.groups.items():
            chans = [ch.to_wire() for ch in info.channels.values()]
            consumers.add_metric([",".join(c["clientAddr"] for c in chans), ",".join(c["clientId"] for c in chans),
                                  group], len(chans))
        return [producers, consumers]

    # ---- lag: consumerProgress's figures (metrics_lag.py), at most once per metrics_lag_refresh_s -------
    async def _lag(self) -> list[Metric]:
        out = await self.lag.get(self._count_lag)
        age = GaugeMetricFamily("sluice_metrics_lag_age_seconds", "Age of the lag figures served "
                                "(recomputed at most once per metrics_lag_refresh_s)")
        age.add_metric([], self.lag.age())
        return [*out, age]

    async def _count_lag(self) -> list[Metric]:
        b = self.broker
        plan = plan_groups(b.offsets, b.consumers)  # on the loop, where offsets and clients live
        queues = {cfg.topic_name: cfg.write_queue_nums for cfg in b.topics.all()}
        counts = await b.pool.run(count_lag, b.admin, b.store, plan, queues, int(time.time() * 1000))
        return lag_families(b.config.cluster_name, b.config.broker_name, counts)

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
