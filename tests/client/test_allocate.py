"""Allocation strategies: RocketMQ's splits, one owner per queue, and every member agreeing."""
from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given, strategies as st

from sluice.client import allocate as A


@dataclass(frozen=True, order=True)
class MQ:
    topic: str
    broker_name: str
    queue_id: int


def queues(n, broker="b"):
    return [MQ("T", broker, i) for i in range(n)]


def split(strategy, mqs, cids):
    return {c: strategy(c, mqs, cids) for c in cids}


def test_averagely_matches_rocketmq_blocks():
    cids = ["c0", "c1", "c2"]
    got = split(A.averagely, queues(8), cids)
    assert [[q.queue_id for q in got[c]] for c in cids] == [[0, 1, 2], [3, 4, 5], [6, 7]]
    got = split(A.averagely, queues(2), cids)
    assert [[q.queue_id for q in got[c]] for c in cids] == [[0], [1], []]


def test_by_circle():
    got = split(A.averagely_by_circle, queues(8), ["c0", "c1", "c2"])
    assert [q.queue_id for q in got["c1"]] == [1, 4, 7]


def test_unknown_consumer_gets_nothing():
    assert A.averagely("x", queues(4), ["a", "b"]) == []


def test_machine_room():
    mqs = [MQ("T", f"{room}@b{i}", q) for room in ("hz", "sh") for i in range(2) for q in range(2)]
    strat = A.by_machine_room({"hz"})
    got = split(strat, sorted(mqs), ["c0", "c1", "c2"])
    owned = [q for c in got for q in got[c]]
    assert sorted(owned) == sorted(q for q in mqs if q.broker_name.startswith("hz@"))
    assert len(owned) == len(set(owned))


def test_machine_room_nearby_shares_rooms_without_consumers():
    mqs = sorted(MQ("T", f"{room}@b", q) for room in ("hz", "sh", "bj") for q in range(3))
    cids = ["hz@c0", "hz@c1", "sh@c2"]
    strat = A.machine_room_nearby(A.averagely, lambda mq: mq.broker_name.split("@")[0], lambda c: c.split("@")[0])
    got = split(strat, mqs, cids)
    assert all(q.broker_name.startswith(("sh", "bj")) for q in got["sh@c2"])
    assert {q.broker_name for q in got["hz@c0"] + got["hz@c1"]} >= {"hz@b"}
    owned = [q for c in cids for q in got[c]]
    assert sorted(owned) == mqs  # bj has no consumer: shared by all, still one owner each


def test_consistent_hash_known_key_and_stability():
    assert A.queue_string(MQ("T", "b", 3)) == "MessageQueue [topic=T, brokerName=b, queueId=3]"
    strat = A.consistent_hash()
    mqs = queues(16)
    before = split(strat, mqs, ["c0", "c1", "c2"])
    after = split(strat, mqs, ["c0", "c1", "c2", "c3"])
    # Adding a member only moves queues to the new member.
    for c in ("c0", "c1", "c2"):
        assert set(after[c]) <= set(before[c])


@pytest.mark.parametrize("strategy", [A.averagely, A.averagely_by_circle, A.consistent_hash(), A.consistent_hash(1)])
@given(n_q=st.integers(0, 40), cids=st.lists(st.text("abcdef0123", min_size=1, max_size=6), min_size=1, max_size=12, unique=True))
def test_every_queue_has_exactly_one_owner(strategy, n_q, cids):
    cids = sorted(cids)
    mqs = queues(n_q)
    owned = [q for c in cids for q in strategy(c, mqs, cids)]
    assert sorted(owned) == mqs
