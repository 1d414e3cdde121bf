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
from typing import TYPE_CHECKING

from sluice.store.ext_files import retain_ext

if TYPE_CHECKING:
    from sluice.store.message_store import MessageStore

log = logging.getLogger(__name__)


@dataclass(slots=True)
class RetentionResult:
    commitlog_files: list[str] = field(default_factory=list)
    consumequeue_files: int = 0
    min_offset: int = 0


def delete_expired(store: MessageStore, now_ms: int) -> RetentionResult:
    cl = store.commitlog
    deadline = now_ms - int(store.config.retention_hours * 3600 * 1000)
    safe_end = min(store.dispatch.reput_offset, store.flusher.flushed_offset)
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
        for cq in store.queues.all():
            res.consumequeue_files += cq.delete_below(res.min_offset)
        for (topic, qid), ext in list(store.ext.exts.items()):
            retain_ext(store.queues.get(topic, qid), ext)
        if store.index is not None:
            store.index.delete_below(res.min_offset)
    return res
