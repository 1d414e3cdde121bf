"""The store's ConsumeQueueExt files: one per topic/queue that has filter bitmaps, and how units use them.

Dispatch writes an ext unit (tag code, store time, bitmap) for every request
that carries a ``bitmap`` (only topics with SQL92 filter data get one) and puts
the unit's address in the consume-queue unit's tag-code slot. Readers call
:func:`resolve_units` to turn those addresses back into tag codes (so tag
filters keep working on such topics) and to hand the bitmaps to the filter
(``MessageFilter.select_units``).
Recovery (:func:`recover_ext`), retention (:func:`retain_ext`) and ``check``
keep the ext files in step with their consume queue.
"""
from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from sluice.store.consumequeue import PAD_SIZE, ConsumeQueue
from sluice.store.consumequeue_ext import (
    MAX_ADDR, SMALL_BATCH, ConsumeQueueExt, ExtBatch, FewExtBatch, is_ext_address_array,
)
from sluice.store.per_queue import OpenFilesLru, PerQueueTable

__all__ = ["ExtTable", "resolve_units", "recover_ext", "retain_ext", "ext_addresses_ok"]

log = logging.getLogger(__name__)

_CHUNK = 1 << 16  # units looked at per step when searching a queue for ext addresses


class ExtTable(PerQueueTable[ConsumeQueueExt]):
    """Every ConsumeQueueExt of the store, created when a queue's first bitmap arrives."""

    def __init__(self, root: Path, *, file_size: int, bitmap_bytes_max: int, lru: OpenFilesLru | None = None) -> None:
        super().__init__(Path(root))
        self.file_size = file_size
        self.bitmap_bytes_max = bitmap_bytes_max
        self.lru = lru  # the consume queues' LRU of open files: one bound over both kinds

    def _new(self, topic: str, queue_id: int, directory: Path) -> ConsumeQueueExt:
        return ConsumeQueueExt(directory, file_size=self.file_size, bitmap_bytes_max=self.bitmap_bytes_max,
                               lru=self.lru)

    def drop(self, topic: str, queue_id: int) -> None:
        """Delete a queue's ext files (its consume queue is being rebuilt or deleted)."""
        with self._lock:
            ext = self.by_queue.get((topic, queue_id))
            if ext is not None:
                ext.destroy()
                self.by_queue = {k: v for k, v in self.by_queue.items() if k != (topic, queue_id)}


def resolve_units(ext: ConsumeQueueExt | None, tag_slots: np.ndarray
                  ) -> tuple[np.ndarray, ExtBatch | FewExtBatch | None, np.ndarray | None]:
    """Tag codes for a batch of consume-queue tag slots.

    Returns ``(codes, batch, unresolved)``: int64 tag codes with ext addresses replaced by their unit's
    tag code; the ExtBatch row-aligned with the input (None when no slot holds an address); and a mask
    of slots that hold an address whose unit cannot be read (code 0 there; the filter must decide those
    on the record, as RocketMQ lets them through its unit check).
    """
    if len(tag_slots) <= SMALL_BATCH:
        return _resolve_few(ext, np.asarray(tag_slots).tolist())
    codes = np.array(tag_slots, dtype=np.int64)
    is_ext = is_ext_address_array(codes)
    if not is_ext.any():
        return codes, None, None
    if ext is None:
        codes[is_ext] = 0
        return codes, None, is_ext
    batch = ext.get_many(codes)
    codes[is_ext] = batch.tags_codes[is_ext]
    unresolved = is_ext & ~batch.valid
    codes[unresolved] = 0
    return codes, batch, unresolved if unresolved.any() else None


def _resolve_few(ext: ConsumeQueueExt | None, slots: list[int]
                 ) -> tuple[np.ndarray, FewExtBatch | None, np.ndarray | None]:
    """resolve_units for a few slots (a woken held pull's window), decided on Python ints: the numpy steps'
    fixed costs would outweigh the work. The same three results."""
    is_ext = [s <= MAX_ADDR for s in slots]
    if not any(is_ext):
        return np.array(slots, dtype=np.int64), None, None
    if ext is None:
        return (np.array([0 if e else s for s, e in zip(slots, is_ext)], dtype=np.int64), None,
                np.array(is_ext, dtype=bool))
    tags, valid, batch = ext.get_few(slots)
    codes = [(t if ok else 0) if e else s for s, e, t, ok in zip(slots, is_ext, tags, valid)]
    bad = [e and not ok for e, ok in zip(is_ext, valid)]
    return np.array(codes, dtype=np.int64), batch, np.array(bad, dtype=bool) if any(bad) else None


def _real(units: np.ndarray) -> np.ndarray:
    return (units["size"] > 0) & (units["size"] != PAD_SIZE)


def _ext_slots(units: np.ndarray) -> np.ndarray:
    return np.flatnonzero(_real(units) & is_ext_address_array(units["tag"].astype(np.int64)))


def recover_ext(cq: ConsumeQueue | None, ext: ConsumeQueueExt) -> None:
    """Drop ext units past the highest address the (already reconciled) consume queue points at."""
    last = None
    if cq is not None:
        hi = cq.max_offset
        while hi > cq.min_offset and last is None:
            lo = max(cq.min_offset, hi - _CHUNK)
            units = cq.get_units(lo, hi - lo)
            if units is None:
                break
            idx = _ext_slots(units)
            if len(idx):
                last = int(units["tag"][idx[-1]])
            hi = lo
    if last is not None:
        ext.truncate_by_max_address(last)
    elif ext.max_address() != ext.min_address():
        ext.truncate(ext.min_address())


def retain_ext(cq: ConsumeQueue | None, ext: ConsumeQueueExt) -> None:
    """Retention: delete ext files wholly below the first address the consume queue still uses."""
    first = None
    if cq is not None:
        lo = cq.min_offset
        while lo < cq.max_offset and first is None:
            units = cq.get_units(lo, _CHUNK)
            if units is None or len(units) == 0:
                break
            idx = _ext_slots(units)
            if len(idx):
                first = int(units["tag"][idx[0]])
            lo += len(units)
    ext.delete_below(first if first is not None else ext.max_address())


def ext_addresses_ok(cq: ConsumeQueue, ext: ConsumeQueueExt | None,
                     release: bool = False) -> tuple[int, int] | None:
    """``store check``: (queue offset, address) of the first ext address that does not resolve, or None.

    ``release``: read the units as ``ConsumeQueue.get_units`` does with it (store/check.py drops their pages)."""
    lo = cq.min_offset
    while lo < cq.max_offset:
        units = cq.get_units(lo, _CHUNK, release)
        if units is None or len(units) == 0:
            return None
        idx = _ext_slots(units)
        if len(idx):
            addrs = units["tag"][idx].astype(np.int64)
            if ext is None:
                return lo + int(idx[0]), int(addrs[0])
            bad = np.flatnonzero(~ext.get_many(addrs).valid)
            if len(bad):
                return lo + int(idx[bad[0]]), int(addrs[bad[0]])
        lo += len(units)
    return None
