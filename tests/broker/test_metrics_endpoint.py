"""``--metrics-listen`` end to end: real ``sluice namesrv`` / ``sluice broker`` subprocesses serving /metrics,
scraped over HTTP after sends and pulls (TPS, put totals, the latency histogram, lag and filter-aware lag that
follow the backlog exactly, filter evaluations), and a bad or taken address failing start-up clearly."""
from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator

import pytest
from prometheus_client.parser import text_string_to_metric_families
from servers import Cluster, free_port, running_cluster, wait_for, wait_for_route

from sluice import LitePullConsumer, Message, MessageSelector, Producer

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(port: int) -> Samples:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=15) as r:
        assert r.status == 200 and r.headers["Content-Type"].startswith("text/plain")
        text = r.read().decode()
    return {(s.name, frozenset(s.labels.items())): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def value(samples: Samples, metric: str, /, **labels: str) -> float:
    """The sum of ``metric``'s samples whose labels include ``labels`` (KeyError when there are none)."""
    hits = [v for (n, ls), v in samples.items() if n == metric and set(labels.items()) <= ls]
    if not hits:
        raise KeyError(f"{metric}{labels} not scraped")
    return sum(hits)


@pytest.fixture(scope="module")
def ports() -> tuple[int, int]:
    return free_port(), free_port()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, ports: tuple[int, int]) -> Iterator[Cluster]:
    ns_port, broker_port = ports
    with running_cluster(tmp_path_factory.mktemp("metrics"), ("broker-a",),
                         "--metrics-listen", f"127.0.0.1:{broker_port}",
                         # lag figures recomputed on every scrape, so they follow the backlog at once
                         config="metrics_lag_refresh_s = 0\n",
                         namesrv_extra=("--metrics-listen", f"127.0.0.1:{ns_port}")) as c:
        yield c


def test_sends_pulls_lag_and_filters_show_in_the_broker_metrics(cluster: Cluster, ports: tuple[int, int]) -> None:
    port = ports[1]
    topic, group = "MetricsT", "MetricsG"
    test_from = time.monotonic()
    with Producer("MetricsPG", cluster.ns, default_topic_queue_nums=2) as p:
        p.send(Message(topic, b"create", properties={"region": "none"}))
        wait_for_route(cluster.ns, topic)
        consumer = LitePullConsumer(group, cluster.ns, consume_from_where="CONSUME_FROM_FIRST_OFFSET")
        consumer.subscribe(topic, MessageSelector.by_sql("region = 'eu'"))
        consumer.start()
        try:
            for i in range(30):
                p.send(Message(topic, b"m%d" % i, properties={"region": "eu" if i % 3 == 0 else "us"}))
            got: list = []
            deadline = time.monotonic() + 60
            while len(got) < 10 and time.monotonic() < deadline:
                got += consumer.poll(1.0)
            assert len(got) == 10 and all(m.user_properties["region"] == "eu" for m in got)
            consumer.commit_sync()
            s = scrape(port)
            assert value(s, "rocketmq_producer_tps", topic=topic) > 0
            assert value(s, "sluice_topic_put_messages_total", topic=topic) == 31
            assert value(s, "rocketmq_consumer_tps", topic=topic, group=group) > 0
            assert value(s, "sluice_group_get_messages_total", topic=topic, group=group) == 10
            assert value(s, "rocketmq_broker_tps") > 0 and value(s, "rocketmq_broker_qps") > 0
            assert value(s, "sluice_filter_evaluations_total", group=group, topic=topic) > 0
            assert value(s, "sluice_filter_matched_total", group=group, topic=topic) >= 10
            assert value(s, "sluice_put_latency_seconds_count") >= 31  # at least one append per send
            assert value(s, "sluice_put_latency_seconds_sum") > 0
            assert value(s, "sluice_store_commitlog_bytes") > 0
            assert 0 < value(s, "rocketmq_brokeruntime_commitlog_disk_ratio") < 1
            # rocketmq-exporter's offsets and client counts, from the same traffic.
            assert value(s, "rocketmq_producer_offset", topic=topic, broker="broker-a") == 31
            # Every queue committed: the committed offsets and the diff add up to the queues' ends.
            assert value(s, "rocketmq_consumer_offset", topic=topic, group=group) \
                + value(s, "rocketmq_group_diff", topic=topic, group=group) == 31
            assert value(s, "rocketmq_group_get_latency_by_storetime", topic=topic, group=group) >= 0
            assert value(s, "rocketmq_producer_count", group="MetricsPG") == 1
            assert value(s, "rocketmq_group_count", group=group) == 1
        finally:
            consumer.shutdown()
        before = scrape(port)
        diff0 = value(before, "rocketmq_group_diff", group=group, topic=topic)
        filtered0 = value(before, "sluice_group_filtered_diff", group=group, topic=topic)
        assert filtered0 == 0 and value(before, "sluice_group_filtered_diff_exact", group=group, topic=topic) == 1
        # A backlog the group has not pulled: the plain lag grows by every message, the filtered by its matches.
        for i in range(7):
            p.send(Message(topic, b"b%d" % i, properties={"region": "eu" if i < 3 else "us"}))
    after = wait_for(lambda: (s := scrape(port)) and value(s, "rocketmq_group_diff", group=group, topic=topic)
                     == diff0 + 7 and s, 20, "the backlog in rocketmq_group_diff")
    assert value(after, "sluice_group_filtered_diff", group=group, topic=topic) == 3
    assert value(after, "rocketmq_producer_offset", topic=topic) == 38
    # The oldest message the group has not consumed was stored during this test.
    assert 0 <= value(after, "rocketmq_group_get_latency_by_storetime", topic=topic, group=group) \
        <= (time.monotonic() - test_from) * 1000
    labels = next(dict(ls) for (n, ls), _ in after.items() if n == "rocketmq_group_diff" and ("group", group) in ls)
    assert labels["msgModel"] == "1" and "countOfOnlineConsumers" in labels
    assert not any(n == "rocketmq_group_diff" and dict(ls)["topic"].startswith("%") for (n, ls), _ in after.items())


def test_the_namesrv_metrics(cluster: Cluster, ports: tuple[int, int]) -> None:
    wait_for_route(cluster.ns, "TBW102")
    s = scrape(ports[0])
    assert value(s, "sluice_namesrv_brokers") == 1
    assert value(s, "sluice_namesrv_topics") >= 1
    assert value(s, "sluice_namesrv_requests_total", name="REGISTER_BROKER") >= 1
    assert value(s, "sluice_namesrv_requests_total", name="GET_ROUTEINFO_BY_TOPIC") >= 1


def _run(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sluice", *args], capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("server", ["broker", "namesrv"])
def test_a_taken_metrics_port_fails_the_start(tmp_path, server: str) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        extra = ["--store", str(tmp_path / "store")] if server == "broker" else []
        r = _run(server, "--listen", f"127.0.0.1:{free_port()}", *extra, "--metrics-listen", f"127.0.0.1:{port}")
    assert r.returncode == 1
    assert f"cannot serve metrics on 127.0.0.1:{port}" in r.stderr and "in use" in r.stderr


@pytest.mark.parametrize("server", ["broker", "namesrv"])
def test_a_malformed_metrics_address_is_a_usage_error(tmp_path, server: str) -> None:
    extra = ["--store", str(tmp_path / "store")] if server == "broker" else []
    r = _run(server, "--listen", f"127.0.0.1:{free_port()}", *extra, "--metrics-listen", "localhost")
    assert r.returncode == 2 and "metrics_listen 'localhost' is not HOST:PORT" in r.stderr
