"""Read a store's files directly (no broker, no store lock): split planning and Arrow decoding.

Splitting. Commit-log records carry no sync marker, so a task cannot find a
record boundary by looking at bytes from an arbitrary offset. The planner
therefore cuts each segment only at offsets *known* to be record starts: the
commit-log offsets that the consume queues (of every topic) point at. A
segment start is always a boundary; inside a segment, the cut for a target
offset ``p`` is the smallest unit offset >= ``p``. Each split ``[start, end)``
owns the records that start in it, and walks them by their size fields,
including records no queue points at (prepared transactional ones). A task
checks that the record at its start says it is at that offset; when the
consume queues are gone, splits fall back to whole segments (still correct,
less parallel).

Decoding. A task walks record starts with sluice.format's RecordWalk (one
struct read per record), then gathers every fixed-width field for a batch with
numpy over the mapped file, at sluice.format's positions
and builds Arrow arrays (properties become a map<string,string> with Arrow
compute kernels); only bodies, topics and property strings are sliced per
record.
"""
from __future__ import annotations

import fcntl
import mmap
import os
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from sluice import format as fmt
from sluice.errors import CorruptRecordError, InvalidParameterError
from sluice.format import (
    CORRUPT,
    FLAG_BORNHOST_V6,
    FLAG_COMPRESSED,
    FLAG_STOREHOST_V6,
    HOST_V4_SIZE,
    HOST_V6_SIZE,
    crc32,
)
from sluice.store.consumequeue import CQ_DTYPE, CQ_UNIT_SIZE, PAD_SIZE

_NOT_QUEUED = np.array(fmt.NOT_QUEUED)  # prepared, rolled back: consumers never see them

#: Columns of both Sluice sources (the broker's and the store files').
SCHEMA_DDL = (
    "topic string, broker string, queue_id int, queue_offset bigint, commitlog_offset bigint, msg_id string, "
    "offset_msg_id string, tags string, keys array<string>, properties map<string,string>, body binary, "
    "born_timestamp timestamp, store_timestamp timestamp, born_host string, reconsume_times int"
)
ARROW_SCHEMA = pa.schema([
    ("topic", pa.string()), ("broker", pa.string()), ("queue_id", pa.int32()), ("queue_offset", pa.int64()),
    ("commitlog_offset", pa.int64()), ("msg_id", pa.string()), ("offset_msg_id", pa.string()),
    ("tags", pa.string()), ("keys", pa.list_(pa.string())), ("properties", pa.map_(pa.string(), pa.string())),
    ("body", pa.binary()), ("born_timestamp", pa.timestamp("us", tz="UTC")),
    ("store_timestamp", pa.timestamp("us", tz="UTC")), ("born_host", pa.string()), ("reconsume_times", pa.int32()),
])


@dataclass(frozen=True, slots=True)
class Split:
    """Records starting in [start, end) (absolute commit-log offsets) of the segment at ``segment``."""

    path: str
    segment: int
    start: int
    end: int


def segment_files(root: str | os.PathLike[str]) -> list[tuple[int, Path]]:
    """(start offset, path) of each commit-log segment, in order."""
    d = Path(root) / "commitlog"
    if not d.is_dir():
        raise InvalidParameterError(f"{root} is not a Sluice store: it has no commitlog/ directory")
    out = [(int(p.name), p) for p in d.iterdir() if p.is_file() and p.name.isdigit() and len(p.name) == 20]
    return sorted(out)


def check_store_path(path: str) -> None:
    """Refuse a store path the executors cannot see the same way: a relative path is resolved against
    each process's own working directory (a Python worker's is not the driver's), a missing one would
    fail every task."""
    if not os.path.isabs(path):
        # No absolute form is suggested: this may run in a planner process whose directory is not the driver's.
        raise InvalidParameterError(f"store path {path!r} is relative: Spark's Python processes resolve it against "
                                    f"their own working directory, not the driver's; pass an absolute path")
    if not os.path.isdir(os.path.join(path, "commitlog")):
        what = "does not exist" if not os.path.exists(path) else "is not a Sluice store (no commitlog/ directory)"
        raise InvalidParameterError(f"store path {path!r} {what} (as seen by the Spark driver; "
                                    f"on a cluster it must be on a file system every executor mounts)")


def store_topics(root: str | os.PathLike[str]) -> set[str]:
    """Topics the store knows: those with consume queues, and those in the broker's config/topics.json."""
    out = set()
    cq = Path(root) / "consumequeue"
    if cq.is_dir():
        out.update(p.name for p in cq.iterdir() if p.is_dir())
    cfg = Path(root) / "config" / "topics.json"
    if cfg.is_file():
        try:
            out.update((orjson.loads(cfg.read_bytes()) or {}).get("topicConfigTable", {}) or {})
        except orjson.JSONDecodeError:
            pass  # a torn config file: the consume queues still say which topics hold messages
    return out


