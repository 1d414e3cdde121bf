"""Columnar dispatch: what one put hands to dispatch, and the batch one dispatch step works on.

A put registers a :class:`PutRun` (one topic and queue, one store time, the
records' offsets, sizes, sysflags, encoded properties and their TAGS, KEYS and
UNIQ_KEY) so dispatch need not parse the records back. A dispatch step takes
the runs that follow each other in the log as a :class:`DispatchBatch` and
writes consume-queue units one numpy array per queue and the key index one
vectorised batch: no Python object per message.

Per-message :class:`DispatchRequest` objects (with decoded properties) are built
only when a registered dispatcher asks for them (``batch.requests()`` in its
``dispatch_batch``, as types.RequestDispatcher does). Once built, they are what
the consume queues are written from, since a dispatcher may change their
``tag_code`` or set a ``bitmap``. A dispatcher that only sets bitmaps may set
them on the runs instead (``PutRun.bitmaps``, as broker/bitmap.py does): the
units, and the records' ext units, are then still written from the columns.
"""
from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from itertools import chain, repeat
from struct import Struct

import numpy as np

from sluice.errors import SluiceError
from sluice.format import FLAG_TRANSACTION_ROLLBACK as _TRAN_ROLLBACK
from sluice.format import TRANSACTION_MASK as _TRAN_MASK
from sluice.format import CQ_UNIT, is_queued, tag_code
from sluice.protocol import properties as P
from sluice.speedups import C
from sluice.store.consumequeue import CQ_DTYPE, ConsumeQueueTable
from sluice.store.index import IndexService
from sluice.store.keyhash import key_hashes, prefix_hash
from sluice.store.dispatch_request import DispatchRequest
from sluice.store.ext_files import ExtTable

__all__ = ["PutRun", "DispatchBatch", "write_units", "write_one_unit", "ext_tags", "index_runs", "index_requests",
           "unit_array", "FEW_UNITS"]

log = logging.getLogger(__name__)

_I64 = Struct("=q")  # a native int64, as speedups.index_entries writes its columns

#: Up to this many units a queue's write packs them with struct (one numpy call) rather than filling three
#: columns of an empty array (four calls, each converting a list): a live stream dispatches one or a few per step.
FEW_UNITS = 16


def unit_array(phys: Sequence[int], sizes: Sequence[int], tags: Sequence[int]) -> np.ndarray:
    """Consume-queue units (CQ_DTYPE) from their three columns."""
    if len(phys) <= FEW_UNITS:
        return np.frombuffer(b"".join(map(CQ_UNIT.pack, phys, sizes, tags)), dtype=CQ_DTYPE)
    units = np.empty(len(phys), dtype=CQ_DTYPE)
    units["offset"] = phys
    units["size"] = sizes
    units["tag"] = tags
    return units


@dataclass(slots=True)
class PutRun:
    """One put as dispatch sees it. The encoder fills the per-record columns; CommitLog.append fills
    ``phys``, ``qoffs`` and ``store_timestamp`` under its lock, before the write position moves."""

    topic: str
    queue_id: int
    sizes: list[int]
    sysflags: list[int]  # as stored (with the IPv6 host bits)
    props: list[str]  # encoded properties, exactly as stored
    tags: list[str | None]
    keys: list[str | None]  # the KEYS value, not split
    uniq: list[str | None]
    #: every record gets a consume-queue unit (no prepared or rolled-back transactional ones)
    all_queued: bool = True
    phys: list[int] = field(default_factory=list)
    qoffs: Sequence[int] = ()
    store_timestamp: int = 0
    #: each record's filter bitmap (None: none), set by a dispatcher (broker/bitmap.py) and written to the
    #: consume queue's ext units as DispatchRequest.bitmap is
    bitmaps: list[bytes | None] | None = None

    @property
    def end(self) -> int:
        """Commit-log offset just after the run's last record."""
        return self.phys[-1] + self.sizes[-1]

    def __len__(self) -> int:
        return len(self.sizes)


