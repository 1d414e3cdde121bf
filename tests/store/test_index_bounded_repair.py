"""The index's whole check (IndexFile.repair without a checkpoint, store/index_repair.py repair_whole) reads
the entries in windows: it leaves every file exactly as the check that read them all at once did, and its
memory does not grow with the number of entries."""
from __future__ import annotations

import shutil
import tempfile
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from store_testlib import run_alone

from sluice.store import index_repair
from sluice.store.index import ENTRY, HEADER, IndexFile, IndexService

T0 = 1_700_000_000_000


# -- the check as it was before windows (commit d39ff85), kept as the reference --------------------------

def _ref_columns(f: IndexFile, n: int) -> tuple[np.ndarray, ...]:
    raw = np.frombuffer(f.mm, dtype=">i4", count=(n - 1) * 5, offset=f._entries_at + ENTRY.size)
    cols = raw.reshape(-1, 5).astype(np.int32)
    phy = (cols[:, 1].astype(np.int64) << 32) | cols[:, 2].view(np.uint32).astype(np.int64)
    return cols[:, 0], phy, cols[:, 3], cols[:, 4]


def _ref_first_bad(f: IndexFile, h, phy, diff, prev, slot) -> int:
    m = len(h)
    idx = np.arange(1, m + 1, dtype=np.int32)
    bad = (h < 0) | (phy < 0) | (diff < 0) | (prev < 0) | (prev >= idx)
    bad[1:] |= phy[1:] < phy[:-1]
    prev_slot = slot[np.clip(prev - 1, 0, max(m - 1, 0))]
    bad |= (prev > 0) & (prev_slot != slot)
    if not bad.any():
        refs = np.bincount(prev, minlength=m + 1)
        used = np.count_nonzero(np.bincount(slot, minlength=f.slot_num))
        if refs[1:].max(initial=0) <= 1 and refs[0] == used:
            return -1
    order = np.argsort(slot, kind="stable")
    s_sorted, i_sorted = slot[order], idx[order]
    exp_sorted = np.zeros_like(i_sorted)
    if m > 1:
        exp_sorted[1:] = np.where(s_sorted[1:] == s_sorted[:-1], i_sorted[:-1], 0)
    expected = np.empty_like(exp_sorted)
    expected[order] = exp_sorted
    bad |= prev != expected
    return int(np.argmax(bad)) if bad.any() else -1


