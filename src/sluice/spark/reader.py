"""Batch reads of ``format("sluice")``: queue ranges planned on the driver, pulled by the tasks.

Planning (the driver's planner process) asks the namesrv for the queues of every
subscribed topic and each queue's min/max offsets, resolves the start and end
offsets, and makes one partition per queue range ``[start, end)``. Each task pulls
its range through a :class:`~sluice.spark.broker_io.BrokerSession` with the
selector evaluated by the broker and yields Arrow record batches.
"""
from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, Filter, InputPartition

from sluice.errors import SluiceError, TopicNotExistError
from sluice.spark.broker_io import BrokerSession
from sluice.spark.options import EARLIEST, LATEST, Options, resolve_table, short_errors
from sluice.spark.pushdown import Pushdown
from sluice.spark.storefiles import ARROW_SCHEMA

__all__ = ["QueueRange", "RangePartition", "SluiceBatchReader", "queue_bounds", "read_range", "resolve",
           "split_ranges", "subscribed_topics"]

log = logging.getLogger(__name__)

_BATCH_ROWS = 4096

#: (topic, broker name, queue id): one queue of the subscription.
QueueKey = tuple[str, str, int]


@dataclass(frozen=True, slots=True)
class QueueRange:
    broker: str
    queue_id: int
    start: int
    end: int
    topic: str = ""

    @property
    def key(self) -> str:
        return f"{self.topic}/{self.broker}:{self.queue_id}"


class RangePartition(InputPartition):
    def __init__(self, r: QueueRange) -> None:
        super().__init__((r.topic, r.broker, r.queue_id, r.start, r.end))
        self.range = r


# ---- planning ----------------------------------------------------------------------------------------
def subscribed_topics(b: BrokerSession, o: Options, *, allow_none: bool = False) -> list[str]:
    """The topics read: the named ones (each must exist), or the pattern's current matches."""
    sub = o.subscription
    if sub.pattern is None:
        return list(sub.topics)
    topics = b.topics_matching(sub.pattern)
    if not topics and not allow_none:
        raise TopicNotExistError(f"subscribePattern {sub.pattern!r} matches no topic on namesrv {o.namesrv}")
    return topics


def queue_bounds(b: BrokerSession, o: Options, *, allow_none: bool = False) -> list[tuple[object, int, int]]:
    """(message queue, min offset, max offset) of every readable queue of every subscribed topic."""
    out = []
    for topic in subscribed_topics(b, o, allow_none=allow_none):
        try:
            queues = b.queues(topic)
        except TopicNotExistError:
            if o.subscription.pattern is None:
                raise
            continue  # listed by the namesrv but with no readable queue (a cluster or broker name, a deleted topic)
        for mq in queues:
            lo, hi = b.bounds(mq)
            out.append((mq, lo, hi))
    return out


def qkey(mq) -> QueueKey:
    return (mq.topic, mq.broker_name, mq.queue_id)


def resolve(b: BrokerSession, spec, ts: int | None, bounds, *, ending: bool) -> dict[QueueKey, int]:
    """Offsets per queue for earliest/latest/JSON/timestamp specs (-2 earliest, -1 latest in JSON).
    A queue the JSON does not name starts at earliest, ends at latest."""
    what = "endingOffsets" if ending else "startingOffsets"
    named: dict[QueueKey, int] = {}
    if isinstance(spec, dict):
        by_topic: dict[str, list[tuple[str, int]]] = {}
        for mq, _lo, _hi in bounds:
            by_topic.setdefault(mq.topic, []).append((mq.broker_name, mq.queue_id))
        named = resolve_table(spec, what, by_topic)
    out: dict[QueueKey, int] = {}
    for mq, lo, hi in bounds:
        key = qkey(mq)
        if ts is not None:
            out[key] = b.search_offset(mq, ts)
            continue
        want = named.get(key, LATEST if ending else EARLIEST) if isinstance(spec, dict) else \
            (EARLIEST if spec == "earliest" else LATEST)
        out[key] = lo if want == EARLIEST else hi if want == LATEST else want
    return out


