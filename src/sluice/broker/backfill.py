"""Backfill hand-over: the result of ``sluice spark backfill`` lets pulls over a backlog skip non-matching
messages without reading the commit log.

A backfill is, per (consumer group, topic, queue), one bit per queue offset in ``[first, end)`` saying
whether the message may match the group's SQL92 selector (file format: sluice.spark.backfill). It arrives
by PUT_FILTER_BACKFILL (Sluice's request code 20021, one request per queue so a frame stays small):

    request fields: consumerGroup, topic, queueId, expressionType, expression
    request body:   the bitmap file's bytes (64-byte SLBF header + bits); empty = remove that queue's backfill
    response body:  {"first", "end", "matched", "bytes"}

Taken safely while running:

* validated before use: magic/version, the header's selector hash equals the request's expression, the
  bit count covers ``end - first``, ``matched`` equals the set bits, ``end`` is not past the consume queue's
  max offset and ``first`` not below its min offset (the bitmap was computed over this queue's stored
  history), and when the group has a live subscription on the topic (heartbeat or filter data) it is the
  same expression;
* bound to the stored messages: the selector is evaluated on the stored records at the first and last
  offsets and at up to ``backfill_verify_samples`` offsets the bitmap marks 0 (drawn at random by the
  broker, so an uploader cannot tell which will be read); a 0 bit on a message that matches refuses the
  whole upload, naming the offset, and nothing changes. 1 bits are not checked: they promise only
  "maybe" and every one is evaluated again at pull time;
* written to ``{store}/filterbackfill/{topic}/{queue}/{group}.bitmap`` by temp file + fsync + rename, then
  mapped read-only (numpy memmap: resident only as pulls touch it) and swapped into the table by one dict
  assignment on the event loop; a pull that holds the old one keeps its own mapping;
* bounded: the files held stay under ``backfill_max_bytes``;
* used by a pull only when the pull's own selector hashes to the bitmap's (a changed subscription drops the
  bitmap, files included), only for offsets in ``[first, end)``, and a 1 bit still evaluates the real
  selector on the record: a bit promises only "maybe".

Restored at broker start from the files (those wholly below the queue's min offset are deleted).
"""
from __future__ import annotations

import logging
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import orjson

from sluice.broker.consumers import ConsumerManager
from sluice.broker.filter_data import ConsumerFilterManager
from sluice.broker.pool import BlockingPool
from sluice.errors import BackfillRefusedError, InvalidParameterError
from sluice.filter import compile_selector
from sluice.filter.base import Selector
from sluice.format import BACKFILL_HEADER as HEADER
from sluice.format import BACKFILL_MAGIC as MAGIC
from sluice.format import BACKFILL_VERSION as VERSION
from sluice.format import backfill_selector_hash as selector_hash
from sluice.persist import write_atomic
from sluice.protocol.command import RemotingCommand
from sluice.transport.connection import RemotingConnection

if TYPE_CHECKING:
    from sluice.broker.filtering import SelectorFilter
    from sluice.store import MessageStore

__all__ = ["BackfillManager", "QueueBackfill", "BackfillProcessor", "DIR_NAME"]

log = logging.getLogger(__name__)

DIR_NAME = "filterbackfill"
Key = tuple[str, str, int]  # (group, topic, queue id)


@dataclass(eq=False)
class QueueBackfill:
    """One queue's bitmap, mapped read-only."""

    group: str
    topic: str
    queue_id: int
    digest: bytes
    first: int
    end: int
    matched: int
    bits: np.ndarray  # packed, most significant bit first (np.packbits order)
    path: Path
    skipped: int = field(default=0)

    @property
    def nbytes(self) -> int:
        return HEADER.size + len(self.bits)

    def may_match(self, offset: int, n: int) -> np.ndarray | None:
        """For queue offsets ``[offset, offset + n)``: False where the bitmap rules a message out;
        None when the window does not meet ``[first, end)``."""
        lo, hi = max(offset, self.first), min(offset + n, self.end)
        if lo >= hi:
            return None
        out = np.ones(n, dtype=bool)
        b0, b1 = (lo - self.first) // 8, (hi - self.first - 1) // 8 + 1
        unpacked = np.unpackbits(np.asarray(self.bits[b0:b1]))
        skip = (lo - self.first) - b0 * 8
        out[lo - offset:hi - offset] = unpacked[skip:skip + (hi - lo)].astype(bool)
        return out


