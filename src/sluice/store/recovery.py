"""Recovery after a stop, and the whole-store check.

The commit log is the truth; consume queues and the key index are caches of it.

* Clean stop (no ``abort`` file): the checkpoint's flushed offset is the end of
  the log; only the few bytes after it are looked at (they should be zeros).
* Unclean stop: records are verified (magic, size, CRC, own offset) from the
  checkpoint's flushed offset (a record boundary, durable by construction), or
  from the start of the last three segments when there is no usable checkpoint.
  The log is cut at the first bad or partial record; the cut bytes are first
  saved to ``{root}/commitlog-tails/`` (ZODB's ``.trN`` lesson). Consume queues
  and the index drop everything that points at or past the cut, and dispatch
  replays from the checkpoint's dispatch offset (units are rewritten in place,
  the index skips what it holds), so what fell short is rebuilt.
"""
from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from sluice.errors import CorruptRecordError
from sluice.protocol import properties as P
from sluice.store.checkpoint import Checkpoint
from sluice.store.commitlog import CommitLog, ParsedRecord, parse_record
from sluice.store.consumequeue import PAD_SIZE, ConsumeQueue, ConsumeQueueTable
from sluice.store.dispatch import is_queued
from sluice.store.ext_files import ExtTable, ext_addresses_ok, recover_ext
from sluice.store.index import IndexService
from sluice.store.types import Problem

log = logging.getLogger(__name__)

TAIL_DIR = "commitlog-tails"


@dataclass(slots=True)
class RecoveryReport:
    abnormal: bool
    scanned_from: int = 0
    end_offset: int = 0
    cut_bytes: int = 0
    tail_file: str | None = None
    error: str | None = None
    queues_truncated: dict[str, int] = field(default_factory=dict)
    reput_from: int = 0


@dataclass(slots=True)
class CheckReport:
    problems: list[Problem] = field(default_factory=list)
    records: int = 0
    units: int = 0
    fixed: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