def queue_boundaries(root: str | os.PathLike[str]) -> tuple[np.ndarray, int]:
    """Sorted commit-log offsets of every record some consume queue points at, and the end of the
    furthest such record (-1 without units)."""
    d = Path(root) / "consumequeue"
    parts, end = [], -1
    if d.is_dir():
        for f in d.glob("*/*/*"):
            if not (f.is_file() and f.name.isdigit()):
                continue
            raw = f.read_bytes()
            units = np.frombuffer(raw[: len(raw) - len(raw) % CQ_UNIT_SIZE], dtype=CQ_DTYPE)
            real = (units["size"] > 0) & (units["size"] != PAD_SIZE)
            offs = units["offset"][real].astype(np.int64)
            if len(offs):
                parts.append(offs)
                end = max(end, int((offs + units["size"][real].astype(np.int64)).max()))
    if not parts:
        return np.empty(0, dtype=np.int64), end
    return np.unique(np.concatenate(parts)), end


def store_is_open(root: str | os.PathLike[str]) -> bool:
    """True while a process (a running broker) holds the store's lock."""
    path = Path(root) / "lock"
    if not path.exists():
        return False
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # closing drops a lock we got
    return False


def _is_record_start(path: Path, rel: int, absolute: int) -> bool:
    """Whether the bytes at ``rel`` of ``path`` are a record that says it is at ``absolute``."""
    with open(path, "rb") as f:
        f.seek(rel)
        head = f.read(fmt.POS_SYSFLAG)
    if len(head) < fmt.POS_SYSFLAG:
        return False
    total, magic = fmt.TOTAL_MAGIC.unpack_from(head, 0)
    return (magic in (fmt.MAGIC_V1, fmt.MAGIC_V2) and total >= fmt.MIN_RECORD_SIZE
            and fmt.I64.unpack_from(head, fmt.POS_PHYSICALOFFSET)[0] == absolute)


def plan_splits(root: str | os.PathLike[str], split_bytes: int = 64 * 1024 * 1024) -> list[Split]:
    """Cut every segment into record-aligned splits of about ``split_bytes`` (see the module doc).

    While a broker has the store open, the scan stops where dispatch has got to (the furthest record a
    consume queue points at): bytes after it may still be being written."""
    if split_bytes <= 0:
        raise InvalidParameterError("split size must be positive")
    segs = segment_files(root)
    bounds, dispatched_end = queue_boundaries(root) if segs else (np.empty(0, dtype=np.int64), -1)
    limit = dispatched_end if store_is_open(root) else None
    out: list[Split] = []
    for start, path in segs:
        end = start + path.stat().st_size
        if limit is not None:
            if start >= limit:
                break
            end = min(end, limit)
        cuts = [start]
        targets = np.arange(start + split_bytes, end, split_bytes, dtype=np.int64)
        if len(targets) and len(bounds):
            idx = np.searchsorted(bounds, targets)
            for b in np.unique(bounds[idx[idx < len(bounds)]]).tolist():
                # A unit left over from a crash may point at garbage: only cut where a record says so.
                if cuts[-1] < b < end and _is_record_start(path, b - start, b):
                    cuts.append(b)
        cuts.append(end)
        out.extend(Split(str(path), start, a, b) for a, b in zip(cuts, cuts[1:]))
    return out


def _be(buf: np.ndarray, pos: np.ndarray, width: int, dtype: str) -> np.ndarray:
    """Big-endian fixed-width values at byte positions ``pos`` of ``buf`` (one gather per field)."""
    idx = pos[:, None] + np.arange(width, dtype=np.int64)
    return np.ascontiguousarray(buf[idx]).view(dtype).ravel().astype(dtype[1:] if dtype[0] == ">" else dtype)


def _strings(mv: memoryview, starts: list[int], ends: list[int], binary: bool = False) -> pa.Array:
    """Bodies: one slice per record joined in C (large values, memcpy-bound)."""
    data = b"".join([mv[s:e] for s, e in zip(starts, ends)])
    lens = np.asarray(ends, dtype=np.int64) - np.asarray(starts, dtype=np.int64)
    offsets = np.zeros(len(starts) + 1, dtype=np.int64)
    np.cumsum(lens, out=offsets[1:])
    return _as_array(offsets, data, len(starts), binary)


