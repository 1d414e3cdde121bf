"""HoldService.hold_then: a held pull answered by a callback (no future, task or timeout context). The callback
gets what hold() would return, once: the wake value (in the next loop iteration, inside one write batch), 0
from the periodic re-check, TIMED_OUT, or CLOSED when its connection closed; the limits and counts are hold()'s.
And the gate's Deferred: a plain handler's request stays counted in flight until its own answer settles it."""
from __future__ import annotations

import asyncio
import logging

import pytest

from sluice.broker.deferred import Deferred
from sluice.broker.filtering import SelectorFilter
from sluice.broker.gate import RequestGate
from sluice.broker.longpoll import CLOSED, FULL, HELD, TIMED_OUT, HoldService
from sluice.errors import NoPermissionError
from sluice.filter import compile_selector
from sluice.protocol.command import RemotingCommand
from sluice.transport import batching
from test_longpoll_batch import _run
from sluice.store.dispatch_columns import DispatchBatch


class _Owner:
    """A connection as far as the hold service sees one: on_close hooks."""

    def __init__(self) -> None:
        self.hooks: list = []

    def on_close(self, cb) -> None:  # noqa: ANN001
        self.hooks.append(cb)

    def close(self) -> None:
        hooks, self.hooks = self.hooks, []
        for cb in hooks:
            cb(self)


def _recorder(calls: list) -> object:
    def then(value: int) -> None:
        calls.append((value, batching.current_batch() is not None))
    return then


def test_woken_by_dispatch_in_the_next_iteration_inside_a_write_batch() -> None:
    async def main() -> None:
        hold = HoldService(lambda t, q: 0, check_interval_s=3600)
        hold.start()
        owner, calls = _Owner(), []
        sql = SelectorFilter(compile_selector("SQL92", "color = 'red'"))
        assert hold.hold_then("T", 0, 0, sql, 3600, owner, _recorder(calls)) == HELD
        assert hold.held_count == 1 and hold.held_by(owner) == 1 and len(owner.hooks) == 1
        hold.dispatch_batch(DispatchBatch([_run("T", 0, 0, 0, ["TagA"], ["blue"])]))
        await asyncio.sleep(0)
        assert calls == [] and hold.held_count == 1  # no match: still held
        hold.dispatch_batch(DispatchBatch([_run("T", 0, 1, 100, ["TagA"], ["red"])]))
        # Out of the counts at once, called back in the next iteration (consume-queue units come after).
        assert calls == [] and hold.held_count == 0 and hold.held_by(owner) == 0 and not hold._held
        await asyncio.sleep(0)
        assert calls == [(200, True)] and hold.woken_by_arrival == 1
        # The same connection holds again: no second close hook.
        assert hold.hold_then("T", 0, 2, None, 3600, owner, _recorder(calls)) == HELD
        assert len(owner.hooks) == 1
        await asyncio.to_thread(hold.dispatch_batch, DispatchBatch([_run("T", 0, 2, 200, ["TagA"], ["red"])]))
        for _ in range(20):
            if len(calls) == 2:
                break
            await asyncio.sleep(0.01)
        assert calls[1] == (300, True)
        await asyncio.sleep(0.05)
        assert len(calls) == 2  # once only
        await hold.stop()
    asyncio.run(main())


def test_timeout_calls_back_once_with_timed_out() -> None:
    async def main() -> None:
        hold = HoldService(lambda t, q: 0, check_interval_s=3600)
        hold.start()
        owner, calls = _Owner(), []
        assert hold.hold_then("T", 0, 0, None, 0.05, owner, _recorder(calls)) == HELD
        await asyncio.sleep(0.2)
        assert calls == [(TIMED_OUT, True)] and hold.timed_out == 1 and hold.held_count == 0
        hold._arrived({("T", 0): [(0, 0, {})]}, 9)  # too late: nothing is held any more
        await asyncio.sleep(0.01)
        assert calls == [(TIMED_OUT, True)]
        await hold.stop()
    asyncio.run(main())


def test_a_woken_pull_never_times_out_afterwards() -> None:
    async def main() -> None:
        hold = HoldService(lambda t, q: 0, check_interval_s=3600)
        hold.start()
        calls: list = []
        hold.hold_then("T", 0, 0, None, 0.05, _Owner(), _recorder(calls))
        hold._arrived({("T", 0): [(0, 0, {})]}, 9)
        await asyncio.sleep(0.2)
        assert calls == [(9, True)] and hold.timed_out == 0
        await hold.stop()
    asyncio.run(main())


