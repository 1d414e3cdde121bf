"""ConsumeQueue: unit writes and numpy reads, files, padding, reload, truncation, retention."""
from __future__ import annotations

from pathlib import Path

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.store.consumequeue import CQ_DTYPE, PAD_SIZE, ConsumeQueue, ConsumeQueueTable

UPF = 8  # units per file


def units(start_phys: int, n: int, size: int = 100, tag: int = 0) -> np.ndarray:
    a = np.zeros(n, dtype=CQ_DTYPE)
    a["offset"] = start_phys + np.arange(n) * size
    a["size"] = size
    a["tag"] = tag
    return a


def cq(tmp_path: Path) -> ConsumeQueue:
    q = ConsumeQueue("T", 0, tmp_path / "T" / "0", UPF)
    q.load()
    return q


def test_put_get_across_files_and_reload(tmp_path: Path) -> None:
    q = cq(tmp_path)
    q.put(0, units(0, 5))
    q.put(5, units(500, 15, tag=7))
    assert q.max_offset == 20 and len(q.queue.files) == 3
    got = q.get_units(3, 10)
    assert list(got["offset"]) == [300 + 100 * i for i in range(10)]
    assert list(got["tag"]) == [0, 0] + [7] * 8
    assert q.unit(19) == (1900, 100, 7) and q.unit(20) is None
    q.close()
    q2 = cq(tmp_path)
    assert (q2.min_offset, q2.max_offset) == (0, 20)
    assert q2.last_unit_end() == 2000
    q2.close()


def test_queue_starting_mid_file_is_padded(tmp_path: Path) -> None:
    q = cq(tmp_path)
    q.put(11, units(0, 2))
    assert (q.min_offset, q.max_offset) == (11, 13)
    pad = q.get_units(8, 3)
    assert list(pad["size"]) == [PAD_SIZE] * 3
    q.close()
    q2 = cq(tmp_path)
    assert (q2.min_offset, q2.max_offset) == (11, 13)
    q2.close()


def test_truncate_after_commitlog(tmp_path: Path) -> None:
    q = cq(tmp_path)
    q.put(0, units(0, 20))
    assert q.truncate_after_commitlog(1250) == 8  # units 12.. end past 1250
    assert q.max_offset == 12 and len(q.queue.files) == 2 and q.unit(12) is None
    q.put(12, units(1200, 1, size=50))
    assert q.unit(12) == (1200, 50, 0)
    q.close()


def test_delete_below_moves_min_offset(tmp_path: Path) -> None:
    q = cq(tmp_path)
    q.put(0, units(0, 20))
    assert q.delete_below(1000) == 1  # file 0 (units 0..7) all below; file 1 holds unit 10 = 1000
    assert q.min_offset == 10 and len(q.queue.files) == 2
    assert q.get_units(0, 4) is None
    assert q.delete_below(10**9) == 1  # never the last file
    assert q.min_offset == 20
    q.close()


def test_table_loads_every_queue(tmp_path: Path) -> None:
    t = ConsumeQueueTable(tmp_path, UPF)
    t.get_or_create("A", 0).put(0, units(0, 3))
    t.get_or_create("B", 3).put(0, units(0, 1))
    t.flush()
    t.close()
    t2 = ConsumeQueueTable(tmp_path, UPF)
    t2.load()
    assert sorted((q.topic, q.queue_id, q.max_offset) for q in t2.all()) == [("A", 0, 3), ("B", 3, 1)]
    t2.close()


@settings(max_examples=40, deadline=None)
@given(chunks=st.lists(st.integers(1, 20), min_size=1, max_size=10), start=st.integers(0, 30))
def test_units_round_trip(tmp_path_factory, chunks, start) -> None:
    q = cq(tmp_path_factory.mktemp("cq"))
    expect = []
    off = start
    for n in chunks:
        u = units(len(expect) * 100, n, tag=n)
        q.put(off, u)
        expect += [(int(a), int(b), int(c)) for a, b, c in u.tolist()]
        off += n
    got = q.get_units(start, off - start)
    assert [(int(a), int(b), int(c)) for a, b, c in got.tolist()] == expect
    assert (q.min_offset, q.max_offset) == (start, off)
    q.close()


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, (1 << 63) - 1), st.integers(-(1 << 31), (1 << 31) - 1),
                          st.integers(-(1 << 63), (1 << 63) - 1)), max_size=40))
def test_few_units_packed_equal_the_column_filled_array(rows: list[tuple[int, int, int]]) -> None:
    """dispatch_columns.unit_array packs a few units with struct and fills columns for more; both give the
    very units (bytes and fields) of the column-filled array."""
    from sluice.store import dispatch_columns
    phys, sizes, tags = ([r[i] for r in rows] for i in range(3))
    expected = np.empty(len(rows), dtype=CQ_DTYPE)
    expected["offset"], expected["size"], expected["tag"] = phys, sizes, tags
    got = dispatch_columns.unit_array(phys, sizes, tags)
    assert got.dtype == CQ_DTYPE and got.tobytes() == expected.tobytes()
    assert (len(rows) <= dispatch_columns.FEW_UNITS) == (not got.flags.writeable)  # which way it took
