"""HoldService: dispatch_batch (columnar dispatch) wakes exactly the held pulls dispatch(requests) wakes; held
pulls are released in O(1) each (operation counts, not timings) and bounded per connection and in all."""
from __future__ import annotations

import asyncio

import pytest

from sluice.broker import longpoll
from sluice.broker.filtering import SelectorFilter
from sluice.broker.longpoll import FULL, TIMED_OUT, HoldService
from sluice.filter import compile_selector
from sluice.protocol import properties as P
from sluice.store.dispatch_columns import DispatchBatch, PutRun


def _run(topic: str, qid: int, first_qoff: int, phys0: int, tags: list[str | None], colors: list[str]) -> PutRun:
    props = [P.encode_properties({**({P.TAGS: t} if t else {}), "color": c}) for t, c in zip(tags, colors)]
    n = len(tags)
    return PutRun(topic, qid, [100] * n, [0] * n, props, tags, [None] * n, [None] * n,
                  phys=[phys0 + 100 * i for i in range(n)], qoffs=list(range(first_qoff, first_qoff + n)),
                  store_timestamp=1)


def _outcomes(columnar: bool) -> list[int]:
    async def main() -> list[int]:
        hold = HoldService(lambda t, q: 0, check_interval_s=60)
        hold.start()
        filters = [None, SelectorFilter(compile_selector("TAG", "TagB")),
                   SelectorFilter(compile_selector("SQL92", "color = 'red'")),
                   SelectorFilter(compile_selector("TAG", "TagZ")), None]
        keys = [("T", 0), ("T", 0), ("T", 1), ("T", 1), ("Other", 0)]
        offsets = [5, 0, 0, 0, 0]
        tasks = [asyncio.create_task(hold.hold(t, q, off, f, 0.5))
                 for (t, q), off, f in zip(keys, offsets, filters)]
        await asyncio.sleep(0.01)
        batch = DispatchBatch([_run("T", 0, 0, 0, ["TagA", "TagB"], ["red", "blue"]),
                               _run("T", 1, 0, 200, [None, "TagA"], ["blue", "red"])])
        fn = hold.dispatch_batch if columnar else (lambda b: hold.dispatch(b.requests()))
        await asyncio.to_thread(fn, batch)
        out = await asyncio.gather(*tasks)
        await hold.stop()
        return out
    return asyncio.run(main())


def test_dispatch_batch_matches_request_dispatch():
    got = _outcomes(columnar=True)
    # queue offset 5 not reached; TagB present; a red message on queue 1; no TagZ; nothing for Other
    assert got == [TIMED_OUT, 400, 400, TIMED_OUT, TIMED_OUT]
    assert got == _outcomes(columnar=False)


def test_dispatch_batch_without_held_pulls_builds_no_requests():
    hold = HoldService(lambda t, q: 0)
    batch = DispatchBatch([_run("T", 0, 0, 0, ["TagA"], ["red"])])
    hold.dispatch_batch(batch)
    assert not batch.materialised


# ---- releasing many held pulls: O(1) each --------------------------------------------------------------

N = 20_000


class _CountingDict(dict):
    """The held-pull table, counting whole-table walks (a rebuilt snapshot of every held queue is one)."""
    walks = 0

    def __iter__(self):
        type(self).walks += 1
        return super().__iter__()

    def keys(self):
        type(self).walks += 1
        return super().keys()

    def items(self):
        type(self).walks += 1
        return super().items()

    def values(self):
        type(self).walks += 1
        return super().values()


class _CountingHeld(longpoll._Held):
    """A held pull counting the comparisons made to find it (a list's remove compares with each one before)."""
    __slots__ = ()
    compares = 0

    def __eq__(self, other: object) -> bool:
        type(self).compares += 1
        return self is other

    __hash__ = object.__hash__


@pytest.fixture
def counting(monkeypatch):
    monkeypatch.setattr(longpoll, "_Held", _CountingHeld)
    _CountingHeld.compares = 0
    _CountingDict.walks = 0


async def _hold_many(hold: HoldService, keys: list[tuple[str, int]]) -> list[asyncio.Task[int]]:
    tasks = [asyncio.create_task(hold.hold(t, q, 0, None, 600)) for t, q in keys]
    for _ in range(1000):
        if hold.held_count == len(keys):
            break
        await asyncio.sleep(0.01)
    assert hold.held_count == len(keys) and hold.refused_full == 0
    return tasks


