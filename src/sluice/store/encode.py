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
from dataclasses import dataclass

from sluice.errors import MessageIllegalError
from sluice.protocol import properties as P
from sluice.protocol.record import (
    FLAG_BORNHOST_V6,
    FLAG_STOREHOST_V6,
    MAGIC_V1,
    _host_bytes,
    body_crc,
    check_topic,
)
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


def encode_batch(msgs: Sequence[StoreMessage], *, store_host: tuple[str, int], max_body: int) -> EncodedBatch:
    """Validate and encode ``msgs`` (all one topic and queue); raise MessageIllegalError before producing
    anything when any message is bad."""
    topic = msgs[0].topic
    check_topic(topic)
    topic_b = topic.encode()
    topic_part = bytes([len(topic_b)]) + topic_b
    store_b, store_v6 = _host_bytes(tuple(store_host))
    parts: list[bytes] = []
    sizes: list[int] = []
    ts_pos: list[int] = []
    sysflags: list[int] = []
    queued: list[bool] | None = None
    transient = P.TRANSIENT_PREFIX
    for i, m in enumerate(msgs):
        body = m.body
        if not isinstance(body, (bytes, bytearray, memoryview)):
            raise MessageIllegalError(f"message body must be bytes, not {type(body).__name__}")
        if len(body) > max_body:
            raise MessageIllegalError(f"message body is {len(body)} bytes; the limit is {max_body}")
        if m.queue_id < 0:
            raise MessageIllegalError(f"queue id {m.queue_id} is negative")
        props = m.properties
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
        props_b = props_s.encode("utf-8")
        if len(props_b) > _MAX_PROPS:
            raise MessageIllegalError(f"properties are {len(props_b)} bytes encoded; the limit is {_MAX_PROPS}")
        born_b, born_v6 = _host_bytes(tuple(m.born_host))
        sysflag = (m.sysflag & ~(FLAG_BORNHOST_V6 | FLAG_STOREHOST_V6)) | (FLAG_BORNHOST_V6 if born_v6 else 0) | (
            FLAG_STOREHOST_V6 if store_v6 else 0)
        blen = len(body)
        total = 48 + len(born_b) + 8 + len(store_b) + 16 + blen + len(topic_part) + 2 + len(props_b)
        if len(born_b) == 8 and len(store_b) == 8:
            parts.append(_HEAD_V4.pack(total, MAGIC_V1, body_crc(body), m.queue_id, m.flag, 0, 0, sysflag,
                                       m.born_timestamp, born_b, 0, store_b, m.reconsume_times,
                                       m.prepared_tx_offset, blen))
        else:
            parts.append(_HEAD.pack(total, MAGIC_V1, body_crc(body), m.queue_id, m.flag, 0, 0, sysflag,
                                    m.born_timestamp) + born_b + _TS.pack(0) + store_b
                         + _TAIL.pack(m.reconsume_times, m.prepared_tx_offset, blen))
        parts.append(body)
        parts.append(topic_part + _U16.pack(len(props_b)) + props_b)
        sizes.append(total)
        ts_pos.append(48 + len(born_b))
        sysflags.append(sysflag)
        t = sysflag & _TRAN_MASK
        if t == 0x4 or t == 0xC:  # prepared / rolled back: no consume-queue unit
            if queued is None:
                queued = [True] * i
            queued.append(False)
        elif queued is not None:
            queued.append(True)
    return EncodedBatch(bytearray().join(parts), sizes, ts_pos, sysflags, queued)
