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

A round that hangs (a disk or network filesystem that stops answering fdatasync) does not hold its replies:
one still waiting ``timeout_s`` after it was asked for (the store's ``sync_flush_timeout_s``, RocketMQ's
syncFlushTimeout, 5 s) is answered with FlushDiskTimeoutError, as RocketMQ's GroupCommitRequest answers
FLUSH_DISK_TIMEOUT when its wait runs out; the message is stored, its durability unconfirmed. Each
such reply leaves the waiter then, so the waits of a hung disk do not pile up in memory, and a round
that ends later confirms only the replies still waiting.
"""
from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable
from typing import Generic, TypeVar

from sluice.errors import FlushDiskTimeoutError
from sluice.ratelog import RateLimitedLog
from sluice.store import MessageStore

__all__ = ["DurableWaiter"]

log = logging.getLogger(__name__)

T = TypeVar("T")


class DurableWaiter(Generic[T]):
    """``wait(end, item)`` on the loop; ``confirm(items, error)`` runs on the loop once ``end`` is durable
    (error None) or the round for it failed (a FlushDiskTimeoutError, RocketMQ's FLUSH_DISK_TIMEOUT)."""

    def __init__(self, store: MessageStore, loop: asyncio.AbstractEventLoop,
                 confirm: Callable[[list[T], BaseException | None], None], *,
                 timeout_s: float | None = None) -> None:
        self._loop = loop
        self._confirm = confirm
        self.timeout_s = store.config.sync_flush_timeout_s if timeout_s is None else timeout_s
        if not self.timeout_s > 0:
            raise ValueError(f"timeout_s {self.timeout_s} must be positive")
        # The loop's alone: (end, item, deadline), ends and deadlines rising.
        self._pending: deque[tuple[int, T, float]] = deque()
        self._timer: asyncio.TimerHandle | None = None  # armed while anything waits
        #: Replies answered FLUSH_DISK_TIMEOUT because no round confirmed them in time, so far.
        self.timed_out = 0
        self._timeouts_log = RateLimitedLog(log)
        self._flush = store.background_flush()
        self._closed = False
        loop.add_reader(self._flush.fileno(), self._ready)

    @property
    def fsync_rounds(self) -> int:
        """Rounds run for this waiter so far (successful or not)."""
        return self._flush.rounds

    def wait(self, end: int, item: T) -> None:
        """Confirm ``item`` once commit-log bytes below ``end`` are durable (loop thread)."""
        deadline = self._loop.time() + self.timeout_s
        self._pending.append((end, item, deadline))
        if self._timer is None:
            self._timer = self._loop.call_at(deadline, self._expire)
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
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._loop.remove_reader(self._flush.fileno())
        self._flush.release()

    def _expire(self) -> None:
        """Answer the replies whose wait ran out; re-arm for the next one (no timer per reply: one at a time,
        at most fifty wake-ups per timeout while a disk hangs)."""
        self._timer = None
        pending, now = self._pending, self._loop.time()
        late: list[T] = []
        while pending and pending[0][2] <= now:
            late.append(pending.popleft()[1])
        if late:
            self.timed_out += len(late)
            self._timeouts_log.log(logging.ERROR, "%d synchronous-flush replies not confirmed durable within %g s "
                                   "(an fsync round hangs; %d answered so far): answered FLUSH_DISK_TIMEOUT",
                                   len(late), self.timeout_s, self.timed_out)
            self._deliver(late, FlushDiskTimeoutError(
                f"the message was stored but not confirmed durable within {self.timeout_s:g} s "
                "(the broker's fsync did not finish: sync_flush_timeout_s)"))
        if pending and not self._closed:
            self._timer = self._loop.call_at(max(pending[0][2], now + self.timeout_s / 50), self._expire)

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
        # The timer stays armed when nothing waits: it finds nothing and stops (no cancel per round).

    def _deliver(self, items: list[T], error: BaseException | None) -> None:
        if items:
            try:
                self._confirm(items, error)
            except Exception:  # one bad reply must not strand the others behind it
                log.exception("confirming durable appends failed")

