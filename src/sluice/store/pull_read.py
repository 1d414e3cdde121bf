"""The pull read path: a queue's records from an offset, filtered, as the raw stored records.

RocketMQ's DefaultMessageStore.getMessage
(store/src/main/java/org/apache/rocketmq/store/DefaultMessageStore.java).
Units are read from the consume queue in one slice; the filter decides on their tag codes or bitmaps alone
where it can (no commit-log read), and only the records left are read. Where
no record needs evaluating, C (speedups.gather_units) copies and checks runs
of records at a time. Where records need evaluating on a few properties (a
SQL92 selector, MessageFilter.record_keys), C (speedups.scan_records) reads
their values and the filter judges each distinct combination once; otherwise
a Python loop reads, checks and evaluates them one by one. All give the same
GetMessageResult (tests/store/test_pull_read.py, tests/store/test_pull_scan.py).
"""
from __future__ import annotations

import logging
import struct
import time

import numpy as np

from sluice.errors import CorruptRecordError
from sluice.format import crc32
from sluice.protocol import properties as P
from sluice.speedups import C
from sluice.store.commitlog import CommitLog, parse_record, verify_record_bytes
from sluice.store.config import PULL_BODY_CEILING, StoreConfig
from sluice.store.consumequeue import CQ_DTYPE, CQ_UNIT_SIZE, PAD_SIZE, ConsumeQueue, ConsumeQueueTable
from sluice.store.consumequeue_ext import SMALL_BATCH
from sluice.store.ext_files import ExtTable, resolve_units
from sluice.store.types import GetMessageResult, GetMessageStatus, MessageFilter

__all__ = ["MAX_VERDICTS", "PullReader", "locate", "verdict_cache"]

log = logging.getLogger("sluice.store.message_store")

#: A consume-queue unit's commit-log offset and size (big-endian, as stored; its tag code follows).
_UNIT_HEAD = struct.Struct(">qi")

_S = GetMessageStatus


#: Value combinations a verdict cache holds before it is emptied (a selector over ever-new values).
MAX_VERDICTS = 65_536
#: Property names C reads for one filter (speedups.scan_records); a filter naming more is evaluated per record.
MAX_RECORD_KEYS = 64


def verdict_cache() -> object | None:
    """A new cache for MessageFilter.record_verdicts (C's speedups.verdict_cache, at most MAX_VERDICTS
    combinations), or None without the C extension: pulls then evaluate record by record."""
    return C.verdict_cache(MAX_VERDICTS) if C is not None else None


def locate(cl: CommitLog, e: CorruptRecordError, commitlog_offset: int) -> CorruptRecordError:
    """The same complaint naming the segment file and the offset in it (looked up only on failure)."""
    f = cl.queue.find(commitlog_offset)
    msg = str(e).split(" (")[0]
    if f is None:
        return CorruptRecordError(msg, path="commitlog", offset=commitlog_offset)
    return CorruptRecordError(msg, path=str(f.path), offset=commitlog_offset - f.start)


