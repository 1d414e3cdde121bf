"""The namesrv's Prometheus metrics (``--metrics-listen``): brokers, topics, requests, gathered when scraped.

rocketmq-exporter reads no namesrv figures, so these are Sluice's own
``sluice_namesrv_*`` names (docs/namesrv.md).
"""
from __future__ import annotations

from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from sluice.metrics_http import LoopGathered
from sluice.protocol.codes import RequestCode

__all__ = ["NamesrvCollector"]


def _code_name(code: int) -> str:
    try:
        return RequestCode(code).name
    except ValueError:
        return str(code)


class NamesrvCollector(LoopGathered, Collector):
    """A prometheus_client collector over a running namesrv (its loop is taken at ``bind``).

    ``server`` is the NamesrvServer, typed loosely: the server imports this module."""

    def __init__(self, server: Any) -> None:
        self.server = server

    async def gather(self) -> list[Metric]:
        routes = self.server.routes
        brokers = GaugeMetricFamily("sluice_namesrv_brokers", "Broker addresses registered and live")
        brokers.add_metric([], len(routes.broker_live_table))
        names = GaugeMetricFamily("sluice_namesrv_broker_names", "Broker names (master/slave sets) known, by cluster",
                                  labels=["cluster"])
        for cluster, members in routes.cluster_addr_table.items():
            names.add_metric([cluster], len(members))
        topics = GaugeMetricFamily("sluice_namesrv_topics", "Topics with a route")
        topics.add_metric([], len(routes.topic_queue_table))
        requests = CounterMetricFamily("sluice_namesrv_requests", "Requests handled, by request code",
                                       labels=["code", "name"])
        for code, n in sorted(self.server.request_counts.items()):
            requests.add_metric([str(code), _code_name(code)], n)
        return [brokers, names, topics, requests]
