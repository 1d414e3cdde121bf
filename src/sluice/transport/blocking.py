"""Blocking facades over the one async implementation: an event loop in a background thread.

``LoopThread`` runs coroutines from synchronous code (CLI, admin, a sync SDK)
with ``run_coroutine_threadsafe``; ``SyncRemotingClient`` wraps RemotingClient
with it. Several facades may share one LoopThread.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
from abc import ABC, abstractmethod
import threading
from collections import deque
from collections.abc import Callable, Coroutine
from functools import partial
from typing import Any, Self, TypeVar

from sluice.errors import RemotingError, RemotingTimeoutError
from sluice.transport.client import DEFAULT_TIMEOUT, RemotingClient
from sluice.transport.batching import begin_writes, end_writes
from sluice.protocol.command import RemotingCommand

__all__ = ["LoopBoundClient", "LoopThread", "SyncRemotingClient"]

T = TypeVar("T")


class LoopThread:
    """A daemon thread running an asyncio loop until :meth:`stop`."""

    def __init__(self, name: str = "sluice-loop") -> None:
        self.loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        # (coroutine or plain function, its Future, whether a function) in submission order
        self._submitted: deque[tuple[Coroutine[Any, Any, Any] | Callable[[], object],
                                     concurrent.futures.Future[Any], bool]] = deque()
        self._drain_scheduled = False
        #: Times submitted coroutines were handed to the loop (a burst submitted while the loop is busy: once).
        self.wakeups = 0
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self._thread.start()
        self._ident = self._thread.ident  # set once start() returns; quiet() runs per send
        self._ready.wait()

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.call_soon(self._ready.set)
        self.loop.run_forever()
        # Let cancelled tasks finish their cleanup before the loop goes away.
        pending = asyncio.all_tasks(self.loop)
        for task in pending:
            task.cancel()
        if pending:
            self.loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        self.loop.close()

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run ``coro`` on the loop and wait for its result; ``timeout`` cancels it."""
        if threading.current_thread() is self._thread:
            coro.close()
            raise RemotingError("LoopThread.run called from its own loop thread (would deadlock)")
        if not self.running:
            coro.close()
            raise RemotingError("the event loop thread is stopped")
        fut = self.submit(coro)
        try:
            return fut.result(timeout)
        except TimeoutError:
            fut.cancel()
            raise RemotingTimeoutError(f"call did not finish within {timeout:g} s") from None

    def quiet(self) -> bool:
        """Called from another thread while nothing submitted waits for the loop: work this thread does itself
        now (a request written from it, RemotingClient.request_from_thread) overtakes nothing it submitted."""
        return not self._submitted and threading.get_ident() != self._ident

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """``asyncio.run_coroutine_threadsafe(coro, self.loop)`` (cancelling the Future cancels the task), but
        coroutines submitted while the loop has not taken the last ones yet wait in a queue: a burst of sends
        from other threads costs the loop one wake-up (a self-pipe write and read), not one per call."""
        fut: concurrent.futures.Future[T] = concurrent.futures.Future()
        self._enqueue(coro, fut, False)
        return fut

    def submit_call(self, fn: Callable[[], object], fut: concurrent.futures.Future[T]) -> concurrent.futures.Future[T]:
        """Run the plain function ``fn`` on the loop, in order with what else was submitted and sharing its
        wake-ups; ``fn`` settles ``fut`` itself, on the loop, now or later (no task is made for it). A future
        cancelled before the loop took it is not run; ``fn`` raising fails ``fut``."""
        self._enqueue(fn, fut, True)
        return fut

    def run_call(self, fn: Callable[[], object], fut: concurrent.futures.Future[T], timeout: float | None = None) -> T:
        """:meth:`submit_call` and wait for ``fut``, as :meth:`run` waits for a coroutine (``timeout`` cancels
        ``fut``)."""
        if threading.current_thread() is self._thread:
            raise RemotingError("LoopThread.run_call called from its own loop thread (would deadlock)")
        if not self.running:
            raise RemotingError("the event loop thread is stopped")
        self._enqueue(fn, fut, True)
        return self.wait(fut, timeout)

    @staticmethod
    def wait(fut: concurrent.futures.Future[T], timeout: float | None = None) -> T:
        """``fut``'s result, as :meth:`run_call` waits for it (``timeout`` cancels ``fut``)."""
        try:
            return fut.result(timeout)
        except TimeoutError:
            fut.cancel()
            raise RemotingTimeoutError(f"call did not finish within {timeout:g} s") from None

    def _enqueue(self, job: Coroutine[Any, Any, Any] | Callable[[], object], fut: concurrent.futures.Future[Any],
                 call: bool) -> None:
        self._submitted.append((job, fut, call))
        if not self._drain_scheduled:
            self._drain_scheduled = True
            try:
                self.loop.call_soon_threadsafe(self._drain)
            except RuntimeError:  # the loop is closed: nothing will run what waits
                self._drain_scheduled = False
                self._fail_waiting()
                raise

    def _fail_waiting(self) -> None:
        while self._submitted:
            job, fut, call = self._submitted.popleft()
            if not call:
                job.close()  # type: ignore[union-attr]
            if fut.set_running_or_notify_cancel():
                fut.set_exception(RemotingError("the event loop thread is stopped"))

    def _drain(self) -> None:
        # The flag goes down before the queue is read: a submit() that still saw it up left its coroutine
        # where this loop finds it.
        self._drain_scheduled = False
        self.wakeups += 1
        queue, loop = self._submitted, self.loop
        batch = begin_writes()  # what the calls write leaves at the end of this drain, not an iteration later
        try:
            self._run_submitted(queue, loop)
        finally:
            end_writes(batch)

    @staticmethod
    def _run_submitted(queue: deque[tuple[Coroutine[Any, Any, Any] | Callable[[], object],
                                          concurrent.futures.Future[Any], bool]],
                       loop: asyncio.AbstractEventLoop) -> None:
        while queue:
            job, fut, call = queue.popleft()
            if call:  # submit_call: the function settles fut itself
                if fut.cancelled():
                    continue
                try:
                    job()  # type: ignore[operator]
                except BaseException as exc:
                    if not fut.done() and fut.set_running_or_notify_cancel():
                        fut.set_exception(exc)
                continue
            if fut.cancelled():
                job.close()  # type: ignore[union-attr]
                continue
            task = loop.create_task(job)  # type: ignore[arg-type]
            task.add_done_callback(partial(_settle, fut))
            fut.add_done_callback(partial(_cancel_soon, loop, task))

    def stop(self, timeout: float = 5.0) -> None:
        if self.running:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout)