def test_releasing_pulls_held_on_many_queues_never_walks_the_table(counting):
    async def main() -> None:
        hold = HoldService(lambda t, q: 0, check_interval_s=600, max_per_owner=N, max_total=N)
        hold._held = _CountingDict()
        hold.start()
        keys = [("T", q) for q in range(N)]
        tasks = await _hold_many(hold, keys)
        hold._arrived({k: [(0, 0, {})] for k in keys}, 123)
        assert set(await asyncio.gather(*tasks)) == {123}
        assert hold.woken_by_arrival == N and hold.removals == N and hold.held_count == 0
        assert not hold._held and not hold._per_owner
        await hold.stop()
    asyncio.run(main())
    assert _CountingDict.walks <= 2  # stop(); no walk per hold or per release
    assert _CountingHeld.compares == 0


def test_pulls_of_one_queue_released_in_any_order_cost_one_step_each(counting):
    async def main() -> None:
        hold = HoldService(lambda t, q: 0, check_interval_s=600, max_per_owner=N, max_total=N)
        hold.start()
        tasks = await _hold_many(hold, [("T", 0)] * N)
        for t in reversed(tasks):  # as a closing connection cancels them, newest first: a list's worst case
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        assert hold.removals == N and hold.held_count == 0 and not hold._held
        tasks = await _hold_many(hold, [("T", 0)] * N)
        hold._arrived({("T", 0): [(0, 0, {})]}, 7)
        assert set(await asyncio.gather(*tasks)) == {7}
        assert hold.removals == 2 * N and not hold._held
        await hold.stop()
    asyncio.run(main())
    assert _CountingHeld.compares <= N  # a list's remove would make ~N*N/2


def test_limits_per_owner_and_in_all():
    async def main() -> None:
        hold = HoldService(lambda t, q: 0, check_interval_s=600, max_per_owner=3, max_total=5)
        hold.start()
        a = [asyncio.create_task(hold.hold("T", 0, 0, None, 600, "A")) for _ in range(3)]
        await asyncio.sleep(0.01)
        assert await hold.hold("T", 0, 0, None, 600, "A") == FULL  # A's 4th
        b = [asyncio.create_task(hold.hold("T", 1, 0, None, 600, "B")) for _ in range(2)]
        await asyncio.sleep(0.01)
        assert hold.held_count == 5 and hold.held_by("A") == 3 and hold.held_by("B") == 2
        assert await hold.hold("T", 1, 0, None, 600, "B") == FULL  # 5 in all
        assert await hold.hold("T", 1, 0, None, 600, "C") == FULL
        assert hold.refused_full == 3
        a[0].cancel()
        await asyncio.gather(a[0], return_exceptions=True)
        c = asyncio.create_task(hold.hold("T", 1, 0, None, 600, "C"))
        await asyncio.sleep(0.01)
        assert hold.held_by("C") == 1 and hold.held_count == 5
        hold._arrived({("T", 0): [(0, 0, {})], ("T", 1): [(0, 0, {})]}, 9)
        assert await asyncio.gather(*a[1:], *b, c) == [9] * 5
        assert hold.held_count == 0 and hold._per_owner == {}
        await hold.stop()
    asyncio.run(main())


def test_dispatch_on_the_loop_wakes_the_held_pull_before_returning() -> None:
    """The broker dispatches on its event loop right after its appends: the matching held pull is woken
    there and then (its future is done when dispatch returns; no hand-over through the loop's self-pipe
    and no loop iteration first), and a non-matching arrival leaves it held. From another thread the
    wake-up still goes through call_soon_threadsafe."""
    async def main() -> None:
        hold = HoldService(lambda t, q: 0, check_interval_s=3600)
        hold.start()
        sql = SelectorFilter(compile_selector("SQL92", "color = 'red'"))
        task = asyncio.create_task(hold.hold("T", 0, 0, sql, 3600))
        while hold.held_count == 0:
            await asyncio.sleep(0)
        waiter = task._fut_waiter  # type: ignore[attr-defined]  # the hold's future
        hold.dispatch_batch(DispatchBatch([_run("T", 0, 0, 0, ["TagA"], ["blue"])]))
        assert hold.held_count == 1 and not waiter.done()  # no match: still held
        hold.dispatch_batch(DispatchBatch([_run("T", 0, 1, 100, ["TagA"], ["red"])]))
        assert waiter.done() and hold.woken_by_arrival == 1
        assert await task == 200

        task = asyncio.create_task(hold.hold("T", 0, 2, sql, 3600))
        while hold.held_count == 0:
            await asyncio.sleep(0)
        batch = DispatchBatch([_run("T", 0, 2, 200, ["TagA"], ["red"])])
        await asyncio.to_thread(hold.dispatch_batch, batch)
        assert await task == 300 and hold.woken_by_arrival == 2
        await hold.stop()
    asyncio.run(main())
