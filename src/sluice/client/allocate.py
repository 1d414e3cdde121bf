"""Queue allocation strategies for consumer-group rebalance, exactly as RocketMQ allocates.

Each strategy is a pure function of (the consumer's id, every queue, every
consumer id); callers pass both lists sorted, as RebalanceImpl does, so every
member of a group computes the same split independently.
"""
from __future__ import annotations

import bisect
import hashlib
from collections.abc import Callable, Collection, Sequence
from typing import Protocol, TypeVar

from sluice.errors import InvalidParameterError


class QueueLike(Protocol):
    @property
    def topic(self) -> str: ...
    @property
    def broker_name(self) -> str: ...
    @property
    def queue_id(self) -> int: ...


Q = TypeVar("Q", bound=QueueLike)
Strategy = Callable[[str, Sequence[Q], Sequence[str]], list[Q]]


def _check(cid: str, mq_all: Sequence[Q], cid_all: Sequence[str]) -> bool:
    if not cid:
        raise InvalidParameterError("current consumer id is empty")
    # RocketMQ logs and returns nothing when this consumer is not (yet) in the broker's list.
    return bool(mq_all) and cid in cid_all


def averagely(cid: str, mq_all: Sequence[Q], cid_all: Sequence[str]) -> list[Q]:
    """AllocateMessageQueueAveragely (the default): contiguous blocks, the first ``mod`` members one extra."""
    if not _check(cid, mq_all, cid_all):
        return []
    index, n, m = cid_all.index(cid), len(cid_all), len(mq_all)
    mod = m % n
    if m <= n:
        avg = 1
    else:
        avg = m // n + 1 if index < mod else m // n
    start = index * avg if index < mod else index * avg + mod
    count = min(avg, m - start)
    return list(mq_all[start:start + count]) if count > 0 else []


def averagely_by_circle(cid: str, mq_all: Sequence[Q], cid_all: Sequence[str]) -> list[Q]:
    """AllocateMessageQueueAveragelyByCircle: queue i goes to member i % |members|."""
    if not _check(cid, mq_all, cid_all):
        return []
    index, n = cid_all.index(cid), len(cid_all)
    return [mq for i, mq in enumerate(mq_all) if i >= index and i % n == index]


def by_config(queues: Sequence[Q]) -> Strategy:
    """AllocateMessageQueueByConfig: always the configured queues, whatever the group looks like."""
    fixed = list(queues)

    def allocate(cid: str, mq_all: Sequence[Q], cid_all: Sequence[str]) -> list[Q]:
        return list(fixed)
    return allocate


def by_machine_room(consumer_idcs: Collection[str]) -> Strategy:
    """AllocateMessageQueueByMachineRoom: only queues of brokers named ``idc@name`` with idc in the set,
    split in equal blocks, the remainder dealt one each to the first members."""
    idcs = set(consumer_idcs)

    def allocate(cid: str, mq_all: Sequence[Q], cid_all: Sequence[str]) -> list[Q]:
        if not _check(cid, mq_all, cid_all):
            return []
        index, n = cid_all.index(cid), len(cid_all)
        pre = [mq for mq in mq_all if len(p := mq.broker_name.split("@")) == 2 and p[0] in idcs]
        mod, rem = divmod(len(pre), n)
        out = list(pre[mod * index: mod * index + mod])
        if rem > index:
            out.append(pre[index + mod * n])
        return out
    return allocate


def machine_room_nearby(
    delegate: Strategy, broker_room: Callable[[QueueLike], str], consumer_room: Callable[[str], str],
) -> Strategy:
    """AllocateMachineRoomNearby: a member first takes (through ``delegate``) the queues of its own room;
    queues of rooms with no live member are shared by all members."""

    def allocate(cid: str, mq_all: Sequence[Q], cid_all: Sequence[str]) -> list[Q]:
        if not _check(cid, mq_all, cid_all):
            return []
        mr2mq: dict[str, list[Q]] = {}
        for mq in mq_all:
            room = broker_room(mq)
            if not room:
                raise InvalidParameterError(f"broker {mq.broker_name!r} has no machine room")
            mr2mq.setdefault(room, []).append(mq)
        mr2c: dict[str, list[str]] = {}
        for c in cid_all:
            room = consumer_room(c)
            if not room:
                raise InvalidParameterError(f"consumer {c!r} has no machine room")
            mr2c.setdefault(room, []).append(c)
        out: list[Q] = []
        mine = consumer_room(cid)
        here = mr2mq.pop(mine, None)
        if here:
            out.extend(delegate(cid, here, mr2c.get(mine, [])))
        for room in sorted(mr2mq):  # RocketMQ iterates a TreeMap
            if room not in mr2c:
                out.extend(delegate(cid, mr2mq[room], cid_all))
        return out
    return allocate


def _md5_hash(key: str) -> int:
    """ConsistentHashRouter.MD5Hash: the first 4 digest bytes, big-endian, unsigned."""
    return int.from_bytes(hashlib.md5(key.encode()).digest()[:4], "big")


def queue_string(mq: QueueLike) -> str:
    """MessageQueue.toString(), the key a queue is hashed by."""
    return f"MessageQueue [topic={mq.topic}, brokerName={mq.broker_name}, queueId={mq.queue_id}]"


def consistent_hash(virtual_nodes: int = 10) -> Strategy:
    """AllocateMessageQueueConsistentHash: a ring of ``virtual_nodes`` points per member
    (``cid-i``, MD5); each queue goes to the first point at or after its hash, wrapping."""
    if virtual_nodes < 0:
        raise InvalidParameterError("virtual_nodes must be >= 0")

    def allocate(cid: str, mq_all: Sequence[Q], cid_all: Sequence[str]) -> list[Q]:
        if not _check(cid, mq_all, cid_all):
            return []
        ring: dict[int, str] = {}
        for c in cid_all:
            for i in range(virtual_nodes):
                ring[_md5_hash(f"{c}-{i}")] = c  # a later node with the same hash replaces the earlier
        if not ring:
            return []
        points = sorted(ring)
        out = []
        for mq in mq_all:
            h = _md5_hash(queue_string(mq))
            i = bisect.bisect_left(points, h)
            if ring[points[i if i < len(points) else 0]] == cid:
                out.append(mq)
        return out
    return allocate


#: Names as RocketMQ's strategies report them (getName()).
STRATEGIES: dict[str, Strategy] = {
    "AVG": averagely,
    "AVG_BY_CIRCLE": averagely_by_circle,
    "CONSISTENT_HASH": consistent_hash(),
}
