"""ConsumeThreads (the push consumer's consume threads) against its twin, concurrent.futures.ThreadPoolExecutor:
the same results and exceptions, jobs started in order, at most max_threads threads with the executor's names,
shutdown cancelling what has not started and letting running jobs finish."""
from __future__ import annotations

import subprocess
import sys
import threading
from concurrent.futures import CancelledError, ThreadPoolExecutor, wait

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.client.consume_threads import ConsumeThreads


def _until(cond) -> None:  # type: ignore[no-untyped-def]
    done = threading.Event()
    while not cond():
        done.wait(0.001)


def _job(x: int) -> int:
    if x % 5 == 0:
        raise ValueError(f"job {x}")
    return x * 2


def _outcomes(futures) -> list[object]:  # type: ignore[no-untyped-def]
    wait(futures, timeout=30)
    out: list[object] = []
    for f in futures:
        exc = f.exception()
        out.append(repr(exc) if exc is not None else f.result())
    return out


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(0, 100), max_size=40), st.integers(1, 4))
def test_results_and_exceptions_are_the_executors(xs: list[int], max_threads: int) -> None:
    pool, twin = ConsumeThreads(max_threads, "t"), ThreadPoolExecutor(max_threads, "t")
    try:
        assert _outcomes([pool.submit(_job, x) for x in xs]) == _outcomes([twin.submit(_job, x) for x in xs])
        assert pool.threads <= max_threads
    finally:
        pool.shutdown()
        twin.shutdown()


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 30))
def test_one_thread_runs_jobs_in_submission_order(n: int) -> None:
    pool = ConsumeThreads(1, "t")
    gate, ran = threading.Event(), []
    first = pool.submit(gate.wait, 30)  # the thread is busy: the jobs below queue up
    futures = [pool.submit(ran.append, i) for i in range(n)]
    gate.set()
    wait([first, *futures], timeout=30)
    assert ran == list(range(n)) and pool.threads == 1
    pool.shutdown()


def test_threads_start_per_job_up_to_the_bound_with_the_executors_names() -> None:
    pool = ConsumeThreads(3, "sluice-consume-g")
    gate = threading.Event()
    names: list[str] = []

    def job() -> None:
        names.append(threading.current_thread().name)
        gate.wait(30)
    assert pool.all_idle  # no thread yet
    futures = [pool.submit(job) for _ in range(5)]
    _until(lambda: len(names) == 3)
    assert pool.threads == 3 and pool.idle == 0 and not pool.all_idle
    assert sorted(names) == ["sluice-consume-g_0", "sluice-consume-g_1", "sluice-consume-g_2"]
    gate.set()
    wait(futures, timeout=30)
    assert len(names) == 5 and pool.threads == 3
    _until(lambda: pool.idle == 3)
    assert pool.all_idle
    pool.shutdown()


def test_a_job_goes_to_the_thread_idle_most_recently() -> None:
    """Both threads idle: the one that finished last is woken (its stack and caches are warm), no new thread."""
    pool = ConsumeThreads(4, "t")
    gates = [threading.Event(), threading.Event()]
    started: list[str] = []

    def job(i: int) -> str:
        started.append(threading.current_thread().name)
        gates[i].wait(30)
        return threading.current_thread().name
    a, b = pool.submit(job, 0), pool.submit(job, 1)
    _until(lambda: len(started) == 2)
    gates[1].set()
    _until(lambda: pool.idle == 1)
    gates[0].set()
    _until(lambda: pool.idle == 2)
    assert pool.submit(threading.current_thread).result(30).name == a.result()
    assert pool.threads == 2 and b.result() != a.result()
    pool.shutdown()


def test_shutdown_cancels_queued_jobs_lets_running_ones_finish_and_ends_the_threads() -> None:
    pool = ConsumeThreads(1, "t")
    gate = threading.Event()
    running = pool.submit(gate.wait, 30)
    _until(lambda: running.running())
    queued = pool.submit(lambda: 1)
    pool.shutdown(cancel_futures=True)
    with pytest.raises(RuntimeError, match="after shutdown"):
        pool.submit(lambda: 2)
    assert queued.cancelled()
    with pytest.raises(CancelledError):
        queued.result()
    gate.set()
    assert running.result(30) is True
    for t in pool._threads:
        t.join(30)
        assert not t.is_alive()


def test_shutdown_without_cancelling_runs_the_queued_jobs_first() -> None:
    pool = ConsumeThreads(1, "t")
    gate = threading.Event()
    running = pool.submit(gate.wait, 30)
    queued = pool.submit(lambda: 7)
    pool.shutdown(cancel_futures=False)
    gate.set()
    assert running.result(30) is True and queued.result(30) == 7
    pool._threads[0].join(30)
    assert not pool._threads[0].is_alive()


def test_idle_threads_end_at_shutdown() -> None:
    pool = ConsumeThreads(2, "t")
    wait([pool.submit(lambda: None) for _ in range(2)], timeout=30)
    _until(lambda: pool.idle == pool.threads)
    pool.shutdown()
    for t in pool._threads:
        t.join(30)
        assert not t.is_alive()
    assert pool.idle == 0


def test_a_bound_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="max_threads must be at least 1, got 0"):
        ConsumeThreads(0, "t")


def test_the_interpreter_exits_with_idle_threads_after_waiting_for_running_jobs() -> None:
    """Non-daemon threads, as the executor's: at exit an idle thread ends and a running job is finished."""
    script = """
import subprocess
import sys
import threading
from sluice.client.consume_threads import ConsumeThreads
pool = ConsumeThreads(2, "t")
pool.submit(lambda: None).result()
started = threading.Event()
def last():
    started.set()
    threading.Event().wait(0.2)
    print("finished", flush=True)
pool.submit(last)
started.wait()
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "finished\n"
