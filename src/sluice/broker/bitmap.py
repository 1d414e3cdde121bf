"""CalcBitmapDispatcher: Bloom-filter bitmaps at dispatch (RocketMQ's CommitLogDispatcherCalcBitMap).

Registered with the store before everything else (and before ``store.start()``,
so records replayed by recovery get bitmaps too). Per dispatch batch and
topic with SQL92 filter data, every distinct expression is evaluated on each
message in one generated function call (groups sharing an expression share
the evaluation), giving a bit mask of TRUE expressions; the bitmap of each
mask (the bits of every group whose expression is TRUE) is built once and
shared by every message with that mask.
The bitmap goes into ``DispatchRequest.bitmap``; the store writes it to the
queue's ConsumeQueueExt. Topics without SQL92 filter data are not touched
(plain tag codes, no ext writes). Evaluation errors count as no match, as in
RocketMQ.
"""
from __future__ import annotations

import logging
import time
from collections import defaultdict

from sluice.broker.filter_data import ConsumerFilterManager, SqlFilterEntry
from sluice.filter import BloomFilter, SqlSelector
from sluice.filter.sql_codegen import compile_multi
from sluice.store.dispatch_columns import DispatchBatch
from sluice.store.types import DispatchRequest

__all__ = ["CalcBitmapDispatcher"]

log = logging.getLogger(__name__)

#: RocketMQ warns when a message's bitmap takes 1 ms or more.
SLOW_PER_MESSAGE_S = 0.001


class CalcBitmapDispatcher:
    """A store Dispatcher (store/types.py) that fills ``DispatchRequest.bitmap``."""

    #: The bitmaps go into the consume queue's ext units: MessageStore.rebuild_queue runs this again.
    rebuilds_bitmaps = True

    def __init__(self, filters: ConsumerFilterManager) -> None:
        self.filters = filters
        self._plans: dict[str, _Plan] = {}
        self.messages = 0
        self.evaluations = 0
        self.seconds = 0.0

    def dispatch_batch(self, batch: DispatchBatch) -> None:
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
        by_topic: dict[str, list[DispatchRequest]]
        if len(requests) == 1:  # one message (a live stream at a low rate): no grouping by topic
            by_topic = {requests[0].topic: requests} if requests[0].topic in sql else {}
        else:
            by_topic = defaultdict(list)
            for r in requests:
                if r.topic in sql:
                    by_topic[r.topic].append(r)
        if not by_topic:
            return
        t0 = time.perf_counter()
        for topic, reqs in by_topic.items():
            plan = self._plan(topic, sql[topic])
            props = [r.properties for r in reqs]
            self.evaluations += len(props) * len(plan.rows)
            masks = list(map(plan.multi, props))
            rows = plan.rows_by_mask
            for r, mask in zip(reqs, masks):
                row = rows.get(mask)
                if row is None:
                    row = rows[mask] = plan.row_of(mask)
                r.bitmap = row
            self.messages += len(reqs)
        took = time.perf_counter() - t0
        self.seconds += took
        if took >= SLOW_PER_MESSAGE_S * len(requests):
            log.warning("bitmap calculation took %.0f ms for %d messages", took * 1000, len(requests))

    def _plan(self, topic: str, entries: tuple[SqlFilterEntry, ...]) -> _Plan:
        plan = self._plans.get(topic)
        if plan is None or plan.entries is not entries:
            plan = self._plans[topic] = _Plan(entries, self.filters.bloom)  # type: ignore[arg-type]
        return plan


class _Plan:
    """One topic's live SQL92 filters compiled together: distinct expressions evaluated in one call per
    message (``multi`` returns a bit mask over them), and the bitmap row of each mask, built once."""

    def __init__(self, entries: tuple[SqlFilterEntry, ...], bloom: BloomFilter) -> None:
        self.entries = entries
        self.bloom = bloom
        by_expr: dict[tuple[str, str], list[SqlFilterEntry]] = defaultdict(list)
        for e in entries:
            by_expr[(e.selector.expression_type, e.selector.expression)].append(e)
        self.rows = list(by_expr.values())  # index i: the groups of distinct expression i
        selectors = [group[0].selector for group in self.rows]
        if all(isinstance(sel, SqlSelector) for sel in selectors):
            self.multi = compile_multi([sel.ast for sel in selectors])  # type: ignore[attr-defined]
        else:  # a plug-in expression type: one call per expression
            def multi(p, _sels=selectors) -> int:
                return sum(1 << i for i, sel in enumerate(_sels) if sel.matches(p))
            self.multi = multi
        self.rows_by_mask: dict[int, bytes] = {}

    def row_of(self, mask: int) -> bytes:
        bits = self.bloom.empty_bits()
        i = 0
        while mask:
            if mask & 1:
                for e in self.rows[i]:
                    self.bloom.hash_to(e.bloom, bits)
            mask >>= 1
            i += 1
        return bits.bytes()
