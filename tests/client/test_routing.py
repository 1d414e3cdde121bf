"""Queue lists from routes, round-robin choice, ordered-send selectors."""
from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sluice.client.results import MessageQueue
from sluice.client.routing import (
    TopicPublishInfo, default_topic_route, java_hash_code, publish_queues, select_by_hash, subscribe_queues,
)
from sluice.message import Message
from sluice.protocol.bodies import BrokerData, QueueData, TopicRouteData


def route(*brokers: tuple[str, int, int, int], masterless: tuple[str, ...] = ()) -> TopicRouteData:
    """brokers: (name, read queues, write queues, perm)."""
    return TopicRouteData(
        queue_datas=[QueueData(broker_name=n, read_queue_nums=r, write_queue_nums=w, perm=p) for n, r, w, p in brokers],
        broker_datas=[BrokerData(cluster="C", broker_name=n, broker_addrs={1: "127.0.0.1:2"} if n in masterless
                                 else {0: f"127.0.0.1:{10 + i}"}) for i, (n, *_rest) in enumerate(brokers)],
    )


def mq(b: str, q: int, topic: str = "T") -> MessageQueue:
    return MessageQueue(topic=topic, broker_name=b, queue_id=q)


def test_publish_queues_sorted_by_broker_writable_with_master_only():
    r = route(("b", 4, 2, 6), ("a", 4, 3, 6), ("ro", 4, 4, 4), ("slave", 4, 4, 6), masterless=("slave",))
    assert publish_queues("T", r) == [mq("a", 0), mq("a", 1), mq("a", 2), mq("b", 0), mq("b", 1)]


def test_publish_queues_of_an_ordered_topic_follow_its_conf():
    r = TopicRouteData(order_topic_conf="b:2;a:1")
    assert publish_queues("T", r) == [mq("b", 0), mq("b", 1), mq("a", 0)]


def test_subscribe_queues_readable_sorted():
    r = route(("b", 2, 4, 6), ("a", 1, 4, 6), ("wo", 3, 3, 2))
    assert subscribe_queues("T", r) == [mq("a", 0), mq("b", 0), mq("b", 1)]


def test_default_topic_route_caps_queue_counts():
    r = default_topic_route(route(("a", 8, 8, 7), ("b", 2, 8, 7)), 4)
    assert [(q.read_queue_nums, q.write_queue_nums) for q in r.queue_datas] == [(4, 4), (2, 2)]


def test_round_robin_covers_every_queue_evenly():
    info = TopicPublishInfo("T", route(("a", 4, 4, 6), ("b", 4, 4, 6)), start_index=5)
    picks = Counter(info.select_one() for _ in range(80))
    assert set(picks) == set(info.queues) and set(picks.values()) == {10}


def test_retry_avoids_the_broker_that_failed():
    info = TopicPublishInfo("T", route(("a", 4, 4, 6), ("b", 4, 4, 6)), start_index=0)
    for _ in range(20):
        assert info.select_one("a").broker_name == "b"
        assert info.select_one("b").broker_name == "a"


def test_retry_with_a_single_broker_falls_back_to_it():
    info = TopicPublishInfo("T", route(("a", 4, 4, 6)), start_index=0)
    assert info.select_one("a").broker_name == "a"


def test_write_queue_nums():
    info = TopicPublishInfo("T", route(("a", 4, 3, 6)))
    assert info.write_queue_nums("a") == 3 and info.write_queue_nums("zz") == -1


def test_java_hash_code_matches_java():
    assert java_hash_code("abc") == 96354
    assert java_hash_code("hello world") == 1794106052
    assert java_hash_code(42) == 42 and java_hash_code(-7) == -7
    assert java_hash_code(2**40 + 3) == ((2**40 + 3) ^ ((2**40 + 3) >> 32)) & 0xFFFFFFFF
    assert java_hash_code(-1 << 40) == -256  # Long.hashCode(-1L << 40) == 0xFFFFFF00
    assert java_hash_code(True) == 1231


def test_select_by_hash_is_java_rule_and_stable():
    queues = [mq("a", i) for i in range(4)] + [mq("b", i) for i in range(4)]
    # "Aa".hashCode() == 2112; -2112 style negatives use abs(h % n) as Java does.
    assert select_by_hash(queues, Message("T", b"x"), "Aa") == queues[2112 % 8]
    assert select_by_hash(queues, Message("T", b"x"), -9) == queues[9 % 8]


@given(st.text(max_size=30), st.integers(min_value=1, max_value=64))
def test_select_by_hash_always_a_listed_queue_and_deterministic(key: str, n: int):
    queues = [mq("a", i) for i in range(n)]
    first = select_by_hash(queues, Message("T", b"x"), key)
    assert first in queues and select_by_hash(list(queues), Message("T", b"y"), key) == first


@pytest.mark.parametrize("start", [0, 1, 2**31 - 1])
def test_select_one_never_fails_for_any_start(start: int):
    info = TopicPublishInfo("T", route(("a", 1, 1, 6), ("b", 1, 1, 6)), start_index=start)
    assert info.select_one("a") == mq("b", 0)
