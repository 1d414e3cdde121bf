"""RocketMQ 4.x message trace data: trace contexts to and from the bodies of ``RMQ_SYS_TRACE_TOPIC`` messages.

A trace body is a run of lines, each ending with FIELD_SEP (char 2), whose
fields are separated by CONTENT_SEP (char 1), as
client/src/main/java/org/apache/rocketmq/client/trace/TraceDataEncoder.java
writes them (``encoderFromContextBean``) and reads them (``decoderFromTraceDataString``):

- ``Pub``: type, timestamp, regionId, group, topic, msgId, tags, keys, storeHost, bodyLength, costTime,
  msgType ordinal, offsetMsgId, success (older writers: 13 fields without offsetMsgId; newer: a 15th,
  clientHost);
- ``SubBefore``: type, timestamp, regionId, group, requestId, msgId, retryTimes, keys;
- ``SubAfter``: type, requestId, msgId, costTime, success, keys, contextCode, timestamp, group (older
  writers stop after keys (6 fields), contextCode (7) or timestamp (8));
- ``EndTransaction``: type, timestamp, regionId, group, topic, msgId, tags, keys, storeHost, msgType
  ordinal, transactionId, transactionState, fromTransactionCheck.

One context of several beans (a consumed batch) is one line per bean. A trace message's keys are every
bean's msgId and keys (TraceTransferBean.transKey), so a key query for a msgId finds its traces. Java
writes a null string as ``null`` (StringBuilder.append), so a message without tags or keys is traced with
``null`` there; this codec keeps such values as they are. Lines of a type it does not know (written by a
newer client) are skipped, as RocketMQ's decoder does; a line of a known type that is too short or has a
malformed number raises TraceFormatError naming the line and the field, as does a msgType ordinal
MessageType.values() has no entry for or an EndTransaction state LocalTransactionState.valueOf refuses (Java's
decoder throws there too).
"""
from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import Enum, IntEnum

from sluice.errors import InvalidParameterError

__all__ = [
    "CONTENT_SEP", "DEFAULT_REGION", "FIELD_SEP", "MESSAGE_TYPES", "TRACE_PRODUCER_GROUP", "TRACE_TOPIC",
    "TRANSACTION_STATES",
    "ConsumeReturnType", "MsgType", "TraceBean", "TraceContext", "TraceFormatError", "TraceType",
    "decode_traces", "encode_context", "encode_contexts",
]

CONTENT_SEP = "\x01"  # TraceConstants.CONTENT_SPLITOR
FIELD_SEP = "\x02"  # TraceConstants.FIELD_SPLITOR
TRACE_TOPIC = "RMQ_SYS_TRACE_TOPIC"  # TopicValidator.RMQ_SYS_TRACE_TOPIC
TRACE_PRODUCER_GROUP = "_INNER_TRACE_PRODUCER"  # TraceConstants.GROUP_NAME(_PREFIX)
DEFAULT_REGION = "DefaultRegion"  # MixAll.DEFAULT_TRACE_REGION_ID


class TraceFormatError(InvalidParameterError):
    """A trace body line of a known type that RocketMQ's decoder could not read either."""


class TraceType(str, Enum):
    """TraceType.java (the names are the wire values)."""

    Pub = "Pub"
    SubBefore = "SubBefore"
    SubAfter = "SubAfter"
    EndTransaction = "EndTransaction"


class MsgType(IntEnum):
    """MessageType.java: traces carry the ordinal."""

    Normal_Msg = 0
    Trans_Msg_Half = 1
    Trans_msg_Commit = 2
    Delay_Msg = 3
    Order_Msg = 4


MESSAGE_TYPES = {t.value: t.name for t in MsgType}
#: LocalTransactionState.java's names: an EndTransaction line's transactionState.
TRANSACTION_STATES = ("COMMIT_MESSAGE", "ROLLBACK_MESSAGE", "UNKNOW")


class ConsumeReturnType(IntEnum):
    """ConsumeReturnType.java: a SubAfter's contextCode is the ordinal."""

    SUCCESS = 0
    TIME_OUT = 1
    EXCEPTION = 2
    RETURNNULL = 3
    FAILED = 4


@dataclass(slots=True)
class TraceBean:
    """TraceBean.java: one traced message. Which fields a line carries depends on the context's type."""

    topic: str = ""
    msg_id: str = ""
    offset_msg_id: str = ""
    tags: str = ""
    keys: str = ""
    store_host: str = ""
    client_host: str = ""
    retry_times: int = 0
    body_length: int = 0
    msg_type: int = MsgType.Normal_Msg
    transaction_id: str = ""
    transaction_state: str = ""
    from_transaction_check: bool = False


