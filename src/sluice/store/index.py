"""The key index: RocketMQ 4.x IndexFile / IndexService, byte for byte.

One index file, all big-endian (store/src/main/java/org/apache/rocketmq/store/index/IndexFile.java,
IndexHeader.java)::

    header   40 bytes   beginTimestamp q | endTimestamp q | beginPhyOffset q | endPhyOffset q
                        | hashSlotCount i | indexCount i        (indexCount starts at 1)
    slots    hashSlotNum x 4     index number of the newest entry of the slot, 0 = empty
    entries  indexNum x 20       keyHash i | phyOffset q | timeDiff i (s since beginTimestamp) | prevIndex i

Entry 0 is never used. Entries that share a slot are chained newest to oldest
through prevIndex. Files are named yyyyMMddHHmmssSSS (local time) and a new one
starts when the current one cannot take a message's keys.

Sluice differences that keep the index exact and repairable (the format is unchanged):

* The header is written once per message, after its entries and slots, so a
  crash mid-message leaves the header at a message boundary; load() drops the
  entries past it and rebuilds the slot table.
* A message's keys never straddle two files (the file rolls early instead), so
  "the highest indexed offset" means "that message is fully indexed" and
  build_index can skip messages at or below it when dispatch replays.
* A new file's header starts at zero (RocketMQ copies the previous end into
  it), so the first entry's timeDiff is 0, as IndexFile.putKey writes it while
  the header's beginTimestamp is 0.
"""
from __future__ import annotations

import logging
import mmap
import os
import struct
import threading
import time
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from sluice.errors import InvalidParameterError, StoreError
from sluice.speedups import C
from sluice.store.keyhash import key_hash, key_hashes
from sluice.store.index_repair import ENTRY, HEADER, repair_tail, repair_whole
from sluice.store.mapped import allocate, data_end

__all__ = ["IndexService", "IndexFile", "key_hash", "index_keys"]

log = logging.getLogger(__name__)

SLOT = struct.Struct(">i")
_I64 = struct.Struct("=q")  # one native int64 of speedups.index_entries' columns
assert HEADER.size == 40 and SLOT.size == 4 and ENTRY.size == 20

INT_MAX = 0x7FFFFFFF
ENTRY_DTYPE = np.dtype([("hash", ">i4"), ("phy", ">i8"), ("diff", ">i4"), ("prev", ">i4")])
assert ENTRY_DTYPE.itemsize == ENTRY.size
#: entries written per header update: a crash leaves at most this many past indexCount (repair zeroes them)
MAX_CHUNK = 16_384
#: bytes of entries allocated at a time ahead of the writer (52,428 entries)
ENTRY_ALLOC_CHUNK = 1024 * 1024


def index_keys(uniq_key: str | None, keys: Iterable[str]) -> list[str]:
    """The keys a message is indexed under (before the ``topic#`` prefix): UNIQ_KEY, then each non-empty key."""
    out = [uniq_key] if uniq_key else []
    out.extend(k for k in keys if k)
    return out


def _never_written(path: Path, slot_num: int, index_num: int) -> bool:
    """An index file a crash cut off during its creation: empty, or shorter than the configured size with a
    header that was never written (creation writes it last; a file of another configuration has one)."""
    size = path.stat().st_size
    if size == 0:
        return True
    if size >= HEADER.size + slot_num * SLOT.size + index_num * ENTRY.size:
        return False
    with open(path, "rb") as fh:
        return not any(fh.read(HEADER.size))


