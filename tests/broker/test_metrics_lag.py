"""metrics_lag.py and the exporter series of metrics.py: RefreshLimited bounds the lag work to one run per
metrics_lag_refresh_s (shared by concurrent scrapes), and an in-process broker scraped over HTTP after known
traffic shows rocketmq-exporter's consumer/topic offsets, latency by store time, send-back and dead-letter
counts, producer and consumer counts with the values that traffic makes."""
from __future__ import annotations

import asyncio
import time
import urllib.request
from typing import Any

import pytest
from broker_support import BrokerHandle, sub_data
from prometheus_client.parser import text_string_to_metric_families

from sluice.broker.config import BrokerConfig
from sluice.broker.metrics_lag import RefreshLimited
from sluice.errors import InvalidParameterError
from sluice.protocol.codes import RequestCode
from sluice.protocol.msgid import decode_offset_msg_id

# ---------------------------------------------------------------------------------------- RefreshLimited


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_last_result_is_served_until_it_is_refresh_seconds_old() -> None:
    clock = Clock()
    cache: RefreshLimited[int] = RefreshLimited(10.0, clock)
    runs: list[float] = []

    async def compute() -> int:
        runs.append(clock.now)
        return len(runs)

    async def main() -> None:
        assert cache.age() == 0.0
        assert await cache.get(compute) == 1  # the first caller waits for a run
        clock.now += 9.9
        assert await cache.get(compute) == 1 and cache.age() == pytest.approx(9.9) and len(runs) == 1
        clock.now += 0.1
        # Due: this caller starts the next run and is answered with the last figures at once.
        assert await cache.get(compute) == 1
        await turns()  # the run it started counts and finishes
        assert len(runs) == 2 and await cache.get(compute) == 2 and cache.age() == 0.0 and cache.runs == 2
    asyncio.run(main())


def test_concurrent_askers_share_one_run_and_zero_means_every_time() -> None:
    async def main() -> None:
        cache: RefreshLimited[int] = RefreshLimited(60.0)
        gate = asyncio.Event()
        runs = 0

        async def compute() -> int:
            nonlocal runs
            runs += 1
            await gate.wait()
            return runs
        waiting = [asyncio.ensure_future(cache.get(compute)) for _ in range(5)]
        await asyncio.sleep(0)
        gate.set()
        assert await asyncio.gather(*waiting) == [1] * 5 and runs == 1
        every: RefreshLimited[int] = RefreshLimited(0.0)
        assert [await every.get(compute) for _ in range(3)] == [2, 3, 4]  # each caller waits for its own
    asyncio.run(main())


