"""The key index (IndexFile / IndexService): format, queries, roll-over, truncation, crash repair."""
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

from sluice.errors import InvalidParameterError, StoreError
from sluice.filter.tagcode import java_string_hash
from sluice.store.index import ENTRY, HEADER, IndexFile, IndexService, index_keys, key_hash
from sluice.store.keyhash import key_hashes, prefix_hash

T0 = 1_700_000_000_000  # a whole second, so entry times read back exactly
ALL = (0, 1 << 62)


def svc(d: Path, slots: int = 7, num: int = 9) -> IndexService:
    s = IndexService(d, max_hash_slots=slots, max_index_num=num)
    s.load()
    return s


def file_bytes(s: IndexService) -> list[bytes]:
    return [f.path.read_bytes() for f in s.files]


def java_abs(s: str) -> int:
    h = java_string_hash(s)
    return 0 if h == -(1 << 31) else abs(h)


# -- hashing ------------------------------------------------------------------------------------------

@given(st.text(st.characters(blacklist_categories=("Cs",)), max_size=20),
       st.text(st.characters(blacklist_categories=("Cs",)), max_size=40))
def test_key_hash_is_abs_java_hash_of_topic_hash_key(topic: str, key: str) -> None:
    assert key_hash(topic, key) == java_abs(topic + "#" + key)


def test_key_hash_maps_integer_min_to_zero() -> None:
    # Solve for a 5-char key that makes Java's hash of "T#<key>" exactly Integer.MIN_VALUE.
    p = java_string_hash("T#") & 0xFFFFFFFF
    target = ((1 << 31) - p * 31**5) % (1 << 32)
    chars = []
    for power in (4, 3, 2, 1, 0):
        c, target = divmod(target, 31**power)
        chars.append(chr(c))
    key = "".join(chars)
    assert java_string_hash("T#" + key) == -(1 << 31)
    assert key_hash("T", key) == 0


def test_lone_surrogates_hash_as_java_code_units() -> None:
    expected = ((java_string_hash("T#") & 0xFFFFFFFF) * 31 * 31 + 0xD800 * 31 + ord("x")) & 0xFFFFFFFF
    assert key_hash("T", "\ud800x") == ((1 << 32) - expected if expected & 0x80000000 else expected)


def test_index_keys_uniq_first_and_empty_tokens_skipped() -> None:
    assert index_keys("U1", ["a", "", "b"]) == ["U1", "a", "b"]
    assert index_keys(None, []) == []
    assert index_keys("", ["", "x"]) == ["x"]


# -- format -------------------------------------------------------------------------------------------

def test_file_layout_matches_rocketmq(tmp_path: Path) -> None:
    s = svc(tmp_path, slots=5, num=10)
    s.build_index("T", "U", ["k"], 4096, T0 + 2500)
    s.build_index("T", None, ["k"], 8192, T0 + 7000)
    s.flush()
    (f,) = s.files
    raw = f.path.read_bytes()
    assert len(raw) == 40 + 5 * 4 + 10 * 20
    assert f.path.name.isdigit() and len(f.path.name) == 17  # yyyyMMddHHmmssSSS
    begin_ts, end_ts, begin_phy, end_phy, slot_count, count = HEADER.unpack_from(raw, 0)
    assert (begin_ts, end_ts, begin_phy, end_phy, count) == (T0 + 2500, T0 + 7000, 4096, 8192, 4)
    hu, hk = key_hash("T", "U"), key_hash("T", "k")
    assert slot_count == len({hu % 5, hk % 5})
    e1, e2, e3 = (ENTRY.unpack_from(raw, 60 + i * 20) for i in (1, 2, 3))
    assert e1 == (hu, 4096, 0, 0)
    assert e2 == (hk, 4096, 0, 1 if hk % 5 == hu % 5 else 0)
    assert e3 == (hk, 8192, 4, 2)  # (7000 - 2500) // 1000 seconds; chained to entry 2
    assert ENTRY.unpack_from(raw, 60) == (0, 0, 0, 0)  # entry 0 is never used
    assert struct.unpack_from(">i", raw, 40 + (hk % 5) * 4)[0] == 3


