"""The stored formats, in one place: the commit-log record, the consume-queue unit and the ext unit.

Everything that reads or writes these bytes takes its layout from here: the
SDK's encoder and decoder (sluice.protocol.record), the store (append, scan,
recovery, dispatch, pull), the Spark store-file reader, and the C extension
(src/csrc/speedups/speedups.h, whose constants sluice.speedups checks against
these at import). Changing the on-disk format is a change to this module and
that header. Only the standard library is imported (no numpy), so the codec
stays light; consumers build their numpy dtypes from the field lists below.

Commit-log record (RocketMQ 4.x, big-endian; store/src/main/java/org/apache/
rocketmq/store/CommitLog.java and common/src/main/java/org/apache/rocketmq/
common/message/MessageDecoder.java). Positions for IPv4 hosts::

     0 TOTALSIZE       int32   the whole record, this field included
     4 MAGICCODE       uint32  MAGIC_V1 (1-byte topic length) or MAGIC_V2 (2-byte)
     8 BODYCRC         int32   CRC32(body) & 0x7FFFFFFF, as java.util.zip.CRC32
    12 QUEUEID         int32
    16 FLAG            int32   the producer's flag
    20 QUEUEOFFSET     int64   patched in at append; 0 for records that get no unit
    28 PHYSICALOFFSET  int64   the record's own commit-log offset, patched in at append
    36 SYSFLAG         int32   the FLAG_* bits below
    40 BORNTIMESTAMP   int64
    48 BORNHOST        4+4     IPv4 address, port (16+4 when SYSFLAG has FLAG_BORNHOST_V6)
    56 STORETIMESTAMP  int64   patched in at append (store_timestamp_pos says where)
    64 STOREHOST       4+4     (16+4 when SYSFLAG has FLAG_STOREHOST_V6)
    72 RECONSUMETIMES  int32
    76 PREPARED_TX_OFF int64
    84 BODYLENGTH      int32, then the body
       TOPICLENGTH     uint8 (MAGIC_V1) or uint16 (MAGIC_V2), then the UTF-8 topic
       PROPLENGTH      uint16, then the properties (name \\x01 value \\x02 ...), UTF-8

A segment that cannot hold the next record plus END_FILE_MIN_BLANK_LENGTH bytes
ends with ``[int32 bytes left][uint32 BLANK_MAGIC]``; zeros where a record's size
should be mark the end of the written data (segments are created sparse).

Consume-queue unit (ConsumeQueue.java), 20 bytes big-endian: commit-log offset
int64, size int32, tag code int64. ConsumeQueueExt unit (ConsumeQueueExt.java):
size int16 (20 + bitmap size), tag code int64, store time int64, bitmap size
int16, bitmap.

Backfill bitmap file (written by ``sluice spark backfill``, served by the
broker's backfill manager), ``{out}/{topic}/{queue_id}/{group}.bitmap``,
big-endian::

     0 magic           b"SLBF"
     4 version         uint16 = BACKFILL_VERSION
     6 reserved        uint16 = 0
     8 selector hash   SHA-256 of "<TYPE>\\n<expression>" (32 bytes, backfill_selector_hash)
    40 first           int64   the first queue offset covered
    48 end             int64   the end queue offset, exclusive
    56 matched         int64   matching messages
    64 bitmap          bit i (numpy packbits order, most significant bit first) = offset first + i matches
"""
from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache

from sluice.errors import CorruptRecordError

try:  # ISA-L's CRC32 (python-isal): the same numbers as zlib's, several times faster on large bodies
    from isal.isal_zlib import crc32
except ImportError:  # pragma: no cover - the dependency is declared; this keeps a bare install working
    from zlib import crc32

# ---- the record --------------------------------------------------------------------------------------

MAGIC_V1 = 0xDAA320A7
MAGIC_V2 = 0xDAA320AB
BLANK_MAGIC = 0xCBD43194
#: room a segment keeps after its last record for the blank marker
END_FILE_MIN_BLANK_LENGTH = 8

