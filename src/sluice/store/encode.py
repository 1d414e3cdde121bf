"""Encode a batch of messages for one queue into one buffer, ready to append.

The layout is sluice.format's (sluice.protocol.record.encode_record is the
reference; a property test holds this byte-for-byte equal to it). The batch path
exists because the append path is bounded by per-message Python: the topic, the
store host and the common IPv4 header shape are worked out once per batch, and
each message costs one struct pack plus a join. The C twin (speedups
encode_batch) takes the usual batch whole; this loop is the reference and takes
the rest.
"""
from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import lru_cache

from sluice.errors import InvalidParameterError, MessageIllegalError
from sluice.format import (
    FLAG_BORNHOST_V6,
    FLAG_STOREHOST_V6,
    HEAD,
    HEAD_V4,
    I64,
    MAGIC_V1,
    MAX_PROPERTIES_LENGTH,
    POS_BORNHOST,
    POS_STORETIMESTAMP_V4,
    TAIL,
    TRANSACTION_MASK,
    U16,
    crc32,
    is_queued,
    store_timestamp_pos,
)
from sluice.protocol import properties as P
from sluice.protocol.record import _host_bytes, check_topic
from sluice.speedups import C
from sluice.store.types import StoreMessage


@dataclass(slots=True)
class EncodedBatch:
    buf: bytearray  # the records back to back
    sizes: list[int]
    ts_positions: list[int]  # where STORETIMESTAMP sits in each record
    sysflags: list[int]  # as stored (with the IPv6 host bits)
    queued: list[bool] | None  # None when every record gets a queue offset, else per record
    props: list[str]  # each record's encoded properties, as stored
    tags: list[str | None]  # TAGS, KEYS and UNIQ_KEY of each record, for dispatch
    keys: list[str | None]
    uniq: list[str | None]


def _encode_props_checked(props: dict[str, str], transient: str) -> str:
    """The exact (slow) path: every name and value checked, transient names left out."""
    stored = 0
    for name, value in props.items():
        if type(name) is not str or type(value) is not str:
            raise MessageIllegalError(f"property {name!r} must map a str to a str")
        if not name:
            P.check_property(name, value)  # raises: the name is empty
        if not name.startswith(transient):
            stored += 1
    props_s = P.encode_properties(props)
    # Each stored pair adds exactly one \x01 and one \x02: more means a name or value holds one.
    if props_s.count("\x01") != stored or props_s.count("\x02") != stored:
        for name, value in props.items():
            P.check_property(name, value)
    return props_s


_INT32_MAX = 0x7FFFFFFF
_MAX_PROPS = MAX_PROPERTIES_LENGTH
_DISPATCH_NAMES = frozenset({P.TAGS, P.KEYS, P.UNIQ_KEY})


def _born_host_bytes(host: tuple[str, int]) -> tuple[bytes, bool]:
    return _host_bytes(tuple(host))


@lru_cache(maxsize=4096)
def _topic_part(topic: str) -> bytes:
    """The topic as a record stores it (length byte, then UTF-8), once it passed check_topic."""
    check_topic(topic)
    topic_b = topic.encode()
    return bytes([len(topic_b)]) + topic_b


