"""``format("sluice")``: topics through the broker as DataFrames (batch, streaming) and back (writing).

Everything that talks to the broker runs where Spark calls it: planning
(queues, offsets) in the driver's planner process, pulls and sends in the
executors; no connection is kept on an object Spark pickles. See docs/spark.md
for the options, the columns and the pushdown rules.
"""
from __future__ import annotations

import datetime
import hashlib
import logging
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import orjson
import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    InputPartition,
    IsNotNull,
    LessThan,
    LessThanOrEqual,
    WriterCommitMessage,
)
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow

from sluice.errors import InvalidParameterError, SluiceError
from sluice.filter import compile_selector
from sluice.filter.tags import parse_tag_subscription
from sluice.spark.storefiles import ARROW_SCHEMA, SCHEMA_DDL

log = logging.getLogger(__name__)

_BATCH_ROWS = 4096
_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)


@dataclass(frozen=True, slots=True)
class QueueRange:
    broker: str
    queue_id: int
    start: int
    end: int

    @property
    def key(self) -> str:
        return f"{self.broker}:{self.queue_id}"


class RangePartition(InputPartition):
    def __init__(self, r: QueueRange) -> None:
        super().__init__((r.broker, r.queue_id, r.start, r.end))
        self.range = r


# ---- options ------------------------------------------------------------------------------------------
class Options:
    """The source options, checked once on the driver (names as in Spark's Kafka source)."""

    def __init__(self, options, *, streaming: bool = False) -> None:
        self.namesrv = options.get("namesrv")
        if not self.namesrv:
            raise InvalidParameterError("format('sluice') needs option namesrv (host:port[;host:port])")
        self.topic = options.get("topic")
        self.selector_type = (options.get("selectorType") or "TAG").upper()
        self.selector = options.get("selector") or ("*" if self.selector_type == "TAG" else None)
        if self.selector_type not in ("TAG", "SQL92"):
            raise InvalidParameterError(f"selectorType must be TAG or SQL92, not {self.selector_type!r}")
        compile_selector(self.selector_type, self.selector)  # refuse a bad selector before any task runs
        self.starting = options.get("startingOffsets") or ("latest" if streaming else "earliest")
        self.ending = options.get("endingOffsets") or "latest"
        self.starting_ts = _int_opt(options, "startingTimestamp")
        self.ending_ts = _int_opt(options, "endingTimestamp")
        self.max_per_trigger = _int_opt(options, "maxOffsetsPerTrigger")
        self.fail_on_data_loss = (options.get("failOnDataLoss") or "true").lower() != "false"
        self.min_partitions = _int_opt(options, "minPartitions") or 0
        self.pull_batch = _int_opt(options, "pullBatchSize") or 256  # the broker caps a pull by bytes
        self.group = options.get("group") or f"spark-sluice-{uuid.uuid4().hex[:12]}"
        self.broker_label = options.get("broker")


def _int_opt(options, name: str) -> int | None:
    raw = options.get(name)
    if raw is None or raw == "":
        return None
    try:
        return int(raw)
    except ValueError:
        raise InvalidParameterError(f"option {name} must be an integer, not {raw!r}") from None


def _offsets_json(spec: str, what: str) -> dict[str, dict[str, int]] | None:
    if spec in ("earliest", "latest"):
        return None
    try:
        data = orjson.loads(spec)
        return {str(b): {str(q): int(o) for q, o in qs.items()} for b, qs in data.items()}
    except (orjson.JSONDecodeError, AttributeError, TypeError, ValueError):
        raise InvalidParameterError(
            f"{what} must be earliest, latest or JSON like {{\"broker-a\": {{\"0\": 23}}}}, not {spec!r}") from None


# ---- broker access (only inside planning or tasks) ------------------------------------------------------
def _consumer(opts: Options):
    from sluice.client import PullConsumer

    c = PullConsumer(opts.group, opts.namesrv)
    c.start()
    return c


def queue_bounds(opts: Options) -> list[tuple[object, int, int]]:
    """(message queue, min offset, max offset) of every readable queue of the topic."""
    if not opts.topic:
        raise InvalidParameterError("reading format('sluice') needs option topic")
    c = _consumer(opts)
    try:
        return [(mq, c.min_offset(mq), c.max_offset(mq)) for mq in c.fetch_message_queues(opts.topic)]
    finally:
        c.shutdown()


