"""ConsumeQueueExt: unit format, addresses, roll-over, batch reads, truncation and crash recovery."""
from __future__ import annotations

import struct
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import sluice.store.consumequeue_ext as CQE
from sluice.errors import InvalidParameterError, StoreError
from sluice.filter.tagcode import tag_code
from sluice.store.consumequeue_ext import (
    MAX_ADDR,
    ConsumeQueueExt,
    ExtUnit,
    decorate,
    ext_queue_dir,
    is_ext_address,
    is_ext_address_array,
    undecorate,
)

LONG_MIN, LONG_MAX = -(1 << 63), (1 << 63) - 1
MAX_REAL_OFFSET = MAX_ADDR - LONG_MIN


def ext(d: Path, file_size: int = 100, bitmap_bytes_max: int = 20) -> ConsumeQueueExt:
    e = ConsumeQueueExt(d, file_size=file_size, bitmap_bytes_max=bitmap_bytes_max)
    e.load()
    return e


# -- addresses ------------------------------------------------------------------------------------------

def test_address_constants_match_rocketmq() -> None:
    assert MAX_ADDR == -2147483649
    assert decorate(0) == LONG_MIN
    assert is_ext_address(MAX_ADDR) and not is_ext_address(MAX_ADDR + 1)
    assert not is_ext_address(-(1 << 31))  # Integer.MIN_VALUE widened: a Java tag hash, not an address


@given(st.integers(0, MAX_REAL_OFFSET))
def test_decorate_round_trips_into_the_address_range(offset: int) -> None:
    a = decorate(offset)
    assert LONG_MIN <= a <= MAX_ADDR
    assert is_ext_address(a)
    assert undecorate(a) == offset


@given(st.one_of(st.integers(-(1 << 31), LONG_MAX), st.text(max_size=30).map(tag_code)))
def test_tag_codes_and_java_hashes_are_never_addresses(code: int) -> None:
    assert not is_ext_address(code)


@given(st.lists(st.integers(LONG_MIN, LONG_MAX), max_size=50))
def test_array_form_agrees_with_scalar_form(codes: list[int]) -> None:
    arr = np.array(codes, dtype=np.int64)
    assert is_ext_address_array(arr).tolist() == [is_ext_address(c) for c in codes]


# -- format and round trips -----------------------------------------------------------------------------

def test_unit_layout_and_file_naming(tmp_path: Path) -> None:
    d = ext_queue_dir(tmp_path, "TopicA", 3)
    assert d == tmp_path / "consumequeue_ext" / "TopicA" / "3"
    e = ext(d, file_size=1000)
    a0 = e.put(tag_code("TagA"), 1_700_000_000_123, bytes(range(1, 15)))
    a1 = e.put(7, 5, b"")
    assert (a0, a1) == (decorate(0), decorate(34))
    e.flush()
    raw = (d / ("0" * 20)).read_bytes()
    assert len(raw) == 1000
    assert struct.unpack_from(">hqqh", raw, 0) == (34, tag_code("TagA"), 1_700_000_000_123, 14)
    assert raw[20:34] == bytes(range(1, 15))
    assert struct.unpack_from(">hqqh", raw, 34) == (20, 7, 5, 0)
    assert raw[54:] == bytes(len(raw) - 54)
    assert e.max_address() == decorate(54)
    e.close()


def test_round_trip_and_reopen(tmp_path: Path) -> None:
    e = ext(tmp_path, file_size=4096, bitmap_bytes_max=16)
    units = [ExtUnit(tag_code(f"T{i}") if i % 3 else 0, 1_700_000_000_000 + i, bytes([i % 256]) * (i % 17))
             for i in range(300)]
    addrs = [e.put(u.tags_code, u.msg_store_time, u.bitmap) for u in units]
    assert all(is_ext_address(a) for a in addrs)
    assert [e.get(a) for a in addrs] == units
    top = e.max_address()
    e.close()
    e = ext(tmp_path, file_size=4096, bitmap_bytes_max=16)
    assert e.max_address() == top
    assert [e.get(a) for a in addrs] == units
    a = e.put(1, 2, b"\x01")
    assert a == top and e.get(a) == ExtUnit(1, 2, b"\x01")
    e.close()


