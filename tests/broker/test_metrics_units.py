"""The metrics' own parts without servers: the put latency histogram against a naive twin, the settings'
validation, and the endpoint's bind rules (exactly the address given; a taken port is a SluiceError)."""
from __future__ import annotations

import urllib.request

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client.core import GaugeMetricFamily

from broker_support import BrokerHandle, sub_data

from sluice.broker.config import BrokerConfig
from sluice.broker.metrics import PUT_LATENCY_BOUNDS, PutLatency
from sluice.errors import InvalidParameterError, SluiceError
from sluice.metrics_http import MetricsServer, parse_metrics_listen
from sluice.namesrv.server import NamesrvConfig


@given(st.lists(st.floats(min_value=0.0, max_value=60.0, allow_nan=False), max_size=200))
def test_put_latency_buckets_match_a_naive_count(observations: list[float]) -> None:
    h = PutLatency()
    for x in observations:
        h.observe(x)
    cum = h.cumulative()
    assert [le for le, _ in cum] == [repr(b) for b in PUT_LATENCY_BOUNDS] + ["+Inf"]
    for (le, n), bound in zip(cum, (*PUT_LATENCY_BOUNDS, float("inf"))):
        assert n == sum(1 for x in observations if x <= bound), le  # Prometheus buckets are "less or equal"
    assert h.sum == pytest.approx(sum(observations))


def test_metrics_listen_is_checked() -> None:
    assert parse_metrics_listen("[::1]:9100") == ("::1", 9100)
    for bad in ("9100", "host:", ":9100", "h:99999", "h:x"):
        with pytest.raises(InvalidParameterError, match="metrics_listen"):
            parse_metrics_listen(bad)
    with pytest.raises(InvalidParameterError, match="metrics_listen 'nope' is not HOST:PORT"):
        BrokerConfig.load(None, metrics_listen="nope")
    with pytest.raises(InvalidParameterError, match="metrics_listen"):
        NamesrvConfig(metrics_listen="nope")
    assert BrokerConfig.load(None, metrics_listen="127.0.0.1:0").metrics_listen == "127.0.0.1:0"


def test_log_settings_are_checked(tmp_path) -> None:
    with pytest.raises(InvalidParameterError, match="log level 'LOUD'"):
        BrokerConfig.load(None, log_level="LOUD")
    assert BrokerConfig.load(None, log_level="debug").log_level == "DEBUG"
    with pytest.raises(InvalidParameterError, match="log_max_bytes"):
        BrokerConfig.load(None, log_max_bytes=0)
    conf = tmp_path / "b.toml"
    conf.write_text('log_dir = "logs"\nlog_max_bytes = 1000\nlog_backups = 2\nmetrics_listen = "127.0.0.1:0"\n')
    c = BrokerConfig.load(conf)
    assert (c.log_dir, c.log_max_bytes, c.log_backups) == (str(tmp_path / "logs"), 1000, 2)  # beside the file


class _One:
    def collect(self):
        g = GaugeMetricFamily("sluice_test_value", "a value")
        g.add_metric([], 42)
        yield g


def test_the_endpoint_binds_exactly_the_address_and_refuses_a_taken_port() -> None:
    m = MetricsServer("127.0.0.1:0", [_One()])
    m.start()
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{m.port}/metrics", timeout=10) as r:
            assert "sluice_test_value 42.0" in r.read().decode()
        assert m.bound == ("127.0.0.1", m.port)  # loopback only, not every interface
        taken = MetricsServer(f"127.0.0.1:{m.port}", [_One()])
        with pytest.raises(SluiceError, match=f"cannot serve metrics on 127.0.0.1:{m.port}"):
            taken.start()
    finally:
        m.close()


def test_an_in_process_scrape_splits_retry_lag_and_counts_the_backlog(make_broker) -> None:
    b = make_broker(handle=BrokerHandle, metrics_listen="127.0.0.1:0")
    rpc = b.rpc()
    assert rpc.heartbeat("c1", "G", [sub_data("T"), sub_data("%RETRY%G")]).code == 0
    for _ in range(3):
        rpc.send("T", b"x")
    b.broker.store.wait_dispatched()
    with urllib.request.urlopen(f"http://127.0.0.1:{b.broker.metrics.port}/metrics", timeout=15) as r:
        text = r.read().decode()
    # No committed offset: the lag is the whole queue, as consumerProgress counts it; one consumer online.
    assert 'rocketmq_group_diff{countOfOnlineConsumers="1",group="G",msgModel="1",topic="T"} 3.0' in text
    assert 'rocketmq_group_retrydiff{countOfOnlineConsumers="1",group="G",msgModel="1",topic="%RETRY%G"} 0.0' in text
    assert 'topic="%RETRY%G"' not in "".join(x for x in text.splitlines() if x.startswith("rocketmq_group_diff"))
    assert 'sluice_group_filtered_diff{group="G",topic="T"} 3.0' in text  # '*' matches every message
    assert 'sluice_topic_put_messages_total{broker="broker-a",cluster="DefaultCluster",topic="T"} 3.0' in text
