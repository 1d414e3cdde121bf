"""The index's repair after a checkpoint (IndexFile.repair(trusted_phy)): it checks only the entries after
the trusted ones, in bounded memory, and leaves the file exactly as the whole check does."""
from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.store.index import HEADER, IndexFile, IndexService

T0 = 1_700_000_000_000
NAMES = ["begin_ts", "end_ts", "begin_phy", "end_phy", "slot_count", "count"]


def _build(d: Path, keys_per_msg: list[int], slots: int, num: int) -> tuple[IndexService, list[int]]:
    s = IndexService(d, max_hash_slots=slots, max_index_num=num)
    s.load()
    counts = []  # indexCount after each message
    for i, k in enumerate(keys_per_msg):
        s.build_index("T", f"u{i}", [f"k{i}-{j}" for j in range(k)], 100 + i * 10, T0 + i * 1000)
        counts.append(s.files[-1].count)
    return s, counts


def _kill_after(path: Path, count: int, phy: int, ts: int) -> None:
    """The header as a kill between a batch's slots and its header leaves it: an older indexCount."""
    raw = bytearray(path.read_bytes())
    values = dict(zip(NAMES, HEADER.unpack_from(raw, 0)))
    values.update(count=count, end_phy=phy, end_ts=ts)
    HEADER.pack_into(raw, 0, *(values[n] for n in NAMES))
    path.write_bytes(bytes(raw))


@settings(max_examples=60)
@given(keys=st.lists(st.integers(0, 4), min_size=2, max_size=30), slots=st.integers(1, 9),
       cut=st.integers(0, 29), trusted=st.integers(0, 29))
def test_tail_repair_equals_the_whole_repair(keys: list[int], slots: int, cut: int, trusted: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        s, counts = _build(d / "a", keys, slots, 400)
        path = s.files[-1].path
        s.close()
        cut = min(cut, len(keys) - 1)
        if counts[cut] > 1:  # the header of message ``cut`` was the last one written
            _kill_after(path, counts[cut], 100 + cut * 10, T0 + cut * 1000)
        (d / "b").mkdir()
        shutil.copy(path, d / "b" / path.name)
        whole = IndexFile(path, slots, 400)
        tail = IndexFile(d / "b" / path.name, slots, 400)
        full_checks: list[Path] = []
        original = IndexFile._repair

        def counted(self: IndexFile) -> list[str]:
            full_checks.append(self.path)
            return original(self)

        IndexFile._repair = counted  # type: ignore[method-assign]
        try:
            assert whole.repair()
            assert tail.repair(100 + min(trusted, cut) * 10)
            assert full_checks == [whole.path]  # the tail repair handled a kill's damage on its own
            assert bytes(whole.mm) == bytes(tail.mm)
            assert whole.count == tail.count and whole.slot_count == tail.slot_count
        finally:
            IndexFile._repair = original  # type: ignore[method-assign]
            whole.close()
            tail.close()


def test_tail_repair_reads_only_the_entries_after_the_trusted_ones(tmp_path: Path, monkeypatch) -> None:
    s, counts = _build(tmp_path / "a", [3] * 2000, 1024, 20_000)
    path = s.files[-1].path
    s.close()
    _kill_after(path, counts[1900], 100 + 1900 * 10, T0 + 1900 * 1000)
    seen: list[int] = []
    real = np.frombuffer

    def spy(buf, dtype=float, count=-1, offset=0):
        if np.dtype(dtype) == np.dtype(">i4") and offset > HEADER.size:  # entry columns, not the slot table
            seen.append(count // 5)
        return real(buf, dtype=dtype, count=count, offset=offset)

    monkeypatch.setattr(np, "frombuffer", spy)
    shutil.copy(path, tmp_path / "copy")
    f = IndexFile(path, 1024, 20_000)
    try:
        assert f.repair(100 + 1890 * 10)
        assert f.count == counts[1900]
    finally:
        f.close()
    assert seen and max(seen) <= 10 * 4  # the ten messages after the trusted one, not 7,600 entries
    seen.clear()
    g = IndexFile(tmp_path / "copy", 1024, 20_000)
    try:
        assert g.repair()  # the whole check reads them all
    finally:
        g.close()
    assert max(seen) >= 7_600
