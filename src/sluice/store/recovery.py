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
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from sluice.errors import CorruptRecordError
from sluice.store.check import CheckReport, check_store
from sluice.store.checkpoint import Checkpoint
from sluice.store.commitlog import CommitLog, parse_record
from sluice.store.consumequeue import PAD_SIZE, ConsumeQueue, ConsumeQueueTable
from sluice.store.ext_files import ExtTable, recover_ext
from sluice.store.index import IndexService

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

    def describe(self) -> str:
        """One line for the start-up log: how the store was closed and what recovery did about it."""
        if not self.abnormal:
            head = f"clean shutdown, commit log ends at {self.end_offset}"
        else:
            head = f"unclean shutdown, commit log scanned from {self.scanned_from}, ends at {self.end_offset}"
        parts = [head]
        if self.error:
            parts.append(f"stopped at a bad record: {self.error}")
        if self.cut_bytes:
            parts.append(f"{self.cut_bytes} torn bytes cut (saved to {self.tail_file})")
        if self.queues_truncated:
            n = sum(self.queues_truncated.values())
            parts.append(f"{n} consume-queue units that disagreed with the log dropped in {len(self.queues_truncated)} "
                         "queue(s)")
        if self.reput_from < self.end_offset:
            parts.append(f"dispatch replays from {self.reput_from} ({self.end_offset - self.reput_from} bytes)")
        return "; ".join(parts)


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
        for each queue found bad (``store check --fix``). Streamed, in bounded memory (store/check.py)."""
        return check_store(self.commitlog, self.queues, self.ext, self.index, rebuild_queue)


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
