"""Commit-log durability: group commit for synchronous flush, a timer thread for asynchronous flush.

Synchronous mode uses leader/follower group commit without a thread of its
own: a writer that needs its bytes durable and finds nobody flushing becomes
the leader, takes the write position and fsyncs everything below it; the
others register (offset, their own lock) and block. The leader releases the
writers its fsync covered and, while others still wait, fsyncs again (they
appended during its fsync, so N waiting writers cost about two fsyncs, not N),
then hands the lead to the oldest waiter. One writer alone just fsyncs: no
thread switch on its path.

Covered writers are woken one by one, each woken writer waking the next: a
shared condition would wake all of them at once (the ones not yet covered too)
and make them fight for its lock and the GIL, which with 64 writers cost more
CPU than the fsyncs. Before fsyncing again after releasing several writers,
the leader lets them append first (while the write position keeps moving, at
most GATHER_MAX_S), so one fsync covers most of them.
"""
from __future__ import annotations

import logging
import threading
import time
from collections import deque
from _thread import LockType as _LockType
from _thread import allocate_lock as _allocate_lock

from sluice.errors import FlushDiskTimeoutError
from sluice.store.commitlog import CommitLog

log = logging.getLogger(__name__)

#: group commit: how long to wait at most for released writers to append again, and how often to look
GATHER_MAX_S = 0.002
GATHER_STEP_S = 0.0001
#: fsyncs a leader does for others before handing the lead to a waiting writer
LEAD_ROUNDS = 8


class FlushService:
    def __init__(self, commitlog: CommitLog, *, interval_ms: int, timeout_s: float) -> None:
        self.commitlog = commitlog
        self.interval_s = interval_ms / 1000.0
        self.timeout_s = timeout_s
        self.flushed_offset = commitlog.write_pos
        self.flush_time = 0  # store time (ms) of the newest record known durable
        self.fsyncs = 0
        self._cond = threading.Condition()  # one fsync at a time (group thread, async thread, flush())
        self._flushing = False
        self._mutex = threading.Lock()  # guards _waiters
        self._waiters: list[list] = []  # [offset to be durable, lock the writer blocks on, handed the lead]
        self._leading = False  # a writer is leading group commit
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._released = 0  # writers the last group commit released
        self._baton: deque[_LockType] = deque()  # covered writers not woken yet (each wakes the next)

    def reset(self, offset: int) -> None:
        with self._cond:
            self.flushed_offset = offset

    # ---- synchronous (group commit) --------------------------------------------------------------
    def wait_flushed(self, offset: int) -> None:
        """Return once commit-log bytes below ``offset`` are durable."""
        if self.flushed_offset >= offset:
            return
        with self._mutex:
            if self.flushed_offset >= offset:
                return
            if not self._leading:
                self._leading = True
                entry = None
            else:
                entry = [offset, _allocate_lock(), False]  # offset, the lock it blocks on, "you lead now"
                entry[1].acquire()
                self._waiters.append(entry)
        if entry is None:
            self._lead()
            return
        if entry[1].acquire(timeout=self.timeout_s):
            if entry[2]:
                self._lead()
            else:
                self._pass_baton()
            return
        with self._mutex:
            if entry in self._waiters:
                self._waiters.remove(entry)
            handed = entry[2]
        if handed:  # the lead came just as we gave up: take it, or nobody flushes for the others
            self._lead()
        # Our lock may still be in the baton queue: nobody would pass it on from us, so release them all.
        while self._baton:
            self._pass_baton()
        if self.flushed_offset < offset:
            raise FlushDiskTimeoutError(f"commit log not flushed to {offset} within {self.timeout_s} s")

    def _lead(self) -> None:
        """Flush until nobody waits (at most LEAD_ROUNDS times), then hand the lead on or give it up."""
        try:
            for _ in range(LEAD_ROUNDS):
                if self._released > 1:
                    self._gather()
                self.flush()
                if not self._waiters:
                    break
        finally:  # whatever happened, the writers still waiting must get a leader
            self._hand_on()

    def _hand_on(self) -> None:
        with self._mutex:
            if not self._waiters:
                self._leading = False
                return
            nxt = self._waiters.pop(0)
            nxt[2] = True
        nxt[1].release()

    def _release_covered(self) -> None:
        flushed = self.flushed_offset
        with self._mutex:
            if not self._waiters:
                self._released = 0
                return
            covered = [e[1] for e in self._waiters if e[0] <= flushed]
            if covered:
                self._waiters = [e for e in self._waiters if e[0] > flushed]
        self._released = len(covered)
        # Wake them one after the other, each woken writer waking the next: released all at once, dozens
        # of threads would fight for the GIL (with 64 writers that cost more CPU than the fsyncs).
        self._baton.extend(covered)
        self._pass_baton()

    def _pass_baton(self) -> None:
        try:
            w = self._baton.popleft()
        except IndexError:
            return
        w.release()

    def _gather(self) -> None:
        """Several writers were just released: let them append again before the next fsync (while the
        write position keeps moving, up to GATHER_MAX_S), so one fsync covers most of them. Without this
        the next fsync starts at once and covers only the few that got the GIL first."""
        cl = self.commitlog
        deadline = time.monotonic() + GATHER_MAX_S
        pos = cl.write_pos
        while time.monotonic() < deadline:
            time.sleep(GATHER_STEP_S)
            now = cl.write_pos
            if now == pos:
                return
            pos = now

    def _flush_as_leader(self) -> None:
        try:
            self._do_flush()
        finally:
            with self._cond:
                self._flushing = False
                self._cond.notify_all()
        self._release_covered()

    def _do_flush(self) -> None:
        cl = self.commitlog
        target = cl.write_pos  # every byte below it is already copied into the mapping
        ts = cl.last_store_timestamp
        start = self.flushed_offset
        if target > start:
            with cl.queue.lock:
                cl.queue.sync(start, target)
            self.fsyncs += 1
        with self._cond:
            if target > self.flushed_offset:
                self.flushed_offset = target
                self.flush_time = ts

    def flush(self) -> None:
        """Flush everything written so far (the group and async threads, checkpoints, close)."""
        with self._cond:
            while self._flushing:
                self._cond.wait()
            self._flushing = True
        self._flush_as_leader()

    # ---- asynchronous ----------------------------------------------------------------------------
    def start_async(self) -> None:
        self._thread = threading.Thread(target=self._run, name="sluice-store-flush", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                if self.commitlog.write_pos > self.flushed_offset:
                    self.flush()
            except Exception:  # a flush failure must not kill the thread; it retries next tick
                log.exception("commit-log flush failed")

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