def resolve(opts: Options, spec: str, ts: int | None, bounds, *, ending: bool) -> dict[str, int]:
    """Offsets per queue key for earliest/latest/JSON/timestamp specs (-2 earliest, -1 latest in JSON)."""
    out: dict[str, int] = {}
    table = _offsets_json(spec, "endingOffsets" if ending else "startingOffsets")
    c = _consumer(opts) if ts is not None else None
    try:
        for mq, lo, hi in bounds:
            key = f"{mq.broker_name}:{mq.queue_id}"
            if ts is not None:
                out[key] = c.search_offset(mq, ts)  # type: ignore[union-attr]
                continue
            want = spec
            if table is not None:
                v = table.get(mq.broker_name, {}).get(str(mq.queue_id))
                want = "latest" if v is None and ending else ("earliest" if v is None else str(v))
            if want == "earliest" or want == "-2":
                out[key] = lo
            elif want == "latest" or want == "-1":
                out[key] = hi
            else:
                out[key] = int(want)
    finally:
        if c is not None:
            c.shutdown()
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
        out.extend(QueueRange(r.broker, r.queue_id, s, min(s + step, r.end)) for s in range(r.start, r.end, step))
    return out


def _unique_key(*parts: object) -> str:
    """A deterministic 32-hex message id: the same (query, batch, partition, row) gives the same id."""
    return hashlib.blake2b("\x1f".join(map(str, parts)).encode(), digest_size=16).hexdigest().upper()


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
    mq = MessageQueue(topic=opts.topic, broker_name=r.broker, queue_id=r.queue_id)
    c = _consumer(opts)
    try:
        offset, pending = r.start, []
        while offset < r.end:
            res = c.pull(mq, sel, offset, min(opts.pull_batch, r.end - offset))
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
                yield _to_batch(pending, opts.broker_label or r.broker)
                pending = []
        if pending:
            yield _to_batch(pending, opts.broker_label or r.broker)
    finally:
        c.shutdown()


# ---- pushdown -----------------------------------------------------------------------------------------
def _sql_quote(s: str) -> str:
    return "'" + s.replace("'", "''") + "'"


def _admitted(f: Filter, at_least: int, above: int) -> tuple[int | None, int | None]:
    """The whole numbers [lo, hi) that comparison ``f`` with a value v admits, given ``at_least``
    (the least whole number >= v) and ``above`` (the least > v); None is unbounded, (None, None)
    a comparison that is not pushed."""
    return {EqualTo: (at_least, above), GreaterThan: (above, None), GreaterThanOrEqual: (at_least, None),
            LessThan: (None, at_least), LessThanOrEqual: (None, above)}.get(type(f), (None, None))


def _intersect(lo: int | None, hi: int | None, new_lo: int | None, new_hi: int | None) -> tuple[int | None, int | None]:
    """[lo, hi) narrowed by [new_lo, new_hi); None is unbounded."""
    return (new_lo if lo is None else lo if new_lo is None else max(lo, new_lo),
            new_hi if hi is None else hi if new_hi is None else min(hi, new_hi))


class Pushdown:
    """Conjuncts the broker (or the range planner) answers exactly; the rest stay in Spark."""

    def __init__(self) -> None:
        self.tag_sets: list[frozenset[str]] = []
        self.queue_ids: frozenset[int] | None = None
        self.offset_lo: int | None = None  # inclusive
        self.offset_hi: int | None = None  # exclusive
        self.ts_lo: int | None = None  # store time in ms, inclusive
        self.ts_hi: int | None = None  # exclusive

    def take(self, f: Filter) -> bool:
        attr = f.attribute
        if attr == ("tags",):
            if isinstance(f, EqualTo) and isinstance(f.value, str):
                self.tag_sets.append(frozenset([f.value]))
                return True
            if isinstance(f, In) and f.value and all(isinstance(v, str) for v in f.value):
                self.tag_sets.append(frozenset(f.value))
                return True
            return False
        if attr in (("queue_offset",), ("queue_id",), ("store_timestamp",)) and isinstance(f, IsNotNull):
            return True  # never null
        if attr == ("queue_id",) and isinstance(f, (EqualTo, In)):
            vals = [f.value] if isinstance(f, EqualTo) else list(f.value)
            if not all(isinstance(v, int) for v in vals):
                return False
            self.queue_ids = frozenset(vals) if self.queue_ids is None else self.queue_ids & frozenset(vals)
            return True
        if attr == ("store_timestamp",) and isinstance(getattr(f, "value", None), datetime.datetime):
            return self._take_time(f)
        if attr == ("queue_offset",) and isinstance(f.value if hasattr(f, "value") else None, int):
            lo, hi = _admitted(f, f.value, f.value + 1)
            if lo is None and hi is None:
                return False
            self.offset_lo, self.offset_hi = _intersect(self.offset_lo, self.offset_hi, lo, hi)
            return True
        return False

    def _take_time(self, f: Filter) -> bool:
        """Store times only grow within a queue (the commit log stamps max(now, last)), so a bound on
        store_timestamp is a queue-offset bound the broker's search_offset finds exactly."""
        v = f.value
        if v.tzinfo is None:
            return False
        us = (v - _EPOCH) // datetime.timedelta(microseconds=1)
        floor_ms, ceil_ms = us // 1000, -(-us // 1000)
        # The column holds ms * 1000; translate each comparison on microseconds into whole ms.
        lo, hi = _admitted(f, ceil_ms, floor_ms + 1)
        if lo is None and hi is None:
            return False
        self.ts_lo, self.ts_hi = _intersect(self.ts_lo, self.ts_hi, lo, hi)
        return True

    def selector(self, selector_type: str, selector: str | None) -> tuple[str, str | None]:
        """The user's selector narrowed by the pushed tag conjuncts (still exact)."""
        if not self.tag_sets:
            return selector_type, selector
        tags = frozenset.intersection(*self.tag_sets)
        if selector_type == "TAG":
            current = parse_tag_subscription(selector)
            if current is not None:
                tags = tags & frozenset(current)
            if all(t == t.strip("".join(map(chr, range(33)))) and "||" not in t and t for t in tags):
                return "TAG", " || ".join(sorted(tags)) if tags else None
        cond = f"TAGS IN ({', '.join(_sql_quote(t) for t in sorted(tags))})" if tags else "FALSE"
        if selector_type == "SQL92" and selector:
            return "SQL92", f"({selector}) AND {cond}"
        return "SQL92", cond


