"""The batch message body of SEND_BATCH_MESSAGE (MessageDecoder.encodeMessages / decodeMessages).

Each message, back to back, big-endian::

    int totalSize | int magic | int bodyCRC | int flag | int bodyLen + body | short propsLen + properties

Java's client writes 0 for magic and bodyCRC (the broker computes the CRC
when it stores the message), and so do we; the decoder ignores both.
"""
from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from sluice.errors import MessageIllegalError
from sluice.protocol import properties as P
from sluice.speedups import C

__all__ = ["BatchEntry", "decode_batch", "decode_batch_columns", "decode_batch_messages", "encode_batch"]

_HEAD = struct.Struct(">iiiii")  # totalSize, magic, bodyCRC, flag, bodyLen
assert _HEAD.size == 20
_PROPS_LEN = struct.Struct(">h")
_FIXED = _HEAD.size + _PROPS_LEN.size  # 22 bytes besides body and properties


@dataclass(frozen=True, slots=True)
class BatchEntry:
    """One message of a batch: the topic and queue come from the request header."""

    body: bytes
    properties: dict[str, str] = field(default_factory=dict)
    flag: int = 0


def encode_batch(entries: Iterable[BatchEntry | tuple[bytes, Mapping[str, str], int]]) -> bytes:
    parts: list[bytes] = []
    for entry in entries:
        body, props, flag = (entry.body, entry.properties, entry.flag) if isinstance(entry, BatchEntry) else entry
        raw_props = P.encode_properties(props).encode("utf-8")
        if len(raw_props) > P.MAX_PROPERTIES_BYTES:
            raise MessageIllegalError(
                f"properties of {len(raw_props)} bytes exceed the {P.MAX_PROPERTIES_BYTES}-byte limit")
        total = _FIXED + len(body) + len(raw_props)
        parts += [_HEAD.pack(total, 0, 0, flag, len(body)), bytes(body), _PROPS_LEN.pack(len(raw_props)), raw_props]
    return b"".join(parts)


def decode_batch(data: bytes | memoryview) -> list[BatchEntry]:
    """Split a batch body; a truncated or inconsistent entry raises MessageIllegalError with its offset."""
    bodies, raw_props, flags = decode_batch_columns(data)
    return list(map(BatchEntry, bodies, map(P.decode_properties, raw_props), flags))


def decode_batch_messages(data: bytes | memoryview, inherited: Mapping[str, str] | None = None,
                          ) -> tuple[list[bytes], list[dict[str, str]], list[int]]:
    """Split a batch body into bodies, decoded properties and flags; each message's properties start from
    ``inherited`` (the request header's, which its own override). Errors are decode_batch's."""
    if C is not None:
        out = C.decode_batch(data, dict(inherited) if inherited else None)
        if out is not None:
            return out
    bodies, raw_props, flags = decode_batch_columns(data)  # raises the precise error, or decodes the rest
    dicts = list(map(P.decode_properties, raw_props))
    if inherited:
        dicts = [{**inherited, **d} for d in dicts]
    return bodies, dicts, flags


def decode_batch_columns(data: bytes | memoryview) -> tuple[list[bytes], list[str], list[int]]:
    """Split a batch body into columns: bodies, encoded properties (not decoded) and flags.

    The broker's send path takes these as is (no object per message); errors are decode_batch's.
    """
    if not isinstance(data, bytes):
        data = bytes(data)  # bytes slices are one copy each; memoryview slices would need .tobytes() too
    end = len(data)
    unpack_head, unpack_len = _HEAD.unpack_from, _PROPS_LEN.unpack_from
    bodies: list[bytes] = []
    raw: list[bytes] = []
    flags: list[int] = []
    starts: list[int] = []
    pos = 0
    while pos < end:
        if end - pos < _FIXED:
            raise MessageIllegalError(f"batch body: {end - pos} stray bytes at offset {pos}")
        total, _magic, _crc, flag, body_len = unpack_head(data, pos)
        if total < _FIXED or pos + total > end:
            raise MessageIllegalError(f"batch body: message at offset {pos} claims {total} bytes, {end - pos} left")
        body_start = pos + _HEAD.size
        props_at = body_start + body_len
        nxt = pos + total
        if body_len < 0 or props_at + _PROPS_LEN.size > nxt:
            raise MessageIllegalError(f"batch body: message at offset {pos} has a bad body length {body_len}")
        (props_len,) = unpack_len(data, props_at)
        if props_len < 0 or props_at + _PROPS_LEN.size + props_len != nxt:
            raise MessageIllegalError(
                f"batch body: message at offset {pos}: sizes do not add up (total {total}, body {body_len}, "
                f"properties {props_len})")
        bodies.append(data[body_start:props_at])
        raw.append(data[props_at + 2:nxt])
        flags.append(flag)
        starts.append(pos)
        pos = nxt
    try:
        props = list(map(bytes.decode, raw))  # UTF-8, strict
    except UnicodeDecodeError:
        for at, r in zip(starts, raw):
            try:
                r.decode()
            except UnicodeDecodeError:
                raise MessageIllegalError(
                    f"batch body: properties of the message at offset {at} are not UTF-8") from None
        raise
    return bodies, props, flags
