"""LoopThread.submit: run_coroutine_threadsafe's contract (results, errors, cancelling from either side),
with a burst submitted while the loop is busy handed over in one wake-up (counted, not timed)."""
from __future__ import annotations

import asyncio
import concurrent.futures
import threading

import pytest

from sluice.errors import RemotingError
from sluice.transport.blocking import LoopThread


async def _echo(x: int) -> int:
    await asyncio.sleep(0)
    return x


async def _fail() -> None:
    raise ValueError("boom")


@pytest.fixture
def lt():  # type: ignore[no-untyped-def]
    t = LoopThread("test-loop")
    yield t
    t.stop()


def test_results_and_errors_come_back(lt: LoopThread) -> None:
    assert lt.submit(_echo(7)).result(30) == 7
    with pytest.raises(ValueError, match="boom"):
        lt.submit(_fail()).result(30)
    assert lt.run(_echo(3), 30) == 3


def test_a_burst_while_the_loop_is_busy_costs_one_wake_up(lt: LoopThread) -> None:
    release = threading.Event()
    busy = threading.Event()

    def block() -> None:
        busy.set()
        release.wait(30)
    lt.loop.call_soon_threadsafe(block)
    assert busy.wait(30)
    before = lt.wakeups
    futs = [lt.submit(_echo(i)) for i in range(500)]
    release.set()
    assert [f.result(30) for f in futs] == list(range(500))
    assert lt.wakeups == before + 1


def test_many_threads_submitting_lose_nothing(lt: LoopThread) -> None:
    def work(k: int) -> list[int]:
        return [f.result(30) for f in [lt.submit(_echo(k * 1000 + i)) for i in range(300)]]
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        got = sorted(x for part in pool.map(work, range(4)) for x in part)
    assert got == sorted(k * 1000 + i for k in range(4) for i in range(300))


def test_cancelling_the_future_cancels_the_task(lt: LoopThread) -> None:
    started, cancelled = threading.Event(), threading.Event()

    async def forever() -> None:
        started.set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancelled.set()
            raise
    fut = lt.submit(forever())
    assert started.wait(30)
    assert fut.cancel()
    assert cancelled.wait(30)


def test_a_future_cancelled_before_the_loop_took_it_never_runs(lt: LoopThread) -> None:
    release, busy = threading.Event(), threading.Event()
    ran = []

    async def mark() -> None:
        ran.append(1)

    def block() -> None:
        busy.set()
        release.wait(30)
    lt.loop.call_soon_threadsafe(block)
    assert busy.wait(30)
    fut = lt.submit(mark())
    assert fut.cancel()
    release.set()
    assert lt.submit(_echo(1)).result(30) == 1  # the queue was drained past the cancelled one
    assert ran == [] and fut.cancelled()


def test_a_task_cancelled_on_the_loop_cancels_the_future(lt: LoopThread) -> None:
    async def cancel_self() -> None:
        asyncio.current_task().cancel()  # type: ignore[union-attr]
        await asyncio.sleep(1)
    fut = lt.submit(cancel_self())
    with pytest.raises(concurrent.futures.CancelledError):
        fut.result(30)


def test_submitting_to_a_closed_loop_is_refused() -> None:
    t = LoopThread("test-loop")
    t.stop()
    coro = _echo(1)
    with pytest.raises(RuntimeError):
        t.submit(coro)
    with pytest.raises(RemotingError, match="stopped"):
        t.run(_echo(2), 5)


def _settle_with(fut: concurrent.futures.Future[int], value: int, log: list[int] | None = None) -> None:
    if log is not None:
        log.append(value)
    if fut.set_running_or_notify_cancel():
        fut.set_result(value)


def test_plain_functions_run_in_order_with_coroutines_and_share_the_wake_up(lt: LoopThread) -> None:
    release, busy = threading.Event(), threading.Event()

    def block() -> None:
        busy.set()
        release.wait(30)
    lt.loop.call_soon_threadsafe(block)
    assert busy.wait(30)
    before = lt.wakeups
    order: list[int] = []

    async def coro_mark(x: int) -> int:
        order.append(x)
        return x
    futs = []
    for i in range(100):
        if i % 2:
            futs.append(lt.submit(coro_mark(i)))
        else:
            f: concurrent.futures.Future[int] = concurrent.futures.Future()
            futs.append(lt.submit_call(lambda f=f, i=i: _settle_with(f, i, order), f))
    release.set()
    assert [f.result(30) for f in futs] == list(range(100))
    assert [x for x in order if x % 2 == 0] == list(range(0, 100, 2))  # the plain ones ran in submission order
    assert lt.wakeups == before + 1


def test_a_plain_function_may_settle_its_future_later_and_raising_fails_it(lt: LoopThread) -> None:
    fut: concurrent.futures.Future[int] = concurrent.futures.Future()
    lt.submit_call(lambda: lt.loop.call_later(0.01, _settle_with, fut, 5), fut)
    assert fut.result(30) == 5

    def boom() -> None:
        raise ValueError("bad call")
    failed: concurrent.futures.Future[int] = concurrent.futures.Future()
    with pytest.raises(ValueError, match="bad call"):
        lt.run_call(boom, failed, 30)
    assert lt.run_call(lambda: _settle_with(fut2, 7), fut2 := concurrent.futures.Future(), 30) == 7


def test_run_call_times_out_by_cancelling_and_refuses_the_loop_thread(lt: LoopThread) -> None:
    never: concurrent.futures.Future[int] = concurrent.futures.Future()
    with pytest.raises(RemotingError, match="did not finish within"):
        lt.run_call(lambda: None, never, 0.05)
    assert never.cancelled()

    async def from_inside() -> str:
        try:
            lt.run_call(lambda: None, concurrent.futures.Future(), 1)
        except RemotingError as exc:
            return str(exc)
        return "ran"
    assert "own loop thread" in lt.run(from_inside(), 30)


def test_a_plain_function_cancelled_before_the_loop_took_it_never_runs(lt: LoopThread) -> None:
    release, busy = threading.Event(), threading.Event()
    ran: list[int] = []

    def block() -> None:
        busy.set()
        release.wait(30)
    lt.loop.call_soon_threadsafe(block)
    assert busy.wait(30)
    fut: concurrent.futures.Future[int] = concurrent.futures.Future()
    lt.submit_call(lambda: ran.append(1), fut)
    assert fut.cancel()
    release.set()
    assert lt.submit(_echo(1)).result(30) == 1
    assert ran == []


def test_plain_functions_waiting_on_a_stopped_loop_fail() -> None:
    t = LoopThread("test-loop")
    t.stop()
    fut: concurrent.futures.Future[int] = concurrent.futures.Future()
    with pytest.raises(RuntimeError):
        t.submit_call(lambda: None, fut)
    with pytest.raises(RemotingError, match="stopped"):
        fut.result(0)
    with pytest.raises(RemotingError, match="stopped"):
        t.run_call(lambda: None, concurrent.futures.Future(), 5)