def test_extreme_field_values(tmp_path: Path) -> None:
    e = ext(tmp_path)
    a = e.put(LONG_MAX, LONG_MIN, b"\xff" * 20)
    assert e.get(a) == ExtUnit(LONG_MAX, LONG_MIN, b"\xff" * 20)


def test_bad_input_is_refused_precisely(tmp_path: Path) -> None:
    e = ext(tmp_path)
    with pytest.raises(InvalidParameterError, match="exceeds"):
        e.put(1, 1, bytes(21))
    with pytest.raises(InvalidParameterError, match="out of range"):
        e.put(1 << 64, 1, b"")
    with pytest.raises(InvalidParameterError, match="not a ConsumeQueueExt address"):
        e.truncate(5)
    with pytest.raises(InvalidParameterError):
        ConsumeQueueExt(tmp_path, file_size=40, bitmap_bytes_max=20)
    with pytest.raises(InvalidParameterError):
        ConsumeQueueExt(tmp_path, bitmap_bytes_max=40000)
    assert e.max_address() == decorate(0)  # nothing was written


def test_get_of_non_units_is_none(tmp_path: Path) -> None:
    e = ext(tmp_path)
    assert e.get(decorate(0)) is None  # empty
    a = e.put(1, 2, b"ab")
    assert e.get(12345) is None  # a tag code, not an address
    assert e.get(a + 1) is None  # inside a unit
    assert e.get(e.max_address()) is None  # not written yet
    assert e.get(decorate(10**9)) is None


# -- roll-over ----------------------------------------------------------------------------------------

def test_units_never_cross_a_file_end(tmp_path: Path) -> None:
    e = ext(tmp_path, file_size=100, bitmap_bytes_max=14)
    addrs = [e.put(i, i, bytes([i]) * 14) for i in range(7)]  # 34-byte units, two per file
    assert [undecorate(a) for a in addrs] == [0, 34, 100, 134, 200, 234, 300]
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == [f"{i * 100:020d}" for i in range(4)]
    raw = (tmp_path / names[0]).read_bytes()
    assert struct.unpack_from(">h", raw, 68)[0] == -1  # the end marker
    assert [e.get(a) for a in addrs] == [ExtUnit(i, i, bytes([i]) * 14) for i in range(7)]
    e.close()
    e = ext(tmp_path, file_size=100, bitmap_bytes_max=14)
    assert e.max_address() == decorate(334)
    assert undecorate(e.put(9, 9, b"")) == 334  # 20 bytes fit with 4 to spare (334 + 20 <= 396)
    assert undecorate(e.put(9, 9, b"")) == 354
    assert undecorate(e.put(9, 9, b"")) == 374
    assert undecorate(e.put(9, 9, b"")) == 400


def test_reopen_right_after_an_end_marker(tmp_path: Path) -> None:
    e = ext(tmp_path, file_size=100, bitmap_bytes_max=14)
    e.put(1, 1, bytes(14))
    e.put(2, 2, bytes(14))
    e.close()
    raw = bytearray((tmp_path / ("0" * 20)).read_bytes())
    struct.pack_into(">h", raw, 68, -1)  # marker written, next file never created
    (tmp_path / ("0" * 20)).write_bytes(bytes(raw))
    e = ext(tmp_path, file_size=100, bitmap_bytes_max=14)
    assert e.max_address() == decorate(100)
    assert undecorate(e.put(3, 3, b"")) == 100


# -- batch reads ----------------------------------------------------------------------------------------

@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.integers(LONG_MIN, LONG_MAX), st.integers(0, 1 << 50), st.binary(max_size=14)),
                min_size=0, max_size=40),
       st.lists(st.one_of(st.integers(0, 60), st.integers(LONG_MIN, LONG_MAX)), max_size=60))