def encode_batch(msgs: Sequence[StoreMessage], *, store_host: tuple[str, int], max_body: int) -> EncodedBatch:
    """Validate and encode ``msgs`` (all one topic and queue); raise MessageIllegalError (InvalidParameterError
    for a batch that mixes queues) before producing anything when any message is bad."""
    first = msgs[0]
    topic, queue_id = first.topic, first.queue_id
    topic_part = _topic_part(topic)
    if type(queue_id) is not int or not 0 <= queue_id <= _INT32_MAX:
        if isinstance(queue_id, int) and queue_id < 0:
            raise MessageIllegalError(f"queue id {queue_id} is negative")
        raise MessageIllegalError(f"queue id {queue_id!r} is not an integer in 0..{_INT32_MAX}")
    store_b, store_v6 = _host_bytes(tuple(store_host))
    if not store_v6:
        if C is not None:
            enc = C.encode_batch(msgs if type(msgs) is list else list(msgs), topic, queue_id, topic_part, store_b,
                                 min(max_body, _INT32_MAX), _born_host_bytes, crc32, P.TRANSIENT_PREFIX)
            if enc is not None:
                buf, sizes, sysflags, props_l, tags, keys, uniq = enc
                return EncodedBatch(buf, sizes, [POS_STORETIMESTAMP_V4] * len(sizes), sysflags, None, props_l,
                                    tags, keys, uniq)
    parts: list[bytes] = []
    sizes: list[int] = []
    sysflags: list[int] = []
    props_l: list[str] = []
    tags: list[str | None] = []
    keys: list[str | None] = []
    uniq: list[str | None] = []
    add = parts.append
    pack_v4, pack_u16, join_pair = HEAD_V4.pack, U16.pack, "\x01".join
    # all but born host, body and properties
    fixed = POS_BORNHOST + 8 + len(store_b) + TAIL.size + len(topic_part) + 2
    store_flag = FLAG_STOREHOST_V6 if store_v6 else 0
    keep_flags = ~(FLAG_BORNHOST_V6 | FLAG_STOREHOST_V6)
    host_bits = store_flag
    size0 = fixed
    pairs = 0  # name/value pairs encoded, to check the separators of the whole batch at once
    odd = False  # a message with IPv6 hosts or a transactional sysflag: per-record columns needed
    last_host: tuple[str, int] | None = None
    born_b = b""
    born_v6 = False
    for m in msgs:
        if m.topic is not topic and m.topic != topic or m.queue_id != queue_id:
            check_topic(m.topic)  # a bad topic or queue id is the more precise complaint
            if m.queue_id < 0:
                raise MessageIllegalError(f"queue id {m.queue_id} is negative")
            raise InvalidParameterError(
                f"a batch goes to one queue: {topic}/{queue_id} and {m.topic}/{m.queue_id} are mixed")
        body = m.body
        if type(body) is not bytes and not isinstance(body, (bytes, bytearray, memoryview)):
            raise MessageIllegalError(f"message body must be bytes, not {type(body).__name__}")
        blen = len(body)
        if blen > max_body:
            raise MessageIllegalError(f"message body is {blen} bytes; the limit is {max_body}")
        props = m.properties
        if props:
            try:
                # str.join type-checks every name and value (the exact path below says which one failed).
                props_s = "\x02".join(map(join_pair, props.items())) + "\x02"
            except TypeError:
                props_s = _encode_props_checked(props, P.TRANSIENT_PREFIX)
            pairs += len(props)
            get = props.get
            tags.append(get("TAGS"))
            keys.append(get("KEYS"))
            uniq.append(get("UNIQ_KEY"))
        else:
            props_s = ""
            tags.append(None)
            keys.append(None)
            uniq.append(None)
        props_b = props_s.encode("utf-8")
        if len(props_b) > _MAX_PROPS:
            raise MessageIllegalError(f"properties are {len(props_b)} bytes encoded; the limit is {_MAX_PROPS}")
        host = m.born_host
        if host is not last_host:
            born_b, born_v6 = _host_bytes(tuple(host))
            last_host = host
            host_bits = store_flag | (FLAG_BORNHOST_V6 if born_v6 else 0)
            size0 = fixed + len(born_b)
        try:
            sysflag = m.sysflag & keep_flags | host_bits
            total = size0 + blen + len(props_b)
            if not born_v6 and not store_v6:
                add(pack_v4(total, MAGIC_V1, crc32(body) & 0x7FFFFFFF, queue_id, m.flag, 0, 0, sysflag,
                            m.born_timestamp, born_b, 0, store_b, m.reconsume_times, m.prepared_tx_offset, blen))
            else:
                odd = True
                add(HEAD.pack(total, MAGIC_V1, crc32(body) & 0x7FFFFFFF, queue_id, m.flag, 0, 0, sysflag,
                              m.born_timestamp) + born_b + I64.pack(0) + store_b
                    + TAIL.pack(m.reconsume_times, m.prepared_tx_offset, blen))
        except (struct.error, TypeError) as exc:  # the C twin answered None for this message: say which field
            raise _field_error(m, exc) from None
        add(body)
        add(topic_part + pack_u16(len(props_b)) + props_b)
        sizes.append(total)
        sysflags.append(sysflag)
        props_l.append(props_s)
        if sysflag & TRANSACTION_MASK:
            odd = True
    # Each stored pair adds exactly one \x01 and one \x02: any more means a name or value holds one. An
    # empty name or a transient one (left out when stored) also takes the exact path, message by message.
    every = "".join(props_l)
    if (every.count("\x01") != pairs or every.count("\x02") != pairs or "\x02\x01" in every
            or every.startswith("\x01") or P.TRANSIENT_PREFIX in every):
        for i, m in enumerate(msgs):
            if m.properties:
                exact = _encode_props_checked(m.properties, P.TRANSIENT_PREFIX)
                if exact != props_l[i]:
                    return encode_batch([_with_stored_props(x) for x in msgs], store_host=store_host,
                                        max_body=max_body)
    ts_pos = [POS_STORETIMESTAMP_V4] * len(sizes)
    queued: list[bool] | None = None
    if odd:
        ts_pos = list(map(store_timestamp_pos, sysflags))
        queued = list(map(is_queued, sysflags))  # prepared / rolled back: no unit
        if all(queued):
            queued = None
    return EncodedBatch(bytearray().join(parts), sizes, ts_pos, sysflags, queued, props_l, tags, keys, uniq)


