"""The latency fault strategy and which send failures are retried.

RocketMQ: client/src/main/java/org/apache/rocketmq/client/latency/MQFaultStrategy.java and
DefaultMQProducerImpl.sendDefaultImpl.
"""
from __future__ import annotations

import pytest

from sluice.client.fault import (
    LATENCY_TABLES, LatencyFaultTolerance, MQFaultStrategy, is_retriable, not_available_duration,
)
from sluice.client.results import MessageQueue
from sluice.client.routing import TopicPublishInfo
from sluice.errors import (
    BrokerResponseError, MessageIllegalError, NoPermissionError, RemotingError, RemotingTimeoutError,
    ServiceNotAvailableError, TopicNotExistError,
)
from sluice.protocol.bodies import BrokerData, QueueData, TopicRouteData
from sluice.protocol.codes import ResponseCode


@pytest.mark.parametrize(("latency", "expected"), [
    (0, 0), (49, 0), (50, 0), (99, 0), (100, 0), (549, 0), (550, 30000), (999, 30000), (1000, 60000),
    (1999, 60000), (2000, 120000), (3000, 180000), (14999, 180000), (15000, 600000), (10**6, 600000),
])
def test_4_9_table(latency: int, expected: int):
    assert not_available_duration(latency, LATENCY_TABLES["4.9"]) == expected


@pytest.mark.parametrize(("latency", "expected"), [
    (49, 0), (100, 0), (550, 2000), (1799, 2000), (1800, 5000), (3000, 6000), (5000, 10000), (15000, 30000),
])
def test_5_table(latency: int, expected: int):
    assert not_available_duration(latency, LATENCY_TABLES["5"]) == expected


class Clock:
    def __init__(self) -> None:
        self.ms = 1_000_000.0

    def __call__(self) -> float:
        return self.ms


def info(start: int = 0) -> TopicPublishInfo:
    r = TopicRouteData(
        queue_datas=[QueueData(broker_name=n, read_queue_nums=2, write_queue_nums=2, perm=6) for n in ("a", "b")],
        broker_datas=[BrokerData(cluster="C", broker_name=n, broker_addrs={0: f"h:{i}"}) for i, n in enumerate("ab")],
    )
    return TopicPublishInfo("T", r, start_index=start)


def test_isolation_charges_the_table_maximum_and_expires():
    clock = Clock()
    s = MQFaultStrategy(True, "4.9", clock=clock)
    s.update_fault_item("a", 12.0, isolation=True)
    item = s.tolerance.items["a"]
    assert item.current_latency == 12.0 and item.start_timestamp == clock.ms + 600000  # 30000 ms charged: the >= 15000 row
    assert not s.tolerance.is_available("a")
    clock.ms += 600000
    assert s.tolerance.is_available("a")


def test_isolation_charge_of_head_table():
    clock = Clock()
    s = MQFaultStrategy(True, "5", clock=clock)
    s.update_fault_item("a", 1.0, isolation=True)  # 10000 ms charged: the >= 5000 row, 10 s
    assert s.tolerance.items["a"].start_timestamp == clock.ms + 10000


def test_enabled_strategy_skips_unavailable_brokers():
    clock = Clock()
    s = MQFaultStrategy(True, clock=clock)
    s.update_fault_item("a", 600, isolation=False)  # 550 row: 30 s out
    i = info()
    assert {s.select_one_message_queue(i, None).broker_name for _ in range(10)} == {"b"}
    s.update_fault_item("a", 10, isolation=False)  # fast again: available at once
    assert {s.select_one_message_queue(i, None).broker_name for _ in range(10)} == {"a", "b"}


def test_all_brokers_in_fault_pick_one_at_least_with_its_queue_range():
    clock = Clock()
    s = MQFaultStrategy(True, clock=clock)
    s.update_fault_item("a", 600, isolation=False)
    s.update_fault_item("b", 20000, isolation=False)
    for _ in range(10):
        mq = s.select_one_message_queue(info(), None)
        # One item of the better half (size 2 -> half 1): the lower latency, "a".
        assert mq.broker_name == "a" and 0 <= mq.queue_id < 2


def test_pick_one_at_least_drops_a_broker_without_queues():
    clock = Clock()
    s = MQFaultStrategy(True, clock=clock)
    for name in ("a", "b"):
        s.update_fault_item(name, 20000, isolation=False)
    s.tolerance.update("gone", 0.0, 10**9)  # lowest latency, but not in this topic
    s.tolerance.items["gone"].current_latency = -1
    mq = s.select_one_message_queue(info(), None)
    assert "gone" not in s.tolerance.items and mq in info().queues


def test_disabled_strategy_records_nothing_and_avoids_last_broker():
    s = MQFaultStrategy(False)
    s.update_fault_item("a", 99999, isolation=True)
    assert s.tolerance.items == {}
    i = info()
    assert all(s.select_one_message_queue(i, "a").broker_name == "b" for _ in range(10))


def test_pick_one_at_least_single_item():
    t = LatencyFaultTolerance(Clock())
    assert t.pick_one_at_least() is None
    t.update("x", 5, 100)
    assert t.pick_one_at_least() == "x"


@pytest.mark.parametrize("exc", [
    RemotingError("down"), RemotingTimeoutError("slow"), TopicNotExistError("t"), ServiceNotAvailableError("s"),
    NoPermissionError("p"), BrokerResponseError("busy", code=ResponseCode.SYSTEM_BUSY),
    BrokerResponseError("sys", code=ResponseCode.SYSTEM_ERROR), BrokerResponseError("go", code=1500),
    BrokerResponseError("buyer", code=204), BrokerResponseError("unit", code=205),
])
def test_retried_failures(exc: Exception):
    assert is_retriable(exc)


@pytest.mark.parametrize("exc", [
    MessageIllegalError("big"), BrokerResponseError("flush", code=ResponseCode.FLUSH_DISK_TIMEOUT),
    BrokerResponseError("x", code=ResponseCode.INVALID_PARAMETER), ValueError("not ours"),
])
def test_final_failures(exc: Exception):
    assert not is_retriable(exc)


def test_queue_values_hashable_and_equal():
    assert MessageQueue(topic="T", broker_name="a", queue_id=1) == MessageQueue(topic="T", broker_name="a", queue_id=1)
    assert len({MessageQueue(topic="T", broker_name="a", queue_id=1)} | {MessageQueue(topic="T", broker_name="a", queue_id=1)}) == 1
