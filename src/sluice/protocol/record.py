"""The commit-log record as the SDK sees it: encode one, decode one, decode a pull body.

The layout (field table, structs, positions, flags, CRC) is sluice.format's,
which owns it; the names below are re-exported from there for the codec's users.
A pull response body is these records back to back, exactly as stored, so the
same decoder serves the store, the broker and every client.
"""
from __future__ import annotations

import ipaddress
import re
import zlib
from struct import error as StructError
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache

from sluice.errors import CorruptRecordError, MessageIllegalError
from sluice.format import (
    BLANK_MAGIC,
    END_FILE_MIN_BLANK_LENGTH,
    FLAG_BORNHOST_V6,
    FLAG_COMPRESSED,
    FLAG_MULTI_TAGS,
    FLAG_STOREHOST_V6,
    FLAG_TRANSACTION_COMMIT,
    FLAG_TRANSACTION_PREPARED,
    FLAG_TRANSACTION_ROLLBACK,
    HEAD,
    I32,
    I64,
    IP4_PORT,
    MAGIC_V1,
    MAGIC_V2,
    MAX_PROPERTIES_LENGTH,
    MAX_TOPIC_LENGTH,
    MIN_RECORD_SIZE,
    POS_BODYCRC,
    POS_BORNHOST,
    POS_BORNTIMESTAMP,
    POS_FLAG,
    POS_MAGIC,
    POS_PHYSICALOFFSET,
    POS_QUEUEID,
    POS_QUEUEOFFSET,
    POS_SYSFLAG,
    POS_TOTALSIZE,
    TAIL,
    U16,
    U32,
    body_crc,
    read_tail,
    store_timestamp_pos,
)

__all__ = [
    "BLANK_MAGIC", "END_FILE_MIN_BLANK_LENGTH", "FLAG_BORNHOST_V6", "FLAG_COMPRESSED", "FLAG_MULTI_TAGS",
    "FLAG_STOREHOST_V6", "FLAG_TRANSACTION_COMMIT", "FLAG_TRANSACTION_PREPARED", "FLAG_TRANSACTION_ROLLBACK",
    "MAGIC_V1", "MAGIC_V2", "MAX_TOPIC_LENGTH", "POS_BODYCRC", "POS_BORNHOST", "POS_BORNTIMESTAMP", "POS_FLAG",
    "POS_MAGIC", "POS_PHYSICALOFFSET", "POS_QUEUEID", "POS_QUEUEOFFSET", "POS_SYSFLAG", "POS_TOTALSIZE",
    "DEFAULT_MAX_BODY", "RecordView", "body_crc", "check_topic", "decode_record", "decompress_body",
    "encode_record", "iter_records", "store_timestamp_pos",
]

DEFAULT_MAX_BODY = 4 * 1024 * 1024
_TOPIC_RE = re.compile(r"[A-Za-z0-9_%|-]+")


def check_topic(topic: str) -> None:
    if not topic:
        raise MessageIllegalError("topic is empty")
    if len(topic) > MAX_TOPIC_LENGTH:
        raise MessageIllegalError(f"topic {topic[:40]!r}... is {len(topic)} characters long; the limit is {MAX_TOPIC_LENGTH}")
    if not _TOPIC_RE.fullmatch(topic):
        bad = next(c for c in topic if not _TOPIC_RE.fullmatch(c))
        raise MessageIllegalError(f"topic {topic!r} contains {bad!r}; allowed are A-Z a-z 0-9 _ % | -")


@lru_cache(maxsize=1024)  # a broker sees few distinct hosts; parsing an address costs more than the rest
def _host_bytes(host: tuple[str, int]) -> tuple[bytes, bool]:
    ip = ipaddress.ip_address(host[0])
    return ip.packed + I32.pack(host[1]), ip.version == 6


