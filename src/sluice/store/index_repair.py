"""Crash repair of one index file (store/index.py IndexFile.repair): the whole check, and the check of
the entries written after the last checkpoint only.

The whole check validates every entry against the others (fields, phyOffset order, in-slot chains) and
rebuilds the slot table from the chains, reading the entries in windows whose pages it then releases:
memory is the slot table's size (an int32 per slot) plus a window, not O(entries). After a checkpoint the entries up to its
index offset were durable; a kill leaves at most entries and slots past indexCount behind them, which
:func:`repair_tail` checks and fixes in memory bounded by the entries since the checkpoint.
"""
from __future__ import annotations

import mmap
import struct
from typing import Protocol

import numpy as np

__all__ = ["ENTRY", "HEADER", "RepairedFile", "repair_whole", "repair_tail", "first_bad", "phy_at"]

#: RocketMQ's IndexHeader (beginTimestamp, endTimestamp, beginPhyOffset, endPhyOffset, hashSlotCount,
#: indexCount) and index entry (keyHash, phyOffset, timeDiff, slotPrevIndex); store/index.py writes them
HEADER = struct.Struct(">qqqqii")
ENTRY = struct.Struct(">iqii")
#: how far past indexCount repair looks for written entries: a chunk, or one message with the most keys
#: properties can hold (32767 bytes: at most 16384 one-character keys)
_REPAIR_LOOKAHEAD = 32_768
#: entries after the checkpoint that the tail repair checks at most (16 MiB of columns); more: the whole check
_TAIL_REPAIR_MAX = 400_000
#: entries the whole check reads at a time (5 MiB of the file; a few times that as int64 columns)
_WINDOW = 1 << 18


class RepairedFile(Protocol):
    """What the repair reads and sets of an index file (store/index.py IndexFile)."""

    mm: mmap.mmap
    slot_num: int
    index_num: int
    alloc_end: int
    count: int
    slot_count: int
    begin_ts: int
    end_ts: int
    begin_phy: int
    end_phy: int
    _entries_at: int

    def header_plausible(self) -> bool: ...
    def _set_end_from_entries(self) -> None: ...


def _window(f: RepairedFile, first: int, m: int) -> tuple[np.ndarray, ...]:
    """Entries first..first+m-1 as native int64 columns: hash, phyOffset, timeDiff, prevIndex."""
    raw = np.frombuffer(f.mm, dtype=">i4", count=m * 5, offset=f._entries_at + first * ENTRY.size)
    cols = raw.reshape(-1, 5).astype(np.int64)
    del raw
    phy = (cols[:, 1] << 32) | (cols[:, 2] & 0xFFFFFFFF)
    return cols[:, 0], phy, cols[:, 3], cols[:, 4]