def test_constructor_rejects_nonsense_sizes(tmp_path: Path) -> None:
    with pytest.raises(InvalidParameterError):
        IndexService(tmp_path, max_hash_slots=0)
    with pytest.raises(InvalidParameterError):
        IndexService(tmp_path, max_index_num=1)


def test_a_file_created_but_never_sized_is_removed(tmp_path: Path) -> None:
    s = svc(tmp_path, slots=5, num=10)
    s.build_index("T", "U", [], 0, T0)
    s.close()
    (tmp_path / "29991231235959999").touch()
    s = svc(tmp_path, slots=5, num=10)
    assert len(s.files) == 1 and not (tmp_path / "29991231235959999").exists()
    assert s.query_offsets("T", "U", 10, *ALL) == [0]


def test_reopening_with_other_sizes_is_refused(tmp_path: Path) -> None:
    s = svc(tmp_path, slots=5, num=10)
    s.build_index("T", "U", [], 0, T0)
    s.close()
    with pytest.raises(StoreError, match="hash slots"):
        svc(tmp_path, slots=6, num=10)


# -- queries ------------------------------------------------------------------------------------------

def test_round_trip_and_reopen(tmp_path: Path) -> None:
    s = svc(tmp_path, slots=101, num=1000)
    for i in range(200):
        s.build_index("Orders", f"UNIQ{i:04d}", [f"order-{i % 10}", "all"], i * 300, T0 + i * 10)
    assert s.query_offsets("Orders", "UNIQ0042", 10, *ALL) == [42 * 300]
    assert s.query_offsets("Orders", "order-3", 100, *ALL) == [i * 300 for i in range(199, -1, -1) if i % 10 == 3]
    assert s.query_offsets("Orders", "all", 5, *ALL) == [i * 300 for i in (199, 198, 197, 196, 195)]
    assert s.query_offsets("Other", "all", 5, *ALL) == []
    assert s.query_offsets("Orders", "missing", 5, *ALL) == []
    assert s.max_indexed_offset() == 199 * 300
    before = file_bytes(s)
    s.close()
    s2 = svc(tmp_path, slots=101, num=1000)
    assert file_bytes(s2) == before
    assert s2.query_offsets("Orders", "order-3", 3, *ALL) == [193 * 300, 183 * 300, 173 * 300]
    s2.build_index("Orders", "UNIQ9999", ["all"], 200 * 300, T0 + 5000)
    assert s2.query_offsets("Orders", "all", 2, *ALL) == [200 * 300, 199 * 300]
    s2.close()


def test_hash_collisions_return_every_candidate(tmp_path: Path) -> None:
    assert java_string_hash("Aa") == java_string_hash("BB")
    s = svc(tmp_path)
    s.build_index("T", None, ["Aa"], 100, T0)
    s.build_index("T", None, ["BB"], 200, T0)
    s.build_index("T", None, ["Cc"], 300, T0)
    assert s.query_offsets("T", "Aa", 10, *ALL) == [200, 100]
    assert s.query_offsets("T", "BB", 10, *ALL) == [200, 100]


def test_slot_collisions_with_different_hashes_are_filtered(tmp_path: Path) -> None:
    s = svc(tmp_path, slots=1, num=50)  # one slot: every key chains through it
    for i in range(20):
        s.build_index("T", None, [f"key{i % 4}"], i, T0)
    assert s.query_offsets("T", "key1", 100, *ALL) == [17, 13, 9, 5, 1]


def test_time_range_filtering(tmp_path: Path) -> None:
    s = svc(tmp_path, slots=11, num=100)
    for i in range(10):
        s.build_index("T", None, ["k"], i * 10, T0 + i * 1000)
    assert s.query_offsets("T", "k", 100, T0 + 3000, T0 + 6000) == [60, 50, 40, 30]
    assert s.query_offsets("T", "k", 100, T0 + 3001, T0 + 5999) == [50, 40]
    assert s.query_offsets("T", "k", 100, T0 + 20_000, T0 + 30_000) == []
    assert s.query_offsets("T", "k", 100, 0, T0 - 1) == []
    assert s.query_offsets("T", "k", 2, 0, T0 + 4000) == [40, 30]
    assert s.query_offsets("T", "k", 100, T0 + 5000, T0) == []
    assert s.query_offsets("T", "k", 0, *ALL) == []


