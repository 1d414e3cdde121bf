"""Retention: delete commit-log segments older than the retention time, and what pointed into them.

A segment's age is the store time of the first record of the *next* segment,
which is at or after its own last record: O(1) per segment, never too early
(it can keep a segment followed by an idle period a little longer). The
segment being written, and any segment not yet flushed or dispatched, is never
deleted. Consume-queue files whose units all point below the new minimum and
index files entirely below it go too, and every queue's minimum offset moves.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field

from sluice.store.commitlog import CommitLog
from sluice.store.config import StoreConfig
from sluice.store.consumequeue import ConsumeQueueTable
from sluice.store.ext_files import ExtTable, retain_ext
from sluice.store.index import IndexService

log = logging.getLogger(__name__)


@dataclass(slots=True)
class RetentionResult:
    commitlog_files: list[str] = field(default_factory=list)
    consumequeue_files: int = 0
    min_offset: int = 0


class Retention:
    """Deletes what is older than ``config.retention_hours`` from the commit log and what points into it."""

    def __init__(self, commitlog: CommitLog, queues: ConsumeQueueTable, ext: ExtTable, index: IndexService | None,
                 config: StoreConfig) -> None:
        self.commitlog = commitlog
        self.queues = queues
        self.ext = ext
        self.index = index
        self.config = config

    def delete_expired(self, now_ms: int, safe_end: int) -> RetentionResult:
        """Delete the segments that expired at ``now_ms`` and end at or below ``safe_end`` (what is flushed
        and dispatched), then the consume-queue, ext and index files wholly below the new minimum."""
        cl = self.commitlog
        deadline = now_ms - int(self.config.retention_hours * 3600 * 1000)
        files = cl.segments()
        count = 0
        for i, f in enumerate(files[:-1]):
            if f.end > safe_end:
                break
            ts = cl.store_timestamp_at(files[i + 1].start)
            if ts is None or ts > deadline:
                break
            count += 1
        res = RetentionResult()
        if count:
            res.commitlog_files = [str(p) for p in cl.queue.delete_first(count)]
            log.info("retention deleted %d commit-log segments; minimum offset now %d", count, cl.min_offset)
        res.min_offset = cl.min_offset
        if count:
            for cq in self.queues.all():
                res.consumequeue_files += cq.delete_below(res.min_offset)
            for (topic, qid), ext in list(self.ext.by_queue.items()):
                retain_ext(self.queues.get(topic, qid), ext)
            if self.index is not None:
                self.index.delete_below(res.min_offset)
        return res
