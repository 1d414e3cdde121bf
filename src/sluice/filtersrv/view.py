"""The messages a worker hands a filter class: lazy views over the pulled batch (``MessageView``).

A filter class at 1 % selectivity looks at a property or two of a hundred records per message it keeps;
decoding every record to a full MessageExt (body copied, ids formatted, hosts and properties built) was
most of the worker's time. A ``MessageView`` is a MessageExt (``isinstance`` holds, every field and
property reads the same: topic, tags, keys, properties, user_properties, body,
msg_id, offset_msg_id, queue_id, queue_offset, ...; it compares, copies and
pickles as that MessageExt) holding the batch and the record's start. It
decodes ``properties`` at once (nearly every class reads them, tags and keys
too) and every other field when it is read: the header's numbers straight from
the bytes, ``body`` and ``topic`` from the record's tail, the rest from one
decoded MessageExt. Fields other than ``properties`` are read-only.
"""
from __future__ import annotations

import dataclasses
import struct
import zlib
from typing import Any

from sluice.format import (
    FLAG_COMPRESSED, I32, MAGIC_V1, POS_FLAG, POS_QUEUEID, POS_QUEUEOFFSET, POS_SYSFLAG, U16, U32, body_length_pos,
)
from sluice.message import MessageExt
from sluice.protocol import properties as P

__all__ = ["MessageView", "decode_messages", "views"]

_I64 = struct.Struct(">q")
_FIELDS = tuple(f.name for f in dataclasses.fields(MessageExt))


def decode_messages(body: bytes) -> list[MessageExt]:
    """Records laid back to back as MessageExt (in C where built), in order; CRCs were checked by the store.
    The client's decoder (sluice.client.broker_api), imported when a class first needs a whole message."""
    from sluice.client.broker_api import decode_messages as decode
    return decode(body, check_crc=False)


class MessageView(MessageExt):
    """One stored record of a batch, decoded field by field as the class reads it."""

    __slots__ = ("_buf", "_at", "_ext")

    def __init__(self, buf: bytes, at: int, text: str) -> None:  # noqa: D107 (no dataclass __init__: lazy)
        self._buf, self._at, self._ext = buf, at, None
        # what nearly every class reads (tags and keys too): decoded at once into MessageExt's own slot,
        # which reads faster than a lazy property would on every access
        self.properties = P.decode_properties(text)

    # the fixed header: read where it sits
    def _i32(self, pos: int) -> int:
        return I32.unpack_from(self._buf, self._at + pos)[0]

    @property
    def store_size(self) -> int:  # type: ignore[override]
        return self._i32(0)

    @property
    def queue_id(self) -> int:  # type: ignore[override]
        return self._i32(POS_QUEUEID)

    @property
    def flag(self) -> int:  # type: ignore[override]
        return self._i32(POS_FLAG)

    @property
    def sysflag(self) -> int:  # type: ignore[override]
        return self._i32(POS_SYSFLAG)

    @property
    def queue_offset(self) -> int:  # type: ignore[override]
        return _I64.unpack_from(self._buf, self._at + POS_QUEUEOFFSET)[0]

    # the tail: body, then topic
    def _tail(self) -> tuple[int, int, int]:
        """(body position, body length, topic position) in the batch."""
        buf, at = self._buf, self._at
        p = at + body_length_pos(self.sysflag)
        body_len = I32.unpack_from(buf, p)[0]
        return p + 4, body_len, p + 4 + body_len

    @property
    def body(self) -> bytes:  # type: ignore[override]
        at, n, _ = self._tail()
        raw = bytes(self._buf[at:at + n])
        return zlib.decompress(raw) if self.sysflag & FLAG_COMPRESSED else raw

    @property
    def topic(self) -> str:  # type: ignore[override]
        _, _, t = self._tail()
        buf = self._buf
        if U32.unpack_from(buf, self._at + 4)[0] == MAGIC_V1:
            return bytes(buf[t + 1:t + 1 + buf[t]]).decode()
        return bytes(buf[t + 2:t + 2 + U16.unpack_from(buf, t)[0]]).decode()

    # the rest (ids, hosts, times): one full decode of this record, kept
    def _full(self) -> MessageExt:
        ext = self._ext
        if ext is None:
            at = self._at
            ext = self._ext = decode_messages(self._buf[at:at + self.store_size])[0]
        return ext

    @property
    def msg_id(self) -> str:  # type: ignore[override]
        return self.properties.get(P.UNIQ_KEY) or self._full().msg_id

    def _values(self) -> tuple[Any, ...]:
        return tuple(getattr(self, name) for name in _FIELDS)

    def __eq__(self, other: object) -> bool:  # equal to the MessageExt it reads as
        if isinstance(other, MessageView):
            return self._values() == other._values()
        if isinstance(other, MessageExt):
            return self._values() == tuple(getattr(other, name) for name in _FIELDS)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # as MessageExt's

    def __reduce__(self) -> Any:  # pickled or copied as the MessageExt it reads as
        return MessageExt, self._values()


def _delegate(name: str) -> property:
    return property(lambda self: getattr(self._full(), name), doc=f"MessageExt.{name}, from the decoded record")


for _name in ("commitlog_offset", "offset_msg_id", "born_timestamp", "born_host", "store_timestamp", "store_host",
              "reconsume_times", "body_crc"):
    setattr(MessageView, _name, _delegate(_name))
del _name


def views(body: bytes) -> list[MessageView]:
    """A view per record of ``body`` (sluice._speedups.record_views where built; this is its twin);
    ValueError when the body is not whole records."""
    from sluice.filtersrv.spans import record_spans
    from sluice.speedups import C
    if C is not None:
        got = C.record_views(body, MessageView)
        if got is not None:
            return got
    offsets, texts = record_spans(body, True)
    assert texts is not None
    return [MessageView(body, at, text) for at, text in zip(memoryview(offsets).cast("I"), texts)]