def _parse(raw: bytes | np.ndarray, where: str) -> tuple[bytes, int, int, int]:
    if len(raw) < HEADER.size:
        raise BackfillRefusedError(f"{where}: {len(raw)} bytes is shorter than the 64-byte backfill header")
    magic, version, _r, digest, first, end, matched = HEADER.unpack_from(bytes(raw[:HEADER.size]), 0)
    if magic != MAGIC or version != VERSION:
        raise BackfillRefusedError(f"{where}: not a version-{VERSION} backfill bitmap (magic {magic!r})")
    if not 0 <= first < end:
        raise BackfillRefusedError(f"{where}: bad offset range [{first}, {end})")
    need = -(-(end - first) // 8)
    if len(raw) - HEADER.size != need:
        raise BackfillRefusedError(f"{where}: [{first}, {end}) needs {need} bitmap bytes, "
                                   f"the file has {len(raw) - HEADER.size}")
    return digest, first, end, matched


_CHUNK_BITS = 1 << 20  # bits unpacked at once while checking an upload


def _chunks(bits: np.ndarray, n: int):
    """The first ``n`` bits of a packed bitmap, unpacked ``_CHUNK_BITS`` at a time (0/1 uint8 arrays)."""
    step = _CHUNK_BITS // 8
    for b in range(0, -(-n // 8), step):
        yield np.unpackbits(bits[b:b + step])[: n - b * 8]


class BackfillManager:
    def __init__(self, store_root: Path, *, max_bytes: int, store: MessageStore, consumers: ConsumerManager,
                 filter_data: ConsumerFilterManager, verify_samples: int = 256) -> None:
        self.root = Path(store_root) / DIR_NAME
        self.max_bytes = max_bytes
        self.verify_samples = verify_samples
        self.store = store
        self.consumers = consumers
        self.filter_data = filter_data
        self.table: dict[Key, QueueBackfill] = {}

    @property
    def held_bytes(self) -> int:
        return sum(b.nbytes for b in self.table.values())

    def _path(self, group: str, topic: str, queue_id: int) -> Path:
        if not group or "/" in group or group.startswith("."):
            raise InvalidParameterError(f"bad consumer group name {group!r}")
        return self.root / topic / str(queue_id) / f"{group}.bitmap"

    def _open(self, path: Path, group: str, topic: str, queue_id: int) -> QueueBackfill:
        mm = np.memmap(path, dtype=np.uint8, mode="r")
        digest, first, end, matched = _parse(mm, str(path))
        return QueueBackfill(group, topic, queue_id, digest, first, end, matched, mm[HEADER.size:], path)

    def load(self) -> None:
        """Restore the stored bitmaps (broker start, after the store opened)."""
        if not self.root.is_dir():
            return
        for path in sorted(self.root.glob("*/*/*.bitmap")):
            topic, qdir, group = path.parent.parent.name, path.parent.name, path.stem
            try:
                bf = self._open(path, group, topic, int(qdir))
            except (BackfillRefusedError, ValueError, OSError) as exc:
                log.warning("ignoring backfill file %s: %s", path, exc)
                continue
            cq = self.store.queues.get(topic, bf.queue_id)
            if cq is None or bf.end <= cq.min_offset:
                del bf
                path.unlink(missing_ok=True)  # retention removed everything it covers
                continue
            self.table[(group, topic, bf.queue_id)] = bf
        if self.table:
            log.info("backfill bitmaps restored: %d queues, %d bytes", len(self.table), self.held_bytes)

    def _live_expression(self, group: str, topic: str) -> tuple[str, str] | None:
        info = self.consumers.get(group)
        sub = info.subscriptions.get(topic) if info is not None else None
        if sub is not None:
            return sub.expression_type, sub.expression
        fd = self.filter_data.get(topic, group)
        if fd is not None and not fd.is_dead:
            return fd.expression_type, fd.expression
        return None

    def put(self, group: str, topic: str, queue_id: int, expression_type: str, expression: str,
            data: bytes) -> QueueBackfill:
        """Validate and store one queue's bitmap, mapped (blocking file I/O: run on the thread pool; then install)."""
        etype = (expression_type or "").upper()
        if etype != "SQL92":
            raise BackfillRefusedError(f"backfill is for SQL92 subscriptions (a {etype or 'TAG'} filter reads "
                                       "consume-queue tag codes only, never the commit log)")
        selector = compile_selector(etype, expression)
        where = f"backfill of {group}/{topic}/{queue_id}"
        digest, first, end, matched = _parse(data, where)
        if digest != selector_hash(etype, expression):
            raise BackfillRefusedError(f"{where}: the bitmap was computed for another selector than "
                                       f"{etype} {expression!r}")
        live = self._live_expression(group, topic)
        if live is not None and live != (etype, expression):
            raise BackfillRefusedError(f"{where}: group {group!r} now subscribes {live[0]} {live[1]!r} on "
                                       f"{topic!r}; the bitmap answers for {etype} {expression!r}")
        cq = self.store.queues.get(topic, queue_id)
        if cq is None:
            raise BackfillRefusedError(f"{where}: this broker has no queue {queue_id} of topic {topic!r}")
        if end > cq.max_offset:
            raise BackfillRefusedError(f"{where}: covers offsets up to {end}, the queue ends at {cq.max_offset} "
                                       "(computed over another store?)")
        if first < cq.min_offset:
            raise BackfillRefusedError(f"{where}: starts at offset {first}, the queue's first stored offset is "
                                       f"{cq.min_offset}")
        bits = np.frombuffer(data, dtype=np.uint8, offset=HEADER.size)
        ones_per_chunk = [int(c.sum()) for c in _chunks(bits, end - first)]
        ones = sum(ones_per_chunk)
        if ones != matched:
            raise BackfillRefusedError(f"{where}: header says {matched} matches, the bits hold {ones}")
        self._verify(where, cq, selector, first, end, bits, ones_per_chunk)
        old = self.table.get((group, topic, queue_id))
        if self.held_bytes - (old.nbytes if old else 0) + len(data) > self.max_bytes:
            raise BackfillRefusedError(f"{where}: {len(data)} more bytes would exceed backfill_max_bytes "
                                       f"({self.max_bytes})")
        path = self._path(group, topic, queue_id)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, data)
        log.info("%s stored: offsets [%d, %d), %d matching", where, first, end, matched)
        return self._open(path, group, topic, queue_id)

    def _verify(self, where: str, cq, selector: Selector, first: int, end: int, bits: np.ndarray,
                ones_per_chunk: list[int]) -> None:
        """Bind the bitmap to the stored messages: evaluate the selector on the records at the first and last
        offsets and at up to ``verify_samples`` offsets drawn uniformly among those marked 0; refuse if a 0
        bit hides a match. Bounded: at most ``verify_samples + 2`` records read per queue, and the bitmap is
        unpacked a chunk at a time (blocking: the thread pool)."""
        n = end - first
        zeros_per_chunk = [min(_CHUNK_BITS, n - i * _CHUNK_BITS) - o for i, o in enumerate(ones_per_chunk)]
        total = sum(zeros_per_chunk)
        k = max(0, min(self.verify_samples, total))
        ranks = sorted(random.SystemRandom().sample(range(total), k)) if k else []
        picked: set[int] = {0, n - 1}
        base = 0  # zeros before this chunk
        for i, (chunk, z) in enumerate(zip(_chunks(bits, n), zeros_per_chunk)):
            mine = [r - base for r in ranks if base <= r < base + z]
            if mine:
                where0 = np.flatnonzero(chunk == 0)
                picked.update(i * _CHUNK_BITS + int(where0[r]) for r in mine)
            base += z
        for rel in sorted(picked):
            offset = first + rel
            bit = int(bits[rel // 8] >> (7 - rel % 8) & 1)
            unit = cq.unit(offset)
            msg = self.store.get_message_by_offset(unit[0]) if unit is not None else None
            if msg is None:
                raise BackfillRefusedError(f"{where}: queue offset {offset} has no stored message to check the "
                                           "bitmap against")
            try:
                ok = selector.evaluate(msg.properties) is True
            except Exception:  # an evaluation error is no match, as at pull time (broker/filtering.py)
                ok = False
            if ok and not bit:
                log.warning("%s refused: offset %d matches but its bit is 0", where, offset)
                raise BackfillRefusedError(f"{where}: queue {cq.queue_id} offset {offset} matches the selector "
                                           "but the bitmap marks it 0 (the bitmap does not describe the stored "
                                           "messages)")

    def install(self, bf: QueueBackfill) -> None:
        """The swap (event loop): pulls from now on use ``bf``; one that holds the old one keeps its mapping."""
        self.table[(bf.group, bf.topic, bf.queue_id)] = bf

    def remove(self, group: str, topic: str, queue_id: int | None = None) -> int:
        """Drop a group's bitmaps on a topic (one queue or all); returns how many."""
        keys = [k for k in self.table if k[0] == group and k[1] == topic and (queue_id is None or k[2] == queue_id)]
        for k in keys:
            bf = self.table.pop(k)
            bf.path.unlink(missing_ok=True)
        return len(keys)

    def attach(self, mf: SelectorFilter | None, group: str, topic: str, queue_id: int, offset: int
               ) -> SelectorFilter | None:
        """Give a pull's SQL92 filter the group's bitmap for this queue, if it answers for the same selector."""
        if not self.table or mf is None or not getattr(mf, "needs_record", False):
            return mf
        bf = self.table.get((group, topic, queue_id))
        if bf is None or not hasattr(mf, "use_backfill"):
            return mf
        sel = mf.selector
        if selector_hash(sel.expression_type, sel.expression) != bf.digest:
            n = self.remove(group, topic)  # the subscription changed: these bitmaps answer for another filter
            log.warning("group %s changed its selector on %s: %d backfill bitmaps dropped", group, topic, n)
            return mf
        mf.use_backfill(bf, offset)
        return mf

    def describe(self) -> list[dict[str, object]]:
        return [{"group": b.group, "topic": b.topic, "queueId": b.queue_id, "first": b.first, "end": b.end,
                 "matched": b.matched, "skipped": b.skipped, "bytes": b.nbytes} for b in self.table.values()]


class BackfillProcessor:
    def __init__(self, *, backfills: BackfillManager, pool: BlockingPool) -> None:
        self.backfills = backfills
        self.pool = pool

    async def handle(self, conn: RemotingConnection, request: RemotingCommand) -> RemotingCommand:
        ext = request.ext_fields
        group, topic = ext.get("consumerGroup", ""), ext.get("topic", "")
        try:
            queue_id = int(ext.get("queueId", ""))
        except ValueError:
            raise InvalidParameterError(f"queueId {ext.get('queueId')!r} is not a number") from None
        if not group or not topic:
            raise InvalidParameterError("PUT_FILTER_BACKFILL needs consumerGroup and topic")
        mgr = self.backfills
        if not request.body:
            n = mgr.remove(group, topic, queue_id)
            return request.make_response(body=orjson.dumps({"removed": n}))
        bf = await self.pool.run(mgr.put, group, topic, queue_id, ext.get("expressionType", "SQL92"),
                                            ext.get("expression", ""), request.body)
        mgr.install(bf)
        return request.make_response(body=orjson.dumps(
            {"first": bf.first, "end": bf.end, "matched": bf.matched, "bytes": bf.nbytes}))
