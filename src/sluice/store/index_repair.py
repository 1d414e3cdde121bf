"""Crash repair of one index file (store/index.py IndexFile.repair): the whole check, and the check of
the entries written after the last checkpoint only.

The whole check validates every entry against the others (fields, phyOffset order, in-slot chains) and
rebuilds the slot table from the chains: O(entries) memory. After a checkpoint the entries up to its
index offset were durable; a kill leaves at most entries and slots past indexCount behind them, which
:func:`repair_tail` checks and fixes in memory bounded by the entries since the checkpoint.
"""
from __future__ import annotations

import mmap
import struct
from typing import Protocol

import numpy as np

__all__ = ["ENTRY", "HEADER", "RepairedFile", "repair_whole", "repair_tail", "columns", "first_bad", "phy_at"]

#: RocketMQ's IndexHeader (beginTimestamp, endTimestamp, beginPhyOffset, endPhyOffset, hashSlotCount,
#: indexCount) and index entry (keyHash, phyOffset, timeDiff, slotPrevIndex); store/index.py writes them
HEADER = struct.Struct(">qqqqii")
ENTRY = struct.Struct(">iqii")
#: how far past indexCount repair looks for written entries: a chunk, or one message with the most keys
#: properties can hold (32767 bytes: at most 16384 one-character keys)
_REPAIR_LOOKAHEAD = 32_768
#: entries after the checkpoint that the tail repair checks at most (16 MiB of columns); more: the whole check
_TAIL_REPAIR_MAX = 400_000


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


def columns(f: RepairedFile, n: int) -> tuple[np.ndarray, ...]:
    """Entries 1..n-1 as native columns: hash, phyOffset, timeDiff, prevIndex (one byteswap pass)."""
    raw = np.frombuffer(f.mm, dtype=">i4", count=(n - 1) * 5, offset=f._entries_at + ENTRY.size)
    cols = raw.reshape(-1, 5).astype(np.int32)
    del raw
    phy = (cols[:, 1].astype(np.int64) << 32) | cols[:, 2].view(np.uint32).astype(np.int64)
    return cols[:, 0], phy, cols[:, 3], cols[:, 4]


def first_bad(f: RepairedFile, h: np.ndarray, phy: np.ndarray, diff: np.ndarray, prev: np.ndarray,
               slot: np.ndarray) -> int:
    """Position (0-based, entry number - 1) of the first entry that breaks the file's invariants, or -1."""
    m = len(h)
    idx = np.arange(1, m + 1, dtype=np.int32)
    bad = (h < 0) | (phy < 0) | (diff < 0) | (prev < 0) | (prev >= idx)
    bad[1:] |= phy[1:] < phy[:-1]
    prev_slot = slot[np.clip(prev - 1, 0, max(m - 1, 0))]
    bad |= (prev > 0) & (prev_slot != slot)
    if not bad.any():
        # Sound chains: in-slot links, no entry anyone's prev twice, one chain start per slot. Then
        # each slot's links run through all its entries in order, which is what inserts produce.
        refs = np.bincount(prev, minlength=m + 1)
        used = np.count_nonzero(np.bincount(slot, minlength=f.slot_num))
        if refs[1:].max(initial=0) <= 1 and refs[0] == used:
            return -1
    # Slow path, exact: each entry's prev must be the previous entry of its slot.
    order = np.argsort(slot, kind="stable")
    s_sorted, i_sorted = slot[order], idx[order]
    exp_sorted = np.zeros_like(i_sorted)
    if m > 1:
        exp_sorted[1:] = np.where(s_sorted[1:] == s_sorted[:-1], i_sorted[:-1], 0)
    expected = np.empty_like(exp_sorted)
    expected[order] = exp_sorted
    bad |= prev != expected
    return int(np.argmax(bad)) if bad.any() else -1


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
    changes: list[str] = []
    n = f.count
    h, phy, diff, prev = columns(f, n) if n > 1 else (np.zeros(0, np.int32),) * 4
    slot = np.where(h >= 0, h, 0) % f.slot_num
    bad_at = first_bad(f, h, phy, diff, prev, slot) if n > 1 else -1
    if bad_at >= 0:
        cut = bad_at + 1  # the entry number of the first bad entry
        if cut > 1:
            # The message of the last good entry may have lost keys past the cut: drop it whole.
            last_phy = phy[cut - 2]
            while cut > 1 and phy[cut - 2] == last_phy:
                cut -= 1
        changes.append(f"indexCount {n} -> {cut} (entry {bad_at + 1} is inconsistent)")
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
    # The slot table must point at the newest entry of each slot (one no entry names as its prev).
    expected_slots = np.zeros(f.slot_num, dtype=np.int32)
    if n > 1:
        refs = np.bincount(prev[: n - 1], minlength=n)
        heads = np.flatnonzero(refs[1:n] == 0)  # positions of the newest entry of each slot
        expected_slots[slot[heads]] = heads + 1
    slots_view = np.frombuffer(f.mm, dtype=">i4", count=f.slot_num, offset=HEADER.size)
    if not np.array_equal(slots_view, expected_slots):
        slots_view[:] = expected_slots
        changes.append("rebuilt the hash-slot table")
    del slots_view
    slot_count = int(np.count_nonzero(expected_slots))
    if slot_count != f.slot_count:
        changes.append(f"hashSlotCount {f.slot_count} -> {slot_count}")
        f.slot_count = slot_count
    if n > 1:
        if f.begin_phy != int(phy[0]):
            changes.append(f"beginPhyOffset {f.begin_phy} -> {int(phy[0])}")
            f.begin_phy = int(phy[0])
        if f.end_phy != int(phy[n - 2]):
            changes.append(f"endPhyOffset {f.end_phy} -> {int(phy[n - 2])}")
            f._set_end_from_entries()
    elif f.begin_phy or f.end_phy or f.begin_ts or f.end_ts:
        changes.append("cleared the begin/end of an empty file")
        f._set_end_from_entries()
    return changes