def _short_strings(buf: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> pa.Array:
    """Topics and property texts (tens of bytes): one numpy gather for the whole batch, no per-record slice."""
    lens = ends - starts
    offsets = np.zeros(len(starts) + 1, dtype=np.int64)
    np.cumsum(lens, out=offsets[1:])
    idx = np.arange(offsets[-1], dtype=np.int64) + np.repeat(starts - offsets[:-1], lens)
    return _as_array(offsets, buf[idx].tobytes(), len(starts), False)


def _as_array(offsets: np.ndarray, data: bytes, n: int, binary: bool) -> pa.Array:
    typ = pa.large_binary() if binary else pa.large_string()
    arr = pa.Array.from_buffers(typ, n, [None, pa.py_buffer(offsets), pa.py_buffer(data)])
    if not binary:
        arr.validate(full=True)  # bad UTF-8 raises here, not in Spark
    return arr.cast(pa.binary() if binary else pa.string())


_HEX = np.frombuffer(b"0123456789ABCDEF", dtype=np.uint8)


def _hex_ids(raw: np.ndarray) -> pa.Array:
    """Uppercase hex of each row of a (n, k) uint8 array."""
    n, k = raw.shape
    out = np.empty((n, 2 * k), dtype=np.uint8)
    out[:, 0::2] = _HEX[raw >> 4]
    out[:, 1::2] = _HEX[raw & 15]
    offsets = np.arange(0, 2 * k * n + 1, 2 * k, dtype=np.int32)
    return pa.Array.from_buffers(pa.string(), n, [None, pa.py_buffer(offsets), pa.py_buffer(out.tobytes())])


def _hosts(buf: np.ndarray, pos: np.ndarray, v6: np.ndarray, mv: memoryview) -> pa.Array:
    """'a.b.c.d:port' for each host at ``pos`` (IPv6 rows formatted in Python; they are rare)."""
    if len(pos) == 0:
        return pa.array([], pa.string())
    octets = [pa.array(buf[pos + i]).cast(pa.string()) for i in range(4)]
    port = pa.array(_be(buf, pos + 4, 4, ">i4")).cast(pa.string())
    v4 = pc.binary_join_element_wise(pc.binary_join_element_wise(*octets, "."), port, ":")
    if not v6.any():
        return v4
    import ipaddress

    vals = v4.to_pylist()
    for i in np.flatnonzero(v6).tolist():
        p = int(pos[i])
        vals[i] = f"{ipaddress.ip_address(bytes(mv[p:p + 16]))}:{fmt.I32.unpack_from(mv, p + 16)[0]}"
    return pa.array(vals, pa.string())


def _properties_map(props: pa.Array) -> pa.Array:
    """map<string,string> from RocketMQ property strings (decode_properties' rules, in Arrow kernels)."""
    n = len(props)
    parts = pc.split_pattern(props, "\x02")
    flat = pc.list_flatten(parts)
    parent = pc.list_parent_indices(parts)
    kv = pc.split_pattern(flat, "\x01", max_splits=1)
    keep = pc.and_(pc.equal(pc.list_value_length(kv), 2), pc.greater_equal(pc.utf8_length(flat), 3))
    kv, parent = kv.filter(keep), parent.filter(keep)
    names, values = pc.list_element(kv, 0), pc.list_element(kv, 1)
    keep = pc.and_(pc.not_equal(names, ""), pc.not_equal(values, ""))
    names, values, parent = names.filter(keep), values.filter(keep), parent.filter(keep)
    counts = np.bincount(np.asarray(parent, dtype=np.int64), minlength=n)
    offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(counts, out=offsets[1:])
    return pa.MapArray.from_arrays(pa.array(offsets), names, values)


def _keys_lists(keys: pa.Array) -> pa.Array:
    """KEYS split on single spaces, empty tokens dropped; no KEYS gives an empty list."""
    n = len(keys)
    parts = pc.split_pattern(pc.fill_null(keys, ""), " ")
    flat = pc.list_flatten(parts)
    parent = pc.list_parent_indices(parts)
    keep = pc.not_equal(flat, "")
    flat, parent = flat.filter(keep), parent.filter(keep)
    counts = np.bincount(np.asarray(parent, dtype=np.int64), minlength=n)
    offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(counts, out=offsets[1:])
    return pa.ListArray.from_arrays(pa.array(offsets), flat)


class SegmentReader:
    """Decodes the records of one split into Arrow record batches (ARROW_SCHEMA)."""

    def __init__(self, split: Split, *, topics: frozenset[str] | None = None, tags: frozenset[str] | None = None,
                 broker: str | None = None, check_crc: bool = True, batch_rows: int = 8192) -> None:
        self.split = split
        self.topics = topics
        self.tags = tags
        self.broker = broker
        self.check_crc = check_crc
        self.batch_rows = batch_rows

    def batches(self):
        sp = self.split
        with open(sp.path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size == 0:
                return
            mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        try:
            yield from self._walk(mm, size)
        finally:
            try:
                mm.close()
            except BufferError:
                pass  # an exception's traceback still holds a view; the mapping goes with it

    def _walk(self, mm: mmap.mmap, size: int):
        sp = self.split
        pos = sp.start - sp.segment
        stop = min(sp.end - sp.segment, size)
        if pos + 8 <= size:
            magic = fmt.U32.unpack_from(mm, pos + fmt.POS_MAGIC)[0]
            if (magic in (fmt.MAGIC_V1, fmt.MAGIC_V2) and pos + fmt.POS_SYSFLAG <= size
                    and fmt.I64.unpack_from(mm, pos + fmt.POS_PHYSICALOFFSET)[0] != sp.start):
                raise CorruptRecordError(f"split start {sp.start} is not a record boundary", path=sp.path,
                                         offset=pos)
        # Record starts from the one walker (magic and size checked); the rest is checked per batch below.
        walk = fmt.RecordWalk(mm, pos, size, where=sp.path)
        starts: list[int] = []
        for p in walk.positions():
            if p >= stop:
                break
            starts.append(p)
            if len(starts) >= self.batch_rows:
                batch = self._decode(mm, starts)
                if batch is not None:
                    yield batch
                starts = []
        else:
            if walk.stop == CORRUPT and walk.pos < stop:
                raise walk.error  # type: ignore[misc]
        if starts:
            batch = self._decode(mm, starts)
            if batch is not None:
                yield batch

    def _decode(self, mm: mmap.mmap, starts_list: list[int]) -> pa.RecordBatch | None:
        buf = np.frombuffer(mm, dtype=np.uint8)
        mv = memoryview(mm)
        try:
            return self._decode_rows(buf, mv, np.asarray(starts_list, dtype=np.int64))
        finally:
            mv.release()
            del buf

    def _decode_rows(self, buf: np.ndarray, mv: memoryview, pos: np.ndarray) -> pa.RecordBatch | None:
        sp = self.split
        # sluice.format's field table, vectorised: host sizes from SYSFLAG, then the positions after them
        total = _be(buf, pos + fmt.POS_TOTALSIZE, 4, ">i4").astype(np.int64)
        magic = _be(buf, pos + fmt.POS_MAGIC, 4, ">u4")
        sysflag = _be(buf, pos + fmt.POS_SYSFLAG, 4, ">i4")
        visible = ~np.isin(sysflag & fmt.TRANSACTION_MASK, _NOT_QUEUED)
        bh = np.where(sysflag & FLAG_BORNHOST_V6, HOST_V6_SIZE, HOST_V4_SIZE)
        sh = np.where(sysflag & FLAG_STOREHOST_V6, HOST_V6_SIZE, HOST_V4_SIZE)
        store_ts_at = pos + fmt.POS_BORNHOST + bh
        store_host_at = store_ts_at + 8
        rec_at = store_host_at + sh  # RECONSUMETIMES
        body_len = _be(buf, rec_at + 12, 4, ">i4").astype(np.int64)
        body_at = rec_at + 16
        body_end = body_at + body_len
        v2 = magic == fmt.MAGIC_V2
        if (body_len < 0).any() or (body_end + 3 > pos + total).any():
            bad = int(np.flatnonzero((body_len < 0) | (body_end + 3 > pos + total))[0])
            raise CorruptRecordError("body length runs past the record", path=sp.path, offset=int(pos[bad]))
        tlen = np.where(v2, _be(buf, body_end, 2, ">u2").astype(np.int64), buf[body_end].astype(np.int64))
        topic_at = body_end + np.where(v2, 2, 1)
        plen_at = topic_at + tlen
        plen = _be(buf, plen_at, 2, ">u2").astype(np.int64)
        props_at = plen_at + 2
        if (props_at + plen != pos + total).any():
            bad = int(np.flatnonzero(props_at + plen != pos + total)[0])
            raise CorruptRecordError("record fields do not add up to its size", path=sp.path, offset=int(pos[bad]))
        phys = _be(buf, pos + fmt.POS_PHYSICALOFFSET, 8, ">i8")
        seg_pos = pos + sp.segment
        if (phys != seg_pos).any():
            bad = int(np.flatnonzero(phys != seg_pos)[0])
            raise CorruptRecordError(f"record says it is at {int(phys[bad])}", path=sp.path, offset=int(pos[bad]))
        topic = _short_strings(buf, topic_at, plen_at)
        keep = visible
        if self.topics is not None:
            keep = keep & np.asarray(pc.is_in(topic, pa.array(sorted(self.topics))), dtype=bool)
        props_text = _short_strings(buf, props_at, props_at + plen)
        if self.tags is not None:
            # Decided on the property text before any body is copied or checked.
            tags = pc.map_lookup(_properties_map(props_text), "TAGS", "last")
            keep = keep & np.asarray(pc.fill_null(pc.is_in(tags, pa.array(sorted(self.tags))), False), dtype=bool)
        if not keep.all():
            idx = np.flatnonzero(keep)
            if len(idx) == 0:
                return None
            pos, total, sysflag, bh, store_ts_at, store_host_at, rec_at = (
                a[idx] for a in (pos, total, sysflag, bh, store_ts_at, store_host_at, rec_at))
            body_at, body_end, props_at, plen, phys = (a[idx] for a in (body_at, body_end, props_at, plen, phys))
            take = pa.array(idx)
            topic, props_text = topic.take(take), props_text.take(take)
        n = len(pos)
        b_starts, b_ends = body_at.tolist(), body_end.tolist()
        if self.check_crc:
            crc = _be(buf, pos + fmt.POS_BODYCRC, 4, ">i4") & 0x7FFFFFFF
            for i, (s, e) in enumerate(zip(b_starts, b_ends)):
                if crc32(mv[s:e]) & 0x7FFFFFFF != crc[i]:
                    raise CorruptRecordError("body CRC mismatch", path=sp.path, offset=s)
        compressed = (sysflag & FLAG_COMPRESSED) != 0
        if compressed.any():
            bodies = [zlib.decompress(mv[s:e]) if c else bytes(mv[s:e])
                      for s, e, c in zip(b_starts, b_ends, compressed.tolist())]
            body = pa.array(bodies, pa.binary())
        else:
            body = _strings(mv, b_starts, b_ends, binary=True)
        props = _properties_map(props_text)
        tags = pc.map_lookup(props, "TAGS", "last")
        keys = _keys_lists(pc.map_lookup(props, "KEYS", "last"))
        v6_store = (sysflag & FLAG_STOREHOST_V6) != 0
        if v6_store.any():
            from sluice.protocol.msgid import create_offset_msg_id

            hosts = _hosts(buf, store_host_at, v6_store, mv).to_pylist()
            offset_ids = pa.array([create_offset_msg_id(h.rsplit(":", 1)[0], int(h.rsplit(":", 1)[1]), int(p))
                                   for h, p in zip(hosts, phys.tolist())], pa.string())
        else:
            raw = np.concatenate([buf[store_host_at[:, None] + np.arange(8)],
                                  buf[(pos + fmt.POS_PHYSICALOFFSET)[:, None] + np.arange(8)]],
                                 axis=1)
            offset_ids = _hex_ids(raw)
        uniq = pc.map_lookup(props, "UNIQ_KEY", "last")
        msg_id = pc.coalesce(uniq, offset_ids)
        born_ts = _be(buf, pos + fmt.POS_BORNTIMESTAMP, 8, ">i8") * 1000
        store_ts = _be(buf, store_ts_at, 8, ">i8") * 1000
        cols = [
            topic,
            pa.nulls(n, pa.string()) if self.broker is None else pa.array([self.broker] * n, pa.string()),
            pa.array(_be(buf, pos + fmt.POS_QUEUEID, 4, ">i4")),
            pa.array(_be(buf, pos + fmt.POS_QUEUEOFFSET, 8, ">i8")),
            pa.array(phys),
            msg_id,
            offset_ids,
            tags,
            keys,
            props,
            body,
            pa.array(born_ts, pa.timestamp("us", tz="UTC")),
            pa.array(store_ts, pa.timestamp("us", tz="UTC")),
            _hosts(buf, pos + fmt.POS_BORNHOST, (sysflag & FLAG_BORNHOST_V6) != 0, mv),
            pa.array(_be(buf, rec_at, 4, ">i4")),
        ]
        return pa.RecordBatch.from_arrays(cols, schema=ARROW_SCHEMA)


def read_split(split: Split, **kw) -> pa.Table:
    """Every batch of one split as a table (tests and small jobs)."""
    batches = list(SegmentReader(split, **kw).batches())
    return pa.Table.from_batches(batches, schema=ARROW_SCHEMA)