def test_sub_second_times_read_back_truncated_to_seconds_like_rocketmq(tmp_path: Path) -> None:
    s = svc(tmp_path)
    s.build_index("T", None, ["k"], 0, T0 + 100)
    s.build_index("T", None, ["k"], 1, T0 + 1900)  # stored as 1 s after the begin time
    assert s.query_offsets("T", "k", 10, T0 + 1100, T0 + 1100) == [1]
    assert s.query_offsets("T", "k", 10, T0 + 1101, T0 + 5000) == []


def test_roll_over_newest_first_across_files(tmp_path: Path) -> None:
    s = svc(tmp_path, slots=3, num=4)  # 3 entries a file
    for i in range(30):
        s.build_index("T", f"u{i}", ["k"], i * 100, T0 + i * 1000)
    assert len(s.files) == 30  # two keys a message, so one message a file
    names = [f.path.name for f in s.files]
    assert names == sorted(names) and len(set(names)) == 30
    assert s.query_offsets("T", "k", 100, *ALL) == [i * 100 for i in range(29, -1, -1)]
    assert s.query_offsets("T", "k", 4, T0 + 10_000, T0 + 20_000) == [2000, 1900, 1800, 1700]
    assert s.query_offsets("T", "u7", 100, *ALL) == [700]
    s.close()
    s = svc(tmp_path, slots=3, num=4)
    assert len(s.files) == 30
    assert s.query_offsets("T", "k", 3, *ALL) == [2900, 2800, 2700]
    s.build_index("T", "u30", ["k"], 3000, T0 + 30_000)
    assert len(s.files) == 31 and s.files[-1].path.name > names[-1]


def test_a_message_with_more_keys_than_a_file_holds_is_split(tmp_path: Path) -> None:
    s = svc(tmp_path, slots=3, num=3)  # 2 entries a file
    s.build_index("T", "u", ["a", "b", "c", "d"], 7, T0)
    assert len(s.files) == 3
    for k in ("u", "a", "b", "c", "d"):
        assert s.query_offsets("T", k, 10, *ALL) == [7]


def test_replayed_messages_are_not_indexed_twice(tmp_path: Path) -> None:
    s = svc(tmp_path)
    s.build_index("T", "u1", ["k"], 10, T0)
    s.build_index("T", "u2", ["k"], 20, T0)
    s.build_index("T", "u1", ["k"], 10, T0)
    s.build_index("T", "u2", ["k"], 20, T0)
    assert s.query_offsets("T", "k", 10, *ALL) == [20, 10]
    s.build_index("T", None, [], 30, T0)  # nothing to index: a no-op
    assert s.max_indexed_offset() == 20


def test_empty_service(tmp_path: Path) -> None:
    s = svc(tmp_path / "idx")
    assert s.max_indexed_offset() == -1
    assert s.query_offsets("T", "k", 10, *ALL) == []
    s.truncate(0)
    s.delete_below(100)
    s.flush()
    s.close()


# -- retention ----------------------------------------------------------------------------------------

def test_delete_below_removes_whole_old_files_never_the_newest(tmp_path: Path) -> None:
    s = svc(tmp_path, slots=3, num=5)  # 4 entries: two messages a file
    for i in range(10):
        s.build_index("T", None, ["k"], i * 10, T0)
    assert [(f.begin_phy, f.end_phy) for f in s.files] == [(0, 30), (40, 70), (80, 90)]
    s.delete_below(70)
    assert [(f.begin_phy, f.end_phy) for f in s.files] == [(40, 70), (80, 90)]
    s.delete_below(71)
    assert [(f.begin_phy, f.end_phy) for f in s.files] == [(80, 90)]
    s.delete_below(10**9)
    assert [(f.begin_phy, f.end_phy) for f in s.files] == [(80, 90)]
    assert len(list(tmp_path.iterdir())) == 1
    assert s.query_offsets("T", "k", 100, *ALL) == [90, 80]


# -- truncation -------------------------------------------------------------------------------------

