"""CalcBitmapDispatcher: Bloom-filter bitmaps at dispatch (RocketMQ's CommitLogDispatcherCalcBitMap).

Registered with the store before everything else (and before ``store.start()``,
so records replayed by recovery get bitmaps too). Per dispatch batch and
topic with SQL92 filter data, each message is evaluated once per distinct
expression (groups sharing an expression share the evaluation), and the bits
of every group whose expression is TRUE are set, a numpy row per message.
The bitmap goes into ``DispatchRequest.bitmap``; the store writes it to the
queue's ConsumeQueueExt. Topics without SQL92 filter data are not touched
(plain tag codes, no ext writes). Evaluation errors count as no match, as in
RocketMQ.
"""
from __future__ import annotations

import logging
import time
from collections import defaultdict

import numpy as np

from sluice.broker.filter_data import ConsumerFilterManager, SqlFilterEntry
from sluice.store.types import DispatchRequest

__all__ = ["CalcBitmapDispatcher"]

log = logging.getLogger(__name__)

SLOW_BATCH_S = 0.05


class CalcBitmapDispatcher:
    #: MessageStore.rebuild_queue runs dispatchers with this flag again over the rebuilt queue.
    rebuilds_bitmaps = True

    def __init__(self, filters: ConsumerFilterManager) -> None:
        self.filters = filters
        self.messages = 0
        self.evaluations = 0
        self.seconds = 0.0

    def dispatch_batch(self, batch) -> None:
        """The store's columnar batch: per-message requests are built only when a topic in it has SQL92
        filter data (everything else keeps the no-objects fast path)."""
        sql = self.filters.sql_topics()
        if sql and any(run.topic in sql for run in batch.runs):
            self.dispatch(batch.requests())

    def dispatch(self, requests: list[DispatchRequest]) -> None:
        sql = self.filters.sql_topics()
        bloom = self.filters.bloom
        if not sql or bloom is None:
            return
        by_topic: dict[str, list[DispatchRequest]] = defaultdict(list)
        for r in requests:
            if r.topic in sql:
                by_topic[r.topic].append(r)
        if not by_topic:
            return
        t0 = time.perf_counter()
        nbytes = bloom.m // 8
        for topic, reqs in by_topic.items():
            bits = np.zeros((len(reqs), nbytes), dtype=np.uint8)
            props = [r.properties for r in reqs]
            by_expr: dict[tuple[str, str], list[SqlFilterEntry]] = defaultdict(list)
            for e in sql[topic]:
                by_expr[(e.selector.expression_type, e.selector.expression)].append(e)
            for entries in by_expr.values():
                matched = entries[0].selector.matches_batch(props)
                self.evaluations += len(props)
                if matched.any():
                    for e in entries:
                        bloom.hash_to_batch(e.bloom, bits, matched)
            rows = bits.tobytes()
            for i, r in enumerate(reqs):
                r.bitmap = rows[i * nbytes:(i + 1) * nbytes]
            self.messages += len(reqs)
        took = time.perf_counter() - t0
        self.seconds += took
        if took >= SLOW_BATCH_S:
            log.warning("bitmap calculation took %.0f ms for %d messages", took * 1000, len(requests))
