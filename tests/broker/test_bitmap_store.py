"""Bitmaps at dispatch, ConsumeQueueExt wiring in the store, and pulls that skip on bitmaps."""
from __future__ import annotations

import random
import time

import numpy as np
import pytest
from filtering_support import FilteredStore, props_of, pull_all, put, small_store_config
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sluice.broker.filter_data import LIVE_MARGIN_MS
from sluice.broker.filtering import SelectorFilter
from sluice.filter import compile_selector
from sluice.store.consumequeue_ext import is_ext_address_array


def sql_filter(fs: FilteredStore, group: str, topic: str, expr: str, *, bloom: bool = True) -> SelectorFilter:
    base = SelectorFilter(compile_selector("SQL92", expr))
    fd = fs.manager.get(topic, group)
    if not bloom or fd is None:
        return base.for_pull(fs.manager.metrics_of(group, topic))
    return base.for_pull(fs.manager.metrics_of(group, topic), fs.manager.bloom, fd.bloom,
                         fd.born_time + LIVE_MARGIN_MS)


def register(fs: FilteredStore, group: str, topic: str, expr: str, etype: str = "SQL92", *,
             born_ago_ms: int = 10_000) -> None:
    assert fs.manager.register(topic, group, expr, etype, 1)
    fs.manager.get(topic, group).born_time -= born_ago_ms  # messages put now count as stored after birth


@pytest.fixture
def fs(tmp_path):
    s = FilteredStore(tmp_path / "store")
    yield s
    s.close()


def tag_slots(fs: FilteredStore, topic: str) -> np.ndarray:
    cq = fs.store.queues.get(topic, 0)
    return cq.get_units(0, cq.max_offset)["tag"].astype(np.int64)


def test_bitmaps_only_for_topics_with_sql_filter_data(fs):
    register(fs, "G", "Sql", "a < 100")
    register(fs, "GT", "Tagged", "TagA", "TAG")
    put(fs.store, "Sql", [props_of(i) for i in range(300)])
    put(fs.store, "Tagged", [props_of(i) for i in range(300)])
    assert is_ext_address_array(tag_slots(fs, "Sql")).all()
    assert not is_ext_address_array(tag_slots(fs, "Tagged")).any()
    assert fs.store.ext.get("Sql", 0) is not None and fs.store.ext.get("Tagged", 0) is None
    assert not (fs.store.root / "consumequeue_ext" / "Tagged").exists()
    # the bitmap of each unit has this group's bits exactly where the expression is TRUE
    ext = fs.store.ext.get("Sql", 0)
    batch = ext.get_many(tag_slots(fs, "Sql"))
    bloom, data = fs.manager.bloom, fs.manager.get("Sql", "G").bloom
    hits = bloom.is_hit_batch(data, batch.bitmaps)
    want = np.array([int(props_of(i)["a"]) < 100 for i in range(300)])
    assert (hits == want).all()


def test_selective_pull_reads_only_bitmap_hits(fs):
    register(fs, "G", "Sel", "a < 10")  # about 1 %
    for g in range(5):
        register(fs, f"Other{g}", "Sel", f"a >= {200 * g}")
    props = [props_of(i) for i in range(5000)]
    put(fs.store, "Sel", props)
    mf = sql_filter(fs, "G", "Sel", "a < 10")
    before = fs.store.pull_records_read
    got = pull_all(fs.store, "Sel", mf)
    reads = fs.store.pull_records_read - before
    want = [i for i, p in enumerate(props) if int(p["a"]) < 10]
    assert got == want and 20 < len(want) < 100
    m = fs.manager.metrics_of("G", "Sel")
    assert reads == m.evaluated == len(want) + m.bitmap_false_positives
    assert m.bitmap_skipped == 5000 - m.evaluated
    # without bitmaps every record is read
    plain = sql_filter(fs, "G", "Sel", "a < 10", bloom=False)
    before = fs.store.pull_records_read
    assert pull_all(fs.store, "Sel", plain) == want
    assert fs.store.pull_records_read - before == 5000