def encode_batch_body(body: bytes, *, topic: str, queue_id: int, sysflag: int, born_timestamp: int,
                      born_host: tuple[str, int], store_host: tuple[str, int], reconsume_times: int,
                      inherited: dict[str, str], max_body: int) -> EncodedBatch | None:
    """A SEND_BATCH_MESSAGE body (sluice.protocol.batch) straight to records, in C: the same EncodedBatch as
    ``encode_batch`` of the StoreMessages ``decode_batch_messages(body, inherited)`` gives, with no dict or
    message object per message. None where the C path does not apply (no extension, IPv6 hosts, messages
    whose properties re-encode differently, delayed or invalid ones): the caller then takes that path."""
    if C is None:
        return None
    born_b, born_v6 = _host_bytes(tuple(born_host))
    store_b, store_v6 = _host_bytes(tuple(store_host))
    if born_v6 or store_v6:
        return None
    inh = P.encode_properties(inherited) if inherited else ""
    if inherited and (len(inherited) * 2 != inh.count("\x01") + inh.count("\x02") or P.TRANSIENT_PREFIX in inh
                      or "" in inherited or not _DISPATCH_NAMES.isdisjoint(inherited)):
        # A separator inside a name or value, a name the store drops, or one dispatch reads from the message
        # itself (the broker never passes those down): the exact path decides.
        return None
    out = C.encode_wire_batch(body, _topic_part(topic), queue_id, sysflag, born_timestamp, born_b, store_b,
                              reconsume_times, max_body, inh.encode(), tuple(k.encode() for k in inherited), crc32)
    if out is None:
        return None
    buf, sizes, sysflags, props_l, tags, keys, uniq = out
    return EncodedBatch(buf, sizes, [POS_STORETIMESTAMP_V4] * len(sizes), sysflags, None, props_l, tags, keys, uniq)


# A record's integer fields and their widths (sluice.format's HEAD / TAIL), for the refusal of one that does not fit.
_INT_FIELDS = (("flag", 32), ("sysflag", 32), ("born_timestamp", 64), ("reconsume_times", 32),
               ("prepared_tx_offset", 64))


def _field_error(m: StoreMessage, exc: Exception) -> MessageIllegalError:
    for name, bits in _INT_FIELDS:
        v = getattr(m, name)
        lo, hi = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
        if type(v) is not int:
            return MessageIllegalError(f"message field {name} must be an integer, not {type(v).__name__}")
        if not lo <= v <= hi:
            return MessageIllegalError(f"message field {name} = {v} is out of range: it must be within {lo}..{hi}")
    return MessageIllegalError(f"message cannot be encoded: {exc}")


def _with_stored_props(m: StoreMessage) -> StoreMessage:
    """The message with only the properties that are stored (transient names dropped)."""
    props = {k: v for k, v in m.properties.items() if not k.startswith(P.TRANSIENT_PREFIX)}
    return replace(m, properties=props)