class DispatchBatch:
    """The runs one dispatch step covers, in commit-log order."""

    __slots__ = ("runs", "count", "_requests")

    def __init__(self, runs: list[PutRun]) -> None:
        self.runs = runs
        self.count = sum(len(r) for r in runs)
        self._requests: list[DispatchRequest] | None = None

    def __len__(self) -> int:
        return self.count

    @property
    def materialised(self) -> bool:
        """True once ``requests()`` was called: the requests (maybe changed by dispatchers) are the truth."""
        return self._requests is not None

    def requests(self) -> list[DispatchRequest]:
        """One DispatchRequest per record, equal to what parsing the records back gives (built once)."""
        if self._requests is None:
            out: list[DispatchRequest] = []
            decode, split, tc = P.decode_properties, P.split_keys, tag_code
            for run in self.runs:
                topic, qid, ts = run.topic, run.queue_id, run.store_timestamp
                first = len(out)
                for props_s, phys, qoff, size, sysflag in zip(run.props, run.phys, run.qoffs, run.sizes,
                                                               run.sysflags):
                    props = decode(props_s)
                    out.append(DispatchRequest(topic, qid, qoff, phys, size, tc(props.get(P.TAGS)), props, ts,
                                               split(props.get(P.KEYS)), props.get(P.UNIQ_KEY), sysflag))
                if run.bitmaps is not None:  # a dispatcher set them on the columns before
                    for r, bitmap in zip(out[first:], run.bitmaps):
                        r.bitmap = bitmap
            self._requests = out
        return self._requests


def write_units(queues: ConsumeQueueTable, runs: list[PutRun], ext: ExtTable | None = None) -> None:
    """Consume-queue units straight from the runs' columns: one numpy array and one put per queue; records
    with a bitmap (``PutRun.bitmaps``) also get an ext unit in ``ext``, as :func:`ext_tags` puts them."""
    groups: dict[tuple[str, int], list[PutRun]] = {}
    for run in runs:
        key = (run.topic, run.queue_id)
        g = groups.get(key)
        if g is None:
            groups[key] = [run]
        else:
            g.append(run)
    for (topic, qid), rs in groups.items():
        if len(rs) == 1 and len(rs[0]) == 1:  # one record (a live stream at a low rate): no lists, no numpy
            r = rs[0]
            if r.all_queued or is_queued(r.sysflags[0]):
                write_one_unit(queues, ext, topic, qid, r.qoffs[0], r.phys[0], r.sizes[0], tag_code(r.tags[0]),
                               r.store_timestamp, None if r.bitmaps is None else r.bitmaps[0])
            continue
        with_bits = ext is not None and any(r.bitmaps is not None for r in rs)
        if len(rs) == 1 and rs[0].all_queued:  # one put for this queue (the usual case): its own columns
            r = rs[0]
            phys, sizes, qoffs = r.phys, r.sizes, r.qoffs
            tags = list(map(tag_code, r.tags))
            if with_bits:
                bitmaps = r.bitmaps  # type: ignore[assignment]
                times = [r.store_timestamp] * len(r)
        elif all(r.all_queued for r in rs):
            phys = list(chain.from_iterable(r.phys for r in rs))
            sizes = list(chain.from_iterable(r.sizes for r in rs))
            tags = list(map(tag_code, chain.from_iterable(r.tags for r in rs)))
            qoffs = list(chain.from_iterable(r.qoffs for r in rs))
            if with_bits:
                bitmaps = list(chain.from_iterable(_bitmaps(r) for r in rs))
                times = list(chain.from_iterable(repeat(r.store_timestamp, len(r)) for r in rs))
        else:
            rows = [(p, s, tag_code(t), q, b, r.store_timestamp) for r in rs
                    for p, s, t, q, f, b in zip(r.phys, r.sizes, r.tags, r.qoffs, r.sysflags, _bitmaps(r))
                    if is_queued(f)]
            if not rows:
                continue
            phys, sizes, tags, qoffs, bitmaps, times = (list(c) for c in zip(*rows))
        if with_bits:
            ext_tags(ext, topic, qid, tags, times, bitmaps, qoffs[0])  # type: ignore[arg-type]
        units = unit_array(phys, sizes, tags)
        cq = queues.get_or_create(topic, qid)
        first = qoffs[0]
        if qoffs[-1] - first == len(qoffs) - 1:
            cq.put(first, units)
        else:  # not contiguous (should not happen): put them one by one
            for i, q in enumerate(qoffs):
                cq.put(q, units[i:i + 1])