# SYSFLAG bits (common/src/main/java/org/apache/rocketmq/common/sysflag/MessageSysFlag.java)
FLAG_COMPRESSED = 0x1
FLAG_MULTI_TAGS = 0x2
FLAG_TRANSACTION_PREPARED = 0x4
FLAG_TRANSACTION_COMMIT = 0x8
FLAG_TRANSACTION_ROLLBACK = 0xC
FLAG_BORNHOST_V6 = 0x10
FLAG_STOREHOST_V6 = 0x20
#: the two bits that hold the transaction type (0, PREPARED, COMMIT or ROLLBACK)
TRANSACTION_MASK = 0xC
#: transaction types whose records get no consume-queue unit
NOT_QUEUED = (FLAG_TRANSACTION_PREPARED, FLAG_TRANSACTION_ROLLBACK)
HOST_V6_FLAGS = FLAG_BORNHOST_V6 | FLAG_STOREHOST_V6

# Fixed positions: the same whatever the host sizes, since they come before the hosts.
POS_TOTALSIZE = 0
POS_MAGIC = 4
POS_BODYCRC = 8
POS_QUEUEID = 12
POS_FLAG = 16
POS_QUEUEOFFSET = 20
POS_PHYSICALOFFSET = 28
POS_SYSFLAG = 36
POS_BORNTIMESTAMP = 40
POS_BORNHOST = 48

HOST_V4_SIZE = 8  # 4-byte address + int32 port
HOST_V6_SIZE = 20  # 16-byte address + int32 port

# Positions when both hosts are IPv4 (every record real clients write).
POS_STORETIMESTAMP_V4 = POS_BORNHOST + HOST_V4_SIZE
POS_STOREHOST_V4 = POS_STORETIMESTAMP_V4 + 8
POS_RECONSUMETIMES_V4 = POS_STOREHOST_V4 + HOST_V4_SIZE
POS_BODYLENGTH_V4 = POS_RECONSUMETIMES_V4 + 12
POS_BODY_V4 = POS_BODYLENGTH_V4 + 4

#: totalsize, magic, bodycrc, queueid, flag, queueoffset, physicaloffset, sysflag, borntimestamp
HEAD = struct.Struct(">iIiiiqqiq")
#: HEAD, then bornhost, storetimestamp, storehost, reconsumetimes, preparedoffset, bodylength (IPv4 hosts)
HEAD_V4 = struct.Struct(">iIiiiqqiq8sq8siqi")
#: reconsumetimes, preparedtransactionoffset, bodylength (after the store host)
TAIL = struct.Struct(">iqi")
#: totalsize, magic: the start of every record and the whole blank marker
TOTAL_MAGIC = struct.Struct(">iI")
#: queueoffset, physicaloffset: contiguous at POS_QUEUEOFFSET, patched together at append
QUEUE_PHYS = struct.Struct(">qq")
I32 = struct.Struct(">i")
U32 = struct.Struct(">I")
I64 = struct.Struct(">q")
U16 = struct.Struct(">H")
IP4_PORT = struct.Struct(">BBBBi")

assert HEAD.size == POS_BORNHOST
assert HEAD_V4.size == POS_BODY_V4 == 88
assert TAIL.size == 16 and TOTAL_MAGIC.size == END_FILE_MIN_BLANK_LENGTH
assert POS_QUEUEOFFSET + QUEUE_PHYS.size == POS_SYSFLAG
#: the smallest record: IPv4 hosts, empty body, topic and properties
MIN_RECORD_SIZE = POS_BODY_V4 + 1 + 2
assert MIN_RECORD_SIZE == 91
#: longest topic a MAGIC_V1 record holds (its length is one byte; RocketMQ's Validators.TOPIC_MAX_LENGTH)
MAX_TOPIC_LENGTH = 127
#: properties length is an unsigned short in the record, a signed short in RocketMQ's checks
MAX_PROPERTIES_LENGTH = 32767


def is_queued(sysflag: int) -> bool:
    """Prepared and rolled-back transactional records get no consume-queue unit (as in RocketMQ)."""
    t = sysflag & TRANSACTION_MASK
    return t != FLAG_TRANSACTION_PREPARED and t != FLAG_TRANSACTION_ROLLBACK


def is_rolled_back(sysflag: int) -> bool:
    """A rolled-back transactional record: never indexed by key."""
    return sysflag & TRANSACTION_MASK == FLAG_TRANSACTION_ROLLBACK


def born_host_size(sysflag: int) -> int:
    return HOST_V6_SIZE if sysflag & FLAG_BORNHOST_V6 else HOST_V4_SIZE