class Recovery:
    """Recovery at start and the whole-store check, over the store's files (the commit log is the truth)."""

    def __init__(self, root: Path, commitlog: CommitLog, queues: ConsumeQueueTable, ext: ExtTable,
                 index: IndexService | None) -> None:
        self.root = root
        self.commitlog = commitlog
        self.queues = queues
        self.ext = ext
        self.index = index

    def recover(self, cp: Checkpoint | None, abnormal: bool) -> RecoveryReport:
        """Cut the log after its last sound record, make consume queues, ext files and the index agree
        with it, and say where dispatch must replay from (``reput_from``). The files must be loaded."""
        cl = self.commitlog
        rep = recover_commitlog(cl, self.root, cp, abnormal)
        end = cl.write_pos
        for cq in self.queues.all():
            dropped = reconcile_queue(cq, cl, end)
            if dropped:
                rep.queues_truncated[f"{cq.topic}/{cq.queue_id}"] = dropped
            cq.delete_below(cl.min_offset)
        for (topic, qid), ext in list(self.ext.by_queue.items()):
            recover_ext(self.queues.get(topic, qid), ext)
        index = self.index
        if index is not None and index.max_indexed_offset() >= end:
            index.truncate(end)
        # Replay from where the consume queues were last known durable (a checkpoint older than a retention
        # run points below the oldest segment: start there); without a checkpoint, rebuild everything.
        reput_from = max(cl.min_offset, min(cp.dispatch_offset, end)) if cp is not None else cl.min_offset
        if abnormal and index is not None:
            # The index may have been repaired below the checkpoint (a torn batch of entries): replay from its
            # last whole message too. The index skips offsets it holds; consume-queue replays are idempotent.
            top = index.max_indexed_offset()
            if top < 0 and cp is not None and cp.index_offset >= 0:
                reput_from = cl.min_offset
            elif 0 <= top < reput_from:
                reput_from = max(cl.min_offset, top)
        rep.reput_from = reput_from
        return rep

    def check(self, rebuild_queue: Callable[[str, int], None] | None = None) -> CheckReport:
        """Verify every record, every consume-queue unit and the key index; with ``rebuild_queue``, call it
        for each queue found bad (``store check --fix``). Everything written must be dispatched first."""
        cl, queues, ext, index = self.commitlog, self.queues, self.ext, self.index
        rep = CheckReport()
        by_phys: dict[int, ParsedRecord] = {}
        per_queue: dict[tuple[str, int], list[ParsedRecord]] = defaultdict(list)

        def on_record(rec: ParsedRecord) -> None:
            by_phys[rec.physical_offset] = rec
            if is_queued(rec.sysflag):
                per_queue[(rec.topic, rec.queue_id)].append(rec)

        damaged: set[int] = set()
        pos = cl.min_offset
        while pos < cl.write_pos:
            end, err = cl.scan(pos, check_crc=True, on_record=on_record)
            if err is None:
                break
            rep.problems.append(Problem(err.path or "commitlog", err.offset or 0, str(err).split(" (")[0]))
            damaged.add(end)
            f = cl.queue.find(end)
            if f is None:
                break
            data = cl.read_record_unchecked(end)
            if data is not None and str(err).startswith("body CRC mismatch"):
                pos = end + len(data)  # the record's structure decoded, so its size can be trusted
            else:
                pos = f.end  # cannot trust sizes past the damage: resume at the next segment
        rep.records = len(by_phys)
        bad_queues: set[tuple[str, int]] = set()
        for (topic, qid), recs in per_queue.items():
            cq = queues.get(topic, qid)
            live = [r for r in recs if r.queue_offset >= (cq.min_offset if cq else 0)]
            if cq is None:
                if live:
                    rep.problems.append(Problem(f"consumequeue/{topic}/{qid}", 0,
                                                "queue missing for stored records"))
                    bad_queues.add((topic, qid))
                continue
            for r in live:
                u = cq.unit(r.queue_offset)
                if u is None or u[0] != r.physical_offset or u[1] != r.total_size:
                    rep.problems.append(Problem(f"consumequeue/{topic}/{qid}", r.queue_offset * 20,
                                                f"unit {r.queue_offset} does not point at its record "
                                                f"{r.physical_offset} ({u})"))
                    bad_queues.add((topic, qid))
                    break
        for cq in queues.all():
            units = cq.get_units(cq.min_offset, cq.max_offset - cq.min_offset)
            if units is None:
                continue
            rep.units += len(units)
            for i in np.flatnonzero((units["size"] > 0) & (units["size"] != PAD_SIZE)):
                phys = int(units["offset"][i])
                rec = by_phys.get(phys)
                qoff = cq.min_offset + int(i)
                if phys < cl.min_offset or phys in damaged:
                    continue
                if rec is None or rec.topic != cq.topic or rec.queue_id != cq.queue_id or rec.queue_offset != qoff:
                    rep.problems.append(Problem(f"consumequeue/{cq.topic}/{cq.queue_id}", qoff * 20,
                                                f"unit {qoff} points at {phys}, not a record of this queue"))
                    bad_queues.add((cq.topic, cq.queue_id))
                    break
        for cq in queues.all():
            bad_ext = ext_addresses_ok(cq, ext.get(cq.topic, cq.queue_id))
            if bad_ext is not None:
                rep.problems.append(Problem(f"consumequeue/{cq.topic}/{cq.queue_id}", bad_ext[0] * 20,
                                            f"unit {bad_ext[0]} holds ext address {bad_ext[1]}, which does not "
                                            "resolve to a ConsumeQueueExt unit"))
                bad_queues.add((cq.topic, cq.queue_id))
        if index is not None:
            top = index.max_indexed_offset()
            for rec in by_phys.values():
                if rec.physical_offset > top:
                    continue
                props = P.decode_properties(rec.properties)
                key = props.get(P.UNIQ_KEY) or next(iter(P.split_keys(props.get(P.KEYS))), None)
                if key and rec.physical_offset not in index.query_offsets(rec.topic, key, 1 << 16, 0, 1 << 62):
                    rep.problems.append(Problem("index", rec.physical_offset,
                                                f"key {key!r} of {rec.topic} not indexed"))
                    break
        if rebuild_queue is not None and bad_queues:
            for topic, qid in sorted(bad_queues):
                rebuild_queue(topic, qid)
                rep.fixed.append(f"rebuilt consume queue {topic}/{qid}")
        return rep


