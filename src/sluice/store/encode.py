"""Encode a batch of messages for one queue into one buffer, ready to append.

The layout is sluice.protocol.record's (encode_record is the reference; a
property test holds this byte-for-byte equal to it). The batch path exists
because the append path is bounded by per-message Python: the topic, the store
host and the common IPv4 header shape are worked out once per batch, and each
message costs one struct pack plus a join.
"""
from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import lru_cache
from itertools import repeat
from operator import add, and_, attrgetter

from sluice.errors import InvalidParameterError, MessageIllegalError
from sluice.protocol import properties as P
from sluice.protocol.record import (
    FLAG_BORNHOST_V6,
    FLAG_STOREHOST_V6,
    MAGIC_V1,
    _host_bytes,
    check_topic,
)
from sluice.speedups import C
from sluice.store.crc import crc32
from sluice.store.types import StoreMessage

# totalsize magic bodycrc queueid flag queueoffset physicaloffset sysflag borntimestamp
_HEAD = struct.Struct(">iIiiiqqiq")
# the same followed by bornhost, storetimestamp, storehost, reconsumetimes, preparedoffset, bodylength (IPv4)
_HEAD_V4 = struct.Struct(">iIiiiqqiq8sq8siqi")
assert _HEAD_V4.size == 88
_TS = struct.Struct(">q")
_TAIL = struct.Struct(">iqi")  # reconsumetimes, preparedtransactionoffset, bodylength
_U16 = struct.Struct(">H")
_MAX_PROPS = 32767
_TRAN_MASK = 0xC


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
_DISPATCH_NAMES = frozenset({P.TAGS, P.KEYS, P.UNIQ_KEY})
_TS_POS_V4 = 48 + 8  # STORETIMESTAMP's position when the born host is IPv4


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
                return EncodedBatch(buf, sizes, [_TS_POS_V4] * len(sizes), sysflags, None, props_l, tags, keys, uniq)
        elif len(msgs) > 1:
            fast = _encode_columns(msgs, topic, queue_id, topic_part, store_b, max_body)
            if fast is not None:
                return fast
    parts: list[bytes] = []
    sizes: list[int] = []
    sysflags: list[int] = []
    props_l: list[str] = []
    tags: list[str | None] = []
    keys: list[str | None] = []
    uniq: list[str | None] = []
    add = parts.append
    pack_v4, pack_u16, join_pair = _HEAD_V4.pack, _U16.pack, "\x01".join
    fixed = 48 + 8 + len(store_b) + 16 + len(topic_part) + 2  # all but born host, body and properties
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
        sysflag = m.sysflag & keep_flags | host_bits
        total = size0 + blen + len(props_b)
        if not born_v6 and not store_v6:
            add(pack_v4(total, MAGIC_V1, crc32(body) & 0x7FFFFFFF, queue_id, m.flag, 0, 0, sysflag,
                        m.born_timestamp, born_b, 0, store_b, m.reconsume_times, m.prepared_tx_offset, blen))
        else:
            odd = True
            add(_HEAD.pack(total, MAGIC_V1, crc32(body) & 0x7FFFFFFF, queue_id, m.flag, 0, 0, sysflag,
                           m.born_timestamp) + born_b + _TS.pack(0) + store_b
                + _TAIL.pack(m.reconsume_times, m.prepared_tx_offset, blen))
        add(body)
        add(topic_part + pack_u16(len(props_b)) + props_b)
        sizes.append(total)
        sysflags.append(sysflag)
        props_l.append(props_s)
        if sysflag & _TRAN_MASK:
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
    ts_pos = [48 + 8] * len(sizes)
    queued: list[bool] | None = None
    if odd:
        ts_pos = [48 + (20 if f & FLAG_BORNHOST_V6 else 8) for f in sysflags]
        if any(f & _TRAN_MASK in (0x4, 0xC) for f in sysflags):  # prepared / rolled back: no unit
            queued = [f & _TRAN_MASK not in (0x4, 0xC) for f in sysflags]
    return EncodedBatch(bytearray().join(parts), sizes, ts_pos, sysflags, queued, props_l, tags, keys, uniq)


