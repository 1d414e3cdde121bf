"""The whole-store check (``sluice store check``, MessageStore.check), streamed.

One pass over the commit log verifies every record (CRC) and, as records go by, checks each queued record
against its consume-queue unit in batches, and each record with keys against the key index. What is kept
is per queue, not per message: the ranges of queue offsets that records cover (one range per queue in a
sound store), the first problem found, and a bounded batch of records waiting for their units. The second
pass reads each queue's units in windows: a unit is sound when its queue offset is covered by a record of
its queue and that record's unit checked out (then the unit points at it); in a queue whose records
disagree with their units, each unit's record is read back from the log. Units are read through the
mapping with their pages released after, so memory stays bounded whatever the size of the store.

Findings and their order are those of the check that kept every record (before this module).
``store check --fix`` rebuilds a bad queue from the log (:func:`rebuild_queue_from_log`) a batch at a time.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import logging

import numpy as np

from sluice.errors import CorruptRecordError
from sluice.format import ParsedRecord, is_queued, parse_record, tag_code
from sluice.protocol import properties as P
from sluice.store.commitlog import CommitLog
from sluice.store.consumequeue import PAD_SIZE, ConsumeQueue, ConsumeQueueTable
from sluice.store.dispatch import DispatchService
from sluice.store.ext_files import ExtTable, ext_addresses_ok
from sluice.store.index import IndexService
from sluice.store.types import DispatchRequest, Problem

__all__ = ["CheckReport", "check_store", "rebuild_queue_from_log"]

log = logging.getLogger(__name__)

#: records waiting for their units, over all queues; at this many every queue's batch is checked
_PENDING_MAX = 65_536
#: records whose keys are looked up in the index between releases of its pages
_INDEX_RELEASE_EVERY = 65_536
#: records of a queue being rebuilt that are written at a time
_REBUILD_BATCH = 4096
#: units read at a time (2.5 MiB)
_UNIT_WINDOW = 131_072


@dataclass(slots=True)
class CheckReport:
    problems: list[Problem] = field(default_factory=list)
    records: int = 0
    units: int = 0
    fixed: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


class _Queue:
    """What the check keeps of one queue's records: covered queue offsets, the first problem, a batch."""

    __slots__ = ("topic", "qid", "cq", "starts", "ends", "problem", "qoffs", "phys", "sizes")

    def __init__(self, topic: str, qid: int, cq: ConsumeQueue | None) -> None:
        self.topic, self.qid, self.cq = topic, qid, cq
        self.starts: list[int] = []  # covered queue offsets: [starts[i], ends[i]), in record order
        self.ends: list[int] = []
        self.problem: Problem | None = None
        self.qoffs: list[int] = []
        self.phys: list[int] = []
        self.sizes: list[int] = []

    def flush(self) -> None:
        """Check the waiting records against their units (the first mismatch is the queue's problem)."""
        if not self.qoffs:
            return
        q = np.array(self.qoffs, dtype=np.int64)
        p = np.array(self.phys, dtype=np.int64)
        s = np.array(self.sizes, dtype=np.int64)
        self.qoffs, self.phys, self.sizes = [], [], []
        breaks = np.flatnonzero(q[1:] != q[:-1] + 1) + 1
        for a, b in zip(np.concatenate(([0], breaks)), np.concatenate((breaks, [len(q)]))):
            lo, hi = int(q[a]), int(q[b - 1]) + 1
            if self.ends and self.ends[-1] == lo:
                self.ends[-1] = hi
            else:
                self.starts.append(lo)
                self.ends.append(hi)
        cq, where = self.cq, f"consumequeue/{self.topic}/{self.qid}"
        if self.problem is not None:
            return
        if cq is None:
            if (q >= 0).any():
                self.problem = Problem(where, 0, "queue missing for stored records")
            return
        live = np.flatnonzero(q >= cq.min_offset)
        if len(live) == 0:
            return
        q, p, s = q[live], p[live], s[live]
        lo, hi = int(q.min()), int(q.max()) + 1
        if hi - lo <= 4 * len(q) + 1024:
            units = cq.get_units(lo, hi - lo, release=True)
            n = 0 if units is None else len(units)
            k = q - lo
            ok = k < n
            if n:
                kk = np.minimum(k, n - 1)
                ok &= (units["offset"][kk] == p) & (units["size"][kk] == s)
            bad = np.flatnonzero(~ok)
            if len(bad) == 0:
                return
            i = int(bad[0])
        else:  # scattered queue offsets (a damaged log): one unit at a time
            for i in range(len(q)):
                u = cq.unit(int(q[i]))
                if u is None or u[0] != p[i] or u[1] != s[i]:
                    break
            else:
                return
        qoff, phys = int(q[i]), int(p[i])
        self.problem = Problem(where, qoff * 20, f"unit {qoff} does not point at its record {phys} "
                                                 f"({cq.unit(qoff)})")

    def covered(self, qoffs: np.ndarray) -> np.ndarray:
        if not self.starts:
            return np.zeros(len(qoffs), dtype=bool)
        order = sorted(range(len(self.starts)), key=self.starts.__getitem__)
        starts = np.array([self.starts[i] for i in order], dtype=np.int64)
        ends = np.maximum.accumulate(np.array([self.ends[i] for i in order], dtype=np.int64))
        i = np.searchsorted(starts, qoffs, side="right") - 1
        return (i >= 0) & (qoffs < ends[np.maximum(i, 0)])