# ---- batch reader -------------------------------------------------------------------------------------
class SluiceBatchReader(DataSourceReader):
    def __init__(self, options) -> None:
        self.opts = Options(options)
        self.push = Pushdown()

    def pushFilters(self, filters: list[Filter]) -> Iterator[Filter]:
        for f in filters:
            if not self.push.take(f):
                yield f

    def partitions(self) -> Sequence[InputPartition]:
        o, p = self.opts, self.push
        bounds = queue_bounds(o)
        if p.queue_ids is not None:
            bounds = [b for b in bounds if b[0].queue_id in p.queue_ids]
        start = resolve(o, o.starting, o.starting_ts, bounds, ending=False)
        end = resolve(o, o.ending, o.ending_ts, bounds, ending=True)
        if p.ts_lo is not None:
            by_time = resolve(o, "earliest", p.ts_lo, bounds, ending=False)
            start = {k: max(v, by_time[k]) for k, v in start.items()}
        if p.ts_hi is not None:
            by_time = resolve(o, "latest", p.ts_hi, bounds, ending=True)
            end = {k: min(v, by_time[k]) for k, v in end.items()}
        ranges = []
        for mq, lo, hi in bounds:
            key = f"{mq.broker_name}:{mq.queue_id}"
            s, e = start[key], min(end[key], hi)
            if s < lo:
                if o.fail_on_data_loss:
                    raise SluiceError(f"data loss: {key} starts at {lo}, {s} was requested; "
                                      "set failOnDataLoss=false to skip it")
                s = lo
            if p.offset_lo is not None:
                s = max(s, p.offset_lo)
            if p.offset_hi is not None:
                e = min(e, p.offset_hi)
            ranges.append(QueueRange(mq.broker_name, mq.queue_id, s, e))
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


# ---- stream reader ------------------------------------------------------------------------------------
class SluiceStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Offsets {"broker:queue": next offset} live in Spark's checkpoint; commit() is advisory (lazy)."""

    def __init__(self, options) -> None:
        self.opts = Options(options, streaming=True)
        self.target: dict[str, int] | None = None

    def _latest(self) -> dict[str, int]:
        return {f"{mq.broker_name}:{mq.queue_id}": hi for mq, _lo, hi in queue_bounds(self.opts)}

    def initialOffset(self) -> dict:
        o = self.opts
        return resolve(o, o.starting, o.starting_ts, queue_bounds(o), ending=False)

    def getDefaultReadLimit(self) -> ReadLimit:
        m = self.opts.max_per_trigger
        return ReadMaxRows(m) if m else ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self.target = self._latest()

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        latest = self.target if self.target is not None else self._latest()
        end = {k: max(v, start.get(k, 0)) for k, v in latest.items()}
        for k, v in start.items():
            end.setdefault(k, v)
        if isinstance(limit, ReadMaxRows):
            end = fair_limit(start, end, limit.max_rows)
        return end

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        ranges = []
        for key, e in sorted(end.items()):
            broker, _, qid = key.rpartition(":")
            s = start.get(key, 0)
            if e > s:
                ranges.append(QueueRange(broker, int(qid), s, e))
        return [RangePartition(r) for r in split_ranges(ranges, self.opts.min_partitions)]

    def read(self, partition: RangePartition):
        yield from read_range(self.opts, partition.range, self.opts.selector_type, self.opts.selector)

    def commit(self, end: dict) -> None:
        """Nothing to do: the checkpoint is the record of what was read (Kafka's source does the same)."""


def fair_limit(start: dict[str, int], end: dict[str, int], max_rows: int) -> dict[str, int]:
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