def _file_name(ms: int) -> str:
    return time.strftime("%Y%m%d%H%M%S", time.localtime(ms // 1000)) + f"{ms % 1000:03d}"


def _name_ms(name: str) -> int:
    try:
        return int(time.mktime(time.strptime(name[:14], "%Y%m%d%H%M%S"))) * 1000 + int(name[14:])
    except (ValueError, OverflowError):
        return 0


class IndexFile:
    """One mapped index file. Not thread-safe on its own: IndexService serialises access."""

    __slots__ = ("path", "slot_num", "index_num", "size", "mm", "_fd", "_entries_at",
                 "begin_ts", "end_ts", "begin_phy", "end_phy", "slot_count", "count", "alloc_end")

    def __init__(self, path: Path, slot_num: int, index_num: int, *, create: bool = False) -> None:
        self.path = path
        self.slot_num = slot_num
        self.index_num = index_num
        self._entries_at = HEADER.size + slot_num * SLOT.size
        self.size = self._entries_at + index_num * ENTRY.size
        flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0)
        fd = os.open(path, flags, 0o644)
        try:
            actual = os.fstat(fd).st_size
            if create:
                # Sized first, then the header and the slot table (written anywhere) are allocated for real,
                # entries ahead of the writer in chunks (mapped.py: no write through a mapping may meet
                # ENOSPC). In this order a crash leaves an empty file or a full-sized one without a header,
                # both of which load() drops; allocating first left a short file load() had to refuse.
                self.alloc_end = min(self.size, self._entries_at + ENTRY_ALLOC_CHUNK)
                os.ftruncate(fd, self.size)
                allocate(fd, 0, self.alloc_end, path)
            elif actual != self.size:
                raise StoreError(
                    f"{path} is {actual} bytes; with {slot_num} hash slots and {index_num} entries an index "
                    f"file is {self.size} bytes (was the index configured differently?)")
            else:
                hole, end = data_end(fd, actual)
                end = max(end, self._entries_at)
                if hole < end:  # holes left by older versions (sparse slot tables) are allocated now
                    allocate(fd, hole, end - hole, path)
                self.alloc_end = end
            self.mm = mmap.mmap(fd, self.size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            os.close(fd)
            if create:
                path.unlink(missing_ok=True)
            raise
        self._fd = fd
        if create:
            self.begin_ts = self.end_ts = self.begin_phy = self.end_phy = self.slot_count = 0
            self.count = 1
            self._write_header()
        else:
            (self.begin_ts, self.end_ts, self.begin_phy, self.end_phy,
             self.slot_count, self.count) = HEADER.unpack_from(self.mm, 0)

    # -- writing ---------------------------------------------------------------------------------------

    def _write_header(self) -> None:
        HEADER.pack_into(self.mm, 0, self.begin_ts, self.end_ts, self.begin_phy, self.end_phy,
                         self.slot_count, self.count)

    @property
    def room(self) -> int:
        return self.index_num - self.count

    def _allocate_entries(self, n: int) -> None:
        """Allocate room for ``n`` more entries before they are written through the mapping."""
        end = self._entries_at + (self.count + n) * ENTRY.size
        if end > self.alloc_end:
            stop = min(self.size, max(end, self.alloc_end + ENTRY_ALLOC_CHUNK))
            allocate(self._fd, self.alloc_end, stop - self.alloc_end, self.path)
            self.alloc_end = stop

    @property
    def empty(self) -> bool:
        return self.count <= 1

    def put(self, hashes: list[int], phy: int, ts: int) -> None:
        """Append one message's entries (the caller checked ``room``), then the header.

        One entry at a time with struct: for a few entries this costs less than put_many's numpy calls,
        which under thread contention also pay for giving up and retaking the GIL."""
        self._allocate_entries(len(hashes))
        mm = self.mm
        slot_num, count, entries_at = self.slot_num, self.count, self._entries_at
        if count <= 1:
            self.begin_phy, self.begin_ts = phy, ts
        diff = (ts - self.begin_ts) // 1000
        diff = 0 if diff < 0 else INT_MAX if diff > INT_MAX else diff
        unpack_slot, pack_slot, pack_entry = SLOT.unpack_from, SLOT.pack_into, ENTRY.pack_into
        for h in hashes:
            slot_at = HEADER.size + (h % slot_num) * 4
            prev = unpack_slot(mm, slot_at)[0]
            if prev <= 0 or prev >= count:
                prev = 0
                self.slot_count += 1
            pack_entry(mm, entries_at + count * 20, h, phy, diff, prev)
            pack_slot(mm, slot_at, count)
            count += 1
        self.count = count
        self.end_phy, self.end_ts = phy, ts
        self._write_header()

    def put_raw(self, hashes: bytes, phys: bytes, ts: bytes) -> None:
        """put_many (C only) with the columns as native int64 bytes, as speedups.index_entries makes them: a
        few entries (dispatch at a low rate) cost no numpy call."""
        n = len(hashes) // 8
        if n == 0:
            return
        self._allocate_entries(n)
        if self.count <= 1:
            self.begin_phy, self.begin_ts = _I64.unpack_from(phys)[0], _I64.unpack_from(ts)[0]
        self._put_c(hashes, phys, ts, _I64.unpack_from(phys, len(phys) - 8)[0], _I64.unpack_from(ts, len(ts) - 8)[0])

    def _put_c(self, hashes: object, phys: object, ts: object, last_phy: int, last_ts: int) -> None:
        """The entries (native int64 buffers, room allocated) written by speedups.index_put, then the header."""
        put = C.index_put  # type: ignore[union-attr]
        self.count, added = put(self.mm, self._entries_at, self.slot_num, self.count, self.begin_ts, hashes, phys, ts)
        self.slot_count += added
        self.end_phy, self.end_ts = last_phy, last_ts
        self._write_header()

    def put_many(self, hashes: np.ndarray, phys: np.ndarray, ts: np.ndarray) -> None:
        """Append entries (whole messages, in commit-log order, at most ``room``), then the header once.

        The result is byte for byte what putting them one at a time gives: an entry's prevIndex is the
        entry before it in the same slot, within this batch or (for the first) the slot's current head.
        Entries go first, then slots, then the header, so a crash leaves the header at the previous batch.
        """
        n = len(hashes)
        if n == 0:
            return
        self._allocate_entries(n)
        count, slot_num = self.count, self.slot_num
        if count <= 1:
            self.begin_phy, self.begin_ts = int(phys[0]), int(ts[0])
        if C is not None:
            self._put_c(np.ascontiguousarray(hashes, dtype=np.int64), np.ascontiguousarray(phys, dtype=np.int64),
                        np.ascontiguousarray(ts, dtype=np.int64), int(phys[-1]), int(ts[-1]))
            return
        idx = np.arange(count, count + n, dtype=np.int64)
        slot = hashes % slot_num
        order = np.argsort(slot, kind="stable")
        s_sorted = slot[order]
        i_sorted = idx[order]
        first = np.empty(n, dtype=bool)
        first[0] = True
        np.not_equal(s_sorted[1:], s_sorted[:-1], out=first[1:])
        last = np.empty(n, dtype=bool)
        last[-1] = True
        last[:-1] = first[1:]
        slots_view = np.frombuffer(self.mm, dtype=">i4", count=slot_num, offset=HEADER.size)
        try:
            head = slots_view[s_sorted[first]].astype(np.int64)
            head[(head <= 0) | (head >= count)] = 0  # garbage or empty: the chain starts here
            prev_sorted = np.empty(n, dtype=np.int64)
            prev_sorted[1:] = i_sorted[:-1]
            prev_sorted[first] = head
            prev = np.empty(n, dtype=np.int64)
            prev[order] = prev_sorted
            entries = np.empty(n, dtype=ENTRY_DTYPE)
            entries["hash"] = hashes
            entries["phy"] = phys
            entries["diff"] = np.clip((ts - self.begin_ts) // 1000, 0, INT_MAX)
            entries["prev"] = prev
            at = self._entries_at + count * ENTRY.size
            self.mm[at:at + n * ENTRY.size] = entries.tobytes()
            slots_view[s_sorted[last]] = i_sorted[last]
        finally:
            del slots_view  # an exported view would keep the mapping from closing
        self.slot_count += int(np.count_nonzero(head == 0))
        self.count = count + n
        self.end_phy, self.end_ts = int(phys[-1]), int(ts[-1])
        self._write_header()

    def rollback(self, offset: int) -> int:
        """Undo, newest first, every entry whose phyOffset >= offset; returns how many were undone."""
        mm, entries_at, undone = self.mm, self._entries_at, 0
        blank = bytes(ENTRY.size)
        while self.count > 1:
            at = entries_at + (self.count - 1) * 20
            h, phy, _diff, prev = ENTRY.unpack_from(mm, at)
            if phy < offset:
                break
            SLOT.pack_into(mm, HEADER.size + (h % self.slot_num) * 4, prev)
            if prev == 0:
                self.slot_count -= 1
            mm[at:at + 20] = blank
            self.count -= 1
            undone += 1
        if undone:
            self._set_end_from_entries()
            self._write_header()
        return undone

    def _set_end_from_entries(self) -> None:
        if self.count <= 1:
            self.begin_ts = self.end_ts = self.begin_phy = self.end_phy = self.slot_count = 0
            return
        _h, phy, diff, _p = ENTRY.unpack_from(self.mm, self._entries_at + (self.count - 1) * 20)
        # The exact store time of that entry is gone; this is the time queries see it at.
        self.end_phy, self.end_ts = phy, self.begin_ts + diff * 1000

    # -- reading ---------------------------------------------------------------------------------------

    def select(self, out: list[int], h: int, max_num: int, begin_ts: int, end_ts: int) -> None:
        """Walk the slot's chain (IndexFile.selectPhyOffset), appending matching offsets newest first."""
        mm, entries_at, base = self.mm, self._entries_at, self.begin_ts
        idx = SLOT.unpack_from(mm, HEADER.size + (h % self.slot_num) * 4)[0]
        if idx <= 0 or idx >= self.count:
            return
        unpack = ENTRY.unpack_from
        while len(out) < max_num:
            kh, phy, diff, prev = unpack(mm, entries_at + idx * 20)
            if diff < 0:
                break
            t = base + diff * 1000
            if kh == h and begin_ts <= t <= end_ts:
                out.append(phy)
            # prev < idx always holds for a sound chain; requiring it makes any loop impossible.
            if prev <= 0 or prev >= idx or t < begin_ts:
                break
            idx = prev

    # -- validation ------------------------------------------------------------------------------------

    def header_plausible(self) -> bool:
        """Cheap checks for files that were complete before the last run (no full scan)."""
        if not 1 <= self.count <= self.index_num or self.slot_count < 0:
            return False
        if self.count == 1:
            return True
        _h, phy, _d, _p = ENTRY.unpack_from(self.mm, self._entries_at + (self.count - 1) * 20)
        first = ENTRY.unpack_from(self.mm, self._entries_at + 20)[1]
        return phy == self.end_phy and first == self.begin_phy and self.begin_phy <= self.end_phy

    def repair(self, trusted_phy: int = -1) -> bool:
        """Validate the entries against each other and the header; fix what a crash can leave behind.

        Returns False when the header itself is unusable (the file must be dropped and rebuilt).
        Logs what it changed. O(entries) numpy work in windows (store/index_repair.py first_bad): memory is
        the slot table's size plus a window, whatever the number of entries.

        ``trusted_phy``: entries up to this commit-log offset were durable at the last checkpoint (the
        checkpoint's index offset). Then only the entries after them are checked, and the slot table is
        fixed by following chains (what a kill can leave: entries and slots past indexCount), in memory
        that does not grow with the file; anything else found there falls back to the whole check.
        """
        if not 1 <= self.count <= self.index_num:
            log.warning("%s: header indexCount %d is outside 1..%d; the file will be rebuilt",
                        self.path, self.count, self.index_num)
            return False
        changes = self._repair_tail(trusted_phy) if trusted_phy >= 0 and self.count > 1 else None
        if changes is None:
            changes = self._repair()
        for c in changes:
            log.warning("%s: repaired after an unclean stop: %s", self.path, c)
        if changes:
            self._write_header()
        return True

    def _repair_tail(self, trusted_phy: int) -> list[str] | None:
        return repair_tail(self, trusted_phy)  # store/index_repair.py

    def _repair(self) -> list[str]:
        return repair_whole(self)

    # -- lifecycle -------------------------------------------------------------------------------------

    def flush(self) -> None:
        os.fdatasync(self._fd)  # unlike mmap.flush this releases the GIL

    def close(self) -> None:
        if self._fd < 0:
            return
        self.mm.close()
        os.close(self._fd)
        self._fd = -1

    def delete(self) -> None:
        self.close()
        self.path.unlink(missing_ok=True)


class IndexService:
    """All index files of a store, oldest first. build_index runs on the dispatch thread; query_offsets
    may run on any thread: one lock serialises them (each call is short)."""

    def __init__(self, directory: Path, *, max_hash_slots: int = 5_000_000, max_index_num: int = 20_000_000) -> None:
        if max_hash_slots < 1 or max_index_num < 2:
            raise InvalidParameterError(
                f"index needs at least 1 hash slot and 2 entries (got {max_hash_slots}, {max_index_num})")
        self.directory = Path(directory)
        self.slot_num = max_hash_slots
        self.index_num = max_index_num
        self.files: list[IndexFile] = []
        self._lock = threading.RLock()
        self._last_name_ms = 0

    def load(self, trusted_offset: int = -1) -> None:
        """Open the existing files, oldest first; validate them and repair the damage of a crash.

        ``trusted_offset``: the checkpoint's index offset (entries up to it were durable): the newest
        file's repair then checks only what came after (IndexFile.repair)."""
        with self._lock:
            self._close_files()
            self.directory.mkdir(parents=True, exist_ok=True)
            names = sorted(p for p in self.directory.iterdir()
                           if p.is_file() and len(p.name) == 17 and p.name.isdigit())
            files: list[IndexFile] = []
            try:
                for p in names:
                    if _never_written(p, self.slot_num, self.index_num):
                        # A crash while the file was being created (empty, or cut short by an older version
                        # that allocated before sizing): it never held an entry.
                        log.warning("%s: index file left unfinished by a crash removed", p)
                        p.unlink()
                        continue
                    files.append(IndexFile(p, self.slot_num, self.index_num))
            except BaseException:
                for f in files:
                    f.close()
                raise
            # A wall clock that went backwards can misorder names; the data order is by offset.
            files.sort(key=lambda f: (f.begin_phy if not f.empty else 1 << 63, f.path.name))
            kept: list[IndexFile] = []
            for i, f in enumerate(files):
                newest = i == len(files) - 1
                ok = (f.repair(trusted_offset) if newest or not f.header_plausible() else True)
                if not ok or f.empty:
                    if not ok:
                        log.warning("%s: dropped; its messages are re-indexed when dispatch replays them", f.path)
                    f.delete()
                    continue
                if kept and f.begin_phy < kept[-1].end_phy:
                    log.warning("%s overlaps %s; dropped", f.path, kept[-1].path)
                    f.delete()
                    continue
                kept.append(f)
            self.files = kept
            for f in kept:
                self._last_name_ms = max(self._last_name_ms, _name_ms(f.path.name))

    # -- writing ---------------------------------------------------------------------------------------

    def build_index(self, topic: str, uniq_key: str | None, keys: list[str], commitlog_offset: int,
                    store_timestamp: int) -> None:
        """Index one message under ``topic#UNIQ_KEY`` and ``topic#k`` for each non-empty key.

        Messages at or below the highest indexed offset are skipped, so a dispatch replay after a crash
        does not index them twice.
        """
        names = index_keys(uniq_key, keys)
        if not names:
            return
        hashes = [key_hash(topic, k) for k in names]
        with self._lock:
            files = self.files
            if files and commitlog_offset <= files[-1].end_phy and not files[-1].empty:
                return
            f = files[-1] if files else None
            while hashes:
                if f is None or (f.room < len(hashes) and not f.empty) or f.room == 0:
                    f = self._roll(f)
                part, hashes = hashes[: f.room], hashes[f.room:]
                f.put(part, commitlog_offset, store_timestamp)

    def build_index_batch(self, prefixes: np.ndarray, names: list[str], phys: np.ndarray, ts: np.ndarray) -> None:
        """Index many messages at once: key i is ``names[i]`` (non-empty) of the message at commit-log offset
        ``phys[i]`` stored at ``ts[i]``, under the topic whose keyhash.prefix_hash is ``prefixes[i]``.

        A message's keys are adjacent and messages come in commit-log order. As build_index, messages at or
        below the highest indexed offset are skipped, and a message's keys never straddle two files.
        """
        if names:
            self.build_index_hashes(key_hashes(prefixes, names), phys, ts)

    def build_index_raw(self, hashes: bytes, phys: bytes, ts: bytes) -> None:
        """build_index_hashes with the columns as native int64 bytes (speedups.index_entries' hashes and offsets):
        written straight by C when they all fit the current file past its highest indexed offset (dispatch
        at a low rate: a few entries, no numpy call); otherwise as build_index_hashes."""
        n = len(hashes) // 8
        if n == 0:
            return
        if C is not None:
            with self._lock:
                files = self.files
                f = files[-1] if files else None
                if f is not None and n <= min(f.room, MAX_CHUNK) and (
                        f.empty or _I64.unpack_from(phys)[0] > f.end_phy):
                    f.put_raw(hashes, phys, ts)
                    return
        self.build_index_hashes(np.frombuffer(hashes, dtype=np.int64), np.frombuffer(phys, dtype=np.int64),
                                np.frombuffer(ts, dtype=np.int64))

    def build_index_hashes(self, hashes: np.ndarray, phys: np.ndarray, ts: np.ndarray) -> None:
        """build_index_batch with the keys already hashed (keyhash.key_hashes), e.g. by dispatch."""
        if len(hashes) == 0:
            return
        with self._lock:
            files = self.files
            f = files[-1] if files else None
            if f is not None and not f.empty and phys[0] <= f.end_phy:
                keep = phys > f.end_phy
                hashes, phys, ts = hashes[keep], phys[keep], ts[keep]
            n = len(hashes)
            if n == 0:
                return
            if f is not None and n <= min(f.room, MAX_CHUNK):  # the usual case: it all fits
                f.put_many(hashes, phys, ts)
                return
            # Message boundaries (and n): a batch is only ever cut at one of them.
            bounds = np.concatenate(([0], np.flatnonzero(phys[1:] != phys[:-1]) + 1, [n]))
            i = 0
            while i < n:
                if f is None or f.room == 0:
                    f = self._roll(f)
                limit = i + min(f.room, MAX_CHUNK)
                cut = n if limit >= n else int(bounds[np.searchsorted(bounds, limit, side="right") - 1])
                if cut <= i:  # the message at i is larger than what is left
                    msg_end = int(bounds[np.searchsorted(bounds, i, side="right")])
                    if msg_end - i <= f.room:
                        cut = msg_end  # more keys than a chunk: still written whole
                    elif not f.empty:
                        f = self._roll(f)
                        continue
                    else:
                        cut = i + f.room  # more keys than a whole file holds (tiny files only): split
                f.put_many(hashes[i:cut], phys[i:cut], ts[i:cut])
                i = cut

    def _roll(self, f: IndexFile | None) -> IndexFile:
        if f is not None:
            f.flush()
        return self._new_file()

    def _new_file(self) -> IndexFile:
        # Names must be unique and increasing even when files roll within one millisecond.
        ms = max(int(time.time() * 1000), self._last_name_ms + 1)
        while (self.directory / _file_name(ms)).exists():
            ms += 1
        self._last_name_ms = ms
        self.directory.mkdir(parents=True, exist_ok=True)
        f = IndexFile(self.directory / _file_name(ms), self.slot_num, self.index_num, create=True)
        self.files = self.files + [f]
        return f

    def truncate(self, commitlog_offset: int) -> None:
        """Recovery: forget every entry whose phyOffset >= commitlog_offset."""
        with self._lock:
            files = list(self.files)
            while files and (files[-1].empty or files[-1].begin_phy >= commitlog_offset):
                files.pop().delete()
            if files:
                files[-1].rollback(commitlog_offset)
            self.files = files

    def delete_below(self, commitlog_min_offset: int) -> None:
        """Retention: delete whole files whose endPhyOffset < commitlog_min_offset, never the newest."""
        with self._lock:
            files = list(self.files)
            gone: list[IndexFile] = []
            while len(files) > 1 and files[0].end_phy < commitlog_min_offset:
                gone.append(files.pop(0))
            self.files = files
            for f in gone:
                f.delete()

    # -- reading ---------------------------------------------------------------------------------------

    def query_offsets(self, topic: str, key: str, max_num: int, begin_ts: int, end_ts: int) -> list[int]:
        """Candidate commit-log offsets of messages indexed under ``topic#key``, newest first.

        Only the hash is compared: the caller reads each candidate and drops hash collisions.
        """
        if max_num <= 0 or begin_ts > end_ts:
            return []
        h = key_hash(topic, key)
        out: list[int] = []
        with self._lock:
            for f in reversed(self.files):
                if len(out) >= max_num:
                    break
                if f.empty or f.begin_ts > end_ts:
                    continue  # every entry's time is at or after its file's begin time
                f.select(out, h, max_num, begin_ts, end_ts)
        return out

    def release_pages(self) -> None:
        """Drop every index file's mapped pages from this process (MADV_DONTNEED: the data stays in the
        files and page cache): a reader walking many chains, as ``store check`` does for every record,
        keeps the resident set bounded instead of growing to the size of the files."""
        with self._lock:
            for f in self.files:
                if f._fd >= 0:
                    f.mm.madvise(mmap.MADV_DONTNEED, 0, len(f.mm))

    def max_indexed_offset(self) -> int:
        with self._lock:
            for f in reversed(self.files):
                if not f.empty:
                    return f.end_phy
            return -1

    # -- lifecycle -------------------------------------------------------------------------------------

    def flush(self) -> None:
        # fsync a duplicate descriptor outside the lock: dispatch keeps indexing meanwhile, and a file
        # closed by retention or truncation in the meantime stays valid to sync through the duplicate.
        with self._lock:
            if not self.files or self.files[-1]._fd < 0:
                return
            fd = os.dup(self.files[-1]._fd)
        try:
            os.fdatasync(fd)
        finally:
            os.close(fd)

    def _close_files(self) -> None:
        for f in self.files:
            f.close()
        self.files = []

    def close(self) -> None:
        with self._lock:
            if self.files:
                self.files[-1].flush()
            self._close_files()