def recover_commitlog(cl: CommitLog, root: Path, cp: Checkpoint | None, abnormal: bool) -> RecoveryReport:
    """Find the end of the valid log, cut whatever follows it; set ``cl.write_pos``."""
    rep = RecoveryReport(abnormal)
    files = cl.queue.files
    if not files:
        cl.write_pos = cp.commitlog_offset if cp else 0
        rep.end_offset = cl.write_pos
        return rep
    if cp is not None and cl.queue.min_offset <= cp.commitlog_offset <= cl.queue.end_offset:
        start = cp.commitlog_offset
    else:
        start = files[max(0, len(files) - 3)].start
    rep.scanned_from = start
    end, err = cl.scan(start, check_crc=True)
    rep.end_offset = end
    if err is not None:
        rep.error = str(err)
        log.error("commit log: %s; cutting the log at %d", err, end)
    dirty = _dirty_end(cl, end)
    if dirty > end:
        rep.cut_bytes = dirty - end
        rep.tail_file = str(_save_tail(cl, root, end, dirty))
        log.warning("commit log: cut %d bytes after offset %d, saved to %s", dirty - end, end, rep.tail_file)
        cl.queue.truncate(end, dirty_end=dirty)
    elif end < cl.queue.end_offset and cl.queue.find(end) is not None:
        # Segments after the end that hold nothing (a roll-over whose first record never landed).
        cl.queue.truncate(end, dirty_end=end)
    cl.write_pos = end
    return rep


def _dirty_end(cl: CommitLog, end: int) -> int:
    """The offset just after the last non-zero byte at or after ``end`` (``end`` if all zeros).

    Only allocated bytes are looked at (past them nothing was written), a chunk at a time with its pages
    released after: a torn tail costs a few chunks of memory, not the rest of the segment."""
    chunk = 1 << 20
    for f in reversed(cl.queue.files):
        if f.end <= end:
            break
        lo = max(end, f.start) - f.start
        hi = min(f.size, f.alloc_end)
        while hi > lo:
            a = max(lo, hi - chunk)
            block = np.frombuffer(f.read_released(a, hi - a), dtype=np.uint8)
            nz = np.flatnonzero(block)
            if len(nz):
                return f.start + a + int(nz[-1]) + 1
            hi = a
    return end


def _save_tail(cl: CommitLog, root: Path, start: int, end: int) -> Path:
    d = root / TAIL_DIR
    d.mkdir(parents=True, exist_ok=True)
    path = d / f"{start:020d}.{int(time.time() * 1000)}.tail"
    with open(path, "wb") as out:
        pos = start
        while pos < end:
            f = cl.queue.find(pos)
            if f is None:
                break
            n = min(end, f.end) - pos
            out.write(f.read(pos - f.start, n))
            pos += n
    return path


def reconcile_queue(cq: ConsumeQueue, cl: CommitLog, commitlog_end: int) -> int:
    """Make ``cq`` agree with the log: drop units past its end, then walk back over units whose record
    does not say it belongs here. Return how many units were dropped."""
    dropped = cq.truncate_after_commitlog(commitlog_end)
    while cq.max_offset > cq.min_offset:
        u = cq.unit(cq.max_offset - 1)
        if u is not None and (u[1] == PAD_SIZE or _unit_ok(cl, cq, cq.max_offset - 1, u)):
            break
        cq.truncate(cq.max_offset - 1)
        dropped += 1
    return dropped


def _unit_ok(cl: CommitLog, cq: ConsumeQueue, qoff: int, u: tuple[int, int, int]) -> bool:
    data = cl.read(u[0], u[1])
    if data is None:
        return u[0] < cl.min_offset  # already deleted by retention: not this unit's fault
    try:
        rec = parse_record(data, 0, check_crc=False)
    except CorruptRecordError:
        return False
    return rec.topic == cq.topic and rec.queue_id == cq.queue_id and rec.queue_offset == qoff