@dataclass(slots=True)
class TraceContext:
    """TraceContext.java: one Pub, SubBefore, SubAfter or EndTransaction record and its beans."""

    trace_type: TraceType
    timestamp: int = 0
    region_id: str = ""
    group: str = ""
    cost_time: int = 0
    success: bool = True
    request_id: str = ""
    context_code: int = 0
    beans: list[TraceBean] = field(default_factory=list)


def _java_bool(v: bool) -> str:
    return "true" if v else "false"


_NAMES = {
    TraceType.Pub: ("type", "timestamp", "regionId", "group", "topic", "msgId", "tags", "keys", "storeHost",
                    "bodyLength", "costTime", "msgType", "offsetMsgId", "success"),
    TraceType.SubBefore: ("type", "timestamp", "regionId", "group", "requestId", "msgId", "retryTimes", "keys"),
    TraceType.SubAfter: ("type", "requestId", "msgId", "costTime", "success", "keys", "contextCode", "timestamp",
                         "group"),
    TraceType.EndTransaction: ("type", "timestamp", "regionId", "group", "topic", "msgId", "tags", "keys",
                               "storeHost", "msgType", "transactionId", "transactionState",
                               "fromTransactionCheck"),
}


def _line(t: TraceType, fields: tuple[object, ...]) -> str:
    line = CONTENT_SEP.join(map(str, fields))
    # One count per line, not a test per field: a separator inside a field shows as one too many.
    if line.count(CONTENT_SEP) != len(fields) - 1 or FIELD_SEP in line:
        for name, value in zip(_NAMES[t], fields):
            text = str(value)
            if CONTENT_SEP in text or FIELD_SEP in text:
                raise TraceFormatError(f"trace field {name} {text!r} contains a trace separator (char 1 or 2)")
    return line + FIELD_SEP


def encode_context(ctx: TraceContext) -> tuple[str, list[str]]:
    """TraceDataEncoder.encoderFromContextBean: the context's lines and the keys its trace message carries
    (each bean's msgId, then its keys split at spaces). TraceFormatError when a text field holds a separator
    or the context has no bean."""
    if not ctx.beans:
        raise TraceFormatError(f"a {ctx.trace_type.value} trace context needs at least one bean")
    t = ctx.trace_type
    c = ctx
    if t is TraceType.Pub:
        b = ctx.beans[0]  # RocketMQ writes the first bean only for Pub and EndTransaction
        data = _line(t, (t.value, c.timestamp, c.region_id, c.group, b.topic, b.msg_id, b.tags, b.keys,
                         b.store_host, b.body_length, c.cost_time, int(b.msg_type), b.offset_msg_id,
                         _java_bool(c.success)))
    elif t is TraceType.EndTransaction:
        b = ctx.beans[0]
        data = _line(t, (t.value, c.timestamp, c.region_id, c.group, b.topic, b.msg_id, b.tags, b.keys,
                         b.store_host, int(b.msg_type), b.transaction_id, b.transaction_state,
                         _java_bool(b.from_transaction_check)))
    elif t is TraceType.SubBefore:
        data = "".join([_line(t, (t.value, c.timestamp, c.region_id, c.group, c.request_id, b.msg_id,
                                  b.retry_times, b.keys)) for b in ctx.beans])
    else:
        success = _java_bool(c.success)
        data = "".join([_line(t, (t.value, c.request_id, b.msg_id, c.cost_time, success, b.keys, c.context_code,
                                  c.timestamp, c.group)) for b in ctx.beans])
    keys: list[str] = []
    for b in ctx.beans:
        keys.append(b.msg_id)
        if b.keys and b.keys != "null":  # Java adds keys only when the message had some
            keys.extend(k for k in b.keys.split(" ") if k)
    return data, keys


def encode_contexts(contexts: Iterable[TraceContext]) -> tuple[bytes, list[str]]:
    """Several contexts as one trace message body (AsyncTraceDispatcher.flushData) and its keys, each once,
    in first-seen order."""
    parts: list[str] = []
    keys: dict[str, None] = {}
    for ctx in contexts:
        data, ks = encode_context(ctx)
        parts.append(data)
        keys.update(dict.fromkeys(ks))
    return "".join(parts).encode(), list(keys)