def test_selective_pull_scans_wide_windows_when_skipping(fs):
    register(fs, "G", "Wide", "a = 12345")
    put(fs.store, "Wide", [props_of(i) for i in range(6000)] + [{"a": "12345", "n": "x"}])
    res = fs.store.get_messages("Wide", 0, 0, 32, sql_filter(fs, "G", "Wide", "a = 12345"))
    assert res.queue_offsets == [6000]  # one round trip, not eight


def test_messages_before_birth_and_without_bitmaps_are_evaluated(fs):
    put(fs.store, "Late", [props_of(i) for i in range(200)])  # before any filter data: no bitmaps
    register(fs, "G", "Late", "region = 'eu'", born_ago_ms=0)
    put(fs.store, "Late", [props_of(i) for i in range(200, 400)])  # bitmaps, but within the live margin
    fd = fs.manager.get("Late", "G")
    fd.born_time -= 10 * LIVE_MARGIN_MS  # pretend the second half came later
    put(fs.store, "Late", [props_of(i) for i in range(400, 600)])
    want = [i for i in range(600) if props_of(i)["region"] == "eu"]
    assert pull_all(fs.store, "Late", sql_filter(fs, "G", "Late", "region = 'eu'")) == want


def test_tag_pulls_on_a_topic_with_sql_consumers(fs):
    register(fs, "G", "Mixed", "a > 500")
    props = [props_of(i) for i in range(500)]
    put(fs.store, "Mixed", props)
    assert is_ext_address_array(tag_slots(fs, "Mixed")).all()
    tag = SelectorFilter(compile_selector("TAG", "TagA || TagC")).for_pull()
    before = fs.store.pull_records_read
    got = pull_all(fs.store, "Mixed", tag)
    assert got == [i for i, p in enumerate(props) if p.get("TAGS") in ("TagA", "TagC")]
    assert fs.store.pull_records_read - before == len(got)  # decided on the resolved tag codes alone


def test_evaluation_errors_count_as_no_match_and_are_counted(fs):
    register(fs, "G", "Err", "odd > 1")
    props = [props_of(i) for i in range(400)]
    put(fs.store, "Err", props)
    assert pull_all(fs.store, "Err", sql_filter(fs, "G", "Err", "odd > 1", bloom=False)) == []
    m = fs.manager.metrics_of("G", "Err")
    assert m.errors == sum(1 for p in props if "odd" in p) > 0 and m.matched == 0
    assert "odd" not in (m.last_error or "") or m.last_error


EXPRS = ["a < 100", "a BETWEEN 200 AND 300", "region IN ('eu', 'jp') AND a > 500", "TAGS = 'TagA'",
         "odd > 1", "NOT (region = 'us') OR a IS NULL", "b IS NOT NULL", "a > 990", "region <> 'cn'"]


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 10_000), exprs=st.lists(st.sampled_from(EXPRS), min_size=1, max_size=4, unique=True),
       n=st.integers(1, 400))
def test_results_identical_with_bitmaps_on_and_off(tmp_path_factory, seed, exprs, n):
    root = tmp_path_factory.mktemp("prop")
    rng = random.Random(seed)
    props = [props_of(i, rng) for i in range(n)]
    on, off = FilteredStore(root / "on"), FilteredStore(root / "off", bitmaps=False)
    try:
        for k, e in enumerate(exprs):
            for s in (on, off):
                register(s, f"G{k}", "P", e)
        half = n // 2
        put(on.store, "P", props[:half])
        # a group registered between the halves: its first half is evaluated directly
        register(on, "Late", "P", exprs[0], born_ago_ms=-LIVE_MARGIN_MS)
        put(on.store, "P", props[half:])
        put(off.store, "P", props)
        for k, e in enumerate(exprs):
            want = [i for i, p in enumerate(props) if compile_selector("SQL92", e).matches(p)]
            assert pull_all(on.store, "P", sql_filter(on, f"G{k}", "P", e), max_msgs=7) == want
            assert pull_all(off.store, "P", sql_filter(off, f"G{k}", "P", e), max_msgs=7) == want
        assert pull_all(on.store, "P", sql_filter(on, "Late", "P", exprs[0])) == \
            [i for i, p in enumerate(props) if compile_selector("SQL92", exprs[0]).matches(p)]
    finally:
        on.close()
        off.close()


