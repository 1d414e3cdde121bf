"""Writes of ``format("sluice")``: rows sent as messages with ids that make replays harmless.

Batch writes: a message's id (UNIQ_KEY, its ``msg_id``) is a hash of the write id and
the row's content (topic, body, tags, keys, properties), plus the row's occurrence
among identical rows of its task, so that real duplicate rows stay apart. A replay of
the same rows, however partitioned, re-sends the same ids and the broker's duplicate
check (broker/dedup.py) stores nothing new; different rows under a reused write id
get new ids and are all stored. Identical rows in *different* partitions start their
occurrences at 0 in each task (no task sees the others), so some copies share an id:
each task reports (content digest, count, topic) of what it sent, and the driver's
commit works out the occurrences no task sent (a content sent by k tasks, n copies in
all, the largest task's share m: occurrences m..n-1) and sends them itself, copying the
stored occurrence 0, under their own ids: a replay finds them stored, as any other row.

Streaming writes keep (query id, micro-batch id, partition, row): a replayed
micro-batch reads the same offsets into the same partitions.

Columns: ``body`` or Kafka's ``value`` (required), ``topic`` (or the option),
``tags``, ``keys`` (array) or Kafka's ``key``, ``properties`` (map) and Kafka's
``headers`` (array of key/value structs; values UTF-8).
"""
from __future__ import annotations

import hashlib
import logging
import time
import uuid
from array import array
from collections import Counter
from dataclasses import dataclass, field

import orjson
from pyspark.sql.datasource import DataSourceStreamWriter, DataSourceWriter, WriterCommitMessage

from sluice.errors import InvalidParameterError, SluiceError
from sluice.spark.options import WRITE_OPTIONS, credentials, tls_options, warn_unknown

__all__ = ["SentCount", "SluiceBatchWriter", "SluiceStreamWriter", "check_write_schema", "content_digest",
           "message_id", "row_message", "send_twins", "unsent_twins"]

log = logging.getLogger(__name__)

_SEND_BATCH = 64
_SEND_BATCH_BYTES = 1024 * 1024
_DIGEST = 16


@dataclass
class SentCount(WriterCommitMessage):
    partition: int
    count: int
    #: Batch writes: the content digests this task sent (16 bytes each, concatenated, each once) ...
    digests: bytes = field(default=b"", repr=False)
    #: ... how many rows had each (array "I") and the index of each one's topic in ``topics`` (array "I").
    counts: bytes = field(default=b"", repr=False)
    topic_of: bytes = field(default=b"", repr=False)
    topics: tuple[str, ...] = ()


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
    topic_of: dict[bytes, str] = {}
    producer = Producer(f"spark-sluice-writer-{uuid.uuid4().hex[:8]}", opts_map["namesrv"],
                        credentials=opts_map.get("credentials"), **opts_map.get("tls", {}))
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
                topic_of.setdefault(digest, topic)
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
    digests = list(seen)
    topics = sorted(set(topic_of.values()))
    index = {t: i for i, t in enumerate(topics)}
    return SentCount(part, n, b"".join(digests), array("I", [seen[d] for d in digests]).tobytes(),
                     array("I", [index[topic_of[d]] for d in digests]).tobytes(), tuple(topics))


def unsent_twins(messages) -> dict[bytes, tuple[str, int, int]]:
    """Contents that several tasks sent: digest -> (topic, the largest task's count, the total count).
    Occurrences [largest, total) of each were sent by no task."""
    seen: dict[bytes, list] = {}
    for m in messages:
        if m is None or not m.digests:
            continue
        counts, where = array("I"), array("I")
        counts.frombytes(m.counts)
        where.frombytes(m.topic_of)
        for j in range(len(counts)):
            d = m.digests[j * _DIGEST:(j + 1) * _DIGEST]
            entry = seen.get(d)
            if entry is None:
                seen[d] = [m.topics[where[j]], 1, counts[j], counts[j]]
            else:
                entry[1] += 1
                entry[2] = max(entry[2], counts[j])
                entry[3] += counts[j]
    return {d: (t, most, total) for d, (t, owners, most, total) in seen.items() if owners > 1}


def send_twins(opts_map: dict, write_id: str, twins: dict[bytes, tuple[str, int, int]]) -> tuple[int, list[str]]:
    """Send the occurrences of split twins that no task sent, copied from the stored occurrence 0.
    Returns (messages sent, ids of occurrence 0 that could not be found)."""
    from sluice.client import Producer
    from sluice.protocol import properties as P
    from sluice.spark.broker_io import BrokerSession

    keyed = _keyed_message_class()
    sent, missing = 0, []
    producer = Producer(f"spark-sluice-writer-{uuid.uuid4().hex[:8]}", opts_map["namesrv"],
                        credentials=opts_map.get("credentials"), **opts_map.get("tls", {}))
    producer.start()
    try:
        with BrokerSession(opts_map["namesrv"], opts_map.get("credentials"), opts_map.get("tls")) as b:
            for d, (topic, most, total) in sorted(twins.items()):
                first = message_id(write_id, d, 0)
                stored = None
                for _ in range(50):  # the key index follows the append closely: a short, bounded wait
                    stored = b.find_by_id(topic, first)
                    if stored is not None:
                        break
                    time.sleep(0.1)
                if stored is None:
                    missing.append(first)
                    continue
                props = {k: v for k, v in stored.properties.items() if k not in P.SYSTEM_NAMES
                         and k != "SLUICE_DEDUP"}
                for k in range(most, total):
                    producer.send(keyed(topic, stored.body, tags=stored.properties.get(P.TAGS), keys=stored.keys,
                                        properties=props, uniq_key=message_id(write_id, d, k)))
                    sent += 1
    finally:
        producer.shutdown()
    return sent, missing


def _writer_opts(options) -> dict:
    if not options.get("namesrv"):
        raise InvalidParameterError("format('sluice') needs option namesrv")
    return {"namesrv": options.get("namesrv"), "topic": options.get("topic"), "credentials": credentials(options),
            "tls": tls_options(options)}


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
        twins = unsent_twins(messages)
        extra = 0
        if twins:
            extra, missing = send_twins(self.opts, self.write_id, twins)
            if missing:
                raise SluiceError(
                    f"sluice write {self.write_id}: {len(missing)} row content(s) appear in more than one "
                    f"partition and their stored copy (e.g. id {missing[0]}) cannot be found to add the other "
                    "copies. Repartition by every column (df.repartition(*df.columns)) so identical rows share "
                    "a partition and write again with the same writeId")
        log.info("sluice write %s: %d messages (%d copies of rows split across partitions)", self.write_id,
                 sum(m.count for m in messages if m) + extra, extra)


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