def store_host_size(sysflag: int) -> int:
    return HOST_V6_SIZE if sysflag & FLAG_STOREHOST_V6 else HOST_V4_SIZE


def store_timestamp_pos(sysflag: int) -> int:
    """Where STORETIMESTAMP sits: after a born host of 8 (IPv4) or 20 (IPv6) bytes."""
    return POS_BORNHOST + (HOST_V6_SIZE if sysflag & FLAG_BORNHOST_V6 else HOST_V4_SIZE)


def body_length_pos(sysflag: int) -> int:
    """Where BODYLENGTH sits (the body follows it)."""
    return store_timestamp_pos(sysflag) + 8 + store_host_size(sysflag) + 12


def body_crc(body: bytes | bytearray | memoryview) -> int:
    """BODYCRC of ``body``: CRC32 & 0x7FFFFFFF (the SDK, the store and the C extension use this one)."""
    return crc32(body) & 0x7FFFFFFF


# ---- decoding and walking ------------------------------------------------------------------------------

@dataclass(slots=True)
class ParsedRecord:
    """The fields the store needs (dispatch, recovery, checks), without building a full RecordView."""

    total_size: int
    queue_id: int
    queue_offset: int
    physical_offset: int
    sysflag: int
    store_timestamp: int
    topic: str
    properties: str


_HEAD8 = struct.Struct(">iIiiiqqi")  # HEAD without borntimestamp: what parse_record needs


def parse_record(buf: bytes | bytearray | memoryview, pos: int, *, check_crc: bool, where: str | None = None,
                 base: int = 0) -> ParsedRecord:
    """Parse the record at ``pos`` of ``buf``; raise CorruptRecordError unless it is whole and valid.

    ``where`` names the file and ``base`` is the file offset of ``buf[0]``, for the error only.
    """
    end = len(buf)
    if pos + POS_BORNTIMESTAMP > end:
        raise CorruptRecordError("record header runs past the end of the data", path=where, offset=base + pos)
    total, magic, crc, qid, _flag, qoff, phys, sysflag = _HEAD8.unpack_from(buf, pos)
    if magic != MAGIC_V1 and magic != MAGIC_V2:
        raise CorruptRecordError(f"bad magic code 0x{magic:08X}", path=where, offset=base + pos)
    if total < MIN_RECORD_SIZE or pos + total > end:
        raise CorruptRecordError(f"record size {total} does not fit", path=where, offset=base + pos)
    ts_at = pos + (POS_BORNHOST + HOST_V6_SIZE if sysflag & FLAG_BORNHOST_V6 else POS_STORETIMESTAMP_V4)
    store_ts = I64.unpack_from(buf, ts_at)[0]
    p = ts_at + 8 + (HOST_V6_SIZE if sysflag & FLAG_STOREHOST_V6 else HOST_V4_SIZE) + 12
    body_at, body_len, topic, props = read_tail(buf, pos, total, magic, p, where, base)
    if check_crc and crc32(buf[body_at:body_at + body_len]) & 0x7FFFFFFF != crc:
        raise CorruptRecordError("body CRC mismatch", path=where, offset=base + pos)
    return ParsedRecord(total, qid, qoff, phys, sysflag, store_ts, topic, props)


def read_tail(buf: bytes | bytearray | memoryview, pos: int, total: int, magic: int, p: int, where: str | None,
              base: int) -> tuple[int, int, str, str]:
    """The variable part of the record of ``total`` bytes at ``pos``, from its BODYLENGTH at ``p``: (body
    position, body length, topic, properties). Raises CorruptRecordError unless they fill the record exactly.
    Both Python decoders (parse_record here, sluice.protocol.record.decode_record) end with this."""
    rec_end = pos + total
    try:
        body_len = I32.unpack_from(buf, p)[0]
        p += 4
        if body_len < 0 or p + body_len > rec_end:
            raise CorruptRecordError(f"body length {body_len} runs past the record", path=where, offset=base + pos)
        body_at = p
        p += body_len
        if magic == MAGIC_V1:
            tlen = buf[p]
            p += 1
        else:
            tlen = U16.unpack_from(buf, p)[0]
            p += 2
        topic = bytes(buf[p:p + tlen]).decode()
        p += tlen
        plen = U16.unpack_from(buf, p)[0]
        p += 2
        props = bytes(buf[p:p + plen]).decode("utf-8")
        p += plen
    except (struct.error, IndexError, UnicodeDecodeError) as e:
        raise CorruptRecordError(f"record does not decode: {e}", path=where, offset=base + pos) from None
    if p != rec_end:
        raise CorruptRecordError(f"record fields take {p - pos} bytes, its size says {total}",
                                 path=where, offset=base + pos)
    return body_at, body_len, topic, props