def test_recovery_truncates_ext_units_past_the_queue(tmp_path):
    fs = FilteredStore(tmp_path / "s")
    register(fs, "G", "R", "a < 500")
    put(fs.store, "R", [props_of(i) for i in range(100)])
    ext = fs.store.ext.get("R", 0)
    end_before = ext.max_address()
    fs.store.queues.get("R", 0).truncate(60)  # as if the last 40 units never reached the disk
    fs.close()
    again = FilteredStore(tmp_path / "s", manager=fs.manager)
    try:
        ext = again.store.ext.get("R", 0)
        # recovery cut the 40 units no consume-queue unit points at (34 bytes each with a 14-byte bitmap)
        assert ext.max_address() == end_before - 40 * 34
        assert pull_all(again.store, "R", sql_filter(again, "G", "R", "a < 500")) == \
            [i for i in range(60) if int(props_of(i)["a"]) < 500]
    finally:
        again.close()


def test_rebuild_queue_recomputes_bitmaps_and_check_verifies_addresses(fs):
    register(fs, "G", "B", "a < 300")
    put(fs.store, "B", [props_of(i) for i in range(200)])
    assert fs.store.check().ok
    cq = fs.store.queues.get("B", 0)
    units = cq.get_units(0, 200).copy()
    units["tag"][5] = -(1 << 62)  # an ext address nothing was written at
    cq.put(0, units)
    rep = fs.store.check()
    assert not rep.ok and "ext address" in str(rep.problems[0])
    fs.store.rebuild_queue("B", 0)
    assert fs.store.check().ok
    assert is_ext_address_array(tag_slots(fs, "B")).all()
    mf = sql_filter(fs, "G", "B", "a < 300")
    assert pull_all(fs.store, "B", mf) == [i for i in range(200) if int(props_of(i)["a"]) < 300]
    assert fs.manager.metrics_of("G", "B").bitmap_skipped > 0


def test_retention_deletes_ext_files_with_their_queue(tmp_path):
    cfg = small_store_config(commitlog_file_size=256 * 1024, max_message_size=64 * 1024,
                             consumequeue_units_per_file=256, consumequeue_ext_file_size=4096, retention_hours=0)
    fs = FilteredStore(tmp_path / "s", store_config=cfg)
    try:
        register(fs, "G", "Old", "a < 500")
        body = [dict(props_of(i), pad="x" * 900) for i in range(1500)]
        put(fs.store, "Old", body)
        ext = fs.store.ext.get("Old", 0)
        files_before = len(ext.files)
        time.sleep(0.01)
        fs.store.flusher.flush()
        res = fs.store.delete_expired_files(now=time.time() + 10)
        assert res.commitlog_files
        assert len(ext.files) < files_before
        mf = sql_filter(fs, "G", "Old", "a < 500")
        lo = fs.store.get_min_offset("Old", 0)
        got = pull_all(fs.store, "Old", mf)
        assert got and got == [i for i in range(1500) if i >= lo and int(body[i]["a"]) < 500]
    finally:
        fs.close()