def split_ranges(ranges: list[QueueRange], min_partitions: int) -> list[QueueRange]:
    """Cut the largest ranges until there are at least ``min_partitions`` (a hint, as Kafka's)."""
    ranges = [r for r in ranges if r.end > r.start]
    total = sum(r.end - r.start for r in ranges)
    if min_partitions <= len(ranges) or total == 0:
        return ranges
    out = []
    for r in ranges:
        parts = max(1, -(-min_partitions * (r.end - r.start) // total))  # ceil: the shares add up to at least the hint
        step = -(-(r.end - r.start) // parts)
        out.extend(QueueRange(r.broker, r.queue_id, s, min(s + step, r.end), r.topic)
                   for s in range(r.start, r.end, step))
    return out


# ---- tasks --------------------------------------------------------------------------------------------
def _to_batch(msgs, broker: str) -> pa.RecordBatch:
    from sluice.protocol import properties as P

    def hostport(h):
        return f"{h[0]}:{h[1]}"

    cols = [
        [m.topic for m in msgs], [broker] * len(msgs), [m.queue_id for m in msgs], [m.queue_offset for m in msgs],
        [m.commitlog_offset for m in msgs], [m.msg_id for m in msgs], [m.offset_msg_id for m in msgs],
        [m.properties.get(P.TAGS) for m in msgs], [m.keys for m in msgs],
        [[(k, v) for k, v in m.properties.items() if k not in (P.MIN_OFFSET, P.MAX_OFFSET)] for m in msgs],
        [m.body for m in msgs], [m.born_timestamp * 1000 for m in msgs], [m.store_timestamp * 1000 for m in msgs],
        [hostport(m.born_host) for m in msgs], [m.reconsume_times for m in msgs],
    ]
    return pa.RecordBatch.from_arrays([pa.array(c, type=f.type) for c, f in zip(cols, ARROW_SCHEMA)],
                                      schema=ARROW_SCHEMA)


def read_range(opts: Options, r: QueueRange, selector_type: str, selector: str | None) -> Iterator[pa.RecordBatch]:
    """Pull [start, end) of one queue with the broker filtering; Arrow batches of the messages."""
    from sluice.client import MessageQueue, PullStatus
    from sluice.client.selector import MessageSelector

    sel = MessageSelector(selector_type, selector)
    mq = MessageQueue(topic=r.topic or opts.topic, broker_name=r.broker, queue_id=r.queue_id)
    label = opts.broker_label or r.broker
    with BrokerSession(opts.namesrv, opts.credentials, opts.tls) as b:
        offset, pending = r.start, []
        while offset < r.end:
            res = b.pull(mq, sel, offset, min(opts.pull_batch, r.end - offset), opts.group)
            if res.status is PullStatus.OFFSET_ILLEGAL:
                lost = f"{r.key} offsets [{offset}, {res.next_begin_offset}) are gone (retention)"
                if opts.fail_on_data_loss or res.next_begin_offset <= offset:
                    raise SluiceError(f"data loss: {lost}; set failOnDataLoss=false to skip it")
                log.warning("skipping %s", lost)
                offset = res.next_begin_offset
                continue
            if res.status is PullStatus.NO_NEW_MSG:
                break
            pending.extend(m for m in res.msg_found_list if m.queue_offset < r.end)
            if res.next_begin_offset <= offset:
                break  # the broker cannot move on (nothing more is stored)
            offset = res.next_begin_offset
            if len(pending) >= _BATCH_ROWS:
                yield _to_batch(pending, label)
                pending = []
        if pending:
            yield _to_batch(pending, label)


class SluiceBatchReader(DataSourceReader):
    def __init__(self, options) -> None:
        self.opts = Options(options)
        self.push = Pushdown()

    def pushFilters(self, filters: list[Filter]) -> Iterator[Filter]:
        for f in filters:
            if not self.push.take(f):
                yield f

    @short_errors
    def partitions(self) -> Sequence[InputPartition]:
        o, p = self.opts, self.push
        with BrokerSession(o.namesrv, o.credentials, o.tls) as b:
            bounds = queue_bounds(b, o)
            if p.queue_ids is not None:
                bounds = [x for x in bounds if x[0].queue_id in p.queue_ids]
            start = resolve(b, o.starting, o.starting_ts, bounds, ending=False)
            end = resolve(b, o.ending, o.ending_ts, bounds, ending=True)
            if p.ts_lo is not None:
                by_time = resolve(b, "earliest", p.ts_lo, bounds, ending=False)
                start = {k: max(v, by_time[k]) for k, v in start.items()}
            if p.ts_hi is not None:
                by_time = resolve(b, "latest", p.ts_hi, bounds, ending=True)
                end = {k: min(v, by_time[k]) for k, v in end.items()}
        ranges = []
        for mq, lo, hi in bounds:
            key = qkey(mq)
            s, e = start[key], min(end[key], hi)
            if s < lo:
                if o.fail_on_data_loss:
                    raise SluiceError(f"data loss: {mq.topic}/{mq.broker_name}:{mq.queue_id} starts at {lo}, "
                                      f"{s} was requested; set failOnDataLoss=false to skip it")
                s = lo
            if p.offset_lo is not None:
                s = max(s, p.offset_lo)
            if p.offset_hi is not None:
                e = min(e, p.offset_hi)
            ranges.append(QueueRange(mq.broker_name, mq.queue_id, s, e, mq.topic))
        return [RangePartition(r) for r in split_ranges(ranges, o.min_partitions)] or \
            [RangePartition(QueueRange("", 0, 0, 0))]

    def read(self, partition: RangePartition):
        r = partition.range
        if r.end <= r.start:
            return
        st, sel = self.push.selector(self.opts.selector_type, self.opts.selector)
        if sel is None and st == "TAG":
            return  # an empty tag intersection matches nothing
        yield from read_range(self.opts, r, st, sel)

