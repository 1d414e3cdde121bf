"""Long polling (RocketMQ's PullRequestHoldService): pulls that found nothing wait for a message.

A held pull waits on a Future until one of:

* a message for its topic/queue at or past its offset is dispatched and passes
  its filter — the store's dispatch thread calls :meth:`HoldService.dispatch`
  (registered as a store dispatcher) and the wake-up crosses to the event loop
  with ``call_soon_threadsafe``;
* the periodic re-check (``check_interval_s``, RocketMQ: 5 s) sees the queue's
  max offset past the pull's offset (a safety net, e.g. for records replayed
  by recovery);
* its own timeout (the client's suspendTimeoutMillis) expires.

Dispatchers run *before* the consume-queue units are written, so a wake-up
carries the commit-log offset the waiter must let dispatch reach
(``store.dispatch.wait_for``) before it pulls again.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from sluice.broker.filtering import SelectorFilter
from sluice.filter.tagcode import tag_code
from sluice.protocol.properties import decode_properties
from sluice.store.dispatch_columns import DispatchBatch
from sluice.store.types import DispatchRequest

__all__ = ["HoldService", "TIMED_OUT"]

log = logging.getLogger(__name__)

Key = tuple[str, int]
#: ``hold()`` result when nothing arrived in time.
TIMED_OUT = -1


@dataclass(eq=False, slots=True)
class _Held:
    key: Key
    offset: int
    filter: SelectorFilter | None
    future: asyncio.Future[int] = field(repr=False)


class HoldService:
    def __init__(self, max_offset: Callable[[str, int], int], *, check_interval_s: float = 5.0) -> None:
        self._max_offset = max_offset
        self.check_interval_s = check_interval_s
        self._held: dict[Key, list[_Held]] = {}
        #: Snapshot of held keys, replaced (never mutated) so the dispatch thread reads it without a lock.
        self._watched: frozenset[Key] = frozenset()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None
        self.woken_by_arrival = 0
        self.woken_by_check = 0
        self.timed_out = 0

    # ---- lifecycle (event loop) --------------------------------------------------------------------
    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._task = self._loop.create_task(self._check_loop(), name="pull-hold-check")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        for waiters in list(self._held.values()):
            for h in waiters:
                if not h.future.done():
                    h.future.set_result(TIMED_OUT)

    @property
    def held_count(self) -> int:
        return sum(len(v) for v in self._held.values())

    # ---- holding (event loop) ----------------------------------------------------------------------
    async def hold(self, topic: str, queue_id: int, offset: int, message_filter: SelectorFilter | None,
                   timeout_s: float) -> int:
        """Wait for a message past ``offset``; returns the commit-log offset dispatch must reach, 0 when
        only a re-check noticed it, or TIMED_OUT."""
        loop = asyncio.get_running_loop()
        key = (topic, queue_id)
        h = _Held(key, offset, message_filter, loop.create_future())
        self._held.setdefault(key, []).append(h)
        self._watched = frozenset(self._held)
        try:
            # The queue may have grown between the pull and now (a send raced us): re-check first.
            if self._max_offset(topic, queue_id) > offset:
                self.woken_by_check += 1
                return 0
            try:
                async with asyncio.timeout(max(0.0, timeout_s)):
                    return await h.future
            except TimeoutError:
                self.timed_out += 1
                return TIMED_OUT
        finally:
            waiters = self._held.get(key)
            if waiters is not None:
                try:
                    waiters.remove(h)
                except ValueError:
                    pass
                if not waiters:
                    del self._held[key]
                    self._watched = frozenset(self._held)

    def _wake(self, h: _Held, value: int) -> None:
        if not h.future.done():
            h.future.set_result(value)

    def _arrived(self, hits: dict[Key, list[tuple[int, int, dict[str, str]]]], end: int) -> None:
        for key, msgs in hits.items():
            for h in list(self._held.get(key, ())):
                if h.future.done():
                    continue
                f = h.filter
                for qoff, tag, props in msgs:
                    if qoff >= h.offset and (f is None or f.match_dispatch(tag, props)):
                        self.woken_by_arrival += 1
                        self._wake(h, end)
                        break

    async def _check_loop(self) -> None:
        while True:
            await asyncio.sleep(self.check_interval_s)
            try:
                self.check_now()
            except Exception:
                log.exception("long-polling re-check failed")

    def check_now(self) -> None:
        """Wake every held pull whose queue now has messages past its offset (RocketMQ's periodic scan)."""
        for key, waiters in list(self._held.items()):
            newest = self._max_offset(*key)
            for h in list(waiters):
                if newest > h.offset and not h.future.done():
                    self.woken_by_check += 1
                    self._wake(h, 0)

    # ---- the store's dispatch thread (store.types.Dispatcher) --------------------------------------
    #: Wakes pulls only: a rebuilt queue's old records need not be seen again.
    rebuilds_bitmaps = False

    def dispatch(self, requests: list[DispatchRequest]) -> None:
        """Store dispatcher hook: runs on the dispatch thread, so it only hands work to the loop."""
        watched = self._watched
        loop = self._loop
        if not watched or loop is None or not requests:
            return
        hits: dict[Key, list[tuple[int, int, dict[str, str]]]] = {}
        for r in requests:
            key = (r.topic, r.queue_id)
            if key in watched:
                hits.setdefault(key, []).append((r.queue_offset, r.tag_code, r.properties))
        if hits:
            last = requests[-1]
            try:
                loop.call_soon_threadsafe(self._arrived, hits, last.commitlog_offset + last.size)
            except RuntimeError:  # the loop is closed: the broker is shutting down
                pass

    def dispatch_batch(self, batch: DispatchBatch) -> None:
        """Columnar store dispatcher hook: with no pull held on a queue of the batch nothing is built;
        otherwise only the held queues' records get a tag code and decoded properties (no DispatchRequest
        per message, a cost the broker would pay per sent message)."""
        watched = self._watched
        loop = self._loop
        if not watched or loop is None or not batch.runs:
            return
        if batch.materialised:  # requests exist already (another dispatcher asked): use them as they are
            self.dispatch(batch.requests())
            return
        hits: dict[Key, list[tuple[int, int, dict[str, str]]]] = {}
        for run in batch.runs:
            key = (run.topic, run.queue_id)
            if key in watched:
                hits.setdefault(key, []).extend(
                    (qoff, tag_code(tag), decode_properties(props))
                    for qoff, tag, props in zip(run.qoffs, run.tags, run.props))
        if hits:
            try:
                loop.call_soon_threadsafe(self._arrived, hits, batch.runs[-1].end)
            except RuntimeError:  # the loop is closed: the broker is shutting down
                pass