class PullReader:
    """The store's pulls, over its commit log, consume queues and ext files; counts what pulls read."""

    def __init__(self, commitlog: CommitLog, queues: ConsumeQueueTable, ext: ExtTable, config: StoreConfig) -> None:
        self.commitlog = commitlog
        self.queues = queues
        self.ext = ext
        self.config = config
        #: Commit-log records read by pulls (served or evaluated and filtered out), and their bytes.
        self.records_read = 0
        self.bytes_read = 0

    def get_messages(self, topic: str, queue_id: int, offset: int, max_msgs: int,
                     message_filter: MessageFilter | None, max_bytes: int | None,
                     scan_units: int = 0) -> GetMessageResult:
        """A pull: up to ``max_msgs`` records from queue ``offset`` that pass ``message_filter``, up to
        ``max_bytes`` (None: max_transfer_bytes) but never past PULL_BODY_CEILING, so an answer always fits a
        frame; the first record is always served (RocketMQ's DefaultMessageStore.isTheBatchFull). The broker
        caps both by its settings first (broker/pull.py). A filtered pull's first window is
        ``scan_units`` units when that is more than max_filter_scan_bytes' (at most max_filter_scan_units):
        the caller's consumer has room for that span of queue offsets."""
        c = self.config
        max_msgs = max(1, max_msgs)
        if max_bytes is None or max_bytes <= 0:
            max_bytes = c.max_transfer_bytes
        max_bytes = min(max_bytes, PULL_BODY_CEILING)
        cq = self.queues.get(topic, queue_id)
        if cq is None:
            return GetMessageResult(_S.NO_MATCHED_LOGIC_QUEUE, 0, 0, 0)
        lo, hi = cq.min_offset, cq.max_offset
        if hi == 0:
            return GetMessageResult(_S.NO_MESSAGE_IN_QUEUE, 0, lo, hi)
        if offset < lo:
            return GetMessageResult(_S.OFFSET_TOO_SMALL, lo, lo, hi)
        if offset == hi:
            return GetMessageResult(_S.OFFSET_OVERFLOW_ONE, offset, lo, hi)
        if offset > hi:
            return GetMessageResult(_S.OFFSET_OVERFLOW_BADLY, lo if lo == 0 else hi, lo, hi)
        if max_msgs == 1 and message_filter is None and C is not None:
            one = self._one(cq, offset, max_bytes, lo, hi)
            if one is not None:
                return one
        # The filter may bound the records one pull evaluates (MessageFilter.max_evaluations): the pull
        # stops before the first record over it and goes on from there next time.
        budget = [(message_filter.max_evaluations if message_filter is not None else 0) or -1]
        # Like RocketMQ, a filtered pull looks at a bounded number of units (maxFilterMessageSize).
        scan = max(max_msgs, c.max_filter_scan_bytes // CQ_UNIT_SIZE, min(scan_units, c.max_filter_scan_units)) \
            if message_filter else max_msgs
        units = cq.get_units(offset, scan)
        if units is None or len(units) == 0:
            upf = self.config.consumequeue_units_per_file
            return GetMessageResult(_S.OFFSET_FOUND_NULL, (offset // upf + 1) * upf, lo, hi)
        res = self._collect(cq, offset, units, max_msgs, max_bytes, message_filter, lo, hi, budget)
        if message_filter is None or res.status is not _S.NO_MATCHED_MESSAGE:
            return res
        # Nothing matched in the first window. While units are being ruled out on their tag codes or
        # bitmaps alone (few records read), look further: a 0.1 % filter then needs a round trip per
        # tens of thousands of units instead of per 800. Bounded in units and time.
        deadline = time.monotonic() + c.max_filter_scan_ms / 1000.0
        scanned, reads = res.next_begin_offset - offset, res.records_read
        while (res.status is _S.NO_MATCHED_MESSAGE and res.next_begin_offset < cq.max_offset
               and scanned < c.max_filter_scan_units and reads * 8 < scanned and budget[0] != 0
               and time.monotonic() < deadline):
            at = res.next_begin_offset
            units = cq.get_units(at, min(scan * 8, c.max_filter_scan_units - scanned))
            if units is None or len(units) == 0:
                break
            more = self._collect(cq, at, units, max_msgs, max_bytes, message_filter, lo, hi, budget)
            scanned += more.next_begin_offset - at
            reads += more.records_read
            if more.status is _S.MESSAGE_WAS_REMOVING:
                more.status = _S.NO_MATCHED_MESSAGE
            res = more
        res.records_read = reads
        return res

    def _collect(self, cq: ConsumeQueue, offset: int, units: np.ndarray, max_msgs: int,
                 max_bytes: int, mf: MessageFilter | None, lo: int, hi: int,
                 budget: list[int] | None = None) -> GetMessageResult:
        """One window of units: decide what the units alone can, then read (and evaluate) the records;
        ``budget[0]`` is the evaluations left to the pull (-1: no bound), spent here."""
        res = GetMessageResult(_S.FOUND, offset, lo, hi)
        if mf is None and C is not None:  # the usual pull: no numpy work on the units at all
            parts, stop_at, removed = self._gather_runs(cq, offset, units, None, max_msgs, max_bytes, res)
            return _result(res, offset, stop_at, parts, False, removed)
        phys, sizes = units["offset"], units["size"]  # views: read as scalars (int()) where used
        # A few units (a woken held pull's window): the masks are lists of Python bools, since numpy's fixed
        # costs per step would outweigh the work; the same outcome (tests/store/test_pull_few.py).
        few = len(units) <= SMALL_BATCH
        real: np.ndarray | list[bool]
        if few:
            real = [s > 0 and s != PAD_SIZE for s in sizes.tolist()]
        else:
            real = (sizes > 0) & (sizes != PAD_SIZE)
        wanted = real
        check = None  # units whose record the filter must see
        if mf is not None:
            if mf.needs_units:
                codes, batch, unresolved = resolve_units(self.ext.get(cq.topic, cq.queue_id), units["tag"])
            else:  # the filter decides without the units' ext rows: none are read
                codes, batch, unresolved = units["tag"], None, None
            mask, check = mf.select_units(codes, batch, unresolved)
            if mask is not None:
                if few:
                    wanted = [r and m for r, m in zip(real, np.asarray(mask, dtype=bool).tolist())]
                else:
                    wanted = real & np.asarray(mask, dtype=bool)
        if wanted is real:
            filtered = False
        elif few:
            filtered = any(r and not w for r, w in zip(real, wanted))
        else:
            filtered = bool((real & ~wanted).any())  # type: ignore[operator]
        if check is None and C is not None:
            # No record needs evaluating: C copies (and checks) runs of the wanted records at a time.
            parts, stop_at, removed = self._gather_runs(cq, offset, units, wanted, max_msgs, max_bytes, res)
        elif check is not None and C is not None and mf is not None and mf.record_keys is not None \
                and len(mf.record_keys) <= MAX_RECORD_KEYS and mf.record_verdicts is not None:
            # Records to evaluate on a few properties: C reads their values and judges each distinct
            # combination once (MessageFilter.record_keys), so no Python step per record.
            parts, stop_at, removed, evaluated_out = self._scan_each(cq, offset, units, phys, sizes, wanted,
                                                                     check, max_msgs, max_bytes, mf, res, budget)
            filtered = filtered or evaluated_out
        else:
            parts, stop_at, removed, evaluated_out = self._read_each(cq, offset, len(units), phys, sizes,
                                                                     np.flatnonzero(np.asarray(wanted)), max_msgs,
                                                                     max_bytes, mf, check, res, budget)
            filtered = filtered or evaluated_out
        if mf is not None:
            mf.consumed(stop_at)
        return _result(res, offset, stop_at, parts, filtered, removed)

    def _one(self, cq: ConsumeQueue, offset: int, max_bytes: int, lo: int, hi: int) -> GetMessageResult | None:
        """An unfiltered read of one record (a woken held pull's unit, judged as it arrived) without numpy:
        the unit's bytes straight to C (speedups.gather_units, as _gather_runs calls it); None, having
        changed nothing, for anything but a plain record found whole in its file (the caller takes the
        general road, which says what is wrong)."""
        raw = cq.unit_bytes(offset)
        if raw is None:
            return None
        p, s = _UNIT_HEAD.unpack_from(raw)
        cl = self.commitlog
        if s <= 0 or s == PAD_SIZE or p < cl.min_offset:
            return None
        f = cl.queue.find(p)
        if f is None:
            return None
        res = GetMessageResult(_S.FOUND, offset, lo, hi)
        try:
            data, _, why = C.gather_units(  # type: ignore[union-attr]
                raw, 0, f.mm, f.start, min(f.end, cl.write_pos), 1, max_bytes, 0, 0,
                self.config.verify_crc_on_read, crc32, offset, res.queue_offsets, res.commitlog_offsets,
                res.sizes, None)
        except ValueError:  # closed by retention meanwhile
            return None
        if why > 1 or not data:
            return None
        res.records_read = 1
        self.records_read += 1
        self.bytes_read += len(data)
        return _result(res, offset, 1, [data], False, False)

    def _gather_runs(self, cq: ConsumeQueue, offset: int, units: np.ndarray,
                     wanted: np.ndarray | list[bool] | None,
                     max_msgs: int, max_bytes: int, res: GetMessageResult) -> tuple[list[bytes], int, bool]:
        """_read_each's outcome for records no filter needs to see (all of them, or the ``wanted`` units): C
        (speedups.gather_units) walks the units and copies and checks the records, one call per commit-log
        file they are in. Returns the runs' bytes, the unit (relative) to go on from, and whether a record
        was gone from the log; fills ``res``'s per-record lists and counters."""
        cl = self.commitlog
        clog_min = cl.min_offset
        verify = self.config.verify_crc_on_read
        qoffs, phys, sizes = res.queue_offsets, res.commitlog_offsets, res.sizes
        parts: list[bytes] = []
        removed = False
        if units.dtype != CQ_DTYPE or not units.flags.c_contiguous:  # C reads the big-endian 20-byte units
            units = np.ascontiguousarray(units, dtype=CQ_DTYPE)  # (np.concatenate of several files' gives native)
        if wanted is None:
            mask = None
        elif isinstance(wanted, list):  # _collect's few units: a byte per unit, as the array's
            mask = bytes(wanted)
        else:
            mask = np.ascontiguousarray(wanted, dtype=np.uint8)
        n = len(units)
        stop_at = n
        u = total = 0
        f = cl.queue.find(int(units[0]["offset"]))
        while u < n:
            try:
                data, stop, why = C.gather_units(  # type: ignore[union-attr]
                    units, u, f.mm if f is not None else b"", f.start if f is not None else 0,
                    min(f.end, cl.write_pos) if f is not None else 0, max_msgs, max_bytes, total, len(sizes), verify,
                    crc32, offset, qoffs, phys, sizes, mask)
            except ValueError:
                if f is None or not f.closed:
                    raise
                data, stop, why = b"", u, 3  # the mapping was closed by retention meanwhile
            if data:
                parts.append(data)
                total += len(data)
            if why == 0 or why == 1:
                break
            if why == 2:
                stop_at = stop
                break
            p, s = int(units[stop]["offset"]), int(units[stop]["size"])
            if why == 3:  # not in that file: in the next one (the loop goes on there), or gone
                g = self._file_after(f, p, s, clog_min)
                if g is None:
                    removed = True
                    u = stop + 1
                else:
                    f, u = g, stop
                continue
            self._damaged(cq, res, offset + stop, p, s, first=not parts)  # why == 4
            stop_at = stop
            break
        taken = len(sizes)
        if taken >= max_msgs:  # like RocketMQ: resume right after the last message taken
            stop_at = qoffs[-1] - offset + 1
        res.records_read += taken
        self.records_read += taken
        self.bytes_read += total
        return parts, stop_at, removed

    def _file_after(self, f, p: int, s: int, clog_min: int):  # type: ignore[no-untyped-def]
        """The commit-log file holding a record that was not in ``f``; None when the record is gone."""
        cl = self.commitlog
        g = cl.queue.find(p) if p >= clog_min else None
        if g is None or g is f or p + s > min(g.end, cl.write_pos) or (f is not None and f.closed):
            return None
        return g

    def _damaged(self, cq: ConsumeQueue, res: GetMessageResult, qoff: int, p: int, s: int, *,
                 first: bool) -> None:
        """A record the C check refused: counted as read, logged with the precise complaint (the Python
        check names the fault, located in its file), raised when it comes first in the pull."""
        res.records_read += 1
        self.records_read += 1
        self.bytes_read += s
        try:
            verify_record_bytes(self.commitlog.read(p, s) or b"", p)
            e = CorruptRecordError(f"record at commit-log offset {p} failed its checks", path="commitlog", offset=p)
        except CorruptRecordError as exc:
            e = exc
        e = locate(self.commitlog, e, p)
        log.error("not serving %s/%d offset %d: %s", cq.topic, cq.queue_id, qoff, e)
        if first:
            raise e

    def _scan_each(self, cq: ConsumeQueue, offset: int, units: np.ndarray, phys: np.ndarray, sizes: np.ndarray,
                   wanted: np.ndarray | list[bool], check: np.ndarray, max_msgs: int, max_bytes: int,
                   mf: MessageFilter,
                   res: GetMessageResult, budget: list[int] | None) -> tuple[list[bytes], int, bool, bool]:
        """_read_each's outcome through C (speedups.scan_records), one call per commit-log file; a record
        C leaves alone (not in the file, damaged, of an unusual shape) takes _read_each's step for it."""
        cl = self.commitlog
        clog_min = cl.min_offset
        verify = self.config.verify_crc_on_read
        if units.dtype != CQ_DTYPE or not units.flags.c_contiguous:  # C reads the big-endian 20-byte units
            units = np.ascontiguousarray(units, dtype=CQ_DTYPE)
        n = len(units)
        idxs: np.ndarray | list[int]
        if isinstance(wanted, list):  # _collect's few units: lists and bytes, no numpy steps
            idxs = [i for i, w in enumerate(wanted) if w]
            wmask = bytes(wanted)
            cmask = np.asarray(check, dtype=bool).tobytes()
        else:
            idxs = np.flatnonzero(wanted)
            wmask = np.ascontiguousarray(wanted, dtype=np.uint8)
            cmask = np.ascontiguousarray(check, dtype=np.uint8)
        ev_idx = np.empty(n, dtype=np.int32)
        ev_code = np.empty(n, dtype=np.int32)
        keys, verdicts, judge = mf.record_keys, mf.record_verdicts, mf.judge
        qoffs, physl, sizesl = res.queue_offsets, res.commitlog_offsets, res.sizes
        parts: list[bytes] = []
        removed = filtered = False
        total = 0
        left = -1 if budget is None else budget[0]
        stop_at = n
        u = int(idxs[0]) if len(idxs) else n
        f = None
        while u < n:
            p = int(phys[u])
            if f is None or not f.start <= p < f.end:
                f = cl.queue.find(p)
            why, stop = 3, u
            if f is not None:
                try:
                    data, stop, why, left, out, n_ev, n_read, n_bytes = C.scan_records(  # type: ignore[union-attr]
                        units, u, wmask, cmask, f.mm, f.start, min(f.end, cl.write_pos), clog_min, max_msgs,
                        max_bytes, len(sizesl), total, left, verify, crc32, offset, qoffs, physl, sizesl, keys,
                        verdicts, judge, ev_idx, ev_code)
                except ValueError:
                    if not f.closed:
                        raise
                    why, stop = 3, u  # the mapping was closed by retention meanwhile
                else:
                    if n_ev:
                        mf.settle(ev_idx[:n_ev], ev_code[:n_ev])
                    if data:
                        parts.append(data)
                        total += len(data)
                    filtered = filtered or out
                    res.records_read += n_read
                    self.records_read += n_read
                    self.bytes_read += n_bytes
            if why == 0:
                break
            if why in (1, 2, 6):
                stop_at = stop
                break
            if budget is not None:  # 3, 4, 5: the Python step for that one record
                budget[0] = left
            idxs = np.asarray(idxs)
            _, at, gone, out = self._read_each(cq, offset, n, phys, sizes, idxs[idxs == stop], max_msgs,
                                               max_bytes, mf, check, res, budget, parts)
            removed, filtered = removed or gone, filtered or out
            total = sum(map(len, parts))
            left = -1 if budget is None else budget[0]
            if at != n or len(sizesl) >= max_msgs:
                stop_at = at
                break
            k = int(np.searchsorted(idxs, stop, side="right"))
            u = int(idxs[k]) if k < len(idxs) else n
        if budget is not None:
            budget[0] = left
        return parts, stop_at, removed, filtered

    def _verified(self, cq: ConsumeQueue, queue_offset: int, data: bytes, phys: int, first: bool, *,
                  crc: bool) -> bool:
        """verify_record_bytes on a record read for a pull: True when it passes; else logged, and raised
        when it is the ``first`` record of the answer (nothing to serve before it), False otherwise."""
        try:
            verify_record_bytes(data, phys, crc=crc)
        except CorruptRecordError as e:
            e = locate(self.commitlog, e, phys)
            log.error("not serving %s/%d offset %d: %s", cq.topic, cq.queue_id, queue_offset, e)
            if first:
                raise e from None
            return False
        return True

    def _read_each(self, cq: ConsumeQueue, offset: int, n_units: int, phys: np.ndarray,
                   sizes: np.ndarray, idxs: np.ndarray, max_msgs: int, max_bytes: int, mf: MessageFilter | None,
                   check: np.ndarray | None, res: GetMessageResult, budget: list[int] | None = None,
                   parts: list[bytes] | None = None) -> tuple[list[bytes], int, bool, bool]:
        """Record by record: read, check, evaluate where ``check`` says so, stopping before the record that
        would exceed the evaluation ``budget``. Returns the records taken (appended to ``parts``, which holds
        what the window took before), the unit (relative) to go on from, whether a record was gone from the
        log, and whether the filter turned a record down."""
        left = -1 if budget is None else budget[0]
        match_at = mf.match_record_at if mf is not None else None  # check is None without a filter
        verify = self.config.verify_crc_on_read
        cl = self.commitlog
        clog_min = cl.min_offset
        if parts is None:
            parts = []
        removed = filtered = False
        total = sum(map(len, parts))
        stop_at = n_units
        for i in idxs.tolist():
            p, s = int(phys[i]), int(sizes[i])
            if parts and total + s > max_bytes:
                stop_at = i
                break
            if left == 0 and check is not None and check[i]:  # out of evaluations: go on from here next pull
                stop_at = i
                break
            data = cl.read(p, s) if p >= clog_min else None
            if data is None:
                removed = True
                continue
            res.records_read += 1
            self.records_read += 1
            self.bytes_read += s
            judged = check is not None and check[i]
            # A record to evaluate gets its body CRC checked only once it passes: one turned down is not
            # served, and the CRC does not cover the properties judged (scan_records, the C twin, alike).
            if verify and not self._verified(cq, offset + i, data, p, not parts, crc=not judged):
                stop_at = i
                break
            if judged:
                if left > 0:
                    left -= 1
                props = P.decode_properties(parse_record(data, 0, check_crc=False).properties)
                if not match_at(i, props):  # type: ignore[misc]
                    filtered = True
                    continue
                if verify and not self._verified(cq, offset + i, data, p, not parts, crc=True):
                    stop_at = i
                    break
            parts.append(data)
            total += s
            res.queue_offsets.append(offset + i)
            res.commitlog_offsets.append(p)
            res.sizes.append(s)
            if len(res.sizes) >= max_msgs:
                stop_at = i + 1  # like RocketMQ: resume right after the last message taken
                break
        if budget is not None:
            budget[0] = left
        return parts, stop_at, removed, filtered


def _result(res: GetMessageResult, offset: int, stop_at: int, parts: list[bytes], filtered: bool,
            removed: bool) -> GetMessageResult:
    res.next_begin_offset = offset + stop_at
    if parts:
        res.data = parts[0] if len(parts) == 1 else b"".join(parts)
    elif filtered:
        res.status = _S.NO_MATCHED_MESSAGE
    elif removed:
        res.status = _S.MESSAGE_WAS_REMOVING
    else:
        res.status = _S.NO_MATCHED_MESSAGE
    return res