def test_close_releases_the_owners_pulls_only() -> None:
    async def main() -> None:
        hold = HoldService(lambda t, q: 0, check_interval_s=3600)
        hold.start()
        a, b, calls_a, calls_b = _Owner(), _Owner(), [], []
        for q in range(3):
            hold.hold_then("T", q, 0, None, 0.1, a, _recorder(calls_a))
        hold.hold_then("T", 0, 0, None, 3600, b, _recorder(calls_b))
        removals = hold.removals
        a.close()
        assert calls_a == [(CLOSED, False)] * 3 and hold.removals == removals + 3
        assert hold.held_count == 1 and hold.held_by(a) == 0 and hold.held_by(b) == 1
        assert a not in hold._watched_owners and list(hold._held) == [("T", 0)]
        await asyncio.sleep(0.2)  # their timers were cancelled
        assert len(calls_a) == 3 and hold.timed_out == 0
        await hold.stop()
        assert calls_b == [(TIMED_OUT, True)]  # stop answers before it returns
    asyncio.run(main())


def test_a_pull_held_for_a_closed_connection_is_released_at_once() -> None:
    class _Closed(_Owner):
        def on_close(self, cb) -> None:  # noqa: ANN001
            cb(self)  # as RemotingConnection.on_close does once closed

    async def main() -> None:
        hold = HoldService(lambda t, q: 0, check_interval_s=3600)
        hold.start()
        owner, calls = _Closed(), []
        assert hold.hold_then("T", 0, 0, None, 3600, owner, _recorder(calls)) == HELD
        assert calls == [(CLOSED, False)] and hold.held_count == 0 and not hold._held
        assert hold._later_by_owner == {} and hold._per_owner == {} and owner not in hold._watched_owners
        await hold.stop()
    asyncio.run(main())


def test_gate_counts_a_deferred_settled_before_it_returned_as_done() -> None:
    gate = RequestGate()

    def handler(conn, request):  # noqa: ANN001, ANN202
        d = Deferred()
        d.settle()
        return d

    assert gate.guard(handler)(_Conn(), RemotingCommand.request(11)) is None and gate.in_flight == 0


def test_limits_and_a_grown_queue() -> None:
    async def main() -> None:
        sizes = {("T", 0): 0, ("T", 1): 5}
        hold = HoldService(lambda t, q: sizes[(t, q)], check_interval_s=3600, max_per_owner=2, max_total=3)
        hold.start()
        a, b, calls = _Owner(), _Owner(), []
        then = _recorder(calls)
        assert hold.hold_then("T", 1, 3, None, 3600, a, then) == 0  # the queue is past offset 3: pull again
        assert hold.woken_by_check == 1 and hold.held_count == 0
        assert [hold.hold_then("T", 0, 0, None, 3600, a, then) for _ in range(3)] == [HELD, HELD, FULL]
        assert hold.hold_then("T", 0, 0, None, 3600, b, then) == HELD
        assert hold.hold_then("T", 0, 0, None, 3600, b, then) == FULL  # 3 in all
        # The coroutine way shares the same counts.
        assert await hold.hold("T", 0, 0, None, 3600, b) == FULL
        assert hold.refused_full == 3
        sizes[("T", 0)] = 1
        hold.check_now()
        await asyncio.sleep(0)
        assert calls == [(0, True)] * 3 and hold.held_count == 0 and hold._per_owner == {}
        assert hold._later_by_owner == {}
        await hold.stop()
    asyncio.run(main())


class _Conn:
    peer = "1.2.3.4:5"


def test_gate_counts_a_deferred_request_until_it_settles(caplog: pytest.LogCaptureFixture) -> None:
    gate = RequestGate()
    pending: list[Deferred] = []

    def handler(conn, request):  # noqa: ANN001, ANN202
        d = Deferred()
        pending.append(d)
        return d

    guarded = gate.guard(handler)
    req = RemotingCommand.request(11)
    assert guarded(_Conn(), req) is None and gate.in_flight == 1
    assert guarded(_Conn(), req) is None and gate.in_flight == 2
    pending[0].settle()
    pending[0].settle()  # once only
    assert gate.in_flight == 1
    with caplog.at_level(logging.DEBUG, logger="sluice.broker.controller"):
        pending[1].settle(NoPermissionError("no"))
    assert gate.in_flight == 0 and "refused" in caplog.text


