"""CalcBitmapDispatcher: Bloom-filter bitmaps at dispatch (RocketMQ's CommitLogDispatcherCalcBitMap).

Registered with the store before everything else (and before ``store.start()``,
so records replayed by recovery get bitmaps too). With the C extension a
columnar batch's runs get their bitmaps without a per-message Python step
(``dispatch_batch``: each distinct combination of the values the expressions
read is judged once, by the evaluation below). Otherwise, per dispatch batch and
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
from sluice.speedups import C
from sluice.store.dispatch_columns import DispatchBatch
from sluice.store.pull_read import verdict_cache
from sluice.store.types import DispatchRequest

__all__ = ["CalcBitmapDispatcher"]

log = logging.getLogger(__name__)

#: At most this many property names for speedups.props_rows (its MAX_KEYS); more: per-message requests.
MAX_NAMES = 64

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
        """The store's columnar batch. Runs of a topic with SQL92 filter data get ``PutRun.bitmaps`` from
        their encoded properties in one C call each (speedups.props_rows: each distinct combination of the
        values the selectors read is judged once, and its bitmap row shared); without the C extension, with
        a plug-in expression type or with requests already built, per-message requests carry them."""
        sql = self.filters.sql_topics()
        if not sql or self.filters.bloom is None:
            return
        runs = [run for run in batch.runs if run.topic in sql]
        if not runs:
            return
        plans = [self._plan(run.topic, sql[run.topic]) for run in runs]
        if batch.materialised or any(plan.names is None for plan in plans):
            self.dispatch(batch.requests())
            return
        t0 = time.perf_counter()
        n = 0
        for run, plan in zip(runs, plans):
            run.bitmaps = C.props_rows(run.props, plan.names, plan.verdicts, plan.judge, plan.row_list)
            n += len(run)
            self.evaluations += len(run) * len(plan.rows)
        self.messages += n
        self._took(time.perf_counter() - t0, n)

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
                r.bitmap = rows.get(mask) or plan.row(mask)
            self.messages += len(reqs)
        self._took(time.perf_counter() - t0, len(requests))

    def _took(self, took: float, n: int) -> None:
        self.seconds += took
        if took >= SLOW_PER_MESSAGE_S * n:
            log.warning("bitmap calculation took %.0f ms for %d messages", took * 1000, n)

    def _plan(self, topic: str, entries: tuple[SqlFilterEntry, ...]) -> _Plan:
        plan = self._plans.get(topic)
        if plan is None or plan.entries is not entries:
            plan = self._plans[topic] = _Plan(entries, self.filters.bloom)  # type: ignore[arg-type]
        return plan


class _Plan:
    """One topic's live SQL92 filters compiled together: distinct expressions evaluated in one call per
    message (``multi`` returns a bit mask over them), and the bitmap row of each mask, built once. With the C
    extension and SQL92 selectors only, also what ``speedups.props_rows`` needs: the property ``names`` the
    selectors read, a verdict cache of row indexes by their values, ``judge`` and ``row_list``."""

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
        #: rows by index (props_rows' verdicts), and the index of each mask's row
        self.row_list: list[bytes] = []
        self._row_index: dict[int, int] = {}
        self.names: tuple[bytes, ...] | None = None
        self.verdicts: object | None = None
        self._keys: tuple[str, ...] = ()
        if C is not None and all(isinstance(sel, SqlSelector) for sel in selectors):
            keys = tuple(dict.fromkeys(k for sel in selectors for k in sel.properties))  # type: ignore[attr-defined]
            if len(keys) <= MAX_NAMES:
                self._keys, self.names, self.verdicts = keys, tuple(k.encode() for k in keys), verdict_cache()

    def judge(self, values: tuple[str | None, ...]) -> int:
        """The index in ``row_list`` of the bitmap row of a message whose ``names`` hold ``values`` (None:
        absent): the selectors read nothing else, so every message with these values shares it."""
        mask = self.multi({k: v for k, v in zip(self._keys, values) if v is not None})
        i = self._row_index.get(mask)
        if i is None:
            i = self._row_index[mask] = len(self.row_list)
            self.row_list.append(self.row(mask))
        return i

    def row(self, mask: int) -> bytes:
        """The bitmap row of ``mask``, built once."""
        row = self.rows_by_mask.get(mask)
        if row is None:
            row = self.rows_by_mask[mask] = self.row_of(mask)
        return row

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
