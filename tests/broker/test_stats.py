"""broker/stats.py: counters with minute/hour/day snapshots (RocketMQ's BrokerStatsManager), and live_config.py."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.broker.config import BrokerConfig
from sluice.broker.live_config import LIVE, apply_update, config_properties, parse_properties, wire_name
from sluice.broker.stats import (_WINDOWS, BROKER_GET_NUMS, BROKER_PUT_NUMS, DLQ_PUT_NUMS, GROUP_GET_NUMS,
                                 SNDBCK_PUT_NUMS, TOPIC_PUT_NUMS, TOPIC_PUT_SIZE, BrokerStats, StatsItem)
from sluice.errors import InvalidParameterError, NoPermissionError


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_minute_tps_and_avgpt() -> None:
    clock = Clock()
    stats = BrokerStats("C", clock=clock)
    for _ in range(5):
        clock.now += 2.0
        stats.on_put("T", 10, 1000)
    clock.now += 10.0  # 20 s since the item was made (at the first put)
    item = stats.get(TOPIC_PUT_NUMS, "T")
    assert item is not None
    snap = item.snapshot(0)
    assert snap.sum == 50 and snap.avgpt == 10.0
    assert snap.tps == pytest.approx(50 / 18.0)  # made at the first put, 18 s ago
    assert stats.get(TOPIC_PUT_SIZE, "T").snapshot(0).sum == 5000  # type: ignore[union-attr]
    assert stats.get(BROKER_PUT_NUMS, "C").snapshot(2).sum == 50  # type: ignore[union-attr]


def test_minute_window_forgets_older_puts_but_the_day_keeps_them() -> None:
    clock = Clock()
    stats = BrokerStats("C", clock=clock)
    stats.on_get("T", "G", 100, 1)
    clock.now += 300.0
    stats.on_get("T", "G", 6, 1)
    clock.now += 1.0
    item = stats.get(GROUP_GET_NUMS, "T@G")
    assert item is not None
    assert item.snapshot(0).sum == 6  # the 100 are older than the minute window
    assert item.snapshot(2).sum == 106
    assert stats.consume_tps("G", "T") == pytest.approx(6 / (item_span := 301.0 - 250.0)) and item_span > 0
    assert stats.consume_tps("G", "other") == 0.0
    assert stats.get(BROKER_GET_NUMS, "C").snapshot(1).sum == 106  # type: ignore[union-attr]


def test_idle_items_are_dropped() -> None:
    clock = Clock()
    stats = BrokerStats("C", clock=clock)
    stats.on_put("Old", 1, 1)
    clock.now += 3 * 86400.0
    stats.on_put("New", 1, 1)
    assert stats.drop_idle() == 2  # Old's TOPIC_PUT_NUMS and TOPIC_PUT_SIZE
    assert stats.get(TOPIC_PUT_NUMS, "Old") is None and stats.get(TOPIC_PUT_NUMS, "New") is not None


def eager_snapshot(created: float, events: list[tuple[float, int]], now: float, window: int) -> tuple[int, float]:
    """The twin: every sample point taken on time (what a sampling thread would do), then the window's oldest."""
    every, keep = _WINDOWS[window]
    samples = [(created, 0)]
    t = created + every
    while t <= now:
        samples.append((t, sum(n for when, n in events if when < t)))
        t += every
    t0, v0 = samples[-keep:][0]
    total = sum(n for _, n in events)
    return total - v0, t0


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.floats(0.0, 900.0), st.integers(1, 1000)), max_size=40), st.floats(0.0, 5000.0))
def test_lazy_sampling_equals_eager_sampling(steps: list[tuple[float, int]], tail: float) -> None:
    clock = Clock()
    item = StatsItem(clock)
    created = clock.now
    events = []
    for dt, n in steps:
        clock.now += dt
        item.add(n)
        events.append((clock.now, n))
    clock.now += tail
    for window in range(3):
        want_sum, t0 = eager_snapshot(created, events, clock.now, window)
        snap = item.snapshot(window)
        assert snap.sum == want_sum
        span = clock.now - t0
        assert snap.tps == pytest.approx(want_sum / span if span > 0 else 0.0)