def test_scanned_pulls_count_false_positives_as_the_loop_does(fs, monkeypatch):
    """Bitmap hits that fail on the record (many groups share the Bloom bits): C's scan
    (speedups.scan_records) serves and counts exactly as the record-by-record loop."""
    from dataclasses import asdict

    from sluice.speedups import C
    from sluice.store import pull_read
    if C is None:
        pytest.skip("the C extension is not built")
    for g in range(40):
        register(fs, f"Other{g}", "Fp", f"a >= {25 * g} AND region = 'eu'")
    register(fs, "G", "Fp", "a < 300 AND odd > 1")  # odd is "abc" or absent: an error or NULL
    put(fs.store, "Fp", [props_of(i) for i in range(3000)])

    def run() -> tuple[list[int], dict]:
        m = fs.manager.metrics_of("G", "Fp")
        before = asdict(m)
        got = pull_all(fs.store, "Fp", sql_filter(fs, "G", "Fp", "a < 300 AND odd > 1"))
        after = asdict(m)
        return got, {k: after[k] - before[k] for k in after if k != "last_error"} | {"last": after["last_error"]}
    fast = run()
    with monkeypatch.context() as mp:
        mp.setattr(pull_read, "C", None)
        slow = run()
    assert fast == slow
    assert fast[1]["bitmap_false_positives"] > 0 and fast[1]["evaluated"] > len(fast[0])


class _Resolving(SelectorFilter):
    """The same filter made to take the units' resolved ext rows (the store's path before needs_units)."""

    __slots__ = ()

    @property
    def needs_units(self) -> bool:
        return True


def test_which_filters_need_the_units_ext_rows(fs):
    register(fs, "G", "N", "a < 100")
    assert sql_filter(fs, "G", "N", "a < 100").needs_units  # Bloom data: the bitmaps are read
    assert not sql_filter(fs, "G", "N", "a < 100", bloom=False).needs_units  # catching up: every record
    assert SelectorFilter(compile_selector("TAG", "TagA")).for_pull().needs_units  # tag codes


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 10_000), expr=st.sampled_from(EXPRS), n=st.integers(1, 600),
       max_msgs=st.sampled_from([1, 7, 32, 300]), budget=st.sampled_from([0, 5, 64]))
def test_a_catch_up_pull_without_the_ext_rows_is_the_pull_with_them(tmp_path_factory, monkeypatch, seed, expr, n,
                                                                    max_msgs, budget):
    """A SQL92 filter without Bloom data on a topic whose units point at ext rows (other groups' bitmaps)
    reads no ext row, and every answer and counter is the one the resolving twin gets."""
    import sluice.store.pull_read as pull_read

    fs = FilteredStore(tmp_path_factory.mktemp("units") / "s")
    try:
        register(fs, "Other", "U", "a < 500")  # bitmaps for someone else: every unit has an ext address
        put(fs.store, "U", [props_of(i, random.Random(seed + i)) for i in range(n)])
        assert is_ext_address_array(tag_slots(fs, "U")).all()
        resolved = [0]
        real = pull_read.resolve_units

        def counting(*a):  # type: ignore[no-untyped-def]
            resolved[0] += 1
            return real(*a)
        monkeypatch.setattr(pull_read, "resolve_units", counting)
        sel = compile_selector("SQL92", expr)
        outcomes = []
        for cls in (SelectorFilter, _Resolving):
            resolved[0] = 0
            base = cls(sel)
            seen, off = [], 0
            while True:
                mf = cls(sel, like=base)  # as for_pull makes a pull's copy, without Bloom data
                mf.metrics = fs.manager.metrics_of(cls.__name__, "U")
                mf.max_evaluations = budget
                res = fs.store.get_messages("U", 0, off, max_msgs, mf)
                seen.append((res.status, res.next_begin_offset, res.queue_offsets, res.records_read))
                if res.next_begin_offset >= n or res.next_begin_offset == off:
                    break
                off = res.next_begin_offset
            m = fs.manager.metrics_of(cls.__name__, "U")
            outcomes.append((seen, m.evaluated, m.matched, m.errors))
            assert (resolved[0] == 0) is (cls is SelectorFilter)
        assert outcomes[0] == outcomes[1]
    finally:
        fs.close()