def check_store(cl: CommitLog, queues: ConsumeQueueTable, ext: ExtTable, index: IndexService | None,
                rebuild_queue: Callable[[str, int], None] | None = None) -> CheckReport:
    """Verify every record, every consume-queue unit and the key index; with ``rebuild_queue``, call it for
    each queue found bad (``store check --fix``). Everything written must be dispatched first."""
    rep = CheckReport()
    seen: dict[tuple[str, int], _Queue] = {}  # in the order queues first appear in the log
    pending = 0
    top = index.max_indexed_offset() if index is not None else -1
    index_problem: list[Problem] = []
    readback: set[tuple[str, int]] = set()

    def on_record(rec: ParsedRecord) -> None:
        nonlocal pending
        rep.records += 1
        if is_queued(rec.sysflag):
            key = (rec.topic, rec.queue_id)
            qs = seen.get(key)
            if qs is None:
                qs = seen[key] = _Queue(rec.topic, rec.queue_id, queues.get(rec.topic, rec.queue_id))
            qs.qoffs.append(rec.queue_offset)
            qs.phys.append(rec.physical_offset)
            qs.sizes.append(rec.total_size)
            pending += 1
            if pending >= _PENDING_MAX:
                for other in seen.values():
                    other.flush()
                pending = 0
        elif (rec.topic, rec.queue_id) not in readback:
            # A unit may point at a record that is not queued (the old check accepted that): such a
            # queue's units are checked by reading their records back.
            readback.add((rec.topic, rec.queue_id))
        if index is not None and not index_problem and rec.physical_offset <= top:
            if rep.records % _INDEX_RELEASE_EVERY == 0:
                index.release_pages()  # the chains walked touch the whole index: keep it from staying resident
            props = P.decode_properties(rec.properties)
            key_ = props.get(P.UNIQ_KEY) or next(iter(P.split_keys(props.get(P.KEYS))), None)
            if key_ and rec.physical_offset not in index.query_offsets(rec.topic, key_, 1 << 16, 0, 1 << 62):
                index_problem.append(Problem("index", rec.physical_offset, f"key {key_!r} of {rec.topic} not indexed"))

    damaged: set[int] = set()
    skipped: list[tuple[int, int]] = []  # log ranges not walked (after damage whose sizes cannot be trusted)
    pos = cl.min_offset
    while pos < cl.write_pos:
        end, err = cl.scan(pos, check_crc=True, on_record=on_record)
        if err is None:
            skipped.append((end, cl.write_pos))
            break
        rep.problems.append(Problem(err.path or "commitlog", err.offset or 0, str(err).split(" (")[0]))
        damaged.add(end)
        f = cl.queue.find(end)
        if f is None:
            skipped.append((end, 1 << 63))
            break
        data = cl.read_record_unchecked(end)
        if data is not None and str(err).startswith("body CRC mismatch"):
            pos = end + len(data)  # the record's structure decoded, so its size can be trusted
        else:
            skipped.append((end, f.end))
            pos = f.end  # cannot trust sizes past the damage: resume at the next segment
    for qs in seen.values():
        qs.flush()
    bad_queues: set[tuple[str, int]] = set()
    for key, qs in seen.items():
        if qs.problem is not None:
            rep.problems.append(qs.problem)
            bad_queues.add(key)

    def walked_record(phys: int) -> ParsedRecord | None:
        """The record the log walk met at ``phys`` (read back; None if it met none there)."""
        if phys < cl.min_offset or any(a <= phys < b for a, b in skipped):
            return None
        data = cl.read_record_unchecked(phys)
        if data is None:
            return None
        try:
            rec = parse_record(data, 0, check_crc=True)
        except CorruptRecordError:
            return None
        return rec if rec.physical_offset == phys else None

    for cq in queues.all():
        qs = seen.get((cq.topic, cq.queue_id))
        lo, found = cq.min_offset, False
        while lo < cq.max_offset:
            units = cq.get_units(lo, _UNIT_WINDOW, release=True)
            if units is None or len(units) == 0:
                break
            rep.units += len(units)
            if not found:
                size, phys = units["size"], units["offset"].astype(np.int64)
                cand = (size > 0) & (size != PAD_SIZE) & (phys >= cl.min_offset)
                if damaged:
                    cand &= ~np.isin(phys, np.fromiter(damaged, dtype=np.int64))
                idx = np.flatnonzero(cand)
                qoffs = lo + idx.astype(np.int64)
                if qs is not None and qs.problem is None and (cq.topic, cq.queue_id) not in readback:
                    # Records checked out against their units: a covered unit points at its record.
                    bad = idx[~qs.covered(qoffs)]
                    first = int(bad[0]) if len(bad) else -1
                else:
                    first = -1
                    for i in idx:
                        rec = walked_record(int(phys[i]))
                        if rec is None or rec.topic != cq.topic or rec.queue_id != cq.queue_id \
                                    or rec.queue_offset != lo + int(i):
                            first = int(i)
                            break
                if first >= 0:
                    qoff = lo + first
                    rep.problems.append(Problem(f"consumequeue/{cq.topic}/{cq.queue_id}", qoff * 20,
                                                f"unit {qoff} points at {int(phys[first])}, not a record of this queue"))
                    bad_queues.add((cq.topic, cq.queue_id))
                    found = True
            lo += len(units)
    for cq in queues.all():
        bad_ext = ext_addresses_ok(cq, ext.get(cq.topic, cq.queue_id), release=True)
        if bad_ext is not None:
            rep.problems.append(Problem(f"consumequeue/{cq.topic}/{cq.queue_id}", bad_ext[0] * 20,
                                        f"unit {bad_ext[0]} holds ext address {bad_ext[1]}, which does not "
                                        "resolve to a ConsumeQueueExt unit"))
            bad_queues.add((cq.topic, cq.queue_id))
    rep.problems.extend(index_problem)
    if rebuild_queue is not None and bad_queues:
        for topic, qid in sorted(bad_queues):
            rebuild_queue(topic, qid)
            rep.fixed.append(f"rebuilt consume queue {topic}/{qid}")
    return rep