def test_get_many_equals_get(units: list[tuple[int, int, bytes]], picks: list[int]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        e = ext(Path(tmp), file_size=128, bitmap_bytes_max=14)
        addrs = [e.put(*u) for u in units]
        # Indices pick stored units (or, past the end, random codes); then some near misses.
        queried = [addrs[p] if 0 <= p < len(addrs) else p for p in picks] + [a + 1 for a in addrs[:3]]
        batch = e.get_many(np.array(queried, dtype=np.int64))
        tags, bitmaps = batch  # unpacks as the pull path expects
        width = max((len(u[2]) for u in units if u), default=0)
        assert bitmaps.dtype == np.uint8 and tags.dtype == np.int64
        for i, a in enumerate(queried):
            unit = e.get(a)
            assert bool(batch.valid[i]) == (unit is not None)
            if unit is None:
                assert tags[i] == 0 and not bitmaps[i].any()
                continue
            n = len(unit.bitmap)
            assert (int(tags[i]), int(batch.msg_store_times[i]), int(batch.bitmap_lengths[i])) == \
                (unit.tags_code, unit.msg_store_time, n)
            assert bitmaps[i, :n].tobytes() == unit.bitmap and not bitmaps[i, n:].any()
        assert bitmaps.shape[1] <= width
        e.close()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.integers(LONG_MIN, LONG_MAX), st.integers(0, 1 << 50), st.binary(max_size=14)),
                min_size=0, max_size=30),
       st.lists(st.one_of(st.integers(0, 40), st.integers(LONG_MIN, LONG_MAX)), max_size=CQE.SMALL_BATCH),
       st.integers(0, 40))
def test_few_units_read_one_by_one_equal_the_numpy_gather(units: list[tuple[int, int, bytes]], picks: list[int],
                                                          below: int) -> None:
    """get_many's small-batch twin (a woken pull's few units) gives the very arrays of the vectorised read,
    for stored units, near misses, random codes and units retention removed."""
    with tempfile.TemporaryDirectory() as tmp:
        e = ext(Path(tmp), file_size=128, bitmap_bytes_max=14)
        addrs = [e.put(*u) for u in units]
        queried = [addrs[p] if 0 <= p < len(addrs) else p for p in picks] + [a + 1 for a in addrs[:2]]
        queried = queried[:CQE.SMALL_BATCH]
        if addrs:
            e.delete_below(addrs[min(below, len(addrs) - 1)])
        few = e.get_many(np.array(queried, dtype=np.int64))
        vectorised = CQE.SMALL_BATCH
        try:
            CQE.SMALL_BATCH = -1
            gathered = e.get_many(np.array(queried, dtype=np.int64))
        finally:
            CQE.SMALL_BATCH = vectorised
        for name in ("tags_codes", "bitmaps", "bitmap_lengths", "msg_store_times", "valid"):
            a, b = getattr(few, name), getattr(gathered, name)
            assert a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b), name
        e.close()


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.integers(LONG_MIN, LONG_MAX), st.integers(0, 1 << 50), st.binary(max_size=14)),
                min_size=0, max_size=30),
       st.lists(st.one_of(st.integers(0, 40), st.integers(LONG_MIN, LONG_MAX)), max_size=CQE.SMALL_BATCH),
       st.integers(0, 40), st.booleans())
def test_resolving_a_few_slots_equals_the_vectorised_resolve(units: list[tuple[int, int, bytes]], picks: list[int],
                                                             below: int, no_ext: bool) -> None:
    """ext_files.resolve_units on a few slots (a woken pull's window, decided on Python ints) gives the very
    codes, ext batch and unresolved mask of the vectorised resolve: stored units, near misses, plain tag
    codes, units retention removed, and no ext queue at all."""
    from sluice.store import ext_files
    with tempfile.TemporaryDirectory() as tmp:
        e = ext(Path(tmp), file_size=128, bitmap_bytes_max=14)
        addrs = [e.put(*u) for u in units]
        queried = [addrs[p] if 0 <= p < len(addrs) else p for p in picks] + [a + 1 for a in addrs[:2]]
        slots = np.array(queried[:CQE.SMALL_BATCH], dtype=">i8")  # as consume-queue units hold them
        if addrs:
            e.delete_below(addrs[min(below, len(addrs) - 1)])
        q = None if no_ext else e
        few = ext_files.resolve_units(q, slots)
        small = ext_files.SMALL_BATCH
        try:
            ext_files.SMALL_BATCH = -1
            vectorised = ext_files.resolve_units(q, slots)
        finally:
            ext_files.SMALL_BATCH = small
        assert few[0].dtype == vectorised[0].dtype and np.array_equal(few[0], vectorised[0])
        assert (few[1] is None) == (vectorised[1] is None) and (few[2] is None) == (vectorised[2] is None)
        if few[1] is not None:
            # The few road's lists (what a few-unit filter reads, FewExtBatch.row_lists) equal the arrays'.
            assert isinstance(few[1], CQE.FewExtBatch)
            assert few[1].width == vectorised[1].width
            assert few[1].row_lists() == vectorised[1].row_lists()
            for name in ("tags_codes", "bitmaps", "bitmap_lengths", "msg_store_times", "valid"):
                a, b = getattr(few[1], name), getattr(vectorised[1], name)
                assert a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b), name
        if few[2] is not None:
            assert few[2].dtype == vectorised[2].dtype and np.array_equal(few[2], vectorised[2])
        e.close()