_topic_of, _qid_of, _body_of, _host_of = (attrgetter(a) for a in ("topic", "queue_id", "body", "born_host"))
_sysflag_of, _props_of, _flag_of = (attrgetter(a) for a in ("sysflag", "properties", "flag"))
_born_ts_of, _recon_of, _prep_of = (attrgetter(a) for a in ("born_timestamp", "reconsume_times", "prepared_tx_offset"))
_JOIN_PAIR, _JOIN_PAIRS = "\x01".join, "\x02".join


def _encode_columns(msgs: Sequence[StoreMessage], topic: str, queue_id: int, topic_part: bytes, store_b: bytes,
                    max_body: int) -> EncodedBatch | None:
    """encode_batch for the usual batch, column by column: every per-message step is a C-level map (no
    bytecode per message), about half the cost of the loop. Usual means: one topic, queue and IPv4 born
    host, bytes bodies, non-empty valid properties, no transactional flag. Anything else (including
    anything invalid) answers None and the loop does it, with its precise errors."""
    n = len(msgs)
    if list(map(_topic_of, msgs)).count(topic) != n or list(map(_qid_of, msgs)).count(queue_id) != n:
        return None
    bodies = list(map(_body_of, msgs))
    hosts = list(map(_host_of, msgs))
    sysflags_in = list(map(_sysflag_of, msgs))
    dicts = list(map(_props_of, msgs))
    if (list(map(type, bodies)).count(bytes) != n or hosts.count(hosts[0]) != n or not all(dicts)
            or any(map(_TRAN_MASK.__and__, sysflags_in))):
        return None
    born_b, born_v6 = _host_bytes(tuple(hosts[0]))
    if born_v6:
        return None
    try:
        pairs_l = list(map(_JOIN_PAIRS, map(map, repeat(_JOIN_PAIR), map(dict.items, dicts))))
    except TypeError:  # a name or value that is not a str, or properties that are not a dict
        return None
    every = "\x02".join(pairs_l)
    npairs = sum(map(len, dicts))
    # Each pair holds one \x01 and adds one \x02: more means a separator inside a name or value. An empty
    # name shows as \x01 right after a separator; transient names must be left out (the loop does that).
    if (every.count("\x01") != npairs or every.count("\x02") != npairs - 1 or "\x02\x01" in every
            or every.startswith("\x01") or P.TRANSIENT_PREFIX in every):
        return None
    props_s = list(map(str.__add__, pairs_l, repeat("\x02")))
    props_b = list(map(str.encode, props_s))
    plens = list(map(len, props_b))
    blens = list(map(len, bodies))
    if max(plens) > _MAX_PROPS or max(blens) > max_body:
        return None
    size0 = 48 + len(born_b) + 8 + len(store_b) + 16 + len(topic_part) + 2
    totals = list(map(add, map(add, blens, plens), repeat(size0)))
    sysflags = list(map(and_, sysflags_in, repeat(~(FLAG_BORNHOST_V6 | FLAG_STOREHOST_V6))))
    crcs = map(and_, map(crc32, bodies), repeat(0x7FFFFFFF))
    try:
        heads = list(map(_HEAD_V4.pack, totals, repeat(MAGIC_V1), crcs, repeat(queue_id), map(_flag_of, msgs),
                         repeat(0), repeat(0), sysflags, map(_born_ts_of, msgs), repeat(born_b), repeat(0),
                         repeat(store_b), map(_recon_of, msgs), map(_prep_of, msgs), blens))
    except struct.error:
        return None
    parts: list[bytes] = [topic_part] * (5 * n)  # head, body, topic, properties length, properties
    parts[0::5] = heads
    parts[1::5] = bodies
    parts[3::5] = list(map(_U16.pack, plens))
    parts[4::5] = props_b
    get = dict.get
    return EncodedBatch(bytearray().join(parts), totals, [48 + len(born_b)] * n, sysflags, None, props_s,
                        list(map(get, dicts, repeat("TAGS"))), list(map(get, dicts, repeat("KEYS"))),
                        list(map(get, dicts, repeat("UNIQ_KEY"))))


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
    return EncodedBatch(buf, sizes, [_TS_POS_V4] * len(sizes), sysflags, None, props_l, tags, keys, uniq)


def _with_stored_props(m: StoreMessage) -> StoreMessage:
    """The message with only the properties that are stored (transient names dropped)."""
    props = {k: v for k, v in m.properties.items() if not k.startswith(P.TRANSIENT_PREFIX)}
    return replace(m, properties=props)