# ---- writers ------------------------------------------------------------------------------------------
@dataclass
class SentCount(WriterCommitMessage):
    partition: int
    count: int


def _keyed_message_class():
    from dataclasses import dataclass as _dc

    from sluice.message import Message
    from sluice.protocol import properties as P

    @_dc(slots=True)
    class KeyedMessage(Message):
        """A message whose UNIQ_KEY is chosen by the writer (the SDK keeps an id a message carries)."""

        uniq_key: str = ""

        def all_properties(self) -> dict[str, str]:
            props = Message.all_properties(self)
            props[P.UNIQ_KEY] = self.uniq_key
            return props

    return KeyedMessage


_SEND_BATCH = 64
_SEND_BATCH_BYTES = 1024 * 1024


def send_rows(opts_map: dict[str, str | None], rows, key_prefix: tuple[object, ...]) -> SentCount:
    """Send the rows of one task in per-topic batches; row i of partition p gets UNIQ_KEY = hash(prefix, p, i)."""
    from pyspark import TaskContext

    from sluice.client import Producer
    from sluice.protocol import properties as P

    keyed = _keyed_message_class()
    ctx = TaskContext.get()
    part = ctx.partitionId() if ctx else 0
    prefix = key_prefix
    if ctx is not None and ctx.getLocalProperty("streaming.sql.batchId") is not None:
        # Stable across a restart from the same checkpoint: the query id and the replayed batch id.
        prefix = (ctx.getLocalProperty("sql.streaming.queryId"), ctx.getLocalProperty("streaming.sql.batchId"))
    topic_opt = opts_map.get("topic")
    producer = Producer(f"spark-sluice-writer-{uuid.uuid4().hex[:8]}", opts_map["namesrv"])
    producer.start()
    n = 0
    pending: list = []
    size = 0

    def flush() -> None:
        nonlocal pending, size
        if pending:
            producer.send_batch(pending) if len(pending) > 1 else producer.send(pending[0])
        pending, size = [], 0

    try:
        for i, row in enumerate(rows):
            d = row.asDict()
            body = d.get("body")
            if body is None:
                raise InvalidParameterError("writing to format('sluice') needs a non-null body column")
            topic = topic_opt or d.get("topic")
            if not topic:
                raise InvalidParameterError("no topic: give a topic column or the topic option")
            props = {k: v for k, v in (d.get("properties") or {}).items() if k not in P.SYSTEM_NAMES}
            body_b = body.encode() if isinstance(body, str) else bytes(body)
            msg = keyed(topic, body_b, tags=d.get("tags"), keys=d.get("keys"), properties=props,
                        uniq_key=_unique_key(*prefix, part, i))
            if pending and (pending[0].topic != topic or len(pending) >= _SEND_BATCH
                            or size + len(body_b) > _SEND_BATCH_BYTES):
                flush()
            pending.append(msg)
            size += len(body_b) + 256
            n += 1
        flush()
    finally:
        producer.shutdown()
    return SentCount(part, n)


class SluiceBatchWriter(DataSourceWriter):
    def __init__(self, options) -> None:
        if not options.get("namesrv"):
            raise InvalidParameterError("format('sluice') needs option namesrv")
        self.opts = {"namesrv": options.get("namesrv"), "topic": options.get("topic")}
        # Chosen once on the driver and pickled to every task: a retried task re-sends the same ids.
        self.write_id = options.get("writeId") or uuid.uuid4().hex

    def write(self, iterator) -> SentCount:
        return send_rows(self.opts, iterator, (self.write_id, 0))


class SluiceStreamWriter(DataSourceStreamWriter):
    def __init__(self, options) -> None:
        if not options.get("namesrv"):
            raise InvalidParameterError("format('sluice') needs option namesrv")
        self.opts = {"namesrv": options.get("namesrv"), "topic": options.get("topic")}

    def write(self, iterator) -> SentCount:
        return send_rows(self.opts, iterator, ("stream", -1))

    def commit(self, messages, batchId: int) -> None:
        log.info("sluice sink: batch %d sent %d messages", batchId, sum(m.count for m in messages if m))

    def abort(self, messages, batchId: int) -> None:
        log.warning("sluice sink: batch %d aborted; a replay re-sends the same message ids", batchId)


class SluiceDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "sluice"

    def schema(self) -> str:
        return SCHEMA_DDL

    def reader(self, schema) -> DataSourceReader:
        return SluiceBatchReader(self.options)

    def streamReader(self, schema) -> DataSourceStreamReader:
        return SluiceStreamReader(self.options)

    def writer(self, schema, overwrite: bool) -> DataSourceWriter:
        return SluiceBatchWriter(self.options)

    def streamWriter(self, schema, overwrite: bool) -> DataSourceStreamWriter:
        return SluiceStreamWriter(self.options)
