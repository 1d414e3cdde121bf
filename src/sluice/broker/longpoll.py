"""Long polling (RocketMQ's PullRequestHoldService): pulls that found nothing wait for a message.

A held pull waits on a Future until one of:

* a message for its topic/queue at or past its offset is dispatched and passes
  its filter — dispatch calls :meth:`HoldService.dispatch` (registered as a
  store dispatcher); on the event loop (the broker dispatches there right after
  its appends) the pull is woken at once, from the store's dispatch thread the
  wake-up crosses to the loop with ``call_soon_threadsafe``;
* the periodic re-check (``check_interval_s``, RocketMQ: 5 s) sees the queue's
  max offset past the pull's offset (a safety net, e.g. for records replayed
  by recovery);
* its own timeout (the client's suspendTimeoutMillis) expires.

Dispatchers run *before* the consume-queue units are written, so a wake-up
carries the commit-log offset the waiter must let dispatch reach
(``store.dispatch.wait_for``) before it pulls again.

Held pulls are bounded per connection and in all. RocketMQ's ManyPullRequest
has no bound; over Sluice's, a pull is not held but answered PULL_NOT_FOUND at
once, which every client takes as "poll again" (no error, no back-off). A
woken pull leaves the structure at once, in O(1); a pull whose connection
closes leaves it when its handler task is cancelled.

Waking is budgeted: a burst of appends can match thousands of held pulls, and
each woken pull reads the store and answers on the loop. At most
``wakes_per_turn`` are woken per event-loop iteration; the rest wait in a FIFO
(already out of the structure, so the dispatch thread no longer sees them) and
are woken in the next iterations, so the loop polls its sockets between
slices and other clients' requests are read and answered meanwhile.

Two ways to hold: :meth:`HoldService.hold` (a coroutine awaiting a Future under
``asyncio.timeout``) and :meth:`HoldService.hold_then` (a plain callback, the
broker's pull path). A woken ``hold_then`` pull costs no future, task,
coroutine resume or timeout context: its callback runs from one ``call_soon``
batch in the next loop iteration (dispatchers run before the consume-queue
units exist, so not at once), inside one write batch so each connection's
answers leave in one write; its timeout is one ``call_at`` handle, cancelled
(O(1)) when it is woken; a connection's close (one ``on_close`` hook per
connection) hands its pulls ``CLOSED``.
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from sluice.broker.filtering import SelectorFilter
from sluice.filter.tagcode import tag_code
from sluice.protocol.properties import decode_properties
from sluice.store.dispatch_columns import DispatchBatch
from sluice.store.types import DispatchRequest
from sluice.transport.batching import begin_writes, end_writes

__all__ = ["HoldService", "TIMED_OUT", "FULL", "CLOSED", "HELD"]

log = logging.getLogger(__name__)

Key = tuple[str, int]
#: ``hold()`` result when nothing arrived in time.
TIMED_OUT = -1
#: ``hold()`` result, at once, when the connection or the broker holds as many pulls as allowed.
FULL = -2
#: ``hold_then()`` callback value when the pull's connection closed: nothing is to be answered.
CLOSED = -3
#: ``hold_then()`` result: held, its callback will be called once.
HELD = 1


@dataclass(eq=False, slots=True)
class _Held:
    key: Key
    offset: int
    filter: SelectorFilter | None
    owner: object
    #: What a wake-up sets: the coroutine's Future (hold) or the callback's _Later (hold_then).
    future: asyncio.Future[int] | _Later = field(repr=False)
    #: hold_then's ``read_from``: [the queue offset the pull's read may start from, past the units that arrived
    #: in order from ``offset`` and that its filter ruled out as they arrived; that offset again once the unit
    #: there woke the pull with a verdict the pull would give, else -1].
    read_from: list[int] | None = None


class _Later:
    """A ``hold_then`` pull's waiter, shaped like the Future the rest of the service sets (done, set_result)."""
    __slots__ = ("service", "held", "then", "timer", "fired")

    def __init__(self, service: HoldService, then: Callable[[int], None]) -> None:
        self.service = service
        self.then = then
        self.held: _Held | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.fired = False

    def done(self) -> bool:
        return self.fired

    def set_result(self, value: int) -> None:
        """Woken (or stopping): leave the counts now, run the callback in the next firing batch."""
        if self.fired:
            return
        self.service._settle(self)
        self.service._fire(self.then, value)

    def expire(self) -> None:
        """The timer: the pull's suspend timeout passed with nothing for it."""
        if self.fired:
            return
        service = self.service
        service.timed_out += 1
        service._remove(self.held)  # type: ignore[arg-type]
        self.timer = None
        self.set_result(TIMED_OUT)


