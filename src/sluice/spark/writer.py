"""Writes of ``format("sluice")``: rows sent as messages with ids that make replays harmless.

Batch writes: a message's id (UNIQ_KEY, its ``msg_id``) is a hash of the write id and
the row's content (topic, body, tags, keys, properties), plus the row's occurrence
among identical rows of its task, so that real duplicate rows stay apart. A replay of
the same rows, however partitioned, re-sends the same ids and the broker's duplicate
check (broker/dedup.py) stores nothing new; different rows under a reused write id
get new ids and are all stored. Identical rows in *different* partitions share an id
(no task sees the others): the driver's commit counts them from the tasks' reports
and fails the job, naming how many, rather than let one of them vanish.

Streaming writes keep (query id, micro-batch id, partition, row): a replayed
micro-batch reads the same offsets into the same partitions.

Columns: ``body`` or Kafka's ``value`` (required), ``topic`` (or the option),
``tags``, ``keys`` (array) or Kafka's ``key``, ``properties`` (map) and Kafka's
``headers`` (array of key/value structs; values UTF-8).
"""
from __future__ import annotations

import hashlib
import logging
import uuid
from collections import Counter
from dataclasses import dataclass, field

import orjson
from pyspark.sql.datasource import DataSourceStreamWriter, DataSourceWriter, WriterCommitMessage

from sluice.errors import InvalidParameterError, SluiceError
from sluice.spark.options import WRITE_OPTIONS, credentials, warn_unknown

__all__ = ["SentCount", "SluiceBatchWriter", "SluiceStreamWriter", "check_write_schema", "content_digest",
           "message_id", "row_message"]

log = logging.getLogger(__name__)

_SEND_BATCH = 64
_SEND_BATCH_BYTES = 1024 * 1024
_DIGEST = 16


@dataclass
class SentCount(WriterCommitMessage):
    partition: int
    count: int
    #: Batch writes: the content digests this task sent (16 bytes each, concatenated, each once).
    digests: bytes = field(default=b"", repr=False)


def _unique_key(*parts: object) -> str:
    """A deterministic 32-hex message id from its parts."""
    return hashlib.blake2b("\x1f".join(map(str, parts)).encode(), digest_size=16).hexdigest().upper()


def message_id(write_id: str, digest: bytes, occurrence: int) -> str:
    """The id of the ``occurrence``-th row (0-based, within its task) with content ``digest``."""
    return _unique_key(write_id, digest.hex(), occurrence)


def content_digest(topic: str, body: bytes, tags: str | None, keys: list[str], props: dict[str, str]) -> bytes:
    head = orjson.dumps([topic, tags, keys, sorted(props.items())])
    h = hashlib.blake2b(digest_size=_DIGEST)
    h.update(len(head).to_bytes(8, "big"))
    h.update(head)
    h.update(body)
    return h.digest()


_KNOWN_COLUMNS = {"body", "value", "topic", "tags", "keys", "key", "properties", "headers"}


def check_write_schema(schema, topic_option: str | None) -> None:
    """Refuse on the driver a DataFrame the writer cannot map (before any task sends)."""
    names = set(schema.fieldNames()) if schema is not None else set()
    if "body" in names and "value" in names:
        raise InvalidParameterError("give the message body as column body or as Kafka's value, not both")
    if "body" not in names and "value" not in names:
        raise InvalidParameterError(f"writing to format('sluice') needs a body (or Kafka's value) column; the "
                                    f"DataFrame has {', '.join(sorted(names)) or 'no columns'}")
    if "keys" in names and "key" in names:
        raise InvalidParameterError("give message keys as column keys (array) or as Kafka's key, not both")
    if not topic_option and "topic" not in names:
        raise InvalidParameterError("no topic: give a topic column or the topic option")


def _text(v, what: str) -> str:
    if isinstance(v, (bytes, bytearray)):
        try:
            return bytes(v).decode()
        except UnicodeDecodeError:
            raise InvalidParameterError(f"{what} is not UTF-8 text (message properties and keys are strings)") \
                from None
    return str(v)


def row_message(d: dict, topic_opt: str | None) -> tuple[str, bytes, str | None, list[str], dict[str, str]]:
    """(topic, body, tags, keys, properties) of one row (Kafka's value/key/headers mapped)."""
    from sluice.protocol import properties as P

    body = d.get("body") if "body" in d else d.get("value")
    if body is None:
        raise InvalidParameterError("writing to format('sluice') needs a non-null body (or value) in every row")
    topic = topic_opt or d.get("topic")
    if not topic:
        raise InvalidParameterError("no topic: give a topic column or the topic option")
    body_b = body.encode() if isinstance(body, str) else bytes(body)
    keys = d.get("keys")
    if keys is None and d.get("key") is not None:
        keys = [_text(d["key"], "key")]
    keys = [str(k) for k in keys or () if k is not None]
    props = {}
    for k, v in (d.get("properties") or {}).items():
        if v is None:
            raise InvalidParameterError(f"property {k!r} is null (message properties cannot be null)")
        if k not in P.SYSTEM_NAMES:
            props[k] = v
    for h in d.get("headers") or ():
        hk, hv = (h["key"], h["value"]) if not isinstance(h, tuple) else h
        if hk is None or hv is None:
            raise InvalidParameterError(f"header {hk!r} has no value (message properties cannot be null)")
        if hk in P.SYSTEM_NAMES:
            continue
        props[hk] = _text(hv, f"header {hk!r}")
    return topic, body_b, d.get("tags"), keys, props


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