def test_a_failed_run_keeps_the_last_figures_and_is_retried(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    cache: RefreshLimited[str] = RefreshLimited(5.0, clock)
    calls = 0

    async def flaky() -> str:
        nonlocal calls
        calls += 1
        if calls == 2:
            raise OSError("disk gone")
        return f"run{calls}"

    async def main() -> None:
        with pytest.raises(OSError):
            await RefreshLimited(5.0, clock).get(_raise)  # no figures yet: the first caller gets the failure
        assert await cache.get(flaky) == "run1"
        clock.now += 6
        assert await cache.get(flaky) == "run1"  # starts the failing run
        await turns()
        assert cache.age() == pytest.approx(6) and cache.runs == 1  # still the old figures
        assert await cache.get(flaky) == "run1"  # due still: the next run starts
        await turns()
        assert await cache.get(flaky) == "run3" and cache.runs == 2
    asyncio.run(main())
    assert "metrics lag count failed, serving the last one: disk gone" in caplog.text


async def turns(n: int = 3) -> None:
    """A few event-loop turns: a started run runs, and its done callback follows."""
    for _ in range(n):
        await asyncio.sleep(0)


async def _raise() -> str:
    raise OSError("no figures yet")


def test_a_negative_refresh_is_refused() -> None:
    with pytest.raises(InvalidParameterError, match="metrics_lag_refresh_s"):
        BrokerConfig(metrics_lag_refresh_s=-1).validate()


# ---------------------------------------------------------------------------------------- a scraped broker

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(port: int) -> Samples:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=15) as r:
        text = r.read().decode()
    return {(s.name, frozenset(s.labels.items())): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def value(samples: Samples, metric: str, /, **labels: str) -> float:
    hits = [v for (n, ls), v in samples.items() if n == metric and set(labels.items()) <= ls]
    if not hits:
        raise KeyError(f"{metric}{labels} not scraped")
    return sum(hits)


def labels_of(samples: Samples, metric: str, /, **labels: str) -> dict[str, str]:
    return next(dict(ls) for (n, ls), _ in samples.items() if n == metric and set(labels.items()) <= ls)


def commit(rpc: Any, group: str, topic: str, offset: int) -> None:
    r = rpc.call(RequestCode.UPDATE_CONSUMER_OFFSET, {"consumerGroup": group, "topic": topic, "queueId": 0,
                                                      "commitOffset": offset})
    assert r.code == 0, r.remark


def test_exporter_series_after_known_traffic(make_broker: Any) -> None:
    b = make_broker(handle=BrokerHandle, metrics_listen="127.0.0.1:0", metrics_lag_refresh_s=3600.0)
    rpc = b.rpc()
    port = b.broker.metrics.port
    assert rpc.heartbeat("c1", "G", [sub_data("T")], producer_group="PG").code == 0
    before_ms = int(time.time() * 1000)
    sent = [rpc.send("T", b"m%d" % i) for i in range(3)]
    assert all(r.code == 0 for r in sent)
    b.broker.store.wait_dispatched()
    commit(rpc, "G", "T", 1)  # two behind
    commit(rpc, "Caught", "T", 3)  # none behind
    # Send-backs: two retried, one over its limit (dead-lettered), all from T for group G.
    for i, limit in ((0, "16"), (1, "16"), (2, "0")):
        offset = decode_offset_msg_id(sent[i].ext_fields["msgId"]).offset
        r = rpc.call(RequestCode.CONSUMER_SEND_MSG_BACK, {"offset": offset, "group": "G", "delayLevel": 0,
                                                          "originTopic": "T", "maxReconsumeTimes": limit})
        assert r.code == 0, r.remark
    b.broker.store.wait_dispatched()
    s = scrape(port)
    after_ms = int(time.time() * 1000)
    assert value(s, "rocketmq_producer_offset", topic="T") == 3
    assert value(s, "rocketmq_topic_dlq_offset", group="G") == 1
    assert labels_of(s, "rocketmq_topic_dlq_offset", group="G")["broker"] == "broker-a"
    assert value(s, "rocketmq_consumer_offset", topic="T", group="G", cluster="DefaultCluster") == 1
    assert value(s, "rocketmq_consumer_offset", topic="T", group="Caught") == 3
    behind = value(s, "rocketmq_group_get_latency_by_storetime", topic="T", group="G")
    assert 0 <= behind <= after_ms - before_ms  # the message at offset 1 was stored in between
    assert value(s, "rocketmq_group_get_latency_by_storetime", topic="T", group="Caught") == 0
    assert value(s, "rocketmq_send_back_nums", topic="T", group="G") == 3  # the minute's sum, as the exporter
    assert value(s, "sluice_send_back_messages_total", topic="T", group="G") == 3
    assert value(s, "sluice_dead_letter_messages_total", topic="T", group="G") == 1
    assert value(s, "rocketmq_producer_count", group="PG") == 1
    assert value(s, "rocketmq_group_count", group="G") == 1
    assert labels_of(s, "rocketmq_group_count", group="G")["localaddr"] == "c1"
    assert value(s, "rocketmq_group_diff", group="G", topic="T") == 2
    # The lag side is computed once per metrics_lag_refresh_s: more traffic shows in the put figures at
    # once, in the lag figures only when they are recomputed.
    assert rpc.send("T", b"late").code == 0
    b.broker.store.wait_dispatched()
    s2 = scrape(port)
    assert value(s2, "sluice_topic_put_messages_total", topic="T") == 4
    assert value(s2, "rocketmq_producer_offset", topic="T") == 3 and value(s2, "rocketmq_group_diff", group="G",
                                                                           topic="T") == 2
    assert value(s2, "sluice_metrics_lag_age_seconds") > 0
    assert b.broker._metrics_collector.lag.runs == 1