def _int(line: list[str], i: int, what: str, n: int) -> int:
    text = line[i]
    if _INT.fullmatch(text) is None:  # Long.parseLong / Integer.parseInt: an optional sign and digits
        raise TraceFormatError(f"trace line {n} ({line[0]}): field {i} ({what}) {text!r} is not an integer")
    return int(text)


def _msg_type(line: list[str], i: int, n: int) -> int:
    value = _int(line, i, "msgType", n)
    if value not in MESSAGE_TYPES:  # MessageType.values()[ordinal]
        raise TraceFormatError(f"trace line {n} ({line[0]}): field {i} (msgType) {value} is not a MessageType "
                               f"ordinal (0..{len(MESSAGE_TYPES) - 1})")
    return value


def _bool(text: str) -> bool:
    return text.lower() == "true"  # Boolean.parseBoolean: anything but "true" (any case) is false


_INT = re.compile(r"[+-]?[0-9]+")
_MIN_FIELDS = {TraceType.Pub: 13, TraceType.SubBefore: 8, TraceType.SubAfter: 6, TraceType.EndTransaction: 13}


def decode_traces(body: bytes | str) -> list[TraceContext]:
    """TraceDataEncoder.decoderFromTraceDataString: every context of a trace message body, one bean each.
    A body that is not UTF-8 raises TraceFormatError."""
    if isinstance(body, (bytes, bytearray, memoryview)):
        try:
            text = bytes(body).decode()
        except UnicodeDecodeError as exc:
            raise TraceFormatError(f"trace body is not UTF-8: {exc}") from None
    else:
        text = body
    out: list[TraceContext] = []
    for n, raw in enumerate(text.split(FIELD_SEP), 1):
        line = raw.split(CONTENT_SEP)
        try:
            t = TraceType(line[0])
        except ValueError:
            continue  # an empty tail or a type of a newer writer
        if len(line) < _MIN_FIELDS[t]:
            raise TraceFormatError(f"trace line {n} ({t.value}) has {len(line)} fields, "
                                   f"at least {_MIN_FIELDS[t]} expected")
        if t is TraceType.Pub:
            bean = TraceBean(topic=line[4], msg_id=line[5], tags=line[6], keys=line[7], store_host=line[8],
                             body_length=_int(line, 9, "bodyLength", n), msg_type=_msg_type(line, 11, n))
            ctx = TraceContext(t, timestamp=_int(line, 1, "timestamp", n), region_id=line[2], group=line[3],
                               cost_time=_int(line, 10, "costTime", n), beans=[bean])
            if len(line) == 13:
                ctx.success = _bool(line[12])
            else:
                bean.offset_msg_id = line[12]
                ctx.success = _bool(line[13])
                if len(line) >= 15:
                    bean.client_host = line[14]
        elif t is TraceType.SubBefore:
            bean = TraceBean(msg_id=line[5], retry_times=_int(line, 6, "retryTimes", n), keys=line[7])
            ctx = TraceContext(t, timestamp=_int(line, 1, "timestamp", n), region_id=line[2], group=line[3],
                               request_id=line[4], beans=[bean])
        elif t is TraceType.SubAfter:
            bean = TraceBean(msg_id=line[2], keys=line[5])
            ctx = TraceContext(t, request_id=line[1], cost_time=_int(line, 3, "costTime", n),
                               success=_bool(line[4]), beans=[bean])
            if len(line) >= 7:
                ctx.context_code = _int(line, 6, "contextCode", n)
            if len(line) >= 8:
                ctx.timestamp = _int(line, 7, "timestamp", n)
            if len(line) >= 9:
                ctx.group = line[8]
        else:
            if line[11] not in TRANSACTION_STATES:  # LocalTransactionState.valueOf
                raise TraceFormatError(f"trace line {n} (EndTransaction): field 11 (transactionState) {line[11]!r} "
                                       f"is not one of {', '.join(TRANSACTION_STATES)}")
            bean = TraceBean(topic=line[4], msg_id=line[5], tags=line[6], keys=line[7], store_host=line[8],
                             msg_type=_msg_type(line, 9, n), transaction_id=line[10],
                             transaction_state=line[11], from_transaction_check=_bool(line[12]))
            ctx = TraceContext(t, timestamp=_int(line, 1, "timestamp", n), region_id=line[2], group=line[3],
                               beans=[bean])
        out.append(ctx)
    return out
