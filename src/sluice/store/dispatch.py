"""Dispatch (RocketMQ's ReputMessageService): follow the commit log, build consume queues and the key index.

A thread reads the commit log from ``reput_offset`` in chunks, parses each
record's header, topic and properties (no CRC: the records were just written,
or verified by recovery), and hands the batch to the registered dispatchers
first (e.g. the filter engine's bitmap calculator, which may replace
``tag_code``), then writes consume-queue units one numpy batch per queue, then
feeds the key index. Readers see a message once its unit is written.
"""
from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict
from collections.abc import Callable

from sluice.errors import CorruptRecordError, DiskFullError
from sluice.format import BLANK, CORRUPT, PARTIAL, RecordWalk, is_queued, tag_code
from sluice.protocol import properties as P
from sluice.store.commitlog import CommitLog
from sluice.store.consumequeue import ConsumeQueueTable
from sluice.store.dispatch_columns import (DispatchBatch, PutRun, ext_tags, index_requests, index_runs, unit_array,
                                          write_one_unit, write_units)
from sluice.store.ext_files import ExtTable
from sluice.store.index import IndexService
from sluice.store.types import Dispatcher, DispatchRequest

log = logging.getLogger(__name__)

#: while appends keep coming, the dispatch thread looks for more this often instead of being woken
BUSY_POLL_S = 0.001

__all__ = ["DispatchService", "is_queued", "BUSY_POLL_S"]  # is_queued: sluice.format's, kept importable here