@pytest.mark.skipif(CQE.C is None, reason="the C extension is not built")
@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.integers(LONG_MIN, LONG_MAX), st.integers(0, 1 << 50), st.binary(max_size=14)),
                min_size=0, max_size=40),
       st.lists(st.one_of(st.integers(0, 60), st.integers(LONG_MIN, LONG_MAX)), min_size=CQE.SMALL_BATCH + 1,
                max_size=80),
       st.integers(0, 40))
def test_the_c_gather_equals_the_numpy_gather(units: list[tuple[int, int, bytes]], picks: list[int],
                                              below: int) -> None:
    """speedups.ext_gather (a window's units over several files) gives the very arrays of the numpy read, for
    stored units, near misses, random codes and units retention removed."""
    with tempfile.TemporaryDirectory() as tmp:
        e = ext(Path(tmp), file_size=128, bitmap_bytes_max=14)
        addrs = [e.put(*u) for u in units]
        queried = [addrs[p] if 0 <= p < len(addrs) else p for p in picks] + [a + 1 for a in addrs[:2]]
        if addrs:
            e.delete_below(addrs[min(below, len(addrs) - 1)])
        fast = e.get_many(np.array(queried, dtype=np.int64))
        c = CQE.C
        try:
            CQE.C = None
            slow = e.get_many(np.array(queried, dtype=np.int64))
        finally:
            CQE.C = c
        for name in ("tags_codes", "bitmaps", "bitmap_lengths", "msg_store_times", "valid"):
            a, b = getattr(fast, name), getattr(slow, name)
            assert a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b), name
        e.close()


def test_ext_gather_refuses_arrays_of_the_wrong_size(tmp_path: Path) -> None:
    e = ext(tmp_path)
    e.put(5, 6, b"ab")
    if CQE.C is None:
        pytest.skip("the C extension is not built")
    f = e.files[0]
    off = np.zeros(2, dtype=np.int64)
    with pytest.raises(ValueError, match="tags holds"):
        CQE.C.ext_gather(f.mm, 0, e.file_size, 22, off, np.zeros(1, dtype=np.int64), np.zeros(2, dtype=np.int64),
                         np.zeros(2, dtype=np.int32), np.zeros(2, dtype=bool), None, 0)
    with pytest.raises(ValueError, match="does not fit rows"):
        CQE.C.ext_gather(f.mm, 0, e.file_size, 22, off, np.zeros(2, dtype=np.int64), np.zeros(2, dtype=np.int64),
                         np.zeros(2, dtype=np.int32), np.zeros(2, dtype=bool), np.zeros((2, 1), dtype=np.uint8), 1)
    e.close()


def test_get_many_edge_cases(tmp_path: Path) -> None:
    e = ext(tmp_path)
    empty = e.get_many(np.array([], dtype=np.int64))
    assert len(empty) == 0 and empty.bitmaps.shape == (0, 0)
    none_yet = e.get_many(np.array([decorate(0)]))
    assert not none_yet.valid.any()
    a = e.put(5, 6, b"")
    b = e.get_many(np.array([a, a]))
    assert b.tags_codes.tolist() == [5, 5] and b.bitmaps.shape == (2, 0) and b.valid.all()


# -- truncation and retention ---------------------------------------------------------------------------