def encode_record(
    *,
    topic: str,
    body: bytes,
    properties: str = "",
    queue_id: int = 0,
    flag: int = 0,
    sysflag: int = 0,
    born_timestamp: int = 0,
    born_host: tuple[str, int] = ("127.0.0.1", 0),
    store_host: tuple[str, int] = ("127.0.0.1", 0),
    store_timestamp: int = 0,
    reconsume_times: int = 0,
    prepared_tx_offset: int = 0,
    queue_offset: int = 0,
    physical_offset: int = 0,
    max_body: int = DEFAULT_MAX_BODY,
) -> bytearray:
    """Build one record; the store patches QUEUEOFFSET, PHYSICALOFFSET and STORETIMESTAMP when it appends.

    Raises MessageIllegalError for a bad topic, an oversized body or properties.
    """
    check_topic(topic)
    if len(body) > max_body:
        raise MessageIllegalError(f"message body is {len(body)} bytes; the limit is {max_body}")
    topic_b = topic.encode()
    props_b = properties.encode("utf-8")
    if len(props_b) > MAX_PROPERTIES_LENGTH:
        raise MessageIllegalError(
            f"properties are {len(props_b)} bytes encoded; the limit is {MAX_PROPERTIES_LENGTH}")
    born_b, born_v6 = _host_bytes(born_host)
    store_b, store_v6 = _host_bytes(store_host)
    sysflag = (sysflag & ~(FLAG_BORNHOST_V6 | FLAG_STOREHOST_V6)) | (FLAG_BORNHOST_V6 if born_v6 else 0) | (
        FLAG_STOREHOST_V6 if store_v6 else 0
    )
    total = POS_BORNHOST + len(born_b) + 8 + len(store_b) + TAIL.size + len(body) + 1 + len(topic_b) + 2 + len(props_b)
    out = bytearray(total)
    HEAD.pack_into(out, 0, total, MAGIC_V1, body_crc(body), queue_id, flag, queue_offset, physical_offset,
                    sysflag, born_timestamp)
    p = POS_BORNHOST
    out[p:p + len(born_b)] = born_b
    p += len(born_b)
    I64.pack_into(out, p, store_timestamp)
    p += 8
    out[p:p + len(store_b)] = store_b
    p += len(store_b)
    TAIL.pack_into(out, p, reconsume_times, prepared_tx_offset, len(body))
    p += TAIL.size
    out[p:p + len(body)] = body
    p += len(body)
    out[p] = len(topic_b)
    out[p + 1:p + 1 + len(topic_b)] = topic_b
    p += 1 + len(topic_b)
    U16.pack_into(out, p, len(props_b))
    out[p + 2:] = props_b
    return out


@dataclass(slots=True)
class RecordView:
    """A decoded record. ``body`` is as stored (still compressed when sysflag says so)."""

    total_size: int
    magic: int
    body_crc: int
    queue_id: int
    flag: int
    queue_offset: int
    physical_offset: int
    sysflag: int
    born_timestamp: int
    born_host: tuple[str, int]
    store_timestamp: int
    store_host: tuple[str, int]
    reconsume_times: int
    prepared_tx_offset: int
    body: bytes
    topic: str
    properties: str


def _read_host(buf, p: int, v6: bool) -> tuple[tuple[str, int], int]:
    if v6:
        ip = str(ipaddress.IPv6Address(bytes(buf[p:p + 16])))
        return (ip, I32.unpack_from(buf, p + 16)[0]), p + 20
    # IPv4 is every record real clients write; formatting the 4 bytes is ~10x cheaper than ipaddress.
    a, b, c, d, port = IP4_PORT.unpack_from(buf, p)
    return (f"{a}.{b}.{c}.{d}", port), p + 8


def decode_record(buf, pos: int = 0, *, check_crc: bool = True, where: str | None = None) -> RecordView:
    """Decode the record at ``pos``; raise CorruptRecordError when it is not a whole, valid record.

    ``where`` names the file for the error message.
    """
    end = len(buf)
    if pos + 8 > end:
        raise CorruptRecordError("record header runs past the end of the data", path=where, offset=pos)
    total, magic, crc, qid, flag, qoff, phys, sysflag, born_ts = HEAD.unpack_from(buf, pos) if pos + HEAD.size <= end \
        else (I32.unpack_from(buf, pos)[0], U32.unpack_from(buf, pos + 4)[0], 0, 0, 0, 0, 0, 0, 0)
    if magic not in (MAGIC_V1, MAGIC_V2):
        raise CorruptRecordError(f"bad magic code 0x{magic:08X}", path=where, offset=pos)
    if total < MIN_RECORD_SIZE or pos + total > end:
        raise CorruptRecordError(f"record size {total} does not fit", path=where, offset=pos)
    try:
        p = pos + POS_BORNHOST
        born_host, p = _read_host(buf, p, bool(sysflag & FLAG_BORNHOST_V6))
        store_ts = I64.unpack_from(buf, p)[0]
        store_host, p = _read_host(buf, p + 8, bool(sysflag & FLAG_STOREHOST_V6))
        reconsume, prepared, _ = TAIL.unpack_from(buf, p)
    except (StructError, IndexError, ValueError) as e:
        raise CorruptRecordError(f"record does not decode: {e}", path=where, offset=pos) from None
    # BODYLENGTH follows RECONSUMETIMES and PREPARED_TX_OFFSET
    body_at, body_len, topic, props = read_tail(buf, pos, total, magic, p + 12, where, 0)
    body = bytes(buf[body_at:body_at + body_len])
    if check_crc and body_crc(body) != crc:
        raise CorruptRecordError("body CRC mismatch", path=where, offset=pos)
    return RecordView(total, magic, crc, qid, flag, qoff, phys, sysflag, born_ts, born_host, store_ts, store_host,
                      reconsume, prepared, body, topic, props)


def iter_records(buf, *, check_crc: bool = True) -> Iterator[RecordView]:
    """Decode records laid back to back (a pull response body)."""
    pos, end = 0, len(buf)
    while pos < end:
        rec = decode_record(buf, pos, check_crc=check_crc)
        yield rec
        pos += rec.total_size


def decompress_body(rec: RecordView) -> bytes:
    """The body as the producer gave it (zlib-inflated when the COMPRESSED bit is set)."""
    if rec.sysflag & FLAG_COMPRESSED:
        return zlib.decompress(rec.body)
    return rec.body
