"""HoldService wakes held pulls in bounded slices per event-loop iteration (``wakes_per_turn``): a burst that
matches many held pulls never wakes them all in one iteration, and the loop polls its sockets between slices
(a readable socket's callback runs before the last slice). Counted in loop iterations, not timed."""
from __future__ import annotations

import asyncio
import socket

import pytest

from sluice.broker.longpoll import TIMED_OUT, HoldService

N = 1000
BUDGET = 64


async def _held(hold: HoldService, n: int, queues: int = 1) -> list[asyncio.Task[int]]:
    tasks = [asyncio.create_task(hold.hold("T", i % queues, 0, None, 600, owner=i % 7)) for i in range(n)]
    for _ in range(1000):
        if hold.held_count == n:
            break
        await asyncio.sleep(0)
    assert hold.held_count == n
    return tasks


@pytest.mark.parametrize("how", ["arrival", "check"])
def test_a_burst_is_woken_in_slices_of_the_budget(how: str) -> None:
    async def main() -> None:
        top = [0]
        hold = HoldService(lambda t, q: top[0], check_interval_s=600, max_per_owner=N, max_total=N,
                           wakes_per_turn=BUDGET)
        hold.start()
        tasks = await _held(hold, N, queues=10)
        if how == "arrival":
            hold._arrived({("T", q): [(0, 0, {})] for q in range(10)}, 55)
        else:
            top[0] = 1
            hold.check_now()
        woken = [sum(1 for t in tasks if not _waiting(t))]
        while not all(t.done() for t in tasks):
            await asyncio.sleep(0)  # one loop iteration
            woken.append(sum(1 for t in tasks if not _waiting(t)))
        steps = [b - a for a, b in zip(woken, woken[1:])]
        assert max(steps) <= BUDGET and sum(steps) + woken[0] == N
        assert len(steps) >= N // BUDGET
        assert set(await asyncio.gather(*tasks)) == {55 if how == "arrival" else 0}
        assert hold.held_count == 0 and hold.waking == 0 and not hold._held
        assert hold.wake_turns_deferred >= N // BUDGET - 1
        await hold.stop()
    asyncio.run(main())


def _waiting(task: asyncio.Task[int]) -> bool:
    """The held pull still waits on its future (not woken yet)."""
    fut = task._fut_waiter  # type: ignore[attr-defined]
    return fut is not None and not fut.done() and not task.done()


def test_sockets_are_polled_between_slices() -> None:
    async def main() -> tuple[int, int]:
        hold = HoldService(lambda t, q: 0, check_interval_s=600, max_per_owner=N, max_total=N,
                           wakes_per_turn=BUDGET)
        hold.start()
        tasks = await _held(hold, N)
        a, b = socket.socketpair()
        a.setblocking(False)
        b.setblocking(False)
        loop = asyncio.get_running_loop()
        seen: list[int] = []
        loop.add_reader(a, lambda: (seen.append(N - hold.waking), a.recv(16)))
        b.send(b"x")  # a request from another client, readable from now on
        hold._arrived({("T", 0): [(0, 0, {})]}, 9)
        await asyncio.gather(*tasks)
        loop.remove_reader(a)
        a.close()
        b.close()
        await hold.stop()
        return seen[0], len(seen)
    woken_when_read, reads = asyncio.run(main())
    assert reads == 1 and woken_when_read < N  # read while pulls were still waiting for their slice


def test_a_queued_pull_whose_connection_closed_costs_no_budget() -> None:
    async def main() -> None:
        hold = HoldService(lambda t, q: 0, check_interval_s=600, max_per_owner=N, max_total=N, wakes_per_turn=2)
        hold.start()
        tasks = await _held(hold, 6)
        hold._arrived({("T", 0): [(0, 0, {})]}, 3)  # wakes 2, queues 4
        assert hold.waking == 4
        for t in tasks[2:5]:  # three queued ones go (their connection closed)
            t.cancel()
        assert await asyncio.gather(*tasks[:2]) == [3, 3]
        assert await tasks[5] == 3
        assert hold.waking == 0 and hold.held_count == 0
        await hold.stop()
    asyncio.run(main())


def test_stop_answers_queued_pulls_at_once() -> None:
    async def main() -> None:
        hold = HoldService(lambda t, q: 0, check_interval_s=600, max_per_owner=N, max_total=N, wakes_per_turn=1)
        hold.start()
        tasks = await _held(hold, 5, queues=2)
        hold._arrived({("T", 0): [(0, 0, {})]}, 4)  # queue 0's three: one woken, two queued
        await hold.stop()  # queue 1's two: TIMED_OUT; the queued ones: their wake value
        assert sorted(await asyncio.gather(*tasks)) == [TIMED_OUT, TIMED_OUT, 4, 4, 4]
    asyncio.run(main())


def test_the_budget_must_be_positive() -> None:
    with pytest.raises(ValueError):
        HoldService(lambda t, q: 0, wakes_per_turn=0)


def test_the_broker_setting(make_broker) -> None:  # type: ignore[no-untyped-def]
    from sluice.broker.config import BrokerConfig
    from sluice.errors import InvalidParameterError
    assert BrokerConfig().max_held_pull_wakes_per_turn == 256
    with pytest.raises(InvalidParameterError, match="max_held_pull_wakes_per_turn"):
        BrokerConfig(max_held_pull_wakes_per_turn=0).validate()
    b = make_broker(max_held_pull_wakes_per_turn=3)
    assert b.broker.hold.wakes_per_turn == 3 and b.broker.runtime_info()["pullWakesDeferred"] == 0