def test_truncate_then_reopen(tmp_path: Path) -> None:
    e = ext(tmp_path, file_size=100, bitmap_bytes_max=14)
    addrs = [e.put(i, i, bytes([i + 1]) * (i % 15)) for i in range(20)]
    e.truncate(addrs[12])
    assert e.max_address() == addrs[12]
    assert e.get(addrs[12]) is None and e.get(addrs[11]) == ExtUnit(11, 11, bytes([12]) * 11)
    e.close()
    e = ext(tmp_path, file_size=100, bitmap_bytes_max=14)
    assert e.max_address() == addrs[12]
    assert [e.get(a) for a in addrs[:12]] == [ExtUnit(i, i, bytes([i + 1]) * (i % 15)) for i in range(12)]
    again = [e.put(i, i, bytes([i + 1]) * (i % 15)) for i in range(12, 20)]
    assert again == addrs[12:]
    e.truncate(decorate(0))
    assert e.max_address() == decorate(0) and e.get(addrs[0]) is None
    assert list(tmp_path.iterdir()) == []
    assert e.put(1, 1, b"") == decorate(0)


def test_truncate_at_a_file_start_and_past_the_end(tmp_path: Path) -> None:
    e = ext(tmp_path, file_size=100, bitmap_bytes_max=14)
    addrs = [e.put(i, i, bytes(14)) for i in range(5)]  # files at 0, 100, 200
    e.truncate(e.max_address() + 1000)  # nothing past the end: a no-op
    assert e.max_address() == decorate(234)
    e.truncate(decorate(200))
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"{0:020d}", f"{100:020d}"]
    assert e.put(9, 9, b"") == decorate(200)
    assert e.get(addrs[3]) == ExtUnit(3, 3, bytes(14))


def test_truncate_by_max_address_keeps_that_unit(tmp_path: Path) -> None:
    e = ext(tmp_path, file_size=1000)
    addrs = [e.put(i, i, bytes(i)) for i in range(8)]
    e.truncate_by_max_address(addrs[4])
    assert e.get(addrs[4]) == ExtUnit(4, 4, bytes(4)) and e.get(addrs[5]) is None
    assert e.max_address() == addrs[5]
    e.truncate_by_max_address(addrs[6])  # not a unit any more: nothing happens
    assert e.max_address() == addrs[5]


def test_delete_below_removes_whole_files_never_the_last(tmp_path: Path) -> None:
    e = ext(tmp_path, file_size=100, bitmap_bytes_max=14)
    addrs = [e.put(i, i, bytes(14)) for i in range(7)]  # files at 0..300
    e.delete_below(decorate(199))
    assert sorted(int(p.name) for p in tmp_path.iterdir()) == [100, 200, 300]
    assert e.min_address() == decorate(100)
    assert e.get(addrs[0]) is None and e.get(addrs[2]) == ExtUnit(2, 2, bytes(14))
    assert not e.get_many(np.array(addrs[:2])).valid.any()
    e.delete_below(decorate(10**6))
    assert sorted(int(p.name) for p in tmp_path.iterdir()) == [300]
    e.close()
    e = ext(tmp_path, file_size=100, bitmap_bytes_max=14)
    assert e.min_address() == decorate(300) and e.max_address() == decorate(334)
    assert e.get(addrs[6]) == ExtUnit(6, 6, bytes(14))


# -- crash recovery -------------------------------------------------------------------------------------

def _tail(tmp_path: Path) -> Path:
    return sorted(tmp_path.iterdir())[-1]