def _release(f: RepairedFile, first: int, m: int) -> None:
    """Drop the pages of entries first..first+m-1 from this process once checked (MADV_DONTNEED: the data
    stays in the file and page cache), so a whole check keeps a window of the file resident, not all of it."""
    a = f._entries_at + first * ENTRY.size
    b = min(len(f.mm), -(-(a + m * ENTRY.size) // mmap.PAGESIZE) * mmap.PAGESIZE)
    a -= a % mmap.PAGESIZE
    if b > a:
        f.mm.madvise(mmap.MADV_DONTNEED, a, b - a)


def _chain(heads: np.ndarray, slot: np.ndarray, idx: np.ndarray, advance: bool) -> np.ndarray:
    """The prevIndex each entry of a window must hold (the entry before it in its slot: in the window, or
    ``heads[slot]`` for a slot's first); with ``advance``, ``heads`` then names each slot's newest entry."""
    m = len(slot)
    if m == 0:
        return np.zeros(0, dtype=np.int64)
    order = np.argsort(slot, kind="stable")
    s_sorted, i_sorted = slot[order], idx[order]
    first = np.empty(m, dtype=bool)
    first[0] = True
    np.not_equal(s_sorted[1:], s_sorted[:-1], out=first[1:])
    exp_sorted = np.empty(m, dtype=np.int64)
    exp_sorted[1:] = i_sorted[:-1]
    exp_sorted[first] = heads[s_sorted[first]]
    if advance:
        last = np.empty(m, dtype=bool)
        last[-1] = True
        last[:-1] = first[1:]
        heads[s_sorted[last]] = i_sorted[last]
    expected = np.empty_like(exp_sorted)
    expected[order] = exp_sorted
    return expected


def first_bad(f: RepairedFile, n: int) -> tuple[int, np.ndarray]:
    """The entry number of the first of entries 1..n-1 that breaks the file's invariants (0: none), and
    each slot's newest entry among the entries before it (what the slot table must hold).

    Invariants: fields non-negative, prevIndex below the entry's own number, phyOffset never decreasing,
    and each entry's prevIndex the previous entry of its slot (what inserts produce). Read in windows of
    ``_WINDOW`` entries: memory is the slot table's size plus a window, whatever the number of entries."""
    heads = np.zeros(f.slot_num, dtype=np.int32)
    prev_phy = -1
    first = 1
    while first < n:
        m = min(_WINDOW, n - first)
        h, phy, diff, prev = _window(f, first, m)
        idx = np.arange(first, first + m, dtype=np.int64)
        slot = np.where(h >= 0, h, 0) % f.slot_num
        bad = (h < 0) | (phy < 0) | (diff < 0) | (prev < 0) | (prev >= idx)
        bad[0] |= phy[0] < prev_phy
        bad[1:] |= phy[1:] < phy[:-1]
        bad |= prev != _chain(heads, slot, idx, advance=False)
        _release(f, first, m)
        if bad.any():
            j = int(np.argmax(bad))
            _chain(heads, slot[:j], idx[:j], advance=True)
            return first + j, heads
        _chain(heads, slot, idx, advance=True)
        prev_phy = int(phy[-1])
        first += m
    return 0, heads


def phy_at(f: RepairedFile, i: int) -> int:
    return ENTRY.unpack_from(f.mm, f._entries_at + i * ENTRY.size)[1]


def repair_tail(f: RepairedFile, trusted_phy: int) -> list[str] | None:
    """The repair after a checkpoint: entries 1..k (phyOffset <= ``trusted_phy``) are trusted; the m
    after them are checked, entries past indexCount zeroed, and slots pointing past indexCount moved
    down their chains. None when something else is wrong (the caller runs the whole check)."""
    n, mm, at0 = f.count, f.mm, f._entries_at
    if not f.header_plausible() or phy_at(f, 1) > trusted_phy:
        return None
    lo, hi = 1, n - 1  # k = the last entry with phy <= trusted_phy (entries are in phy order)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if phy_at(f, mid) <= trusted_phy:
            lo = mid
        else:
            hi = mid - 1
    k = lo
    m = n - 1 - k
    if m > _TAIL_REPAIR_MAX:
        return None
    slot_num = f.slot_num
    if m:
        raw = np.frombuffer(mm, dtype=">i4", count=m * 5, offset=at0 + (k + 1) * ENTRY.size)
        cols = raw.reshape(-1, 5).astype(np.int64)
        del raw
        h, diff, prev = cols[:, 0], cols[:, 3], cols[:, 4]
        phy = (cols[:, 1] << 32) | (cols[:, 2] & 0xFFFFFFFF)
        idx = np.arange(k + 1, n, dtype=np.int64)
        if ((h < 0) | (phy < 0) | (diff < 0) | (prev < 0) | (prev >= idx)).any():
            return None
        if (phy[1:] < phy[:-1]).any() or phy[0] < phy_at(f, k):
            return None
        slot = h % slot_num
        linked = prev > 0
        prev_h = np.array([ENTRY.unpack_from(mm, at0 + int(p) * ENTRY.size)[0] for p in prev[linked]],
                          dtype=np.int64)
        if len(prev_h) and (prev_h % slot_num != slot[linked]).any():
            return None
    changes: list[str] = []
    slots = np.frombuffer(mm, dtype=">i4", count=slot_num, offset=HEADER.size)
    try:
        past = np.flatnonzero(slots >= n)
        for sl in past:  # a kill between a batch's slots and its header: walk back below indexCount
            v, steps = int(slots[sl]), 0
            while v >= n:
                if v >= f.index_num or steps > _REPAIR_LOOKAHEAD:
                    return None
                eh, _p, _d, v = ENTRY.unpack_from(mm, at0 + v * ENTRY.size)
                if eh < 0 or eh % slot_num != sl or v < 0:
                    return None
                steps += 1
            slots[sl] = v
        if len(past):
            changes.append(f"moved {len(past)} hash slots back below indexCount")
        if m:  # each slot the checked entries use must name its newest one
            order = np.argsort(slot, kind="stable")
            last_of = np.ones(m, dtype=bool)
            last_of[:-1] = slot[order][1:] != slot[order][:-1]
            heads_s, heads_i = slot[order][last_of], idx[order][last_of]
            if (slots[heads_s] != heads_i).any():
                return None
        slot_count = int(np.count_nonzero(slots))
    finally:
        del slots
    at = at0 + n * ENTRY.size
    look = max(0, min(_REPAIR_LOOKAHEAD, f.index_num - n, (f.alloc_end - at) // ENTRY.size))
    tail = np.frombuffer(mm, dtype=np.uint8, count=look * ENTRY.size, offset=at)
    written = np.flatnonzero(tail.reshape(-1, ENTRY.size).any(axis=1))
    del tail
    if len(written):
        stop = n + int(written[-1]) + 1
        mm[at:at0 + stop * ENTRY.size] = bytes((stop - n) * ENTRY.size)
        changes.append(f"zeroed {stop - n} entries past indexCount")
    if slot_count != f.slot_count:
        changes.append(f"hashSlotCount {f.slot_count} -> {slot_count}")
        f.slot_count = slot_count
    return changes


def repair_whole(f: RepairedFile) -> list[str]:
    """The whole check: every entry against the others (first_bad, in windows), the count cut before the
    first bad entry's message, entries past it zeroed, the slot table and header made to match."""
    changes: list[str] = []
    n = f.count
    bad, heads = first_bad(f, n)
    if bad:
        cut = bad
        if cut > 1:
            # The message of the last good entry may have lost keys past the cut: drop it whole, undoing
            # its entries in the slot heads newest first (each good entry's prev is its slot's head before it).
            last_phy = phy_at(f, cut - 1)
            while cut > 1:
                h, phy, _d, prev = ENTRY.unpack_from(f.mm, f._entries_at + (cut - 1) * ENTRY.size)
                if phy != last_phy:
                    break
                heads[h % f.slot_num] = prev
                cut -= 1
        changes.append(f"indexCount {n} -> {cut} (entry {bad} is inconsistent)")
        n = f.count = cut
    # Entries written past the header's count belong to a message whose header never got written.
    at = f._entries_at + n * ENTRY.size
    # Only allocated bytes are looked at: beyond them nothing was written, and reading could allocate.
    look = max(0, min(_REPAIR_LOOKAHEAD, f.index_num - n, (f.alloc_end - at) // ENTRY.size))
    tail = np.frombuffer(f.mm, dtype=np.uint8, count=look * ENTRY.size, offset=at)
    written = np.flatnonzero(tail.reshape(-1, ENTRY.size).any(axis=1))
    del tail
    if len(written):
        stop = n + int(written[-1]) + 1
        f.mm[at:f._entries_at + stop * ENTRY.size] = bytes((stop - n) * ENTRY.size)
        changes.append(f"zeroed {stop - n} entries past indexCount")
    # The slot table must point at the newest entry of each slot; compared and written a window at a time.
    slots_view = np.frombuffer(f.mm, dtype=">i4", count=f.slot_num, offset=HEADER.size)
    try:
        rebuilt = False
        for a in range(0, f.slot_num, _WINDOW):
            b = min(f.slot_num, a + _WINDOW)
            if not np.array_equal(slots_view[a:b], heads[a:b]):
                slots_view[a:b] = heads[a:b]
                rebuilt = True
    finally:
        del slots_view
    if rebuilt:
        changes.append("rebuilt the hash-slot table")
    slot_count = int(np.count_nonzero(heads))
    del heads
    if slot_count != f.slot_count:
        changes.append(f"hashSlotCount {f.slot_count} -> {slot_count}")
        f.slot_count = slot_count
    if n > 1:
        begin, end = phy_at(f, 1), phy_at(f, n - 1)
        if f.begin_phy != begin:
            changes.append(f"beginPhyOffset {f.begin_phy} -> {begin}")
            f.begin_phy = begin
        if f.end_phy != end:
            changes.append(f"endPhyOffset {f.end_phy} -> {end}")
            f._set_end_from_entries()
    elif f.begin_phy or f.end_phy or f.begin_ts or f.end_ts:
        changes.append("cleared the begin/end of an empty file")
        f._set_end_from_entries()
    return changes