class _OutOfOrder(Exception):
    """A rebuilt queue's records are not in contiguous queue-offset order in the log."""


def rebuild_queue_from_log(cl: CommitLog, dispatch: DispatchService, queues: ConsumeQueueTable, ext: ExtTable,
                           topic: str, queue_id: int) -> None:
    """Throw away one consume queue (and its ConsumeQueueExt) and rebuild it from the commit log
    (MessageStore.rebuild_queue, ``store check --fix``); the caller holds dispatch's run lock.

    Records in contiguous queue-offset order (a sound log) are written a batch at a time, so memory does
    not grow with the queue. Otherwise the rebuild starts over collecting every record of the queue and
    writes them sorted by queue offset, as it always did."""
    if not _rebuild(cl, dispatch, queues, ext, topic, queue_id, stream=True):
        _rebuild(cl, dispatch, queues, ext, topic, queue_id, stream=False)


def _rebuild(cl: CommitLog, dispatch: DispatchService, queues: ConsumeQueueTable, ext: ExtTable,
             topic: str, queue_id: int, *, stream: bool) -> bool:
    cq = queues.get_or_create(topic, queue_id)
    cq.destroy()
    ext.drop(topic, queue_id)
    found: list[DispatchRequest] = []
    expect = -1

    def write(reqs: list[DispatchRequest]) -> None:
        # Dispatchers that rebuild bitmaps (the broker's bitmap calculator) see the records again.
        for d in dispatch.dispatchers:
            if d.rebuilds_bitmaps:
                try:
                    d.dispatch(reqs)
                except Exception:
                    log.exception("dispatcher %r failed while rebuilding %s/%d", d, topic, queue_id)
        reqs.sort(key=lambda r: r.queue_offset)
        dispatch.write_queue(topic, queue_id, reqs)

    def on_record(rec: ParsedRecord) -> None:
        nonlocal found, expect
        if rec.topic == topic and rec.queue_id == queue_id and is_queued(rec.sysflag):
            if stream:
                if expect >= 0 and rec.queue_offset != expect:
                    raise _OutOfOrder
                expect = rec.queue_offset + 1
            props = P.decode_properties(rec.properties)
            found.append(DispatchRequest(
                topic, queue_id, rec.queue_offset, rec.physical_offset, rec.total_size,
                tag_code(props.get(P.TAGS)), props, rec.store_timestamp, [], None, rec.sysflag))
            if stream and len(found) >= _REBUILD_BATCH:
                write(found)
                found = []

    try:
        cl.scan(cl.min_offset, check_crc=False, on_record=on_record)
    except _OutOfOrder:
        return False
    if found:
        write(found)
    return True
