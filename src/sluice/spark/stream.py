"""Streaming reads of ``format("sluice")`` (micro-batches).

Offsets live in Spark's checkpoint as ``{"<topic>": {"<broker>:<queue>": next offset}}``,
the shape of ``startingOffsets``; ``commit()`` is advisory (and lazy in PySpark), as
Kafka's source commits nothing. What PySpark 4.3 lets a Python stream reader show in
a query's progress: ``reportLatestOffset`` (the progress's ``latestOffset``). The source's
``description`` is fixed by the JVM side (``PythonMicroBatchStream...@hash``) and a
Python reader has no custom-metrics hook, so the latest offsets are reported together
with what Kafka puts in its metrics: the source's name (Sluice, topics, selector) and
``avgOffsetsBehindLatest`` / ``maxOffsetsBehindLatest`` / ``minOffsetsBehindLatest``.
"""
from __future__ import annotations

import logging
from collections.abc import Sequence

from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow

from sluice.errors import InvalidParameterError
from sluice.spark.broker_io import BrokerSession
from sluice.spark.options import Options, short_errors
from sluice.spark.reader import QueueRange, RangePartition, queue_bounds, read_range, resolve, split_ranges

__all__ = ["SluiceStreamReader", "fair_limit", "flatten", "nest", "offsets_behind"]

log = logging.getLogger(__name__)

#: (topic, "broker:queue"): one queue in a flat offset table.
Flat = dict[tuple[str, str], int]


def nest(flat: Flat) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for (topic, q), off in sorted(flat.items()):
        out.setdefault(topic, {})[q] = off
    return out


def flatten(nested: dict, single_topic: str | None = None) -> Flat:
    """A checkpointed offset dict as a flat table; the flat ``{"broker:queue": n}`` form that checkpoints of
    earlier versions hold is read as the query's one topic."""
    out: Flat = {}
    for k, v in nested.items():
        if isinstance(v, dict):
            out.update({(k, q): int(o) for q, o in v.items()})
        elif single_topic is not None:
            out[(single_topic, k)] = int(v)
        else:
            raise InvalidParameterError(f"checkpointed offset {k!r}: {v!r} names no topic; this query reads "
                                        "several topics (start it with a new checkpoint)")
    return out


def fair_limit(start: dict, end: dict, max_rows: int) -> dict:
    """Cap the total backlog at ``max_rows``, shared evenly across queues (unused shares move on)."""
    backlog = {k: end[k] - start.get(k, 0) for k in end if end[k] > start.get(k, 0)}
    take = dict.fromkeys(backlog, 0)
    left = max_rows
    while left > 0 and backlog:
        share = max(1, left // len(backlog))
        for k in sorted(backlog):
            n = min(share, backlog[k] - take[k], left)
            take[k] += n
            left -= n
            if left == 0:
                break
        backlog = {k: v for k, v in backlog.items() if take[k] < v}
    return {k: start.get(k, 0) + take.get(k, 0) if k in take else end[k] for k in end}


def offsets_behind(end: Flat, latest: Flat) -> dict[str, float | int]:
    """Kafka's metrics: per queue, latest offset minus the offset the planned batch ends at."""
    behind = [max(0, latest[k] - end.get(k, 0)) for k in latest]
    if not behind:
        return {"avgOffsetsBehindLatest": 0.0, "maxOffsetsBehindLatest": 0, "minOffsetsBehindLatest": 0}
    return {"avgOffsetsBehindLatest": sum(behind) / len(behind), "maxOffsetsBehindLatest": max(behind),
            "minOffsetsBehindLatest": min(behind)}


class SluiceStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Every control call runs in one long-lived Python process per query, so state on self persists."""

    def __init__(self, options) -> None:
        self.opts = Options(options, streaming=True)
        self.target: Flat | None = None
        self._latest_seen: Flat | None = None
        self._last_end: Flat | None = None

    def _session(self) -> BrokerSession:
        return BrokerSession(self.opts.namesrv, self.opts.credentials, self.opts.tls)

    def _latest(self) -> Flat:
        with self._session() as b:
            return {(mq.topic, f"{mq.broker_name}:{mq.queue_id}"): hi
                    for mq, _lo, hi in queue_bounds(b, self.opts, allow_none=True)}

    def _earliest(self, keys: list[tuple[str, str]]) -> Flat:
        from sluice.client import MessageQueue

        with self._session() as b:
            out = {}
            for topic, q in keys:
                broker, _, qid = q.rpartition(":")
                out[(topic, q)] = b.bounds(MessageQueue(topic=topic, broker_name=broker, queue_id=int(qid)))[0]
            return out

    @short_errors
    def initialOffset(self) -> dict:
        o = self.opts
        log.info("%s: starting at %s", o.describe(), o.starting)
        with self._session() as b:
            bounds = queue_bounds(b, o, allow_none=True)
            start = resolve(b, o.starting, o.starting_ts, bounds, ending=False)
        return nest({(t, f"{br}:{q}"): off for (t, br, q), off in start.items()})

    def getDefaultReadLimit(self) -> ReadLimit:
        m = self.opts.max_per_trigger
        return ReadMaxRows(m) if m else ReadAllAvailable()

    @short_errors
    def prepareForTriggerAvailableNow(self) -> None:
        self.target = self._latest()

    @short_errors
    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        first = flatten(start, self.opts.topic)
        latest = self.target if self.target is not None else self._latest()
        end = {k: max(v, first.get(k, 0)) for k, v in latest.items()}
        for k, v in first.items():
            end.setdefault(k, v)
        if isinstance(limit, ReadMaxRows):
            end = fair_limit(first, end, limit.max_rows)
        self._latest_seen = self._latest() if self.target is not None else latest
        self._last_end = end
        return nest(end)

    def reportLatestOffset(self) -> dict | None:
        """For the progress report's ``latestOffset``: the queues' latest offsets, the source's name and
        how far the planned batch ends behind latest (Kafka's metric names)."""
        if self._latest_seen is None:
            return None
        return {"source": self.opts.describe(), "offsets": nest(self._latest_seen),
                **offsets_behind(self._last_end or {}, self._latest_seen)}

    @short_errors
    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        one = self.opts.topic
        first, last = flatten(start, one), flatten(end, one)
        fresh = sorted(k for k in last if k not in first)
        if fresh:  # queues that appeared since the batch started (a new topic of a pattern): from earliest
            first = {**first, **self._earliest(fresh)}
        ranges = []
        for (topic, q), e in sorted(last.items()):
            broker, _, qid = q.rpartition(":")
            s = first.get((topic, q), 0)
            if e > s:
                ranges.append(QueueRange(broker, int(qid), s, e, topic))
        return [RangePartition(r) for r in split_ranges(ranges, self.opts.min_partitions)]

    def read(self, partition: RangePartition):
        yield from read_range(self.opts, partition.range, self.opts.selector_type, self.opts.selector)

    def commit(self, end: dict) -> None:
        """Nothing to do: the checkpoint is the record of what was read (Kafka's source does the same)."""