def verify_record_bytes(rec: bytes | bytearray | memoryview, offset: int, *, where: str | None = None,
                        file_offset: int = 0, crc: bool = True) -> None:
    """Cheap check of one record about to be served: magic, size, own position, body CRC (not with
    ``crc=False``: a record read for its properties, which the CRC does not cover, and not served).

    The C twin is record_ok in src/csrc/speedups/reads.c (pulls through gather_units)."""
    total, magic = TOTAL_MAGIC.unpack_from(rec, 0)
    if (magic != MAGIC_V1 and magic != MAGIC_V2) or total != len(rec):
        raise CorruptRecordError(f"bad magic 0x{magic:08X} or size {total} (expected {len(rec)})",
                                 path=where, offset=file_offset)
    if I64.unpack_from(rec, POS_PHYSICALOFFSET)[0] != offset:
        raise CorruptRecordError(f"record does not say it is at commit-log offset {offset}",
                                 path=where, offset=file_offset)
    stored_crc = I32.unpack_from(rec, POS_BODYCRC)[0]
    p = body_length_pos(I32.unpack_from(rec, POS_SYSFLAG)[0])
    body_len = I32.unpack_from(rec, p)[0]
    if body_len < 0 or p + 4 + body_len > total:
        raise CorruptRecordError(f"body length {body_len} runs past the record", path=where, offset=file_offset)
    if crc and crc32(rec[p + 4:p + 4 + body_len]) & 0x7FFFFFFF != stored_crc & 0x7FFFFFFF:
        raise CorruptRecordError("body CRC mismatch", path=where, offset=file_offset)


# Why a walk stopped (RecordWalk.stop).
END = "end"  # exactly at the end of the data given
END_OF_DATA = "zeros"  # zeros where a record's size should be: nothing more was written
BLANK = "blank"  # the blank marker that ends a segment
PARTIAL = "partial"  # (window only) the next record runs past the data given: read more to go on
CORRUPT = "corrupt"  # a record failed its checks: ``error`` says which and where