def test_truncate_undoes_exactly(tmp_path: Path) -> None:
    a, b = svc(tmp_path / "a", slots=3, num=6), svc(tmp_path / "b", slots=3, num=6)
    msgs = [("T", f"u{i}", ["Aa", "BB"] if i % 2 else ["k"], i * 10, T0 + i * 1000) for i in range(12)]
    for m in msgs:
        a.build_index(*m)
    for m in msgs[:5]:
        b.build_index(*m)
    a.truncate(45)
    assert a.max_indexed_offset() == 40
    assert file_bytes(a) == file_bytes(b)
    for m in msgs[5:]:
        a.build_index(*m)
        b.build_index(*m)
    assert file_bytes(a) == file_bytes(b)
    a.truncate(0)
    assert a.files == [] and list((tmp_path / "a").iterdir()) == []


OPS = st.lists(
    st.one_of(
        st.tuples(st.just("put"), st.sampled_from(["T", "U"]), st.one_of(st.none(), st.sampled_from(["u1", "u2"])),
                  st.lists(st.sampled_from(["Aa", "BB", "k1", "k2", ""]), max_size=4),
                  st.integers(0, 30), st.integers(0, 3)),
        st.tuples(st.just("truncate"), st.floats(0, 1)),
        st.tuples(st.just("reopen")),
    ),
    max_size=40,
)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=OPS, slots=st.integers(1, 4), num=st.integers(2, 7))
def test_truncate_then_rebuild_equals_model_and_fresh_build(ops: list[tuple], slots: int, num: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        s = svc(root / "s", slots, num)
        model: list[tuple[int, int, str, list[str]]] = []  # (offset, ts, topic, keys) of surviving messages
        next_off, ts = 0, T0
        for op in ops:
            if op[0] == "put":
                _, topic, uniq, keys, step, secs = op
                ts += secs * 1000
                s.build_index(topic, uniq, keys, next_off, ts)
                if index_keys(uniq, keys):
                    model.append((next_off, ts, topic, index_keys(uniq, keys)))
                next_off += 1 + step
            elif op[0] == "truncate":
                next_off = int(op[1] * next_off)
                s.truncate(next_off)
                model = [m for m in model if m[0] < next_off]
            else:
                s.close()
                s = svc(root / "s", slots, num)
            assert s.max_indexed_offset() == (model[-1][0] if model else -1)
        for qt in ("T", "U"):
            for qk in ("Aa", "k1", "k2", "u1"):
                h = key_hash(qt, qk)
                want = [off for off, _t, topic, names in reversed(model) for n in names if key_hash(topic, n) == h]
                assert s.query_offsets(qt, qk, 1000, *ALL) == want
                assert s.query_offsets(qt, qk, 2, *ALL) == want[:2]
                lo, hi = T0 + 5000, T0 + 40_000
                want_t = [off for off, t, topic, names in reversed(model) for n in names
                          if key_hash(topic, n) == h and lo <= t <= hi]
                assert s.query_offsets(qt, qk, 1000, lo, hi) == want_t
        fresh = svc(root / "fresh", slots, num)
        for off, t, topic, names in model:
            fresh.build_index(topic, None, names, off, t)
        assert file_bytes(s) == file_bytes(fresh)
        s.close()
        fresh.close()


# -- crash repair ---------------------------------------------------------------------------------------

def _poke_header(path: Path, **fields: int) -> None:
    raw = bytearray(path.read_bytes())
    names = ["begin_ts", "end_ts", "begin_phy", "end_phy", "slot_count", "count"]
    values = dict(zip(names, HEADER.unpack_from(raw, 0)))
    values.update(fields)
    HEADER.pack_into(raw, 0, *(values[n] for n in names))
    path.write_bytes(bytes(raw))


def _build(d: Path, msgs: list[tuple]) -> IndexService:
    s = svc(d, slots=5, num=40)
    for m in msgs:
        s.build_index(*m)
    return s


MSGS = [("T", f"u{i}", ["k", "Aa"], i * 10, T0 + i * 1000) for i in range(8)]


def test_entries_past_the_header_count_are_dropped_on_load(tmp_path: Path) -> None:
    # Simulate a crash after a message's entries and slots were written but before its header.
    s = _build(tmp_path / "a", MSGS)
    path = s.files[-1].path
    s.close()
    _poke_header(path, count=1 + 3 * 6, end_phy=50, end_ts=T0 + 5000)
    s = svc(tmp_path / "a", slots=5, num=40)
    assert s.max_indexed_offset() == 50
    assert s.query_offsets("T", "k", 100, *ALL) == [50, 40, 30, 20, 10, 0]
    ref = _build(tmp_path / "b", MSGS[:6])
    assert file_bytes(s) == file_bytes(ref)
    for m in MSGS:  # dispatch replays from the start: nothing is indexed twice
        s.build_index(*m)
        ref.build_index(*m)
    assert file_bytes(s) == file_bytes(ref)


def test_a_header_count_past_the_written_entries_is_cut_back(tmp_path: Path) -> None:
    s = _build(tmp_path / "a", MSGS)
    path = s.files[-1].path
    s.close()
    _poke_header(path, count=30)  # entries 25..29 were never written (all zeros)
    s = svc(tmp_path / "a", slots=5, num=40)
    # The last whole message before the cut may have had more keys: it goes too (dispatch re-indexes it).
    ref = _build(tmp_path / "b", MSGS[:7])
    assert file_bytes(s) == file_bytes(ref)


def test_a_torn_entry_cuts_its_whole_message(tmp_path: Path) -> None:
    s = _build(tmp_path / "a", MSGS)
    f = s.files[-1]
    path, entries_at = f.path, 40 + 5 * 4
    s.close()
    raw = bytearray(path.read_bytes())
    raw[entries_at + 23 * 20:entries_at + 24 * 20] = bytes(20)  # entry 23 is message 7's second key
    path.write_bytes(bytes(raw))
    s = svc(tmp_path / "a", slots=5, num=40)
    assert s.max_indexed_offset() == 60
    assert file_bytes(s) == file_bytes(_build(tmp_path / "b", MSGS[:7]))


def test_a_broken_chain_is_cut_where_it_breaks(tmp_path: Path) -> None:
    s = _build(tmp_path / "a", MSGS)
    path = s.files[-1].path
    s.close()
    raw = bytearray(path.read_bytes())
    at = 60 + 13 * 20  # entry 13 is message 4's first
    h, phy, diff, _prev = ENTRY.unpack_from(raw, at)
    ENTRY.pack_into(raw, at, h, phy, diff, 13)  # a self-loop
    path.write_bytes(bytes(raw))
    s = svc(tmp_path / "a", slots=5, num=40)
    assert s.max_indexed_offset() == 20  # message 3 goes as well: it was last before the damage
    assert file_bytes(s) == file_bytes(_build(tmp_path / "b", MSGS[:3]))
    assert s.query_offsets("T", "k", 100, *ALL) == [20, 10, 0]


def test_a_chain_that_skips_an_entry_is_cut(tmp_path: Path) -> None:
    s = svc(tmp_path / "a", slots=1, num=20)  # one slot: entries chain 1 <- 2 <- 3 <- ...
    for i in range(6):
        s.build_index("T", None, ["k"], i * 10, T0)
    path = s.files[-1].path
    s.close()
    raw = bytearray(path.read_bytes())
    at = 44 + 4 * 20
    h, phy, diff, _prev = ENTRY.unpack_from(raw, at)
    ENTRY.pack_into(raw, at, h, phy, diff, 2)  # entry 4 skips entry 3: two entries now name entry 2
    path.write_bytes(bytes(raw))
    s = svc(tmp_path / "a", slots=1, num=20)
    assert s.max_indexed_offset() == 10
    assert s.query_offsets("T", "k", 100, *ALL) == [10, 0]


def test_an_unusable_header_drops_the_file(tmp_path: Path) -> None:
    s = svc(tmp_path, slots=3, num=5)
    for i in range(6):
        s.build_index("T", None, ["k"], i * 10, T0)
    newest = s.files[-1].path
    s.close()
    _poke_header(newest, count=-7)
    s = svc(tmp_path, slots=3, num=5)
    assert not newest.exists()
    assert s.max_indexed_offset() == 30
    s.build_index("T", None, ["k"], 40, T0)
    assert s.query_offsets("T", "k", 100, *ALL) == [40, 30, 20, 10, 0]


def test_an_implausible_older_file_is_checked_and_repaired(tmp_path: Path) -> None:
    s = svc(tmp_path, slots=3, num=5)
    for i in range(8):
        s.build_index("T", None, ["k"], i * 10, T0)
    oldest = s.files[0].path
    s.close()
    _poke_header(oldest, end_phy=999)
    s = svc(tmp_path, slots=3, num=5)
    assert s.files[0].end_phy == 30
    assert s.query_offsets("T", "k", 100, *ALL) == [70, 60, 50, 40, 30, 20, 10, 0]


# -- threads -------------------------------------------------------------------------------------------

def test_queries_run_safely_while_dispatch_builds(tmp_path: Path) -> None:
    s = svc(tmp_path, slots=13, num=64)
    errors: list[BaseException] = []
    done = threading.Event()

    def reader() -> None:
        try:
            while not done.is_set():
                got = s.query_offsets("T", "k", 1000, *ALL)
                assert got == sorted(got, reverse=True)
                assert all(o % 10 == 0 for o in got)
        except BaseException as e:  # noqa: BLE001 - handed to the main thread
            errors.append(e)

    threads = [threading.Thread(target=reader) for _ in range(3)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 10
    for i in range(2000):
        s.build_index("T", f"u{i}", ["k"], i * 10, T0 + i)
        if time.monotonic() > deadline:
            break
    done.set()
    for t in threads:
        t.join(5)
    assert not errors
    assert s.query_offsets("T", "k", 5, *ALL)[0] == s.max_indexed_offset()


# -- batch hashing and batch building (dispatch's path) -----------------------------------------------

keys_st = st.text(st.characters(), min_size=1, max_size=12)  # lone surrogates and astral chars included


@given(st.lists(st.tuples(st.sampled_from(["T", "Bench", "é_topic", "%RETRY%g"]), keys_st), min_size=1, max_size=60))
def test_key_hashes_equal_key_hash(pairs: list[tuple[str, str]]) -> None:
    prefixes = np.array([prefix_hash(t) for t, _k in pairs], dtype=np.uint32)
    got = key_hashes(prefixes, [k for _t, k in pairs])
    assert got.tolist() == [key_hash(t, k) for t, k in pairs]


def test_key_hashes_long_keys_and_integer_min() -> None:
    p = java_string_hash("T#") & 0xFFFFFFFF
    target = ((1 << 31) - p * 31**5) % (1 << 32)
    chars = []
    for power in (4, 3, 2, 1, 0):
        c, target = divmod(target, 31**power)
        chars.append(chr(c))
    keys = ["".join(chars), "k" * 5000, "x"]
    got = key_hashes(np.full(3, prefix_hash("T"), dtype=np.uint32), keys)
    assert got.tolist() == [0, key_hash("T", "k" * 5000), key_hash("T", "x")]
    with pytest.raises(ValueError):
        key_hashes(np.zeros(1, dtype=np.uint32), [""])


def reference_put(f, hashes: list[int], phy: int, ts: int) -> None:
    """The one-entry-at-a-time algorithm put_many replaced (IndexFile.putKey's order of writes)."""
    mm, count = f.mm, f.count
    if count <= 1:
        f.begin_phy, f.begin_ts = phy, ts
    diff = min(max((ts - f.begin_ts) // 1000, 0), 0x7FFFFFFF)
    for h in hashes:
        slot_at = HEADER.size + (h % f.slot_num) * 4
        prev = struct.unpack_from(">i", mm, slot_at)[0]
        if prev <= 0 or prev >= count:
            prev = 0
            f.slot_count += 1
        ENTRY.pack_into(mm, f._entries_at + count * 20, h, phy, diff, prev)
        struct.pack_into(">i", mm, slot_at, count)
        count += 1
    f.count = count
    f.end_phy, f.end_ts = phy, ts
    f._write_header()


@settings(max_examples=40, deadline=None)
@given(msgs=st.lists(st.lists(st.integers(0, 2**31 - 1), min_size=1, max_size=4), min_size=1, max_size=40),
       slots=st.integers(1, 9), cut=st.integers(0, 40))
def test_put_many_writes_what_one_at_a_time_writes(msgs: list[list[int]], slots: int, cut: int) -> None:
    with tempfile.TemporaryDirectory() as d:
        a = IndexFile(Path(d) / "a", slots, 200, create=True)
        b = IndexFile(Path(d) / "b", slots, 200, create=True)
        try:
            hs, ps, ts = [], [], []
            for i, m in enumerate(msgs):
                reference_put(a, m, i * 100, T0 + i * 700)
                hs += m
                ps += [i * 100] * len(m)
                ts += [T0 + i * 700] * len(m)
            k = min(cut, len(hs))  # two batches, split anywhere the test likes
            for lo, hi in ((0, k), (k, len(hs))):
                b.put_many(np.array(hs[lo:hi], dtype=np.int64), np.array(ps[lo:hi], dtype=np.int64),
                           np.array(ts[lo:hi], dtype=np.int64))
            assert bytes(a.mm) == bytes(b.mm)
            assert (a.count, a.slot_count, a.end_phy) == (b.count, b.slot_count, b.end_phy)
        finally:
            a.close()
            b.close()


@settings(max_examples=30, deadline=None)
@given(msgs=st.lists(st.tuples(st.one_of(st.none(), keys_st), st.lists(keys_st, max_size=3)), min_size=1,
                     max_size=30),
       slots=st.integers(1, 7), num=st.integers(2, 12), split=st.integers(0, 30))
def test_build_index_batch_equals_build_index(msgs, slots: int, num: int, split: int) -> None:
    """Whole files (roll-over, messages never straddling files, splits of oversized ones) come out the same."""
    with tempfile.TemporaryDirectory() as d:
        one = svc(Path(d) / "one", slots, num)
        many = svc(Path(d) / "many", slots, num)
        rows = []
        for i, (u, ks) in enumerate(msgs):
            one.build_index("T", u, ks, i * 10, T0 + i * 1000)
            rows += [(k, i * 10, T0 + i * 1000) for k in index_keys(u, ks)]
        k = min(split, len(rows))
        while 0 < k < len(rows) and rows[k][1] == rows[k - 1][1]:
            k += 1  # a batch holds whole messages
        for part in (rows[:k], rows[k:]):
            many.build_index_batch(np.full(len(part), prefix_hash("T"), dtype=np.uint32), [r[0] for r in part],
                                   np.array([r[1] for r in part], dtype=np.int64),
                                   np.array([r[2] for r in part], dtype=np.int64))
        many.build_index_batch(np.full(len(rows), prefix_hash("T"), dtype=np.uint32), [r[0] for r in rows],
                               np.array([r[1] for r in rows], dtype=np.int64),
                               np.array([r[2] for r in rows], dtype=np.int64))  # a replay: all skipped
        assert file_bytes(one) == file_bytes(many)
        one.close()
        many.close()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(msgs=st.lists(st.tuples(st.integers(0, 3), st.integers(-2, 40), st.lists(st.integers(0, 2**31 - 1),
                                                                                  min_size=1, max_size=4)),
                     min_size=1, max_size=40),
       slots=st.integers(1, 9), num=st.integers(2, 12))
def test_build_index_raw_writes_what_build_index_hashes_writes(msgs: list[tuple[int, int, list[int]]], slots: int,
                                                               num: int) -> None:
    """Dispatch's few-entries path (native int64 bytes, no numpy) against the numpy one, message by message:
    the same files byte for byte, including replays below the indexed offset and files that fill and roll."""
    with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
        raw, ref = svc(Path(a), slots, num), svc(Path(b), slots, num)
        phy = 0
        for gap, ts_step, hashes in msgs:
            phy = max(0, phy + gap * 100 - (150 if gap == 0 else 0))  # gap 0: a replay of an indexed offset
            ts = T0 + 1000 * max(0, ts_step)
            n = len(hashes)
            h = np.array(hashes, dtype=np.int64)
            raw.build_index_raw(h.tobytes(), np.full(n, phy, dtype=np.int64).tobytes(),
                                np.full(n, ts, dtype=np.int64).tobytes())
            ref.build_index_hashes(h, np.full(n, phy, dtype=np.int64), np.full(n, ts, dtype=np.int64))
        assert file_bytes(raw) == file_bytes(ref)
        assert [(f.count, f.end_phy, f.begin_phy, f.slot_count) for f in raw.files] == \
            [(f.count, f.end_phy, f.begin_phy, f.slot_count) for f in ref.files]
        raw.close()
        ref.close()