def _settle(fut: concurrent.futures.Future[Any], task: asyncio.Task[Any]) -> None:
    """The task's outcome to the submitter's Future (asyncio.futures._chain_future's, without its locks)."""
    if task.cancelled():
        fut.cancel()
        return
    if not fut.set_running_or_notify_cancel():  # cancelled by the submitter meanwhile
        return
    exc = task.exception()
    if exc is None:
        fut.set_result(task.result())
    else:
        fut.set_exception(exc)


def _cancel_soon(loop: asyncio.AbstractEventLoop, task: asyncio.Task[Any],
                 fut: concurrent.futures.Future[Any]) -> None:
    if fut.cancelled() and not task.done():
        try:
            loop.call_soon_threadsafe(task.cancel)
        except RuntimeError:  # the loop is closed
            pass


class LoopBoundClient(ABC):
    """A blocking wrapper of an async client whose calls run on a LoopThread: its own one unless one
    is given. ``close`` (or leaving ``with``) closes the async client on that loop, then stops the
    loop if it is the wrapper's own."""

    def __init__(self, loop_thread: LoopThread | None, thread_name: str) -> None:
        self._owns_loop = loop_thread is None
        self.loop_thread = loop_thread or LoopThread(thread_name)

    @abstractmethod
    def _close_async(self) -> Coroutine[Any, Any, None]:
        """The wrapped client's ``close()``."""

    def close(self) -> None:
        if self.loop_thread.running:
            self.loop_thread.run(self._close_async(), 10.0)
        if self._owns_loop:
            self.loop_thread.stop()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class SyncRemotingClient(LoopBoundClient):
    """Blocking RemotingClient: ``invoke(addr, request, timeout)`` / ``invoke_oneway`` / ``close``."""

    def __init__(self, loop_thread: LoopThread | None = None, **client_options: Any) -> None:
        super().__init__(loop_thread, "sluice-remoting")
        self.client = RemotingClient(**client_options)

    def _close_async(self) -> Coroutine[Any, Any, None]:
        return self.client.close()

    def invoke(self, addr: str, request: RemotingCommand, timeout: float = DEFAULT_TIMEOUT) -> RemotingCommand:
        # The outer bound only guards against a wedged loop; the inner timeout is the real one.
        return self.loop_thread.run(self.client.invoke(addr, request, timeout),
                                    timeout + self.client.connect_timeout + 5.0)

    def invoke_oneway(self, addr: str, request: RemotingCommand) -> None:
        self.loop_thread.run(self.client.invoke_oneway(addr, request), self.client.connect_timeout + 5.0)
