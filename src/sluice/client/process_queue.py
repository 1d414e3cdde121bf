"""ProcessQueue: the messages of one queue pulled but not yet consumed (RocketMQ's ProcessQueue).

It is the flow-control gauge (count, bytes, offset span) and the source of the
offset a queue may commit: the lowest offset still cached, so a slow message
holds progress back but is never skipped. Orderly queues move taken messages
to ``consuming`` and commit past them only on success. All access happens on
the consumer's event loop, so there is no lock.
"""
from __future__ import annotations

import asyncio
import time

from sluice.message import MessageExt

__all__ = ["ProcessQueue"]


class ProcessQueue:
    __slots__ = ("msgs", "consuming", "msg_count", "msg_size", "queue_offset_max", "dropped", "locked",
                 "last_lock_time", "last_pull_time", "last_consume_time", "arrived", "consume_lock", "busy", "room")

    def __init__(self) -> None:
        #: offset -> message, inserted in ascending offset order (pulls return ascending offsets).
        self.msgs: dict[int, MessageExt] = {}
        #: Orderly: taken by the listener, not yet committed.
        self.consuming: dict[int, MessageExt] = {}
        self.msg_count = 0
        self.msg_size = 0
        self.queue_offset_max = -1
        self.dropped = False
        #: Orderly: the broker lock is held (renewed within lock_max_live).
        self.locked = False
        self.last_lock_time = 0.0
        self.last_pull_time = time.monotonic()
        self.last_consume_time = time.monotonic()
        #: Set when messages arrive; an orderly consume task waits on it.
        self.arrived = asyncio.Event()
        #: Orderly: held while a batch is with the listener (a released queue waits for it).
        self.consume_lock = asyncio.Lock()
        #: Listener calls in flight for this queue.
        self.busy = 0
        #: Set when consumed messages leave the queue: a pull loop held back by flow control waits on it.
        self.room = asyncio.Event()

    # ------------------------------------------------------------------------------ gauges

    @property
    def max_span(self) -> int:
        if not self.msgs:
            return 0
        return next(reversed(self.msgs)) - next(iter(self.msgs))

    async def wait_for_room(self, timeout: float) -> None:
        """Flow control's pause: until consumed messages leave the queue, at most ``timeout`` seconds (RocketMQ
        waits the whole PULL_TIME_DELAY_MILLS_WHEN_FLOW_CONTROL; a queue that empties sooner is pulled sooner).
        The caller checks its thresholds again either way."""
        self.room.clear()
        try:
            await asyncio.wait_for(self.room.wait(), timeout)
        except TimeoutError:
            pass

    def lock_expired(self, max_live: float) -> bool:
        return time.monotonic() - self.last_lock_time > max_live

    # ------------------------------------------------------------------------------ changes

    def put(self, msgs: list[MessageExt]) -> list[MessageExt]:
        """Cache pulled messages; returns those not cached already (a re-pull after an offset reset)."""
        if msgs and not self.consuming:
            offs = [m.queue_offset for m in msgs]
            last = next(reversed(self.msgs)) if self.msgs else -1
            # The usual pull: ascending offsets past everything cached, so all are fresh and append in order.
            if offs[0] > last and offs[0] > self.queue_offset_max and offs == sorted(set(offs)):
                self.msgs.update(zip(offs, msgs))
                self.msg_size += sum(len(m.body) for m in msgs)
                self.msg_count += len(msgs)
                self.queue_offset_max = offs[-1]
                self.arrived.set()
                return msgs
        fresh = []
        for m in msgs:
            off = m.queue_offset
            if off in self.msgs or off in self.consuming:
                continue
            if self.msgs and off < next(reversed(self.msgs)):
                self._insert_sorted(off, m)
            else:
                self.msgs[off] = m
            fresh.append(m)
            self.msg_size += len(m.body)
            if off > self.queue_offset_max:
                self.queue_offset_max = off
        self.msg_count += len(fresh)
        if fresh:
            self.arrived.set()
        return fresh

    def _insert_sorted(self, off: int, m: MessageExt) -> None:
        items = sorted([*self.msgs.items(), (off, m)])
        self.msgs = dict(items)

    def remove(self, msgs: list[MessageExt]) -> int:
        """Forget consumed messages; returns the offset the queue may commit (-1: nothing cached ever)."""
        pop = self.msgs.pop
        gone = [m for m in msgs if pop(m.queue_offset, None) is not None]
        self.msg_count -= len(gone)
        self.msg_size -= sum(len(m.body) for m in gone)
        self.last_consume_time = time.monotonic()
        if gone:
            self.room.set()
        if self.msgs:
            return next(iter(self.msgs))
        return self.queue_offset_max + 1 if self.queue_offset_max >= 0 else -1

    # ------------------------------------------------------------------------------ orderly

    def take(self, n: int) -> list[MessageExt]:
        """The next ``n`` messages in offset order, moved to ``consuming``."""
        out = []
        while self.msgs and len(out) < n:
            off = next(iter(self.msgs))
            m = self.msgs.pop(off)
            self.consuming[off] = m
            out.append(m)
        if not self.msgs:
            self.arrived.clear()
        return out

    def commit(self) -> int:
        """The taken batch succeeded: the offset after it (or -1 when nothing was taken)."""
        if not self.consuming:
            return -1
        offset = max(self.consuming) + 1
        for m in self.consuming.values():
            self.msg_count -= 1
            self.msg_size -= len(m.body)
        self.consuming.clear()
        self.last_consume_time = time.monotonic()
        self.room.set()
        return offset

    def make_back_to_consume(self, msgs: list[MessageExt]) -> None:
        """The taken batch failed: back to the head of the queue, to be taken again."""
        for m in msgs:
            self.consuming.pop(m.queue_offset, None)
        self.msgs = dict(sorted([*self.msgs.items(), *((m.queue_offset, m) for m in msgs)]))
        if self.msgs:
            self.arrived.set()

    def clear(self) -> None:
        self.msgs.clear()
        self.consuming.clear()
        self.msg_count = self.msg_size = 0