def send_rows(opts_map: dict, rows, write_id: str | None) -> SentCount:
    """Send the rows of one task in per-topic batches. ``write_id`` set: content ids (batch writes);
    None: (query id, batch id, partition, row) ids from the streaming task's properties."""
    from pyspark import TaskContext

    from sluice.client import Producer

    keyed = _keyed_message_class()
    ctx = TaskContext.get()
    part = ctx.partitionId() if ctx else 0
    stream_prefix = None
    if write_id is None:
        # Stable across a restart from the same checkpoint: the query id and the replayed batch id.
        stream_prefix = (ctx.getLocalProperty("sql.streaming.queryId"),
                         ctx.getLocalProperty("streaming.sql.batchId")) if ctx else ("stream", -1)
    seen: Counter[bytes] = Counter()
    producer = Producer(f"spark-sluice-writer-{uuid.uuid4().hex[:8]}", opts_map["namesrv"],
                        credentials=opts_map.get("credentials"))
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
            topic, body, tags, keys, props = row_message(row.asDict(), opts_map.get("topic"))
            if stream_prefix is not None:
                uniq = _unique_key(*stream_prefix, part, i)
            else:
                digest = content_digest(topic, body, tags, keys, props)
                uniq = message_id(write_id, digest, seen[digest])
                seen[digest] += 1
            msg = keyed(topic, body, tags=tags, keys=keys, properties=props, uniq_key=uniq)
            if pending and (pending[0].topic != topic or len(pending) >= _SEND_BATCH
                            or size + len(body) > _SEND_BATCH_BYTES):
                flush()
            pending.append(msg)
            size += len(body) + 256
            n += 1
        flush()
    finally:
        producer.shutdown()
    return SentCount(part, n, b"".join(seen))


def shared_contents(messages) -> int:
    """Rows whose content also appeared in another task: each such group was stored once per occurrence
    index, so rows were lost; returns how many distinct contents were shared."""
    owners: Counter[bytes] = Counter()
    for m in messages:
        if m is None or not m.digests:
            continue
        d = m.digests
        owners.update(d[i:i + _DIGEST] for i in range(0, len(d), _DIGEST))
    return sum(1 for c in owners.values() if c > 1)


def _writer_opts(options) -> dict:
    if not options.get("namesrv"):
        raise InvalidParameterError("format('sluice') needs option namesrv")
    return {"namesrv": options.get("namesrv"), "topic": options.get("topic"), "credentials": credentials(options)}


class SluiceBatchWriter(DataSourceWriter):
    def __init__(self, options, schema=None) -> None:
        warn_unknown(options, WRITE_OPTIONS, "writing")
        self.opts = _writer_opts(options)
        check_write_schema(schema, self.opts["topic"])
        # Chosen once on the driver and pickled to every task: a retried task re-sends the same ids.
        self.write_id = options.get("writeId") or uuid.uuid4().hex

    def write(self, iterator) -> SentCount:
        return send_rows(self.opts, iterator, self.write_id)

    def commit(self, messages) -> None:
        shared = shared_contents(messages)
        if shared:
            raise SluiceError(
                f"sluice write {self.write_id}: {shared} row content(s) appear in more than one partition; "
                "identical rows get one id per partition and occurrence, so the duplicate check kept only one "
                "copy each. Repartition by every column (df.repartition(*df.columns)) so identical rows share "
                "a partition, or add a column that tells them apart, and write again with the same writeId")
        log.info("sluice write %s: %d messages", self.write_id, sum(m.count for m in messages if m))


class SluiceStreamWriter(DataSourceStreamWriter):
    def __init__(self, options, schema=None) -> None:
        warn_unknown(options, WRITE_OPTIONS, "writing")
        self.opts = _writer_opts(options)
        check_write_schema(schema, self.opts["topic"])

    def write(self, iterator) -> SentCount:
        return send_rows(self.opts, iterator, None)

    def commit(self, messages, batchId: int) -> None:
        log.info("sluice sink: batch %d sent %d messages", batchId, sum(m.count for m in messages if m))

    def abort(self, messages, batchId: int) -> None:
        log.warning("sluice sink: batch %d aborted; a replay re-sends the same message ids", batchId)
