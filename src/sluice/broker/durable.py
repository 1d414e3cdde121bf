"""Replies that wait for the disk: the event loop asks for fsyncs and is woken once per fsync.

Under synchronous flush the Appender appends on the loop and hands the replies of each merge (a read) here with
the commit-log end they need durable. ``wait`` asks the store's BackgroundFlush
(store/background_flush.py) for a round at once, which a thread outside the GIL (the C extension's, when
built) starts right away, covering everything appended before it started, while the loop goes on. Its end
makes an eventfd the loop watches readable, and the loop answers every reply that round covered, in one
callback. RocketMQ's GroupCommitService (store/src/main/java/org/apache/rocketmq/store/CommitLog.java)
works the same way, with a Java thread.

Replies are confirmed only once an fsync that started after their append finished: an end is never
answered before a round asked for it or for a higher one reported success (or a flush of the store's own
did, ``FlushService.flushed_offset``). A failed round answers its replies with the error, even when a later
round succeeds (after a failed writeback Linux may report the next fsync clean without the lost pages).
"""
from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable
from typing import Generic, TypeVar

from sluice.store import MessageStore

__all__ = ["DurableWaiter"]

log = logging.getLogger(__name__)

T = TypeVar("T")


class DurableWaiter(Generic[T]):
    """``wait(end, item)`` on the loop; ``confirm(items, error)`` runs on the loop once ``end`` is durable
    (error None) or the round for it failed (a FlushDiskTimeoutError, RocketMQ's FLUSH_DISK_TIMEOUT)."""

    def __init__(self, store: MessageStore, loop: asyncio.AbstractEventLoop,
                 confirm: Callable[[list[T], BaseException | None], None]) -> None:
        self._loop = loop
        self._confirm = confirm
        self._pending: deque[tuple[int, T]] = deque()  # the loop's alone: (end, item), ends rising
        self._flush = store.background_flush()
        self._closed = False
        loop.add_reader(self._flush.fileno(), self._ready)

    @property
    def fsync_rounds(self) -> int:
        """Rounds run for this waiter so far (successful or not)."""
        return self._flush.rounds

    def wait(self, end: int, item: T) -> None:
        """Confirm ``item`` once commit-log bytes below ``end`` are durable (loop thread)."""
        self._pending.append((end, item))
        if not self._flush.request():  # durable already (a flush of the store's own covered it)
            self._settle(self._flush.durable, [])

    def close(self) -> None:
        """Stop the thread after it made durable what was asked; the replies it covered are confirmed on the
        loop (at once when called there, else in the loop's next iteration if it still runs)."""
        if self._closed:
            return
        self._closed = True
        self._flush.close()
        try:
            on_loop = asyncio.get_running_loop() is self._loop
        except RuntimeError:
            on_loop = False
        if on_loop:
            self._finish()
            return
        try:
            self._loop.call_soon_threadsafe(self._finish)
        except RuntimeError:  # the loop is closed: nobody is left to answer
            self._flush.release()

    def _finish(self) -> None:
        self._ready()
        self._loop.remove_reader(self._flush.fileno())
        self._flush.release()

    def _ready(self) -> None:
        durable, errors = self._flush.collect()
        self._settle(durable, errors)

    def _settle(self, durable: int, errors: list[tuple[int, BaseException]]) -> None:
        pending = self._pending
        # Ends rise with the appends; one that did not would wait for a later confirmation, never an early one.
        for upto, error in errors:
            failed: list[T] = []
            while pending and pending[0][0] <= upto:
                failed.append(pending.popleft()[1])
            self._deliver(failed, error)
        items: list[T] = []
        while pending and pending[0][0] <= durable:
            items.append(pending.popleft()[1])
        self._deliver(items, None)

    def _deliver(self, items: list[T], error: BaseException | None) -> None:
        if items:
            try:
                self._confirm(items, error)
            except Exception:  # one bad reply must not strand the others behind it
                log.exception("confirming durable appends failed")

