"""The push consumer's consume threads: a thread pool whose idle threads each wait on a lock of their own,
so a job given while a thread is idle wakes that one thread and nothing else.

concurrent.futures.ThreadPoolExecutor puts every job on one shared queue: ``submit`` builds a work item,
puts it (waking any of the waiting threads), then checks the pool's size, all while the submitting thread
(the consumer's event loop) holds the GIL, and it cannot say whether a thread is idle. Here ``submit`` picks
the idle thread itself (the most recently idle: its caches are warm) and releases its lock as the last thing
before returning, so the consume service's hand-over (consume_service.py) drops the GIL right after the
wake, and ``all_idle`` tells the service when a hand-over can be taken at once.

Semantics as the executor's: jobs start in submission order (a job no idle thread took waits in a FIFO that
every thread empties before it goes idle), threads are started one per job until ``max_threads`` exist
(RocketMQ's consumeThreadMax; ConsumeMessageConcurrentlyService's pool never shrinks below its core size
either), named ``<prefix>_<n>``, a job's result or exception goes to its ``concurrent.futures.Future``, and
``shutdown(cancel_futures=True)`` cancels the jobs not started, lets running ones finish and stops the
threads. Threads are not daemons: at interpreter exit every pool is shut down and its running jobs are
waited for, as the executor's are.
"""
from __future__ import annotations

import threading
import weakref
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

__all__ = ["ConsumeThreads"]

_Job = tuple[Future, Callable[..., Any], tuple[Any, ...]]
_pools: weakref.WeakSet[ConsumeThreads] = weakref.WeakSet()
_exiting = False


def _at_exit() -> None:
    # Runs before the interpreter joins its non-daemon threads (threading._register_atexit, as
    # concurrent.futures.thread does): idle threads are woken to end, running jobs finish.
    global _exiting
    _exiting = True
    for pool in list(_pools):
        pool.shutdown(cancel_futures=False)


threading._register_atexit(_at_exit)  # type: ignore[attr-defined]


class _Worker:
    __slots__ = ("wake", "job")

    def __init__(self) -> None:
        #: Held while the thread is idle; released by whoever gives it a job (or stops the pool).
        self.wake = threading.Lock()
        self.wake.acquire()
        #: The job handed over with the wake; None on a wake to stop.
        self.job: _Job | None = None


class ConsumeThreads:
    """Up to ``max_threads`` threads named ``<name_prefix>_<n>``, started as jobs arrive."""

    def __init__(self, max_threads: int, name_prefix: str) -> None:
        if max_threads < 1:
            raise ValueError(f"max_threads must be at least 1, got {max_threads}")
        self.max_threads = max_threads
        self.name_prefix = name_prefix
        self._mutex = threading.Lock()
        self._idle: list[_Worker] = []  # the most recently idle last: the next job goes to a warm thread
        self._queue: deque[_Job] = deque()  # jobs given while no thread was idle, in order
        self._threads: list[threading.Thread] = []
        self._shutdown = False
        _pools.add(self)

    @property
    def threads(self) -> int:
        """Threads started."""
        return len(self._threads)

    @property
    def idle(self) -> int:
        """Threads waiting for a job."""
        return len(self._idle)

    @property
    def all_idle(self) -> bool:
        """No thread is running a job or about to take one (True before the first thread starts)."""
        return len(self._idle) == len(self._threads)

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future:
        """Run ``fn(*args)`` on a consume thread: the most recently idle one, woken directly, or the first
        to finish its job; a new thread while fewer than ``max_threads`` exist. RuntimeError after
        shutdown (as the executor's)."""
        fut: Future = Future()
        job = (fut, fn, args)
        with self._mutex:
            if self._shutdown or _exiting:
                raise RuntimeError("cannot schedule new futures after shutdown")
            if self._idle:
                worker = self._idle.pop()
                worker.job = job
                worker.wake.release()  # the last step: the caller may now drop the GIL for this thread
                return fut
            self._queue.append(job)
            if len(self._threads) < self.max_threads:
                t = threading.Thread(target=self._run, name=f"{self.name_prefix}_{len(self._threads)}")
                self._threads.append(t)
                t.start()
        return fut

    def _run(self) -> None:
        worker = _Worker()
        job: _Job | None = None
        while True:
            if job is not None:
                _execute(job)
                job = None
            with self._mutex:
                if self._queue:
                    job = self._queue.popleft()
                    continue
                if self._shutdown:
                    return
                self._idle.append(worker)
            worker.wake.acquire()
            job, worker.job = worker.job, None
            if job is None:
                return  # woken by shutdown

    def shutdown(self, cancel_futures: bool = True) -> None:
        """No new jobs; with ``cancel_futures`` the jobs not started are cancelled (otherwise the threads
        run them first); idle threads end, busy ones after their job. Does not wait."""
        with self._mutex:
            self._shutdown = True
            if cancel_futures:
                while self._queue:
                    self._queue.popleft()[0].cancel()
            idle, self._idle = self._idle, []
        for worker in idle:
            worker.wake.release()


def _execute(job: _Job) -> None:
    fut, fn, args = job
    if not fut.set_running_or_notify_cancel():
        return
    try:
        result = fn(*args)
    except BaseException as exc:  # noqa: BLE001 - the future carries it, as the executor's work item does
        fut.set_exception(exc)
        del exc
    else:
        fut.set_result(result)