def write_one_unit(queues: ConsumeQueueTable, ext: ExtTable | None, topic: str, qid: int, qoff: int, phys: int,
                   size: int, tag: int, store_timestamp: int, bitmap: bytes | None) -> None:
    """One record's consume-queue unit, and its ext unit when it has a bitmap (as :func:`ext_tags` puts
    them), without the lists and numpy array of a batch."""
    if bitmap is not None and ext is not None:
        try:
            tag = ext.get_or_create(topic, qid).put(tag, store_timestamp, bitmap)
        except SluiceError as e:
            log.warning("no ext units for %s/%d offsets %d..: %s", topic, qid, qoff, e)
    queues.get_or_create(topic, qid).put_unit(qoff, phys, size, tag)


def _bitmaps(run: PutRun) -> Iterable[bytes | None]:
    return repeat(None, len(run)) if run.bitmaps is None else run.bitmaps


def ext_tags(ext: ExtTable, topic: str, qid: int, tags: list[int], times: list[int], bitmaps: list[bytes | None],
             first_qoff: int) -> None:
    """Put an ext unit (tag code, store time, bitmap) for each record with a bitmap, in order, and put the
    unit's address in its tag slot of ``tags`` (RocketMQ's putMessagePositionInfoWrapper). If the ext write
    fails the slots keep the plain tag codes and pulls evaluate those records directly."""
    missing = bitmaps.count(None)
    if missing == len(bitmaps):
        return
    every = missing == 0
    with_bits = [] if every else [i for i, b in enumerate(bitmaps) if b is not None]
    try:
        addrs = ext.get_or_create(topic, qid).put_many(
            tags if every else [tags[i] for i in with_bits], times if every else [times[i] for i in with_bits],
            bitmaps if every else [bitmaps[i] for i in with_bits])  # type: ignore[arg-type]
    except SluiceError as e:
        log.warning("no ext units for %s/%d offsets %d..: %s", topic, qid, first_qoff, e)
        return
    if every:
        tags[:] = addrs
    else:
        for i, a in zip(with_bits, addrs):
            tags[i] = a


def _index_keys_of(uniq: str | None, keys: str | None, out: list[str]) -> int:
    """Append a message's index keys (UNIQ_KEY, then each non-empty KEYS token); return how many."""
    n = len(out)
    if uniq:
        out.append(uniq)
    if keys:
        out.extend(k for k in keys.split(P.KEY_SEPARATOR) if k)
    return len(out) - n


def _simple(run: PutRun) -> bool:
    """Every record has a UNIQ_KEY and one key (the usual shape: a producer's id and a business key)."""
    uniq, keys = run.uniq, run.keys
    return (run.all_queued and None not in uniq and "" not in uniq and None not in keys and "" not in keys
            and P.KEY_SEPARATOR not in "".join(keys))


#: below this many records a batch is indexed message by message (struct, no numpy): numpy's fixed cost per
#: call, and under thread contention the GIL it gives up and must take back, outweigh its per-key gain
SMALL_BATCH = 32


