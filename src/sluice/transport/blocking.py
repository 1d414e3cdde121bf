"""Blocking facades over the one async implementation: an event loop in a background thread.

``LoopThread`` runs coroutines from synchronous code (CLI, admin, a sync SDK)
with ``run_coroutine_threadsafe``; ``SyncRemotingClient`` wraps RemotingClient
with it. Several facades may share one LoopThread.
"""
from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
import threading
from collections.abc import Coroutine
from typing import Any, Self, TypeVar

from sluice.errors import RemotingError, RemotingTimeoutError
from sluice.transport.client import DEFAULT_TIMEOUT, RemotingClient
from sluice.protocol.command import RemotingCommand

__all__ = ["LoopBoundClient", "LoopThread", "SyncRemotingClient"]

T = TypeVar("T")


class LoopThread:
    """A daemon thread running an asyncio loop until :meth:`stop`."""

    def __init__(self, name: str = "sluice-loop") -> None:
        self.loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self._thread.start()
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
        fut = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return fut.result(timeout)
        except TimeoutError:
            fut.cancel()
            raise RemotingTimeoutError(f"call did not finish within {timeout:g} s") from None

    def stop(self, timeout: float = 5.0) -> None:
        if self.running:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout)


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
