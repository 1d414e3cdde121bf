"""Offset tables keyed by message queue: RocketMQ's ``ResetOffsetBody`` and Sluice's list form.

RocketMQ serialises ``Map<MessageQueue, Long>`` with fastjson, which writes the
key object itself as the key (not valid JSON)::

    {"offsetTable":{{"brokerName":"broker-a","queueId":0,"topic":"T"}:42}}

Java clients decode RESET_CONSUMER_CLIENT_OFFSET (220) bodies only in that
form, so the broker sends it. Sluice's own admin bodies use a list instead
(``{"offsetTable":[{"topic","brokerName","queueId","offset"}]}``, see
docs/broker.md); :func:`decode_offset_table` reads both.
"""
from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import orjson

from sluice.errors import InvalidParameterError
from sluice.protocol.bodies import MessageQueue, loads_lenient

__all__ = ["decode_offset_table", "decode_queue_table", "encode_fastjson_offset_table", "fastjson_queue_table",
           "loads_fastjson"]

# A flat JSON object in key position: after "{" or "," and before ":". Topic and broker names cannot
# hold braces, so a MessageQueue key never nests.
_OBJECT_KEY = re.compile(rb"([{,]\s*)(\{[^{}]*\})(\s*:)")


def encode_fastjson_offset_table(offsets: Mapping[MessageQueue, int]) -> bytes:
    """``{"offsetTable":{{mq}:offset,...}}`` as fastjson writes ResetOffsetBody (keys in sorted field order)."""
    items = []
    for mq, offset in offsets.items():
        key = orjson.dumps({"brokerName": mq.broker_name, "queueId": mq.queue_id, "topic": mq.topic})
        items.append(key + b":" + str(int(offset)).encode())
    return b'{"offsetTable":{' + b",".join(items) + b"}}"


def fastjson_queue_table(entries: list[Mapping[str, Any]]) -> bytes:
    """Flat entries (``topic``, ``brokerName``, ``queueId`` plus the value's fields) as fastjson writes a
    ``Map<MessageQueue, V>``: the object ``{"offsetTable": ...}`` of TopicStatsTable or ConsumeStats, what
    Java's fastjson (rocketmq-dashboard, rocketmq-exporter) parses; :func:`decode_queue_table` reads it."""
    items = []
    for e in entries:
        key = orjson.dumps({"brokerName": e["brokerName"], "queueId": e["queueId"], "topic": e["topic"]})
        value = {k: v for k, v in e.items() if k not in ("topic", "brokerName", "queueId")}
        items.append(key + b":" + orjson.dumps(value))
    return b"{" + b",".join(items) + b"}"


def _quote_key(match: re.Match[bytes]) -> bytes:
    return match.group(1) + orjson.dumps(match.group(2).decode("utf-8")) + match.group(3)


def loads_fastjson(data: bytes) -> Any:
    """A JSON body that may hold fastjson's object keys anywhere (ConsumeStatsList nests ConsumeStats)."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return loads_lenient(_OBJECT_KEY.sub(_quote_key, data))


def decode_queue_table(data: bytes | str, key: str = "offsetTable") -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A body with a table keyed by message queue, in either form: the whole document and the table as
    flat entries (``topic``, ``brokerName``, ``queueId`` plus the value's fields; a bare number value
    becomes ``offset``). Reads Sluice's list form and RocketMQ's fastjson form of ResetOffsetBody,
    TopicStatsTable (GET_TOPIC_STATS_INFO) and ConsumeStats (GET_CONSUME_STATS)."""
    raw = data.encode() if isinstance(data, str) else bytes(data)
    if not raw:
        raise InvalidParameterError("queue table body is empty")
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError:
        doc = loads_lenient(_OBJECT_KEY.sub(_quote_key, raw))
    table = doc.get(key) if isinstance(doc, dict) else None
    entries: list[dict[str, Any]] = []
    try:
        if isinstance(table, list):
            for e in table:
                entries.append({**e, "topic": str(e["topic"]), "brokerName": str(e["brokerName"]),
                                "queueId": int(e["queueId"])})
        elif isinstance(table, dict):
            for k, value in table.items():
                mq = orjson.loads(k)
                fields = dict(value) if isinstance(value, dict) else {"offset": int(value)}
                entries.append({**fields, "topic": str(mq["topic"]), "brokerName": str(mq["brokerName"]),
                                "queueId": int(mq["queueId"])})
        else:
            raise InvalidParameterError(f"body has no {key}")
    except (KeyError, TypeError, ValueError, orjson.JSONDecodeError) as exc:
        raise InvalidParameterError(f"malformed {key} entry: {exc!r}") from None
    return doc, entries


def decode_offset_table(data: bytes | str) -> dict[MessageQueue, int]:
    """The ``offsetTable`` of a body in fastjson's object-key form or Sluice's list form."""
    _, entries = decode_queue_table(data)
    try:
        return {MessageQueue(topic=e["topic"], broker_name=e["brokerName"], queue_id=e["queueId"]): int(e["offset"])
                for e in entries}
    except (KeyError, TypeError, ValueError) as exc:
        raise InvalidParameterError(f"malformed offsetTable entry: {exc!r}") from None
