"""Client instance sharing and reference counting (no server needed: nothing is sent before a route is used)."""
from __future__ import annotations

import asyncio

import pytest

from sluice.client import AsyncProducer, AsyncPullConsumer, ClientInstance
from sluice.errors import ClientError


def test_one_instance_per_loop_and_namesrv_set_released_by_the_last_user():
    async def main() -> None:
        p1 = AsyncProducer("P1", "127.0.0.1:1;127.0.0.1:2")
        p2 = AsyncProducer("P2", ["127.0.0.1:1", "127.0.0.1:2"])
        c = AsyncPullConsumer("C", "127.0.0.1:1;127.0.0.1:2")
        other = AsyncProducer("P1", "127.0.0.1:1;127.0.0.1:2", instance_name="other")
        for x in (p1, p2, c, other):
            await x.start()
        inst = p1.instance
        assert p2.instance is inst and c.instance is inst and other.instance is not inst
        assert set(inst.producers) == {"P1", "P2"} and set(inst.consumers) == {"C"}
        assert inst.heartbeat_data().client_id == inst.client_id
        with pytest.raises(ClientError, match="already started in this client instance"):
            await AsyncProducer("P1", "127.0.0.1:1;127.0.0.1:2").start()
        await p1.shutdown()
        await c.shutdown()
        assert not inst.closed and set(inst.producers) == {"P2"}
        await p2.shutdown()
        assert inst.closed and not inst._tasks
        await other.shutdown()
        with pytest.raises(ClientError, match="not started"):
            p1.instance  # noqa: B018

    asyncio.run(main())


def test_a_new_loop_gets_a_new_instance():
    seen = []

    async def main() -> None:
        p = AsyncProducer("P", "127.0.0.1:1")
        await p.start()
        seen.append(p.instance)
        await p.shutdown()

    asyncio.run(main())
    asyncio.run(main())
    assert seen[0] is not seen[1] and all(i.closed for i in seen)
    assert not any(i in ClientInstance._registry.values() for i in seen)


def test_a_heartbeat_joins_one_on_its_way_with_the_same_data_and_only_that():
    """A starting consumer's heartbeat and the one a new broker's route spawns are one request; a heartbeat
    whose data changed meanwhile, or asked for after the first was answered, is sent."""
    from sluice.errors import SluiceError
    from sluice.protocol.bodies import HeartbeatData

    async def settle() -> None:
        for _ in range(5):
            await asyncio.sleep(0)

    async def main() -> None:
        p = AsyncProducer("P1", "127.0.0.1:1")
        await p.start()
        inst = p.instance
        sent: list[tuple[str, HeartbeatData]] = []
        gate = asyncio.Event()
        fail = [False]

        async def heartbeat(addr: str, data: HeartbeatData, timeout: float) -> None:
            sent.append((addr, data))
            await gate.wait()
            if fail[0]:
                raise SluiceError("refused")

        inst.api.heartbeat = heartbeat  # type: ignore[method-assign]
        first = asyncio.ensure_future(inst.send_heartbeat(["b:1", "b:2"]))
        await settle()
        joined = asyncio.ensure_future(inst.send_heartbeat(["b:1"]))
        await settle()
        assert [a for a, _ in sent] == ["b:1", "b:2"]
        inst.register_producer("P2", object())  # the data changed: this one is sent
        changed = asyncio.ensure_future(inst.send_heartbeat(["b:1"]))
        await settle()
        assert [a for a, _ in sent] == ["b:1", "b:2", "b:1"]
        assert {g.group_name for g in sent[-1][1].producer_data_set} == {"P1", "P2"}
        joined.cancel()  # a joiner giving up does not cancel the heartbeat it joined
        await settle()
        assert not first.done()
        fail[0] = True  # failures are logged, never raised to the joiners
        gate.set()
        await asyncio.gather(first, changed)
        assert not inst._heartbeats
        gate.clear()
        fail[0] = False
        again = asyncio.ensure_future(inst.send_heartbeat(["b:1"]))  # the last one was answered: sent anew
        await settle()
        assert [a for a, _ in sent] == ["b:1", "b:2", "b:1", "b:1"]
        gate.set()
        await again
        inst.producers.pop("P2")
        await p.shutdown()

    asyncio.run(main())


def test_an_instance_and_its_services_are_freed_once_no_client_holds_it():
    """Each per-instance service (rebalance, class filters, transaction checks, replies) holds its instance;
    kept in module-level weak-key tables they kept every instance alive, so each consumer started and shut
    down leaked one (found 2026-11-29: one ClientInstance more per cycle). They now live on the instance."""
    import gc
    import weakref

    from sluice.client.class_filter import ClassFilters
    from sluice.client.rebalance import RebalanceService
    from sluice.client.reply import ReplyWaiters
    from sluice.client.transaction import _CheckService

    async def main() -> weakref.ref[ClientInstance]:
        c = AsyncPullConsumer("C", "127.0.0.1:1")
        await c.start()
        inst = c.instance
        services = [kind.of(inst) for kind in (RebalanceService, ClassFilters, _CheckService, ReplyWaiters)]
        assert [kind.of(inst) for kind in (RebalanceService, ClassFilters, _CheckService, ReplyWaiters)] == services
        await c.shutdown()
        assert inst.closed
        return weakref.ref(inst)

    gone = asyncio.run(main())
    gc.collect()
    assert gone() is None