class RecordWalk:
    """Walks the records laid back to back in ``buf`` from ``pos`` to ``end``: the one Python walker over
    stored records (commit-log scan and recovery, dispatch replay, the dedup window's rebuild, the Spark
    store-file reader's record starts).

    Iterate it for ParsedRecords (``positions()`` for record starts only, checking just magic and size).
    The walk stops, without raising, at the end of the data, at zeros, at the blank marker or at a bad
    record; then ``stop`` says which, ``error`` holds the CorruptRecordError (with file and offset) and
    ``pos`` is the offset in ``buf`` just after the last record handed out (where the walk stopped).

    ``window``: ``buf`` is a window into a longer log (a read of some bytes), so a record or header
    running past its end stops the walk as PARTIAL (``want`` is that record's size when known), and the
    blank marker's length is not checked against the segment. ``log_offset``: the commit-log offset of
    ``buf[0]``, to check that each record says it is where it is. ``where`` and ``file_offset`` (the file
    offset of ``buf[0]``) name the place in errors.
    """

    __slots__ = ("buf", "pos", "end", "check_crc", "where", "file_offset", "log_offset", "window", "stop",
                 "error", "want")

    def __init__(self, buf: bytes | bytearray | memoryview, pos: int = 0, end: int | None = None, *,
                 check_crc: bool = True, where: str | None = None, file_offset: int = 0,
                 log_offset: int | None = None, window: bool = False) -> None:
        self.buf = buf
        self.pos = pos
        self.end = len(buf) if end is None else end
        self.check_crc = check_crc
        self.where = where
        self.file_offset = file_offset
        self.log_offset = log_offset
        self.window = window
        self.stop: str | None = None
        self.error: CorruptRecordError | None = None
        self.want = 0

    def __iter__(self) -> Iterator[ParsedRecord]:
        return self._walk(True)  # type: ignore[return-value]

    def positions(self) -> Iterator[int]:
        return self._walk(False)  # type: ignore[return-value]

    def _corrupt(self, pos: int, message: str) -> None:
        self.stop = CORRUPT
        self.error = CorruptRecordError(message, path=self.where, offset=self.file_offset + pos)

    def _walk(self, parse: bool) -> Iterator[ParsedRecord | int]:
        buf, end, base, log_offset, window = self.buf, self.end, self.file_offset, self.log_offset, self.window
        check_crc, where = self.check_crc, self.where
        unpack = TOTAL_MAGIC.unpack_from
        pos = self.pos
        self.stop = self.error = None
        while True:
            if pos + 8 > end:
                if pos == end:
                    self.stop = END
                elif window:
                    self.stop, self.want = PARTIAL, 0
                else:
                    self._corrupt(pos, "truncated record header at segment end")
                break
            total, magic = unpack(buf, pos)
            if magic == BLANK_MAGIC:
                if not window and total != end - pos:
                    self._corrupt(pos, f"blank marker says {total} bytes, {end - pos} remain")
                else:
                    self.stop = BLANK
                break
            if total == 0 and magic == 0:
                self.stop = END_OF_DATA
                break
            if window and pos + total > end and total >= MIN_RECORD_SIZE and (magic == MAGIC_V1 or magic == MAGIC_V2):
                self.stop, self.want = PARTIAL, total
                break
            if parse:
                try:
                    rec = parse_record(buf, pos, check_crc=check_crc, where=where, base=base)
                except CorruptRecordError as e:
                    self.stop, self.error = CORRUPT, e
                    break
                if log_offset is not None and rec.physical_offset != log_offset + pos:
                    self._corrupt(pos, f"record says it is at {rec.physical_offset}")
                    break
                pos += total
                self.pos = pos
                yield rec
            else:
                if magic != MAGIC_V1 and magic != MAGIC_V2:
                    self._corrupt(pos, f"bad magic code 0x{magic:08X}")
                    break
                if total < MIN_RECORD_SIZE or pos + total > end:
                    self._corrupt(pos, f"record size {total} does not fit")
                    break
                self.pos = pos + total
                yield pos
                pos += total
        self.pos = pos


# ---- consume queue and ConsumeQueueExt units -----------------------------------------------------------

#: a consume-queue unit's fields (numpy dtype spec): commit-log offset, record size, tag code
CQ_UNIT_FIELDS = (("offset", ">i8"), ("size", ">i4"), ("tag", ">i8"))
CQ_UNIT = struct.Struct(">qiq")
CQ_UNIT_SIZE = CQ_UNIT.size
assert CQ_UNIT_SIZE == 20
#: the size of a unit that pads a queue file before its first real unit; such a unit holds no message
CQ_PAD_SIZE = 0x7FFFFFFF

#: an ext unit's head: size (20 + bitmap size), tag code, store time, bitmap size; the bitmap follows
EXT_UNIT_HEAD_FIELDS = (("size", ">i2"), ("tags", ">i8"), ("time", ">i8"), ("bm", ">i2"))
EXT_UNIT_HEAD = struct.Struct(">hqqh")
EXT_SIZE = struct.Struct(">h")
EXT_MIN_UNIT_SIZE = EXT_UNIT_HEAD.size
assert EXT_MIN_UNIT_SIZE == 20 and EXT_SIZE.size == 2
EXT_MAX_UNIT_SIZE = 32767  # the size field is a signed short
EXT_END_BLANK = 4  # room an ext file always keeps after its last unit, for the -1 end marker
LONG_MIN = -(1 << 63)
#: Integer.MIN_VALUE - 1: the highest ext address (an ext unit's offset + Long.MIN_VALUE)
EXT_MAX_ADDR = -(1 << 31) - 1


def ext_decorate(offset: int) -> int:
    """The address of the ext unit at byte ``offset`` of the ext log (offset + Long.MIN_VALUE)."""
    return offset + LONG_MIN


def ext_undecorate(address: int) -> int:
    return address - LONG_MIN


def is_ext_address(code: int) -> bool:
    """True when a consume-queue tag-code slot holds an ext address rather than a tag code."""
    return code <= EXT_MAX_ADDR


