"""SendFuture (client/send_future.py) against concurrent.futures.Future, the general road: any sequence of
calls gives the same answers, errors, states and callbacks (hypothesis); threads waiting in result /
exception, concurrent.futures.wait and as_completed are woken as a Future's are."""
from __future__ import annotations

import concurrent.futures as cf
import threading
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sluice.client.send_future import SendFuture

OPS = ["cancel", "cancelled", "running", "done", "set_running", "set_result", "set_exception", "result", "exception",
       "add_done_callback", "repr"]


def apply(fut: cf.Future[Any], ops: list[tuple[str, int]], log: list[Any]) -> list[Any]:
    out: list[Any] = []
    for op, arg in ops:
        try:
            if op == "cancel":
                r: Any = fut.cancel()
            elif op == "cancelled":
                r = fut.cancelled()
            elif op == "running":
                r = fut.running()
            elif op == "done":
                r = fut.done()
            elif op == "set_running":
                r = fut.set_running_or_notify_cancel()
            elif op == "set_result":
                r = fut.set_result(arg)
            elif op == "set_exception":
                r = fut.set_exception(ValueError(arg))
            elif op == "result":
                r = fut.result(0)
            elif op == "exception":
                e = fut.exception(0)
                r = None if e is None else (type(e).__name__, str(e))
            elif op == "add_done_callback":
                r = fut.add_done_callback(lambda f, arg=arg: log.append((arg, f.cancelled(), f.done())))
            else:
                r = repr(fut).split(" at ")[1].split(" ", 1)[1]  # the state part; the class name differs
        except Exception as exc:  # the same class, and for what a caller reads, the same text
            r = ("raised", type(exc).__name__, str(exc) if not isinstance(exc, cf.InvalidStateError) else "")
        out.append(r)
    out.append((fut._state, fut.done()))
    return out


@given(st.lists(st.tuples(st.sampled_from(OPS), st.integers(0, 9)), max_size=12))
def test_any_calls_answer_as_a_future_does(ops: list[tuple[str, int]]) -> None:
    log_plain: list[Any] = []
    log_fast: list[Any] = []
    assert apply(SendFuture(), ops, log_fast) == apply(cf.Future(), ops, log_plain)
    assert log_fast == log_plain


def test_it_is_a_concurrent_futures_future() -> None:
    assert isinstance(SendFuture(), cf.Future)


def later(fn: Any, *args: Any) -> threading.Thread:
    t = threading.Timer(0.05, fn, args)
    t.start()
    return t


def waiting(fut: SendFuture[Any], call: str) -> tuple[threading.Thread, list[Any]]:
    """A thread blocked in ``fut.<call>()`` without a timeout (its outcome in the list), once it waits."""
    out: list[Any] = []

    def run() -> None:
        try:
            out.append(getattr(fut, call)())
        except BaseException as exc:
            out.append(type(exc))
    t = threading.Thread(target=run, daemon=True)
    t.start()
    while not (fut._cond is not None and fut._cond._waiters):  # type: ignore[attr-defined]
        t.join(0.001)
    return t, out


@pytest.mark.parametrize("call", ["result", "exception"])
@pytest.mark.parametrize("how", ["result", "exception", "cancel"])
def test_a_waiting_thread_is_woken(call: str, how: str) -> None:
    fut: SendFuture[int] = SendFuture()
    t, out = waiting(fut, call)
    err = KeyError("k")
    if how == "result":
        fut.set_result(7)
    elif how == "exception":
        fut.set_exception(err)
    else:
        fut.cancel()
    t.join(30)  # a liveness bound: a missed notification leaves the thread waiting for ever
    assert not t.is_alive()
    want = {("result", "result"): 7, ("result", "exception"): KeyError, ("exception", "result"): None,
            ("exception", "exception"): err}.get((call, how), cf.CancelledError)
    assert out == [want]


def test_a_wait_times_out_on_a_pending_future() -> None:
    with pytest.raises(TimeoutError):
        SendFuture().result(0.01)
    with pytest.raises(TimeoutError):
        SendFuture().exception(0.01)


def test_wait_and_as_completed_see_them_finish() -> None:
    futs: list[SendFuture[int]] = [SendFuture() for _ in range(4)]
    futs[0].set_result(0)
    for i, f in enumerate(futs[1:], 1):
        later(f.set_result, i)
    done, _ = cf.wait(futs, timeout=10)
    assert done == set(futs)
    more: list[SendFuture[int]] = [SendFuture() for _ in range(3)]
    later(more[1].set_result, 1)
    later(more[0].set_exception, ValueError("x"))
    later(lambda: more[2].cancel() and more[2].set_running_or_notify_cancel())
    assert set(cf.as_completed(more, timeout=10)) == set(more)
    first, pending = cf.wait([SendFuture(), more[1]], timeout=10, return_when=cf.FIRST_COMPLETED)
    assert first == {more[1]} and len(pending) == 1
