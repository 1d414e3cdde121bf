"""Commit-log durability: fsyncs on demand for synchronous flush, a timer thread for asynchronous flush.

One fsync runs at a time (``flush``). ``wait_flushed(offset)`` returns once the
bytes below ``offset`` are durable: it fsyncs itself when nobody is fsyncing,
else waits for the fsync in progress and fsyncs again if that one did not cover
it. Many synchronous writer threads do not wait here one by one: the store's
puts go through group_commit.py, where one writer appends and fsyncs for all;
what waits here are single callers (``MessageStore.wait_durable``). The broker
waits on neither: background_flush.py fsyncs for its event loop and reports the
rounds here (``note_flushed``).
"""
from __future__ import annotations

import logging
import threading
import time

from sluice.errors import FlushDiskTimeoutError
from sluice.store.commitlog import CommitLog

log = logging.getLogger(__name__)


class FlushService:
    def __init__(self, commitlog: CommitLog, *, interval_ms: int, timeout_s: float) -> None:
        self.commitlog = commitlog
        self.interval_s = interval_ms / 1000.0
        self.timeout_s = timeout_s
        self.flushed_offset = commitlog.write_pos
        self.flush_time = 0  # store time (ms) of the newest record known durable
        self.fsyncs = 0
        self._cond = threading.Condition()  # one fsync at a time (writers, the async thread, flush())
        self._flushing = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def reset(self, offset: int) -> None:
        with self._cond:
            self.flushed_offset = offset

    # ---- synchronous -----------------------------------------------------------------------------
    def wait_flushed(self, offset: int) -> None:
        """Return once commit-log bytes below ``offset`` are durable; FlushDiskTimeoutError when that takes
        longer than the flush timeout."""
        deadline = time.monotonic() + self.timeout_s
        while self.flushed_offset < offset:
            with self._cond:
                while self._flushing and self.flushed_offset < offset:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise FlushDiskTimeoutError(f"commit log not flushed to {offset} within {self.timeout_s} s")
                    self._cond.wait(left)
                if self.flushed_offset >= offset:
                    return
                self._flushing = True
            self._flush_as_leader()

    def _flush_as_leader(self) -> None:
        try:
            self._do_flush()
        finally:
            with self._cond:
                self._flushing = False
                self._cond.notify_all()

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

    def note_flushed(self, offset: int, flush_time: int | None, fsyncs: int) -> None:
        """Record rounds run elsewhere (background_flush.py): bytes below ``offset`` are durable, the newest
        of them stored at ``flush_time``."""
        with self._cond:
            if offset > self.flushed_offset:
                self.flushed_offset = offset
                if flush_time is not None:
                    self.flush_time = flush_time
            self.fsyncs += fsyncs

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