class DispatchService:
    def __init__(self, commitlog: CommitLog, queues: ConsumeQueueTable, index: IndexService | None,
                 *, batch_bytes: int) -> None:
        self.commitlog = commitlog
        self.queues = queues
        self.index = index
        self.batch_bytes = batch_bytes
        self.reput_offset = 0
        self.dispatchers: list[Dispatcher] = []
        #: The store's ConsumeQueueExt table (set by MessageStore); None writes plain tag codes only.
        self.ext: ExtTable | None = None
        self.dispatched_messages = 0
        self.error: Exception | None = None
        #: Told when dispatch meets a full disk (MessageStore's DiskGuard.space_error: sends are refused).
        self.on_space_error: Callable[[Exception], object] | None = None
        self._space_backoff = 0.0
        #: How long the thread sleeps when nothing wakes it. An owner that dispatches itself after its own
        #: appends (drive_externally) keeps the thread only as a slow safety net.
        self.poll_s = 0.2
        self._cond = threading.Condition()
        self._run_lock = threading.Lock()  # one reput at a time (thread, catch-up, tests)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        #: Runs dispatched by ``reput(index_later=True)`` whose key-index entries are not built yet, in order.
        self._index_later: list[PutRun] = []

    def drive_externally(self, poll_s: float = 0.05) -> None:
        """The owner calls :meth:`reput` itself right after its appends (the broker does, on its event loop):
        appends stop waking the thread, which then only polls every ``poll_s`` for appends made elsewhere.

        In Python the thread brings no parallelism (dispatch holds the GIL), only a GIL hand-over and a
        futex wake per append: done on the appending thread, the same work costs less."""
        self.poll_s = poll_s
        self.commitlog.wake_dispatch = False

    def add_dispatcher(self, d: Dispatcher) -> None:
        # Copy on write: the dispatch thread iterates without a lock.
        self.dispatchers = self.dispatchers + [d]

    # ---- the work ----------------------------------------------------------------------------------
    def reput(self, *, index_later: bool = False) -> int:
        """Dispatch everything written so far; return how many records were dispatched.

        With ``index_later`` the key-index entries of the appenders' batches are left for :meth:`index_deferred`
        (the broker answers the sends and the pulls they wake first): units, ext units and dispatchers run as
        always, so readers see the messages once this returns. A key query, the next reput and the store's
        close build them first, so no query and no index file ever misses a dispatched message."""
        done = 0
        with self._run_lock:
            if self._index_later:
                self._index_pending()
            while True:
                batch, new_offset = self._read_batch(self.reput_offset)
                if new_offset == self.reput_offset:
                    break
                if batch:
                    self._dispatch(batch, index_later)
                    done += len(batch)
                with self._cond:
                    self.reput_offset = new_offset
                    self.dispatched_messages += len(batch)
                    self._cond.notify_all()
                if new_offset >= self.commitlog.write_pos:  # caught up: what _read_batch would find next
                    break
        return done

    def _read_batch(self, start: int) -> tuple[list[DispatchRequest] | DispatchBatch, int]:
        cl = self.commitlog
        if start >= cl.write_pos:
            return [], start
        if start in cl.pending:
            return self._from_pending(start)
        out, end = self._parse_batch(start)
        if cl.pending:
            # Batches registered while the table was full may now lie behind: forget them.
            for k in [k for k in list(cl.pending) if k < end]:
                cl.pending.pop(k, None)
        return out, end

    def _from_pending(self, start: int) -> tuple[DispatchBatch, int]:
        """The runs the appenders registered, as one columnar batch: no parsing of the records."""
        pending = self.commitlog.pending
        runs: list[PutRun] = []
        off = start
        n = 0
        while n < 8192:
            run = pending.pop(off, None)
            if run is None:
                break
            runs.append(run)
            n += len(run)
            off = run.end
        return DispatchBatch(runs), off

    def _parse_batch(self, start: int) -> tuple[list[DispatchRequest], int]:
        cl = self.commitlog
        if cl.queue.find(start) is None:
            # Below the oldest segment (retention ran ahead) or between segments: move to the next one.
            first = cl.queue.min_offset
            return [], first if start < first else start
        # This path replays the log (recovery, a pending table that overflowed): its pages are released once
        # copied, so a replay of a large log keeps memory bounded (appends dispatch from ``pending``).
        data, seg_end = cl.read_span(start, self.batch_bytes, release=True)
        walk = RecordWalk(data, check_crc=False, where="commitlog", file_offset=start, window=True)
        out = self._requests(walk)
        if walk.stop == PARTIAL and not out and walk.want:  # a record larger than one batch: read exactly it
            data = cl.read_span(start, walk.want, release=True)[0]
            walk = RecordWalk(data, check_crc=False, where="commitlog", file_offset=start, window=True)
            out = self._requests(walk)
        if walk.stop == BLANK:
            return out, seg_end
        if walk.stop == CORRUPT and not out:
            raise walk.error  # type: ignore[misc]
        if walk.pos == 0 and start < cl.write_pos:
            # Written data where no record starts: say so (dispatch.error, logged) instead of spinning silently.
            raise CorruptRecordError(f"no record at commit-log offset {start} below the write position "
                                     f"{cl.write_pos}", path="commitlog", offset=start)
        return out, start + walk.pos

    @staticmethod
    def _requests(walk: RecordWalk) -> list[DispatchRequest]:
        """One DispatchRequest per record of the walk (dispatch replaying the log, not the append path)."""
        decode, split, tags, keys, uniq = P.decode_properties, P.split_keys, P.TAGS, P.KEYS, P.UNIQ_KEY
        out: list[DispatchRequest] = []
        for rec in walk:
            props = decode(rec.properties)
            out.append(DispatchRequest(
                rec.topic, rec.queue_id, rec.queue_offset, rec.physical_offset, rec.total_size,
                tag_code(props.get(tags)), props, rec.store_timestamp, split(props.get(keys)), props.get(uniq),
                rec.sysflag))
        return out

    def index_deferred(self) -> None:
        """Build the key-index entries ``reput(index_later=True)`` left (nothing when none are left)."""
        if self._index_later:
            with self._run_lock:
                if self._index_later:
                    self._index_pending()

    def _index_pending(self) -> None:
        """Under the run lock: the deferred runs, in dispatch order; kept for a retry if the index fails."""
        runs = self._index_later
        if self.index is not None:
            index_runs(self.index, runs)
        self._index_later = []

    def _dispatch(self, batch: list[DispatchRequest] | DispatchBatch, index_later: bool = False) -> None:
        if isinstance(batch, DispatchBatch):
            self._dispatch_columns(batch, index_later)
            return
        for d in self.dispatchers:
            try:
                d.dispatch(batch)
            except Exception:  # a plug-in's failure must not stop the store (RocketMQ logs and goes on)
                log.exception("dispatcher %r failed", d)
        self._write_requests(batch)
        if self.index is not None:
            index_requests(self.index, batch)

    def _write_requests(self, batch: list[DispatchRequest]) -> None:
        if len(batch) == 1:  # one record (a live stream at a low rate): no grouping, no per-batch lists
            self.write_one(batch[0])
            return
        groups: dict[tuple[str, int], list[DispatchRequest]] = defaultdict(list)
        for r in batch:
            if is_queued(r.sysflag):
                groups[(r.topic, r.queue_id)].append(r)
        for (topic, qid), reqs in groups.items():
            self.write_queue(topic, qid, reqs)

    def _dispatch_columns(self, batch: DispatchBatch, index_later: bool = False) -> None:
        """A batch from the appenders, as columns (``Dispatcher.dispatch_batch``; a dispatcher that wants
        requests has them built once). Without requests, units and index come straight from the columns;
        with ``index_later`` the index entries wait for :meth:`index_deferred`."""
        for d in self.dispatchers:
            try:
                d.dispatch_batch(batch)
            except Exception:  # a plug-in's failure must not stop the store (RocketMQ logs and goes on)
                log.exception("dispatcher %r failed", d)
        if batch.materialised:  # dispatchers may have changed tag codes or set bitmaps: write those
            self._write_requests(batch.requests())
        else:
            write_units(self.queues, batch.runs, self.ext)
        if self.index is not None:
            if index_later:
                self._index_later += batch.runs
            else:
                index_runs(self.index, batch.runs)

    def write_queue(self, topic: str, qid: int, reqs: list[DispatchRequest]) -> None:
        """Write the consume-queue units of one queue's requests (in queue-offset order).

        A request with a ``bitmap`` gets a ConsumeQueueExt unit (tag code, store time, bitmap) and the
        unit's address goes in the tag-code slot (RocketMQ's putMessagePositionInfoWrapper); if the ext
        write fails the slot keeps the plain tag code and pulls evaluate that message directly.
        """
        cq = self.queues.get_or_create(topic, qid)
        tags = [r.tag_code for r in reqs]
        bitmaps = [r.bitmap for r in reqs]
        if self.ext is not None and bitmaps.count(None) < len(bitmaps):
            ext_tags(self.ext, topic, qid, tags, [r.store_timestamp for r in reqs], bitmaps, reqs[0].queue_offset)
        # column-wise (or packed, for a few): far cheaper than a list of tuples
        units = unit_array([r.commitlog_offset for r in reqs], [r.size for r in reqs], tags)
        first = reqs[0].queue_offset
        if reqs[-1].queue_offset - first == len(reqs) - 1:
            cq.put(first, units)
        else:  # not contiguous (should not happen): put runs one by one
            for i, r in enumerate(reqs):
                cq.put(r.queue_offset, units[i:i + 1])

    def write_one(self, r: DispatchRequest) -> None:
        """What :meth:`write_queue` writes for a one-request list (nothing for a record that gets no unit:
        a prepared or rolled-back transactional one), without its lists and numpy array."""
        if not is_queued(r.sysflag):
            return
        write_one_unit(self.queues, self.ext, r.topic, r.queue_id, r.queue_offset, r.commitlog_offset, r.size,
                       r.tag_code, r.store_timestamp, r.bitmap)

    # ---- waiting -----------------------------------------------------------------------------------
    def wait_for(self, offset: int, timeout: float) -> bool:
        """Block until everything below commit-log ``offset`` is dispatched; False on timeout."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self.reput_offset < offset:
                left = deadline - time.monotonic()
                if left <= 0 or self.error is not None:
                    return False
                self._cond.wait(left)
        return True

    # ---- the thread --------------------------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="sluice-store-dispatch", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        """Sleep on the append event while idle; while appends keep coming, poll every millisecond
        instead (RocketMQ's reput service does), so a stream of appends costs no wake-up each: the
        appender sets the event only while this thread is idle (``commitlog.dispatch_idle``)."""
        cl = self.commitlog
        appended = cl.appended
        busy = False
        while not self._stop.is_set():
            if busy:
                time.sleep(BUSY_POLL_S)
            else:
                cl.dispatch_idle = True
                if self.reput_offset >= cl.write_pos:  # checked after the flag: no append goes unseen
                    appended.wait(self.poll_s)
                cl.dispatch_idle = False
                appended.clear()
            if self._stop.is_set():
                break
            try:
                busy = self.reput() > 0
                self.error = None
                self._space_backoff = 0.0
            except DiskFullError as e:
                # No room for consume-queue, ext or index bytes: sends are refused meanwhile (the disk
                # guard logs, rate-limited); retry with back-off, from where dispatch stopped.
                busy = False
                if self.on_space_error is not None:
                    self.on_space_error(e)
                self._space_backoff = min(30.0, max(1.0, self._space_backoff * 2))
                with self._cond:
                    self.error = e
                    self._cond.notify_all()
                self._stop.wait(self._space_backoff)
            except CorruptRecordError as e:
                busy = False
                # Cannot step over a record whose size is untrustworthy; recovery or check must handle it.
                if self.error is None:
                    log.error("dispatch stopped at commit-log offset %d: %s", self.reput_offset, e)
                self._fail(e)
            except Exception as e:
                busy = False
                log.exception("dispatch failed at commit-log offset %d", self.reput_offset)
                self._fail(e)

    def _fail(self, e: Exception) -> None:
        with self._cond:
            self.error = e
            self._cond.notify_all()  # waiters give up now rather than at their timeout
        self._stop.wait(1.0)  # then retry: the cause may be transient

    def stop(self) -> None:
        self._stop.set()
        self.commitlog.appended.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