def test_send_backs_count_per_origin_topic_and_group_and_dead_letters_apart() -> None:
    clock = Clock()
    stats = BrokerStats("C", clock=clock)
    stats.on_send_back("T", "G", False)
    stats.on_send_back("T", "G", True)
    stats.on_send_back("U", "G", False)
    assert stats.get(SNDBCK_PUT_NUMS, "T@G").value == 2 and stats.get(SNDBCK_PUT_NUMS, "U@G").value == 1
    assert stats.get(DLQ_PUT_NUMS, "T@G").value == 1 and stats.get(DLQ_PUT_NUMS, "U@G") is None
    clock.now += 5.0
    snap = stats.get(SNDBCK_PUT_NUMS, "T@G").snapshot(0)
    assert snap.sum == 2 and snap.avgpt == 1.0 and snap.tps == pytest.approx(2 / 5.0)


# ---------------------------------------------------------------------------------------- live_config

@dataclasses.dataclass
class Part:
    pass


@dataclasses.dataclass
class Target:
    config: BrokerConfig = dataclasses.field(default_factory=BrokerConfig)
    topics: Part = dataclasses.field(default_factory=Part)
    send_processor: Part = dataclasses.field(default_factory=Part)
    retry_processor: Part = dataclasses.field(default_factory=Part)
    transactions: Part = dataclasses.field(default_factory=Part)
    pull_processor: Part = dataclasses.field(default_factory=Part)
    subgroups: Part = dataclasses.field(default_factory=Part)


def test_properties_show_rocketmq_names_and_hide_the_secret() -> None:
    props = config_properties(BrokerConfig(acl_access_key="ak", acl_secret_key="very-secret", flush="sync"))
    assert props["flushDiskType"] == "SYNC_FLUSH" and props["brokerClusterName"] == "DefaultCluster"
    assert props["maxEvaluationsPerPull"] == "4096"  # Sluice's own setting, camelCase
    assert "very-secret" not in "".join(props.values())


def test_update_reaches_the_parts_that_read_the_setting() -> None:
    t = Target()
    changes = apply_update(t, parse_properties("maxReconsumeTimes=4\nautoCreateTopicEnable : false\n"
                                               "transactionCheckMax=2\nmaxTransferCountOnMessageInMemory=7\n"))
    assert changes == {"max_reconsume_times": 4, "auto_create_topic": False, "transaction_check_max": 2,
                       "max_transfer_count": 7}
    assert t.config.max_reconsume_times == 4 and t.subgroups.default_retry_max_times == 4  # type: ignore[attr-defined]
    assert t.topics.auto_create is False and t.transactions.check_max == 2  # type: ignore[attr-defined]
    assert t.pull_processor.config.max_transfer_count == 7  # type: ignore[attr-defined]


def test_update_refusals_change_nothing() -> None:
    t = Target()
    with pytest.raises(NoPermissionError, match="brokerName"):
        apply_update(t, {"brokerName": "x", "maxReconsumeTimes": "2"})
    with pytest.raises(InvalidParameterError, match="nope"):
        apply_update(t, {"nope": "1"})
    with pytest.raises(InvalidParameterError, match="true or false"):
        apply_update(t, {"longPollingEnable": "yes"})
    with pytest.raises(InvalidParameterError, match="max_transfer_count"):
        apply_update(t, {"max_transfer_count": "0"})  # BrokerConfig.validate's own refusal
    assert t.config == BrokerConfig()
    with pytest.raises(InvalidParameterError, match="name=value"):
        parse_properties("just words")


def test_every_live_setting_exists_and_has_a_wire_name() -> None:
    names = {f.name for f in dataclasses.fields(BrokerConfig)}
    assert set(LIVE) <= names
    assert len({wire_name(n) for n in names}) == len(names)


def test_a_live_max_reconsume_times_is_the_retry_limit_of_groups_created_afterwards(tmp_path: Path) -> None:
    from sluice.broker.subgroups import SubscriptionGroupManager
    t = Target(subgroups=SubscriptionGroupManager(tmp_path))  # type: ignore[arg-type]
    before = t.subgroups.require("EarlyGroup")  # type: ignore[attr-defined]
    apply_update(t, parse_properties("maxReconsumeTimes=4\n"))
    assert t.subgroups.require("LateGroup").retry_max_times == 4  # type: ignore[attr-defined]
    assert before.retry_max_times == 16  # a group's own setting is its own (updateSubGroup -r)