def _ref_repair_whole(f: IndexFile) -> list[str]:
    changes: list[str] = []
    n = f.count
    h, phy, diff, prev = _ref_columns(f, n) if n > 1 else (np.zeros(0, np.int32),) * 4
    slot = np.where(h >= 0, h, 0) % f.slot_num
    bad_at = _ref_first_bad(f, h, phy, diff, prev, slot) if n > 1 else -1
    if bad_at >= 0:
        cut = bad_at + 1
        if cut > 1:
            last_phy = phy[cut - 2]
            while cut > 1 and phy[cut - 2] == last_phy:
                cut -= 1
        changes.append(f"indexCount {n} -> {cut} (entry {bad_at + 1} is inconsistent)")
        n = f.count = cut
    at = f._entries_at + n * ENTRY.size
    look = max(0, min(index_repair._REPAIR_LOOKAHEAD, f.index_num - n, (f.alloc_end - at) // ENTRY.size))
    tail = np.frombuffer(f.mm, dtype=np.uint8, count=look * ENTRY.size, offset=at)
    written = np.flatnonzero(tail.reshape(-1, ENTRY.size).any(axis=1))
    del tail
    if len(written):
        stop = n + int(written[-1]) + 1
        f.mm[at:f._entries_at + stop * ENTRY.size] = bytes((stop - n) * ENTRY.size)
        changes.append(f"zeroed {stop - n} entries past indexCount")
    expected_slots = np.zeros(f.slot_num, dtype=np.int32)
    if n > 1:
        refs = np.bincount(prev[: n - 1], minlength=n)
        heads = np.flatnonzero(refs[1:n] == 0)
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


# -- windows give the same file and the same findings -----------------------------------------------------

def _build(d: Path, keys_per_msg: list[int], slots: int, num: int) -> Path:
    s = IndexService(d, max_hash_slots=slots, max_index_num=num)
    s.load()
    for i, k in enumerate(keys_per_msg):
        s.build_index("T", f"u{i}", [f"k{i}-{j}" for j in range(k)], 100 + i * 10, T0 + i * 1000)
    path = s.files[-1].path
    s.close()
    return path


_damage = st.lists(st.tuples(st.integers(0, 10_000), st.binary(min_size=1, max_size=6)), max_size=4)


@settings(max_examples=150, deadline=None)
@given(keys=st.lists(st.integers(0, 4), min_size=1, max_size=40), slots=st.integers(1, 9),
       damage=_damage, count=st.one_of(st.none(), st.integers(1, 120)), window=st.integers(1, 7))
def test_windowed_whole_check_equals_the_check_of_all_entries_at_once(
        keys: list[int], slots: int, damage: list[tuple[int, bytes]], count: int | None, window: int) -> None:
    num = 200
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        path = _build(d / "a", keys, slots, num)
        raw = bytearray(path.read_bytes())
        entries_at = HEADER.size + slots * 4
        for at, b in damage:  # bytes of entries, slots or header overwritten (a torn page, a bad disk)
            at = at % (entries_at + 130 * ENTRY.size)
            raw[at:at + len(b)] = b[: len(raw) - at]
        if count is not None:
            raw[36:40] = count.to_bytes(4, "big")
        path.write_bytes(bytes(raw))
        (d / "b").mkdir()
        shutil.copy(path, d / "b" / path.name)
        ref = IndexFile(path, slots, num)
        new = IndexFile(d / "b" / path.name, slots, num)
        saved = index_repair._WINDOW
        index_repair._WINDOW = window
        try:
            if not 1 <= ref.count <= num:
                assert not new.repair()
                return
            expected = _ref_repair_whole(ref)
            if expected:
                ref._write_header()
            assert new.repair() is True
            got = index_repair.repair_whole(new)  # idempotent: a second run finds nothing
            assert got == []
            assert bytes(new.mm) == bytes(ref.mm)
            assert (new.count, new.slot_count, new.begin_phy, new.end_phy) == \
                   (ref.count, ref.slot_count, ref.begin_phy, ref.end_phy)
        finally:
            index_repair._WINDOW = saved
            ref.close()
            new.close()


def test_windowed_whole_check_reports_what_the_reference_reports(tmp_path: Path, monkeypatch) -> None:
    path = _build(tmp_path / "a", [3] * 50, 7, 400)
    raw = bytearray(path.read_bytes())
    entries_at = HEADER.size + 7 * 4
    raw[entries_at + 101 * ENTRY.size + 4:entries_at + 101 * ENTRY.size + 12] = bytes(8)  # entry 101: phy 0
    path.write_bytes(bytes(raw))
    shutil.copy(path, tmp_path / "copy")
    ref = IndexFile(path, 7, 400)
    new = IndexFile(tmp_path / "copy", 7, 400)
    monkeypatch.setattr(index_repair, "_WINDOW", 16)
    try:
        expected = _ref_repair_whole(ref)
        got = index_repair.repair_whole(new)
        assert got == expected
            # four keys a message (UNIQ_KEY and three): entries 97..100 are the message before the bad one
        assert got[0] == "indexCount 201 -> 97 (entry 101 is inconsistent)"
        assert bytes(new.mm[:new._entries_at + 160 * ENTRY.size]) == bytes(ref.mm[:ref._entries_at + 160 * ENTRY.size])
    finally:
        ref.close()
        new.close()


# -- memory -----------------------------------------------------------------------------------------------

SLOTS = 100_000


def _big_file(d: Path, entries: int) -> Path:
    """One index file holding ``entries`` entries (three keys a message), written as dispatch writes them."""
    s = IndexService(d, max_hash_slots=SLOTS, max_index_num=entries + 2)
    s.load()
    rng = np.random.default_rng(entries)
    step = 3 * 16_000
    for a in range(0, entries, step):
        m = min(step, entries - a)
        hashes = rng.integers(0, 1 << 31, m, dtype=np.int64)
        phys = (np.arange(a, a + m, dtype=np.int64) // 3) * 100
        s.build_index_hashes(hashes, phys, T0 + phys)
    assert s.files[-1].count == entries + 1
    path = s.files[-1].path
    s.close()
    return path


def _repair_peak(path: Path, entries: int) -> tuple[int, IndexFile]:
    f = IndexFile(path, SLOTS, entries + 2)
    # Damage near the end: the whole check runs to it, cuts there, rebuilds the slot table.
    at = f._entries_at + (entries - 10) * ENTRY.size
    f.mm[at:at + 4] = (-5).to_bytes(4, "big", signed=True)
    tracemalloc.start()
    try:
        assert f.repair()  # no checkpoint: the whole check
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return peak, f


def _repair_peak_json(path: str, entries: str) -> list[int]:
    """:func:`_repair_peak` for run_alone: (peak, entries kept, end_phy)."""
    peak, f = _repair_peak(Path(path), int(entries))
    try:
        return [peak, f.count, f.end_phy]
    finally:
        f.close()


@pytest.mark.slow
def test_whole_check_memory_does_not_grow_with_the_entries(tmp_path: Path) -> None:
    small_n, big_n = 600_000, 6_000_000  # 12 MB and 120 MB of entries
    peaks = {}
    for n in (small_n, big_n):
        path = _big_file(tmp_path / str(n), n)
        # In a fresh interpreter: tracemalloc counts every thread, the suite's leftovers too (run_alone).
        peak, count, end_phy = run_alone("test_index_bounded_repair", "_repair_peak_json", str(path), str(n))
        assert count < n - 10 and count >= n - 13  # cut before the damaged entry's message
        assert end_phy == ((count - 2) // 3) * 100
        path.unlink()
        peaks[n] = peak
        print(f"{n} entries: whole check peak {peak / 2**20:.1f} MiB")
    # The check of all entries at once took ~50 bytes an entry (300 MB here); windows take the slot
    # table's heads and a window's columns, the same at both sizes.
    assert peaks[big_n] <= 64 * 2**20
    assert peaks[big_n] <= peaks[small_n] + 4 * 2**20