@pytest.mark.parametrize("torn", [
    b"\x00\x22" + bytes(18),                 # size written, the rest never reached the disk
    b"\x00\x22" + struct.pack(">qqh", 1, 2, 9),  # a size and bitmap size that disagree
    b"\x00\x10",                             # a size below the minimum
    b"\x7f\xff",                             # a size that runs past the file end
])
def test_a_torn_last_unit_is_ignored_on_load(tmp_path: Path, torn: bytes) -> None:
    e = ext(tmp_path, file_size=200, bitmap_bytes_max=14)
    addrs = [e.put(i, i, bytes([7]) * 14) for i in range(3)]
    top = e.max_address()
    e.close()
    raw = bytearray(_tail(tmp_path).read_bytes())
    pos = undecorate(top) % 200
    raw[pos:pos + len(torn)] = torn
    _tail(tmp_path).write_bytes(bytes(raw))
    e = ext(tmp_path, file_size=200, bitmap_bytes_max=14)
    assert e.max_address() == top
    assert e.get(top) is None
    assert [e.get(a) for a in addrs] == [ExtUnit(i, i, bytes([7]) * 14) for i in range(3)]
    raw = _tail(tmp_path).read_bytes()
    assert raw[pos:] == bytes(len(raw) - pos)  # the torn bytes are gone
    assert e.put(5, 5, b"\x01") == top and e.get(top) == ExtUnit(5, 5, b"\x01")


def test_a_unit_whose_size_was_never_written_is_not_there(tmp_path: Path) -> None:
    e = ext(tmp_path, file_size=200, bitmap_bytes_max=14)
    e.put(1, 1, b"a")
    top = e.max_address()
    e.close()
    raw = bytearray(_tail(tmp_path).read_bytes())
    pos = undecorate(top)
    raw[pos + 2:pos + 21] = struct.pack(">qqh", 3, 4, 1) + b"z"  # put() writes the size last
    _tail(tmp_path).write_bytes(bytes(raw))
    e = ext(tmp_path, file_size=200, bitmap_bytes_max=14)
    assert e.max_address() == top and e.get(top) is None


def test_load_scans_mixed_unit_sizes(tmp_path: Path) -> None:
    e = ext(tmp_path, file_size=64 * 1024, bitmap_bytes_max=32)
    rng = np.random.default_rng(7)
    lengths = [int(x) for x in rng.integers(0, 33, 3000)]
    lengths[1000:2500] = [14] * 1500  # a long run of one size, as a real queue has
    addrs = [e.put(i, i, bytes([i % 251]) * n) for i, n in enumerate(lengths)]
    top = e.max_address()
    e.close()
    e = ext(tmp_path, file_size=64 * 1024, bitmap_bytes_max=32)
    assert e.max_address() == top
    batch = e.get_many(np.array(addrs))
    assert batch.valid.all() and batch.bitmap_lengths.tolist() == lengths
    assert batch.tags_codes.tolist() == list(range(3000))


def test_files_with_a_gap_are_refused(tmp_path: Path) -> None:
    e = ext(tmp_path, file_size=100, bitmap_bytes_max=14)
    for i in range(5):
        e.put(i, i, bytes(14))
    e.close()
    (tmp_path / f"{100:020d}").unlink()
    with pytest.raises(StoreError, match="missing"):
        ext(tmp_path, file_size=100, bitmap_bytes_max=14)
    with pytest.raises(StoreError, match="files of this ext queue are 64 bytes"):
        ext(tmp_path, file_size=64, bitmap_bytes_max=14)
    (tmp_path / f"{200:020d}").rename(tmp_path / f"{150:020d}")
    with pytest.raises(StoreError, match="multiple"):
        ext(tmp_path, file_size=100, bitmap_bytes_max=14)


# -- threads -------------------------------------------------------------------------------------------

def test_reads_run_safely_while_dispatch_writes(tmp_path: Path) -> None:
    e = ext(tmp_path, file_size=4096, bitmap_bytes_max=14)
    addrs: list[int] = []
    errors: list[BaseException] = []
    done = threading.Event()

    def reader() -> None:
        try:
            while not done.is_set():
                snap = np.array(addrs[-200:], dtype=np.int64)
                b = e.get_many(snap)
                assert b.valid.all()
                assert (b.tags_codes == (b.msg_store_times * 3)).all()
        except BaseException as exc:  # noqa: BLE001 - handed to the main thread
            errors.append(exc)

    threads = [threading.Thread(target=reader) for _ in range(2)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 10
    for i in range(5000):
        addrs.append(e.put(i * 3, i, bytes([i % 256]) * 14))
        if i % 1000 == 0:
            e.delete_below(addrs[max(0, i - 2000)] - 4096 * 4)  # retention races with reads too
        if time.monotonic() > deadline:
            break
    done.set()
    for t in threads:
        t.join(5)
    assert not errors