def index_runs(index: IndexService, runs: list[PutRun]) -> None:
    """Index every record of the runs in one batch."""
    if C is not None:
        _index_runs_c(index, runs)
        return
    if sum(map(len, runs)) < SMALL_BATCH:
        build, split = index.build_index, P.split_keys
        for run in runs:
            topic, ts = run.topic, run.store_timestamp
            for u, k, p, f in zip(run.uniq, run.keys, run.phys, run.sysflags):
                if (u or k) and f & _TRAN_MASK != _TRAN_ROLLBACK:
                    build(topic, u, split(k), p, ts)
        return
    if all(_simple(r) for r in runs):
        # Two keys per record: hash the UNIQ_KEYs and the KEYS as two columns (each mostly of one length,
        # which key_hashes turns into one matrix product), then interleave them in index order.
        uniq: list[str] = []
        keys: list[str] = []
        phys: list[int] = []
        ts: list[int] = []
        prefixes: list[int] = []
        for run in runs:
            n = len(run)
            uniq += run.uniq  # type: ignore[arg-type]
            keys += run.keys  # type: ignore[arg-type]
            phys += run.phys
            ts += [run.store_timestamp] * n
            prefixes += [prefix_hash(run.topic)] * n
        pre = np.array(prefixes, dtype=np.uint32)
        hashes = np.empty(2 * len(phys), dtype=np.int64)
        hashes[0::2] = key_hashes(pre, uniq)
        hashes[1::2] = key_hashes(pre, keys)
        index.build_index_hashes(hashes, np.repeat(np.array(phys, dtype=np.int64), 2),
                                 np.repeat(np.array(ts, dtype=np.int64), 2))
        return
    names: list[str] = []
    counts: list[int] = []  # keys per message, parallel to the message columns below
    phys = []
    ts = []
    prefixes = []
    for run in runs:
        for u, k, p, f in zip(run.uniq, run.keys, run.phys, run.sysflags):
            if f & _TRAN_MASK == _TRAN_ROLLBACK:
                continue
            c = _index_keys_of(u, k, names)
            if c:
                counts.append(c)
                phys.append(p)
        n = len(phys) - len(ts)
        ts += [run.store_timestamp] * n
        prefixes += [prefix_hash(run.topic)] * n
    _build(index, names, counts, phys, ts, prefixes)


def _index_runs_c(index: IndexService, runs: list[PutRun]) -> None:
    """index_runs with the keys split and hashed in C (speedups.index_entries), one call per run."""
    hashes: list[bytes] = []
    phys: list[bytes] = []
    ts: list[int] = []
    counts: list[int] = []
    entries = C.index_entries  # type: ignore[union-attr]
    for run in runs:
        h, p = entries(prefix_hash(run.topic), run.uniq, run.keys, run.phys, run.sysflags)
        if h:
            hashes.append(h)
            phys.append(p)
            ts.append(run.store_timestamp)
            counts.append(len(h) // 8)
    if not hashes:
        return
    if len(hashes) == 1:  # one put (a live stream's dispatch step): its columns as they are, no numpy
        index.build_index_raw(hashes[0], phys[0], _I64.pack(ts[0]) * counts[0])
        return
    index.build_index_hashes(np.frombuffer(b"".join(hashes), dtype=np.int64),
                             np.frombuffer(b"".join(phys), dtype=np.int64),
                             np.repeat(np.array(ts, dtype=np.int64), counts))


def index_requests(index: IndexService, requests: list[DispatchRequest]) -> None:
    """Index per-message requests (dispatch parsed from the log, or built for dispatchers) in one batch."""
    if len(requests) < SMALL_BATCH:
        for r in requests:
            if (r.uniq_key or r.keys) and (r.sysflag & _TRAN_MASK) != _TRAN_ROLLBACK:
                index.build_index(r.topic, r.uniq_key, r.keys, r.commitlog_offset, r.store_timestamp)
        return
    names: list[str] = []
    counts: list[int] = []
    phys: list[int] = []
    ts: list[int] = []
    prefixes: list[int] = []
    for r in requests:
        if (r.uniq_key or r.keys) and (r.sysflag & _TRAN_MASK) != _TRAN_ROLLBACK:
            c = len(names)
            if r.uniq_key:
                names.append(r.uniq_key)
            names.extend(k for k in r.keys if k)
            if len(names) > c:
                counts.append(len(names) - c)
                phys.append(r.commitlog_offset)
                ts.append(r.store_timestamp)
                prefixes.append(prefix_hash(r.topic))
    _build(index, names, counts, phys, ts, prefixes)


def _build(index: IndexService, names: list[str], counts: list[int], phys: list[int], ts: list[int],
           prefixes: list[int]) -> None:
    if not names:
        return
    c = np.array(counts, dtype=np.int64)
    index.build_index_batch(np.repeat(np.array(prefixes, dtype=np.uint32), c), names,
                            np.repeat(np.array(phys, dtype=np.int64), c), np.repeat(np.array(ts, dtype=np.int64), c))
