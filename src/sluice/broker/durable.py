"""Replies that wait for the disk: one thread fsyncs for the event loop and confirms once per fsync.

Under synchronous flush the Appender appends on the loop and hands each loop iteration's replies here with
the commit-log end they need durable. The thread fsyncs up to the highest end asked for (the store's
FlushService: one fsync at a time, each covering everything appended before it starts) and then wakes the
loop once, which answers every reply that fsync covered. RocketMQ's GroupCommitService
(store/src/main/java/org/apache/rocketmq/store/CommitLog.java) works the same way. One long-lived thread
instead of a pool job per iteration: no job, future and thread hop per request group, and one loop wake-up
per fsync rather than one per iteration.

Replies are confirmed only once an fsync that started after their append finished: an end is never
answered before ``MessageStore.wait_durable`` returned for it or for a higher one.
"""
from __future__ import annotations

import asyncio
import logging
import threading
from collections import deque
from collections.abc import Callable
from typing import Generic, TypeVar

from sluice.store import MessageStore

__all__ = ["DurableWaiter"]

log = logging.getLogger(__name__)

T = TypeVar("T")


class DurableWaiter(Generic[T]):
    """``wait(end, item)`` on the loop; ``confirm(items, error)`` runs on the loop once ``end`` is durable
    (error None) or the wait for it failed (the store's FlushDiskTimeoutError, say)."""

    def __init__(self, store: MessageStore, loop: asyncio.AbstractEventLoop,
                 confirm: Callable[[list[T], BaseException | None], None]) -> None:
        self._store = store
        self._loop = loop
        self._confirm = confirm
        self._pending: deque[tuple[int, T]] = deque()  # the loop's alone: (end, item), ends rising
        self._cond = threading.Condition()
        self._want = 0  # the highest end asked for (under _cond)
        self._idle = False  # the thread waits for work (under _cond): only then is a notify needed
        self._stopping = False
        self.fsync_rounds = 0
        self._thread = threading.Thread(target=self._run, name="sluice-group-commit", daemon=True)
        self._thread.start()

    def wait(self, end: int, item: T) -> None:
        """Confirm ``item`` once commit-log bytes below ``end`` are durable (loop thread)."""
        self._pending.append((end, item))
        with self._cond:
            if end > self._want:
                self._want = end
                if self._idle:  # a busy thread reads _want when its fsync returns
                    self._cond.notify()

    def close(self) -> None:
        """Stop the thread after it made durable what was asked (replies still pending are confirmed on the
        loop if it still runs)."""
        with self._cond:
            self._stopping = True
            self._cond.notify()  # idle or not: it checks _stopping before it waits again
        self._thread.join()

    def _run(self) -> None:
        done = 0
        while True:
            with self._cond:
                while self._want <= done and not self._stopping:
                    self._idle = True
                    self._cond.wait()
                    self._idle = False
                if self._want <= done:
                    return  # stopping, nothing left to make durable
                want = self._want
            error: BaseException | None = None
            try:
                self._store.wait_durable(want)
            except BaseException as exc:  # the replies up to ``want`` get it; later ones start a new round
                error = exc
            done = want
            self.fsync_rounds += 1
            try:
                self._loop.call_soon_threadsafe(self._confirmed, want, error)
            except RuntimeError:  # the loop is closed: nobody is left to answer
                return

    def _confirmed(self, upto: int, error: BaseException | None) -> None:
        pending = self._pending
        items: list[T] = []
        # Ends rise with the appends; one that did not would wait for a later confirmation, never an early one.
        while pending and pending[0][0] <= upto:
            items.append(pending.popleft()[1])
        if items:
            try:
                self._confirm(items, error)
            except Exception:  # one bad reply must not strand the others behind it
                log.exception("confirming durable appends failed")
