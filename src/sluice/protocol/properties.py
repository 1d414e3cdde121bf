"""Message properties as RocketMQ stores and sends them: ``name \\x01 value \\x02`` per pair.

Names of the system properties are RocketMQ's (MessageConst.java).
"""
from __future__ import annotations

from collections.abc import Mapping

from sluice.errors import MessageIllegalError
from sluice.speedups import C

NAME_VALUE_SEPARATOR = "\x01"
PROPERTY_SEPARATOR = "\x02"
MAX_PROPERTIES_BYTES = 32767  # the stored length is a signed short

TAGS = "TAGS"
KEYS = "KEYS"
UNIQ_KEY = "UNIQ_KEY"
WAIT = "WAIT"
DELAY = "DELAY"
RETRY_TOPIC = "RETRY_TOPIC"
REAL_TOPIC = "REAL_TOPIC"
REAL_QID = "REAL_QID"
TRAN_MSG = "TRAN_MSG"
PGROUP = "PGROUP"
MIN_OFFSET = "MIN_OFFSET"
MAX_OFFSET = "MAX_OFFSET"
ORIGIN_MESSAGE_ID = "ORIGIN_MESSAGE_ID"
RECONSUME_TIME = "RECONSUME_TIME"
# Request-reply (MessageConst: PROPERTY_CORRELATION_ID, _MESSAGE_REPLY_TO_CLIENT, _MESSAGE_TTL, _CLUSTER,
# _MESSAGE_TYPE, _PUSH_REPLY_TIME, _REPLY_MESSAGE_ARRIVE_TIME).
CORRELATION_ID = "CORRELATION_ID"
REPLY_TO_CLIENT = "REPLY_TO_CLIENT"
TTL = "TTL"
CLUSTER = "CLUSTER"
MSG_TYPE = "MSG_TYPE"
PUSH_REPLY_TIME = "PUSH_REPLY_TIME"
ARRIVE_TIME = "ARRIVE_TIME"
#: MixAll.REPLY_MESSAGE_FLAG: the MSG_TYPE of a reply.
REPLY_MESSAGE_FLAG = "reply"
MAX_RECONSUME_TIMES = "MAX_RECONSUME_TIMES"
CONSUME_START_TIME = "CONSUME_START_TIME"
TIMER_DELIVER_MS = "TIMER_DELIVER_MS"
TIMER_DELAY_SEC = "TIMER_DELAY_SEC"
TIMER_DELAY_MS = "TIMER_DELAY_MS"
DLQ_ORIGIN_TOPIC = "DLQ_ORIGIN_TOPIC"
DLQ_ORIGIN_MESSAGE_ID = "DLQ_ORIGIN_MESSAGE_ID"
# Message trace (MessageConst.PROPERTY_MSG_REGION, PROPERTY_TRACE_SWITCH).
MSG_REGION = "MSG_REGION"
TRACE_ON = "TRACE_ON"
TRANSIENT_PREFIX = "__RMQ.TRANSIENT."
KEY_SEPARATOR = " "

#: Names a user may not set through ``Message.properties`` (MessageConst.STRING_HASH_SET).
SYSTEM_NAMES = frozenset({
    TAGS, KEYS, UNIQ_KEY, WAIT, DELAY, RETRY_TOPIC, REAL_TOPIC, REAL_QID, TRAN_MSG, PGROUP,
    MIN_OFFSET, MAX_OFFSET, ORIGIN_MESSAGE_ID, RECONSUME_TIME, MAX_RECONSUME_TIMES,
    CONSUME_START_TIME, "TRAN_PREPARED_QUEUE_OFFSET", "TRANSACTION_CHECK_TIMES",
    "CHECK_IMMUNITY_TIME_IN_SECONDS", "INSTANCE_ID", CORRELATION_ID, REPLY_TO_CLIENT, TTL, CLUSTER, MSG_TYPE,
    PUSH_REPLY_TIME, ARRIVE_TIME,
    "MSG_REGION", "TRACE_ON", "BUYER_ID", "TRANSFER_FLAG", "CORRECTION_FLAG", "MQ2_FLAG",
    "__transactionId__", "INNER_NUM", "INNER_BASE", "DUP_INFO", "__SHARDINGKEY",
    TIMER_DELIVER_MS, TIMER_DELAY_SEC, TIMER_DELAY_MS, DLQ_ORIGIN_TOPIC, DLQ_ORIGIN_MESSAGE_ID,
    "__CRC32#",
})


def check_property(name: str, value: str) -> None:
    """Refuse a name or value that would break the encoding (or be dropped by it)."""
    if not name:
        raise MessageIllegalError("property name is empty")
    for what, text in (("name", name), ("value", value)):
        if NAME_VALUE_SEPARATOR in text or PROPERTY_SEPARATOR in text:
            raise MessageIllegalError(
                f"property {what} {text!r} contains \\x01 or \\x02, the property separators"
            )


def encode_properties(props: Mapping[str, str]) -> str:
    """Encode a mapping; ``None`` values and transient names are left out, as RocketMQ does."""
    parts = []
    for name, value in props.items():
        if value is None or name.startswith(TRANSIENT_PREFIX):
            continue
        parts.append(f"{name}\x01{value}\x02")
    return "".join(parts)


def _decode_properties_py(text: str) -> dict[str, str]:
    """Decode; a part shorter than 3 chars or with an empty name or value is dropped (RocketMQ's rule).

    The reference for speedups' C twin, which ``decode_properties`` is when the extension is built."""
    out: dict[str, str] = {}
    if not text:
        return out
    for part in text.split(PROPERTY_SEPARATOR):
        if len(part) < 3:
            continue
        name, sep, value = part.partition(NAME_VALUE_SEPARATOR)
        if sep and name and value:
            out[name] = value
    return out


decode_properties = _decode_properties_py if C is None else C.decode_properties


def split_keys(keys: str | None) -> list[str]:
    """KEYS holds several keys separated by one space; empty tokens are skipped."""
    if not keys:
        return []
    return [k for k in keys.split(KEY_SEPARATOR) if k]
