"""A queue's start (Rebalancer._take / start_offset) against a scripted broker: what is asked, in which order,
and what the consumer is told, with no server (the broker calls are fakes that record and wait on gates)."""
from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest

from sluice.client.offset_store import RemoteBrokerOffsetStore
from sluice.client.push_options import PushConsumerOptions
from sluice.client.rebalance import Rebalancer
from sluice.client.results import MessageQueue
from sluice.errors import SluiceError

MQ = MessageQueue(topic="T", broker_name="b", queue_id=0)
RETRY = MessageQueue(topic="%RETRY%G", broker_name="b", queue_id=0)


@dataclass
class Broker:
    """QUERY_CONSUMER_OFFSET, GET_MIN/MAX_OFFSET, SEARCH_OFFSET and UPDATE_CONSUMER_OFFSET, each answered when
    its gate opens; ``log`` records ("ask"/"done", call) in order."""

    committed: int = -1
    min: int = 5
    max: int = 90
    fail: set[str] = field(default_factory=set)
    log: list[tuple[str, str]] = field(default_factory=list)
    gates: dict[str, asyncio.Event] = field(default_factory=dict)
    commits: list[int] = field(default_factory=list)

    def gate(self, name: str) -> asyncio.Event:
        return self.gates.setdefault(name, asyncio.Event())

    async def call(self, name: str, value: int) -> int:
        self.log.append(("ask", name))
        try:
            await self.gate(name).wait()
        except asyncio.CancelledError:
            self.log.append(("cancelled", name))
            raise
        self.log.append(("done", name))
        if name in self.fail:
            raise SluiceError(f"{name} failed")
        return value

    async def query(self, mq: MessageQueue) -> int:
        return await self.call("query", self.committed)

    async def commit(self, mq: MessageQueue, offset: int) -> None:
        await self.call("commit", offset)
        self.commits.append(offset)

    async def min_offset(self, addr: str, mq: MessageQueue, timeout: float) -> int:
        return await self.call("min", self.min)

    async def max_offset(self, addr: str, mq: MessageQueue, timeout: float) -> int:
        return await self.call("max", self.max)

    async def search_offset(self, addr: str, mq: MessageQueue, ts: int, timeout: float) -> int:
        return await self.call("search", 42)


class Consumer:
    """The parts of a push consumer the rebalancer uses (push_view.PushConsumerView)."""

    def __init__(self, broker: Broker, where: str = "CONSUME_FROM_FIRST_OFFSET") -> None:
        self.group = "G"
        self.options = PushConsumerOptions(consume_from_where=where)
        self.orderly = False
        self.running = True
        self.consume_timestamp_ms = 0
        self.offset_store = RemoteBrokerOffsetStore(broker.query, broker.commit)

        async def broker_addr_for(topic: str, name: str, *, master_only: bool = True) -> str:
            return "addr"
        self.instance: Any = SimpleNamespace(api=broker, broker_addr_for=broker_addr_for, client_id="me")
        self.started: list[tuple[MessageQueue, int, list[tuple[str, str]]]] = []
        self.broker = broker
        self.rebalancer = Rebalancer(self)  # type: ignore[arg-type]

    def start_pulling(self, mq: MessageQueue, pq: Any, offset: int) -> None:
        """As the push consumer: a pull task, whose first request goes out when the task first runs."""
        async def pull() -> None:
            self.started.append((mq, offset, list(self.broker.log)))
        asyncio.get_running_loop().create_task(pull())


async def settle() -> None:
    for _ in range(10):
        await asyncio.sleep(0)


def test_a_new_group_asks_its_start_beside_the_committed_offset_and_pulls_before_the_commit_is_answered():
    async def main() -> None:
        b = Broker()
        c = Consumer(b)
        take = asyncio.ensure_future(c.rebalancer._take(MQ))
        await settle()
        assert sorted(b.log) == [("ask", "min"), ("ask", "query")]  # both asked before either is answered
        b.gate("query").set()
        await settle()
        assert not c.started  # the start offset is not known yet
        b.gate("min").set()
        assert await take is True
        await settle()
        (mq, offset, seen), = c.started
        assert (mq, offset) == (MQ, 5)
        # the commit goes out before the first pull, which does not wait for its answer
        assert seen[-1] == ("ask", "commit") and ("done", "commit") not in seen
        assert c.offset_store.read_memory(MQ) == 5 and MQ in c.rebalancer.process_queues
        done = asyncio.ensure_future(c.rebalancer.cancel_pending())  # a shutdown waits for the start commit
        await settle()
        assert not done.done()
        b.gate("commit").set()
        await done
        assert b.commits == [5] and MQ not in c.offset_store.dirty

    asyncio.run(main())


def test_a_committed_offset_wins_and_the_start_asked_beside_it_is_dropped_even_when_it_fails():
    async def main() -> None:
        b = Broker(committed=17, fail={"min"})
        c = Consumer(b)
        take = asyncio.ensure_future(c.rebalancer._take(MQ))
        await settle()
        b.gate("query").set()
        assert await take is True
        await settle()
        assert [(mq, off) for mq, off, _ in c.started] == [(MQ, 17)]
        assert ("cancelled", "min") in b.log and ("done", "min") not in b.log and not b.commits and ("ask", "commit") not in b.log

    asyncio.run(main())


@pytest.mark.parametrize("where,name,expected", [("CONSUME_FROM_LAST_OFFSET", "max", 90),
                                                 ("CONSUME_FROM_TIMESTAMP", "search", 42)])
def test_other_starts_are_asked_only_when_the_group_has_no_committed_offset(where: str, name: str,
                                                                            expected: int) -> None:
    async def main() -> None:
        b = Broker()
        c = Consumer(b, where)
        for g in ("query", name, "commit"):
            b.gate(g).set()
        assert await c.rebalancer.compute_pull_from_where(MQ) == expected
        # compute_pull_from_where (the lite pull consumer's) returns once the start is committed
        assert b.log == [("ask", "query"), ("done", "query"), ("ask", name), ("done", name), ("ask", "commit"),
                         ("done", "commit")]
        assert b.commits == [expected]

    asyncio.run(main())


def test_a_retry_topic_starts_at_zero_without_asking_the_broker_where():
    async def main() -> None:
        b = Broker()
        c = Consumer(b)
        for g in ("query", "commit"):
            b.gate(g).set()
        assert await c.rebalancer.start_offset(RETRY) == (0, True)
        assert b.log == [("ask", "query"), ("done", "query")]

    asyncio.run(main())


def test_a_failed_start_offset_leaves_the_queue_untaken_and_a_failed_commit_dirty():
    async def main() -> None:
        b = Broker(fail={"min"})
        c = Consumer(b)
        for g in ("query", "min"):
            b.gate(g).set()
        assert await c.rebalancer._take(MQ) is True
        assert not c.started and MQ not in c.rebalancer.process_queues

        b2 = Broker(fail={"commit"})
        c2 = Consumer(b2)
        for g in ("query", "min", "commit"):
            b2.gate(g).set()
        assert await c2.rebalancer._take(MQ) is True
        await c2.rebalancer.cancel_pending()
        await settle()
        assert [(mq, off) for mq, off, _ in c2.started] == [(MQ, 5)]
        assert MQ in c2.offset_store.dirty  # the periodic persist commits it again

    asyncio.run(main())