class HoldService:
    """Held pulls by queue, each queue's in a dict (insertion-ordered, removal O(1)); counted per owner (the
    connection) and in all. A list per queue (remove scans it) and a frozenset of held queues rebuilt on
    every hold and release (for the dispatch thread) made releasing n pulls cost O(n^2)."""

    def __init__(self, max_offset: Callable[[str, int], int], *, check_interval_s: float = 5.0,
                 max_per_owner: int = 4096, max_total: int = 65_536, wakes_per_turn: int = 256) -> None:
        if wakes_per_turn < 1:
            raise ValueError(f"wakes_per_turn {wakes_per_turn} must be positive")
        self._max_offset = max_offset
        self.check_interval_s = check_interval_s
        self.max_per_owner = max_per_owner
        self.max_total = max_total
        self.wakes_per_turn = wakes_per_turn
        #: Matched pulls not woken yet (over this turn's budget), with their wake value, oldest first.
        self._to_wake: deque[tuple[_Held, int]] = deque()
        self._wakes_left = wakes_per_turn
        self._turn_scheduled = False
        #: Loop iterations in which the budget ran out with pulls still to wake (for tests and runtime info).
        self.wake_turns_deferred = 0
        #: Pulls waiting, by queue. The dispatch thread only tests ``key in self._held`` (atomic under the
        #: GIL); the loop alone changes it, and removes a queue's entry when its last pull goes.
        self._held: dict[Key, dict[_Held, None]] = {}
        self._count = 0
        self._per_owner: dict[object, int] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None
        self.woken_by_arrival = 0
        self.woken_by_check = 0
        self.timed_out = 0
        #: Pulls answered at once, unheld, because a limit was reached.
        self.refused_full = 0
        #: Held pulls taken out of the structure (for tests: releasing n pulls is n removals, no scans).
        self.removals = 0
        self._full_logged_at = 0.0
        #: hold_then pulls by owner (released when the owner closes), and the owners whose close is watched.
        self._later_by_owner: dict[object, dict[_Later, None]] = {}
        self._watched_owners: set[object] = set()
        #: hold_then callbacks to call in the next firing batch (one call_soon for all of them).
        self._firing: list[tuple[Callable[[int], None], int]] = []
        self._fire_scheduled = False

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
            for h in list(waiters):
                self._wake(h, TIMED_OUT)
        while self._to_wake:  # stopping: answer everyone now, no budget
            h, value = self._to_wake.popleft()
            if not h.future.done():
                h.future.set_result(value)
        self._fire_all()  # hold_then pulls are answered now, before the broker waits for requests in flight

    @property
    def held_count(self) -> int:
        """Pulls being held now (woken ones count until their coroutine has finished with the hold)."""
        return self._count

    def held_by(self, owner: object) -> int:
        return self._per_owner.get(owner, 0)

    # ---- holding (event loop) ----------------------------------------------------------------------
    async def hold(self, topic: str, queue_id: int, offset: int, message_filter: SelectorFilter | None,
                   timeout_s: float, owner: object = None) -> int:
        """Wait for a message past ``offset``; returns the commit-log offset dispatch must reach, 0 when
        only a re-check noticed it, TIMED_OUT, or FULL at once (unheld) when ``owner`` (the connection)
        or the broker holds as many pulls as allowed."""
        if not self._admit(owner):
            return FULL
        h = _Held((topic, queue_id), offset, message_filter, owner, asyncio.get_running_loop().create_future())
        self._enter(h)
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
        finally:  # also when cancelled: the connection closed (its handler tasks are cancelled)
            self._remove(h)
            self._leave(owner)

    def hold_then(self, topic: str, queue_id: int, offset: int, message_filter: SelectorFilter | None,
                  timeout_s: float, owner: object, then: Callable[[int], None], *,
                  read_from: list[int] | None = None) -> int:
        """:meth:`hold` without a coroutine: HELD, and later ``then`` is called once (on the loop) with what
        ``hold`` would return (or CLOSED when ``owner``'s connection closed first); FULL at once (not held)
        over the limits; 0 at once (not held) when the queue grew past ``offset`` already (pull again).
        ``owner`` needs ``on_close(callback)`` (a RemotingConnection).

        ``read_from`` (a two-item list, set to ``[offset, -1]``): while held, its first item moves past each
        unit that arrives next in order and that the filter rules out (``dispatch_verdict`` 0), so the woken
        pull reads from there: a sparse subscription's wake-up reads the unit that matched, not every unit
        since its last answer, each of which the arrival check evaluated already. Its second item becomes
        that queue offset when the unit there is the one that woke the pull, judged exactly as the pull would
        judge it (``dispatch_verdict`` 1)."""
        if not self._admit(owner):
            return FULL
        if self._max_offset(topic, queue_id) > offset:
            self.woken_by_check += 1
            return 0
        if read_from is not None:
            read_from[:] = (offset, -1)
        loop = self._loop or asyncio.get_running_loop()
        later = _Later(self, then)
        h = later.held = _Held((topic, queue_id), offset, message_filter, owner, later, read_from)
        self._enter(h)
        mine_later = self._later_by_owner.get(owner)
        if mine_later is None:
            mine_later = self._later_by_owner[owner] = {}
        mine_later[later] = None
        later.timer = loop.call_at(loop.time() + max(0.0, timeout_s), later.expire)
        if owner not in self._watched_owners:  # one hook per connection, kept until it closes
            self._watched_owners.add(owner)
            owner.on_close(self._owner_closed)  # type: ignore[attr-defined]  # at once if closed: CLOSED now
        return HELD

    def _settle(self, later: _Later) -> None:
        """A hold_then pull leaves the counts (it is out of the structure already, or taken out here)."""
        later.fired = True
        h = later.held
        assert h is not None
        self._remove(h)
        if later.timer is not None:
            later.timer.cancel()
            later.timer = None
        owner = h.owner
        self._leave(owner)
        mine = self._later_by_owner[owner]
        del mine[later]
        if not mine:
            del self._later_by_owner[owner]

    def _owner_closed(self, owner: object) -> None:
        self._watched_owners.discard(owner)
        for later in list(self._later_by_owner.get(owner, ())):
            self._settle(later)
            later.then(CLOSED)

    def _fire(self, then: Callable[[int], None], value: int) -> None:
        self._firing.append((then, value))
        if not self._fire_scheduled:
            self._fire_scheduled = True
            (self._loop or asyncio.get_running_loop()).call_soon(self._fire_all)

    def begin_fires(self) -> bool:
        """Hold back the callbacks of the pulls woken from now on until :meth:`end_fires` (the broker's appender
        dispatching on the loop: once its units are written they are answered at once, in this iteration,
        rather than by a loop callback in the next). False, changing nothing, when a firing is scheduled
        already: that one answers them."""
        if self._fire_scheduled:
            return False
        self._fire_scheduled = True
        return True

    def end_fires(self) -> None:
        """Answer the pulls woken since :meth:`begin_fires` (which returned True)."""
        self._fire_all()

    def _fire_all(self) -> None:
        """Call the woken pulls' callbacks, in one write batch: a connection's answers leave in one write, in
        this iteration."""
        self._fire_scheduled = False
        firing, self._firing = self._firing, []
        if not firing:
            return
        batch = begin_writes()
        try:
            for then, value in firing:
                try:
                    then(value)
                except Exception:  # a callback answers its own errors; this is a bug: log it, go on
                    log.exception("answering a held pull failed")
        finally:
            end_writes(batch)

    def _admit(self, owner: object) -> bool:
        """Whether one more pull may be held for ``owner`` (the connection) and in all; a refusal is counted
        and logged (rate-limited)."""
        mine = self._per_owner.get(owner, 0)
        if mine >= self.max_per_owner or self._count >= self.max_total:
            self.refused_full += 1
            self._log_full(owner, mine)
            return False
        return True

    def _enter(self, h: _Held) -> None:
        """Hold ``h``: in its queue's waiters (what a wake-up finds) and in the counts the limits read."""
        waiters = self._held.get(h.key)
        if waiters is None:
            waiters = self._held[h.key] = {}
        waiters[h] = None
        self._count += 1
        self._per_owner[h.owner] = self._per_owner.get(h.owner, 0) + 1

    def _leave(self, owner: object) -> None:
        """A held pull of ``owner`` left the counts (its waiters entry is gone already: _remove)."""
        self._count -= 1
        left = self._per_owner[owner] - 1
        if left:
            self._per_owner[owner] = left
        else:
            del self._per_owner[owner]

    def _remove(self, h: _Held) -> None:
        waiters = self._held.get(h.key)
        if waiters is not None and waiters.pop(h, 0) is None:
            self.removals += 1
            if not waiters:
                del self._held[h.key]

    def _log_full(self, owner: object, mine: int) -> None:
        now = time.monotonic()
        if now - self._full_logged_at >= 10.0:  # rate-limited: a client over the limit polls again at once
            self._full_logged_at = now
            log.warning("pull not held: %d held by %s (max_held_pulls_per_connection %d), %d in all "
                        "(max_held_pulls %d); answered PULL_NOT_FOUND at once (%d so far)",
                        mine, getattr(owner, "peer", owner), self.max_per_owner, self._count, self.max_total,
                        self.refused_full)

    def _wake(self, h: _Held, value: int) -> None:
        self._remove(h)
        if not h.future.done():
            h.future.set_result(value)

    def _queue_wake(self, h: _Held, value: int) -> None:
        """Take ``h`` out of the structure now and wake it within this turn's budget, or in a later turn."""
        self._remove(h)
        self._to_wake.append((h, value))

    def _drain(self) -> None:
        """Wake queued pulls up to what is left of this loop iteration's budget; a callback scheduled for the
        next iteration renews the budget (and goes on waking), so between two slices the loop polls I/O."""
        queue = self._to_wake
        left = self._wakes_left
        while queue and left:
            h, value = queue.popleft()
            if not h.future.done():  # a pull whose connection closed meanwhile costs nothing
                h.future.set_result(value)
                left -= 1
        self._wakes_left = left
        if left < self.wakes_per_turn and not self._turn_scheduled:
            if queue:
                self.wake_turns_deferred += 1
            self._turn_scheduled = True
            (self._loop or asyncio.get_running_loop()).call_soon(self._next_turn)

    def _next_turn(self) -> None:
        self._turn_scheduled = False
        self._wakes_left = self.wakes_per_turn
        if self._to_wake:
            self._drain()

    @property
    def waking(self) -> int:
        """Pulls matched but not woken yet (over the per-turn budget)."""
        return len(self._to_wake)

    def _arrived(self, hits: dict[Key, list[tuple[int, int, dict[str, str]]]], end: int) -> None:
        for key, msgs in hits.items():
            waiters = self._held.get(key)
            if not waiters:
                continue
            for h in list(waiters):
                f = h.filter
                read_from = h.read_from if f is not None else None
                for qoff, tag, props in msgs:
                    if qoff < h.offset:
                        continue
                    if f is None:
                        verdict = 1
                    elif read_from is None:
                        verdict = 1 if f.match_dispatch(tag, props) else 2
                    else:
                        verdict = f.dispatch_verdict(tag, props)
                    if verdict == 1 or verdict == 3:
                        if verdict == 1 and read_from is not None and qoff == read_from[0]:
                            read_from[1] = qoff  # judged as the pull would: it need not judge it again
                        self.woken_by_arrival += 1
                        self._queue_wake(h, end)
                        break
                    if verdict == 0 and read_from is not None and qoff == read_from[0]:
                        read_from[0] = qoff + 1  # ruled out: the woken pull need not read it again
        if self._to_wake:  # none queued: nothing to wake, and a used budget has its renewal scheduled already
            self._drain()

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
            for h in [h for h in waiters if newest > h.offset]:
                self.woken_by_check += 1
                self._queue_wake(h, 0)
        self._drain()

    # ---- the store's dispatch thread (store.types.Dispatcher) --------------------------------------
    #: Wakes pulls only: a rebuilt queue's old records need not be seen again.
    rebuilds_bitmaps = False

    def dispatch(self, requests: list[DispatchRequest]) -> None:
        """Store dispatcher hook: runs on the dispatch thread, so it only hands work to the loop."""
        watched = self._held
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
            self._hand_over(loop, hits, last.commitlog_offset + last.size)

    def dispatch_batch(self, batch: DispatchBatch) -> None:
        """Columnar store dispatcher hook: with no pull held on a queue of the batch nothing is built;
        otherwise only the held queues' records get a tag code and decoded properties (no DispatchRequest
        per message, a cost the broker would pay per sent message)."""
        watched = self._held
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
            self._hand_over(loop, hits, batch.runs[-1].end)

    def _hand_over(self, loop: asyncio.AbstractEventLoop, hits: dict[Key, list[tuple[int, int, dict[str, str]]]],
                   end: int) -> None:
        """Match the arrivals against the held pulls: at once when dispatch runs on the loop itself (the
        broker dispatches there after its appends), so a woken pull runs in the next iteration; from the
        store's dispatch thread through ``call_soon_threadsafe``."""
        if asyncio._get_running_loop() is loop:
            self._arrived(hits, end)
            return
        try:
            loop.call_soon_threadsafe(self._arrived, hits, end)
        except RuntimeError:  # the loop is closed: the broker is shutting down
            pass