def test_a_deferred_awaited_without_the_gate_gives_none() -> None:
    async def main() -> object:
        return await Deferred()
    assert asyncio.run(main()) is None


# ---- through a real broker (in process) -------------------------------------------------------------------

def _held_by_callback(b, n: int = 1) -> None:  # noqa: ANN001
    import time
    deadline = time.monotonic() + 5
    while sum(len(v) for v in b.broker.hold._later_by_owner.values()) < n:
        assert time.monotonic() < deadline, "the pull was not held by a callback"
        time.sleep(0.005)


def test_broker_holds_a_pull_without_a_task_and_answers_it(broker) -> None:  # noqa: ANN001
    from test_broker_longpoll import _pull_in_thread
    from broker_support import bodies
    consumer, producer = broker.rpc(), broker.rpc()
    producer.send("CB", b"first")
    t, out = _pull_in_thread(consumer, "CB", offset=1, suspend_ms=10_000)
    _held_by_callback(broker)
    b = broker.broker
    assert b.gate.in_flight == 1  # the held pull is still counted
    conns = [c for c in b.server.connections if c.busy]
    assert len(conns) == 1 and not conns[0]._tasks  # no handler task behind it
    producer.send("CB", b"second")
    t.join(10)
    assert bodies(out["resp"]) == [b"second"]
    assert b.gate.in_flight == 0 and b.hold.held_count == 0 and conns[0].busy == 0


def test_a_pull_woken_before_dispatch_caught_up_waits_for_it_then_answers(broker) -> None:  # noqa: ANN001
    """The wake value says how far dispatch must be; one it has not reached (the dispatch thread lags) is
    waited for off the loop (here it never comes: the wait's 1 s bound ends it) and the pull is answered."""
    from test_broker_longpoll import _pull_in_thread
    from sluice.protocol.codes import ResponseCode
    consumer, producer = broker.rpc(), broker.rpc()
    producer.send("Lag", b"first")
    t, out = _pull_in_thread(consumer, "Lag", offset=1, suspend_ms=10_000)
    _held_by_callback(broker)
    b = broker.broker
    b.hold._loop.call_soon_threadsafe(b.hold._arrived, {("Lag", 0): [(1, 0, {})]}, 1 << 50)
    t.join(10)
    assert out["resp"].code == ResponseCode.PULL_NOT_FOUND  # nothing new: pulled again, answered as it is
    assert b.gate.in_flight == 0 and b.hold.held_count == 0
    assert all(c.busy == 0 for c in b.server.connections)


def test_fires_held_back_between_begin_and_end_are_answered_by_end_fires_in_this_iteration() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        hold = HoldService(lambda t, q: 0, check_interval_s=3600)
        hold.start()
        owner, calls = _Owner(), []
        for q in (0, 1):
            assert hold.hold_then("T", q, 0, None, 3600, owner, _recorder(calls)) == HELD
        await asyncio.sleep(0)
        ready = len(loop._ready)  # type: ignore[attr-defined]
        assert hold.begin_fires()
        assert not hold.begin_fires()  # one holder at a time: a nested dispatch leaves the firing to the first
        hold.dispatch_batch(DispatchBatch([_run("T", 0, 0, 100, ["TagA"], ["red"])]))
        hold.dispatch_batch(DispatchBatch([_run("T", 1, 0, 300, ["TagA"], ["red"])]))
        assert calls == [] and hold.held_count == 0
        hold.end_fires()
        assert calls == [(200, True), (400, True)]  # both, at once, in one write batch
        # nothing was left for the next iteration but the wake budget's renewal
        assert [h for h in list(loop._ready)[ready:]  # type: ignore[attr-defined]
                if "_fire_all" in repr(h)] == []
        await asyncio.sleep(0)
        assert len(calls) == 2
        # A firing scheduled already answers what is woken meanwhile: begin_fires changes nothing then.
        assert hold.hold_then("T", 0, 1, None, 3600, owner, _recorder(calls)) == HELD
        hold._fire(lambda v: calls.append(("other", v)), 7)  # a timeout's, say: scheduled on the loop
        assert not hold.begin_fires()
        hold.dispatch_batch(DispatchBatch([_run("T", 0, 1, 500, ["TagA"], ["red"])]))
        assert len(calls) == 2
        await asyncio.sleep(0)
        assert calls[2:] == [("other", 7), (600, True)]
        await hold.stop()
    asyncio.run(main())