# ---- tag codes (the consume queue's tag-code slot) -----------------------------------------------------
#
# RocketMQ stores Java's String.hashCode() of the tag and leaves hash collisions to the client. Sluice's
# 8-byte code keeps the Java hash in the low 32 bits and an independent 31-bit hash (CRC32 of the UTF-8
# tag) in the high bits, so the broker can match tags exactly on consume-queue units alone. The code is
# never negative, so it cannot be mistaken for an ext address (those are at or below EXT_MAX_ADDR).

def java_string_hash(s: str) -> int:
    """Java ``String.hashCode`` over UTF-16 code units, as a signed 32-bit int."""
    h = 0
    data = s.encode("utf-16-be")
    for i in range(0, len(data), 2):
        h = (31 * h + ((data[i] << 8) | data[i + 1])) & 0xFFFFFFFF
    return h - 0x100000000 if h & 0x80000000 else h


@lru_cache(maxsize=65536)
def tag_code(tag: str | None) -> int:
    """The consume-queue tag code of a tag; 0 for no tag."""
    if not tag:
        return 0
    second = crc32(tag.encode("utf-8")) & 0x7FFFFFFF
    return (second << 32) | (java_string_hash(tag) & 0xFFFFFFFF)


def java_hash_of_code(code: int) -> int:
    """The Java hash part of a tag code, signed, as RocketMQ clients compute it."""
    low = code & 0xFFFFFFFF
    return low - 0x100000000 if low & 0x80000000 else low


# ---- what the C extension must have been compiled with -------------------------------------------------

#: The constants src/csrc/speedups/speedups.h defines, by name; sluice.speedups refuses an extension whose
#: ``_speedups.FORMAT`` differs (a stale build after a format change).
C_FORMAT: dict[str, int] = {
    "MAGIC_V1": MAGIC_V1,
    "MAGIC_V2": MAGIC_V2,
    "BLANK_MAGIC": BLANK_MAGIC,
    "MIN_RECORD_SIZE": MIN_RECORD_SIZE,
    "HEAD_V4": HEAD_V4.size,
    "POS_BODYCRC": POS_BODYCRC,
    "POS_QUEUEID": POS_QUEUEID,
    "POS_FLAG": POS_FLAG,
    "POS_QUEUEOFFSET": POS_QUEUEOFFSET,
    "POS_PHYSICALOFFSET": POS_PHYSICALOFFSET,
    "POS_SYSFLAG": POS_SYSFLAG,
    "POS_BORNTIMESTAMP": POS_BORNTIMESTAMP,
    "POS_BORNHOST": POS_BORNHOST,
    "POS_STORETIMESTAMP_V4": POS_STORETIMESTAMP_V4,
    "POS_STOREHOST_V4": POS_STOREHOST_V4,
    "POS_RECONSUMETIMES_V4": POS_RECONSUMETIMES_V4,
    "POS_BODYLENGTH_V4": POS_BODYLENGTH_V4,
    "HOST_V4_SIZE": HOST_V4_SIZE,
    "HOST_V6_SIZE": HOST_V6_SIZE,
    "FLAG_COMPRESSED": FLAG_COMPRESSED,
    "FLAG_BORNHOST_V6": FLAG_BORNHOST_V6,
    "FLAG_STOREHOST_V6": FLAG_STOREHOST_V6,
    "TRANSACTION_MASK": TRANSACTION_MASK,
    "FLAG_TRANSACTION_PREPARED": FLAG_TRANSACTION_PREPARED,
    "FLAG_TRANSACTION_ROLLBACK": FLAG_TRANSACTION_ROLLBACK,
    "MAX_PROPERTIES_LENGTH": MAX_PROPERTIES_LENGTH,
    "CQ_UNIT_SIZE": CQ_UNIT_SIZE,
    "CQ_PAD_SIZE": CQ_PAD_SIZE,
}


# ---- the backfill bitmap file ------------------------------------------------------------------------

BACKFILL_MAGIC = b"SLBF"
BACKFILL_VERSION = 1
BACKFILL_HEADER = struct.Struct(">4sHH32sqqq")
assert BACKFILL_HEADER.size == 64


def backfill_selector_hash(expression_type: str, expression: str) -> bytes:
    """The subscription a backfill file was computed for: SHA-256 of ``<TYPE>\\n<expression>``."""
    return hashlib.sha256(f"{expression_type.upper()}\n{expression}".encode()).digest()
