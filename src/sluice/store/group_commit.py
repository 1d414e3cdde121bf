"""Synchronous puts from many threads: one thread appends for all of them, then fsyncs for all of them.

Under ``flush_mode="sync"`` a put returns only once its bytes are durable. With
many writer threads each appending for itself, every put paid its own encode
and append under the GIL and two thread hand-offs (woken by the fsync leader,
then waiting for the GIL held by the writer woken before it): several times the
CPU per put of one writer without fsync (figures in docs/store.md).

So the writers only queue their batches. One of them, the leader, takes
everything queued, appends it (the batches of one topic and queue merged into
one encode, as the broker's Appender does), fsyncs once (the GIL is released
meanwhile, and the writers it released earlier queue their next puts), then
releases the writers it covered, one by one, each woken writer waking the next
(waking dozens at once only makes them fight for the GIL). It leads for a few
rounds while writers keep queueing, then hands the lead to the oldest waiting
writer. A woken writer has little left to do before it queues again, so the
hand-offs are short. An invalid batch fails alone: a merged append the store
refuses is redone batch by batch.

RocketMQ's GroupCommitService does the waiting part on a thread of its own;
here a writer leads, so a writer alone costs no thread switch.
"""
from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Sequence
from _thread import LockType as _LockType
from _thread import allocate_lock as _allocate_lock

from sluice.errors import FlushDiskTimeoutError, SluiceError
from sluice.store.flush import FlushService
from sluice.store.types import PutResult, StoreMessage

__all__ = ["GroupCommit"]

#: rounds (append + fsync + release) a leader runs while writers keep queueing, before handing the lead on
LEAD_ROUNDS = 8

Append = Callable[[Sequence[StoreMessage]], list[PutResult]]


class _Put:
    __slots__ = ("msgs", "lock", "results", "error", "lead", "taken", "gone")

    def __init__(self, msgs: Sequence[StoreMessage]) -> None:
        self.msgs = msgs
        self.lock: _LockType = _allocate_lock()
        self.lock.acquire()  # released when the put is done (or handed the lead)
        self.results: list[PutResult] | None = None
        self.error: BaseException | None = None
        self.lead = False  # its writer leads (and so is not woken with the others)
        self.taken = False  # a leader took it: it is appended, or failed
        self.gone = False  # its writer gave up waiting: the baton skips it


class GroupCommit:
    """``put(msgs)``: append ``msgs`` (one topic and queue) and return once they are durable."""

    def __init__(self, append: Append, flusher: FlushService, timeout_s: float) -> None:
        self._append = append  # MessageStore's append without waiting for durability
        self._flusher = flusher
        self._timeout_s = timeout_s
        self._mutex = threading.Lock()
        self._queue: list[_Put] = []
        self._leading = False
        self._baton: deque[_Put] = deque()  # covered puts not woken yet (each woken one wakes the next)
        self.rounds = 0

    def put(self, msgs: Sequence[StoreMessage]) -> list[PutResult]:
        req = _Put(msgs)
        with self._mutex:
            self._queue.append(req)
            lead = not self._leading
            if lead:
                self._leading = req.lead = True
        if lead:
            self._lead()
        elif req.lock.acquire(timeout=self._timeout_s):
            if req.lead:
                self._lead()
            else:
                self._pass_baton()
        else:
            self._timed_out(req)
        if req.error is not None:
            raise req.error
        return req.results  # type: ignore[return-value]

    # ---- leading -----------------------------------------------------------------------------------
    def _lead(self) -> None:
        try:
            for _ in range(LEAD_ROUNDS):
                with self._mutex:
                    batch, self._queue = self._queue, []
                if not batch:
                    break
                self._round(batch)
        finally:  # whatever happened, queued writers must get a leader
            self._hand_on()

    def _round(self, batch: list[_Put]) -> None:
        for req in batch:
            req.taken = True
        appended = self._append_all(batch)
        self.rounds += 1
        if appended:
            try:
                self._flusher.flush()
            except Exception as exc:  # every writer of the round learns it: stored, not confirmed durable
                for req in appended:
                    req.error = FlushDiskTimeoutError(f"commit log fsync failed: {exc}")
                    req.error.results = req.results  # type: ignore[attr-defined]
                    req.results = None
        self._release(batch)

    def _append_all(self, batch: list[_Put]) -> list[_Put]:
        """Append every queued put (one store call per topic and queue where they agree); the puts that
        got results."""
        groups: dict[tuple[str, int], list[_Put]] = {}
        for req in batch:
            m = req.msgs[0]
            groups.setdefault((m.topic, m.queue_id), []).append(req)
        done: list[_Put] = []
        for reqs in groups.values():
            if len(reqs) > 1:
                merged = [m for r in reqs for m in r.msgs]
                try:
                    results = self._append(merged)
                except SluiceError:
                    pass  # one batch is invalid: append them one by one below, so only it fails
                except BaseException as exc:  # noqa: BLE001 - the store could not append at all
                    for r in reqs:
                        r.error = exc
                    continue
                else:
                    pos = 0
                    for r in reqs:
                        r.results = results[pos:pos + len(r.msgs)]
                        pos += len(r.msgs)
                    done += reqs
                    continue
            for r in reqs:
                try:
                    r.results = self._append(r.msgs)
                    done.append(r)
                except BaseException as exc:  # noqa: BLE001 - delivered to the writer that sent it
                    r.error = exc
        return done

    def _release(self, batch: list[_Put]) -> None:
        """Wake the round's writers one after the other, each woken writer waking the next."""
        mine = [r for r in batch if not r.lead]  # (the leader's own put is not waiting)
        if not mine:
            return
        with self._mutex:
            self._baton.extend(mine)
        self._pass_baton()

    def _pass_baton(self) -> None:
        with self._mutex:
            while self._baton:
                req = self._baton.popleft()
                if not req.gone:
                    req.lock.release()
                    return

    def _hand_on(self) -> None:
        with self._mutex:
            if not self._queue:
                self._leading = False
                return
            nxt = self._queue[0]
            nxt.lead = True
        nxt.lock.release()

    # ---- a writer that waited too long -------------------------------------------------------------
    def _timed_out(self, req: _Put) -> None:
        with self._mutex:
            queued = not req.taken and req in self._queue
            if queued:
                self._queue.remove(req)
        if queued:
            # The leader is stuck (a stalled fsync): store the messages anyway, as RocketMQ's putMessage
            # does before it waits, and report them stored but not confirmed durable.
            try:
                results = self._append(req.msgs)
            except BaseException as exc:  # noqa: BLE001 - the writer's own error
                req.error = exc
                return
            req.error = FlushDiskTimeoutError(f"commit log not flushed within {self._timeout_s} s")
            req.error.results = results  # type: ignore[attr-defined]
            return
        # Taken by a leader: wait for its round to end (appended and flushed, or failed), bounded.
        if not req.lock.acquire(timeout=self._timeout_s):
            with self._mutex:
                woken = req.lock.acquire(blocking=False)  # released just now, after all?
                req.gone = not woken  # else a later baton would stop here, with nobody to pass it on
            if not woken:
                if req.error is None:
                    req.error = FlushDiskTimeoutError(f"commit log not flushed within {2 * self._timeout_s} s")
                    req.error.results = req.results  # type: ignore[attr-defined]  # stored, not confirmed
                    req.results = None
                return
        if req.lead:
            self._lead()
        else:
            self._pass_baton()
