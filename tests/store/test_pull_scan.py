"""Pull-time SQL92 through C (speedups.scan_records: values judged once per distinct combination) equals the
record-by-record Python loop (store/pull_read.py _read_each, the reference).

Every pull runs both ways on the same store with the broker's filter (broker/filtering.py SelectorFilter)
and must give the same GetMessageResult (records, offsets, next offset, status, counters), the same
evaluation budget left and the same FilterMetrics (evaluated, matched, errors, last error). Records have
random properties (missing ones, values that do not parse as numbers, non-ASCII ones); some examples patch
the stored properties bytes (duplicate names, separators, invalid UTF-8) to reach the parser's odd cases.
"""
from __future__ import annotations

import random
from dataclasses import asdict

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from store_testlib import msg, small_config

from sluice.broker.filter_data import FilterMetrics
from sluice.broker.filtering import SelectorFilter
from sluice.errors import CorruptRecordError
from sluice.filter import compile_selector
from sluice.format import C_FORMAT
from sluice.speedups import C
from sluice.store import MessageStore, pull_read
from sluice.store.types import GetMessageStatus as S

pytestmark = pytest.mark.skipif(C is None, reason="the C extension is not built")

SEGMENT = 128 * 1024  # small segments: a pull's records span several files
HEAD_V4 = C_FORMAT["HEAD_V4"]  # a record's fixed part with IPv4 hosts: the body follows
N = 240
REGIONS = ["eu", "us", "ap", "é∂", "e"]
A_VALUES = ["1", "50", "99", "49", "abc", "-3", "1.5", " 7", "99999999999999999999", "0x10", "5e1", ""]

ATOMS = ["region = 'eu'", "region <> 'us'", "a >= 50", "a < 10", "a = 1.5", "a BETWEEN 40 AND 60",
         "b IS NULL", "b IS NOT NULL", "region IN ('eu', 'ap')", "region NOT IN ('eu')", "TAGS = 'TagA'",
         "b = 'x'", "a > b", "c = TRUE", "c = FALSE", "a <> 3"]


def selectors() -> st.SearchStrategy[str]:
    atom = st.sampled_from(ATOMS)
    return st.recursive(atom, lambda inner: st.one_of(
        st.tuples(inner, st.sampled_from([" AND ", " OR "]), inner).map(lambda t: f"({t[0]}{t[1]}{t[2]})"),
        inner.map(lambda s: f"NOT ({s})")), max_leaves=4)


def pull(store: MessageStore, base: SelectorFilter, offset: int, max_msgs: int, max_bytes: int | None,
         budget: int) -> dict:
    mf = base.for_pull(FilterMetrics())
    mf.max_evaluations = budget
    before = store.pull_records_read, store.pull_bytes_read
    try:
        out = asdict(store.get_messages("T", 0, offset, max_msgs, mf, max_bytes))
    except CorruptRecordError as e:
        out = {"error": str(e)}
    out["counted"] = (store.pull_records_read - before[0], store.pull_bytes_read - before[1])
    out["metrics"] = asdict(mf.metrics)
    return out


def both_ways(store, monkeypatch, expression: str, *args) -> tuple[dict, dict]:
    """The same pull through C and through the Python loop (each with a fresh filter and metrics)."""
    base = SelectorFilter(compile_selector("SQL92", expression))
    assert base.record_keys is not None
    fast = pull(store, base, *args)
    with monkeypatch.context() as m:
        m.setattr(pull_read, "C", None)
        slow = pull(store, SelectorFilter(compile_selector("SQL92", expression)), *args)
    return fast, slow


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory):
    rng = random.Random(15)
    s = MessageStore(tmp_path_factory.mktemp("scan") / "store",
                     small_config(commitlog_file_size=SEGMENT, max_message_size=32 * 1024))
    s.start()
    puts = []
    for i in range(N):
        props = {"TAGS": rng.choice(["TagA", "TagB"]), "n": str(i)}
        if rng.random() < 0.9:
            props["region"] = rng.choice(REGIONS)
        if rng.random() < 0.9 and (a := rng.choice(A_VALUES)):
            props["a"] = a
        if rng.random() < 0.3:
            props["b"] = rng.choice(["x", "y"])
        if rng.random() < 0.3:
            props["c"] = rng.choice(["true", "false", "TRUE", "1"])
        puts += s.put_messages([msg(body=b"%d" % i * rng.choice([3, 300, 3000, 9000]), **props)])
    s.wait_dispatched()
    s.test_puts = puts
    yield s
    s.close()


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(expression=selectors(), offset=st.integers(0, N - 1), max_msgs=st.integers(1, 64),
       max_bytes=st.one_of(st.none(), st.integers(1, 200_000)), budget=st.sampled_from([0, 0, 1, 5, 40]))
def test_scan_equals_the_loop(store, monkeypatch, expression, offset, max_msgs, max_bytes, budget) -> None:
    fast, slow = both_ways(store, monkeypatch, expression, offset, max_msgs, max_bytes, budget)
    assert fast == slow


PATCH_BYTES = st.sampled_from([b"\x01", b"\x02", b"r", b"a", b"e", b"u", b"\xff", b"\xc3", b"5"])


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(expression=selectors(), victims=st.lists(st.integers(0, 39), min_size=1, max_size=3),
       where=st.integers(0, 10_000), patch=st.lists(PATCH_BYTES, min_size=1, max_size=4))
def test_odd_properties_bytes_equal_the_loop(store, monkeypatch, expression, victims, where, patch) -> None:
    """Bytes of the stored properties overwritten (the body CRC does not cover them): duplicate or empty
    names, stray separators, invalid UTF-8; both ways decide (or refuse) the same."""
    saved = []
    try:
        for v in victims:
            put = store.test_puts[v]
            f = store.commitlog.queue.find(put.commitlog_offset)
            rec = put.commitlog_offset - f.start
            body_len = int.from_bytes(f.mm[rec + HEAD_V4 - 4:rec + HEAD_V4], "big")
            tpos = rec + HEAD_V4 + body_len
            ppos = tpos + 1 + f.mm[tpos] + 2
            plen = put.size - (ppos - rec)
            data = b"".join(patch)[:plen]
            at = ppos + where % max(1, plen - len(data) + 1)
            saved.append((f, at, bytes(f.mm[at:at + len(data)])))
            f.mm[at:at + len(data)] = data
        fast, slow = both_ways(store, monkeypatch, expression, 0, 32, None, 0)
        assert fast == slow
    finally:
        for f, at, old in reversed(saved):
            f.mm[at:at + len(old)] = old


def test_duplicate_names_take_the_last_value(store, monkeypatch) -> None:
    """A record's ``n`` part renamed to ``b`` ahead of its own ``b``: the later ``b`` is the value."""
    for qoff, put in enumerate(store.test_puts):
        f = store.commitlog.queue.find(put.commitlog_offset)
        at = put.commitlog_offset - f.start
        rec = bytes(f.mm[at:at + put.size])
        if b"\x02b\x01" in rec:
            break
    n_part = b"n\x01%d\x02" % qoff
    assert rec.index(n_part) < rec.index(b"\x02b\x01")  # n is written before b
    pos = at + rec.index(n_part)
    old = bytes(f.mm[pos:pos + len(n_part)])
    try:
        f.mm[pos:pos + len(n_part)] = b"b\x01" + b"z" * (len(n_part) - 3) + b"\x02"
        first = "z" * (len(n_part) - 3)
        for expr in (f"b = '{first}'", "b = 'x'", "b = 'y'"):
            fast, slow = both_ways(store, monkeypatch, expr, qoff, 1, None, 0)
            assert fast == slow
            if expr == f"b = '{first}'":
                assert qoff not in fast["queue_offsets"]
    finally:
        f.mm[pos:pos + len(n_part)] = old


def test_budget_and_errors_are_counted_per_record(store, monkeypatch) -> None:
    fast, slow = both_ways(store, monkeypatch, "a >= 50", 0, 64, None, 25)
    assert fast == slow
    assert fast["metrics"]["evaluated"] == 25 and fast["next_begin_offset"] <= 25
    fast, slow = both_ways(store, monkeypatch, "a >= 50", 0, 500, None, 0)
    assert fast == slow and fast["metrics"]["errors"] > 0 and fast["metrics"]["last_error"]


def test_records_across_segments_and_removed_ones(tmp_path, monkeypatch) -> None:
    s = MessageStore(tmp_path / "s", small_config(commitlog_file_size=SEGMENT, max_message_size=32 * 1024))
    s.start()
    try:
        for i in range(24):
            s.put_messages([msg(body=b"x" * 15000, region="eu" if i % 3 else "us", n=str(i))])
        s.wait_dispatched()
        fast, slow = both_ways(s, monkeypatch, "region = 'eu'", 0, 32, None, 0)
        assert fast == slow and len(fast["sizes"]) == 16
        s.commitlog.queue.delete_first(1)  # retention took the oldest segment; the queue still points into it
        for offset in (0, 1, 7, 8, 9):
            fast, slow = both_ways(s, monkeypatch, "region = 'eu'", offset, 8, None, 0)
            assert fast == slow
    finally:
        s.close()


def test_a_damaged_record_stops_both_ways_alike(tmp_path, monkeypatch) -> None:
    s = MessageStore(tmp_path / "s", small_config())
    s.start()
    try:
        res = s.put_messages([msg(body=b"%03d" % i * 100, region="eu") for i in range(10)])
        s.wait_dispatched()
        bad = res[4]
        f = s.commitlog.queue.find(bad.commitlog_offset)
        f.mm[bad.commitlog_offset - f.start + HEAD_V4 + 5] ^= 0xFF  # a byte inside the body
        fast, slow = both_ways(s, monkeypatch, "region = 'eu'", 0, 32, None, 0)
        assert fast == slow
        assert fast["queue_offsets"] == [0, 1, 2, 3] and fast["next_begin_offset"] == 4
        fast, slow = both_ways(s, monkeypatch, "region = 'eu'", 4, 32, None, 0)
        assert fast == slow and "CRC" in fast["error"]
    finally:
        s.close()


def test_a_damaged_body_the_filter_turns_down_is_passed_over_both_ways(tmp_path, monkeypatch) -> None:
    """A record read only for its properties is not served, so its body CRC is not its pull's business
    (the CRC does not cover the properties); a served one is still checked."""
    s = MessageStore(tmp_path / "s", small_config())
    s.start()
    try:
        res = s.put_messages([msg(body=b"%03d" % i * 100, region="us" if i in (3, 4) else "eu")
                              for i in range(10)])
        s.wait_dispatched()
        for bad in (res[3], res[6]):  # one the filter turns down, one it passes
            f = s.commitlog.queue.find(bad.commitlog_offset)
            f.mm[bad.commitlog_offset - f.start + HEAD_V4 + 5] ^= 0xFF
        fast, slow = both_ways(s, monkeypatch, "region = 'eu'", 0, 32, None, 0)
        assert fast == slow
        assert fast["queue_offsets"] == [0, 1, 2, 5] and fast["next_begin_offset"] == 6
        assert fast["metrics"]["evaluated"] == 7  # 0..6: the damaged 6 passes, then its CRC stops the pull
        fast, slow = both_ways(s, monkeypatch, "region = 'eu'", 6, 32, None, 0)
        assert fast == slow and "CRC" in fast["error"]
        fast, slow = both_ways(s, monkeypatch, "region = 'us'", 0, 32, None, 0)
        assert fast == slow and "CRC" in fast["error"]  # 3 is served to this group: refused, named
        fast, slow = both_ways(s, monkeypatch, "region = 'us'", 4, 32, None, 0)
        assert fast == slow and fast["queue_offsets"] == [4]  # 6 turned down: its body is not read
    finally:
        s.close()


def test_an_ipv6_record_is_judged_by_the_python_step(tmp_path, monkeypatch) -> None:
    s = MessageStore(tmp_path / "s", small_config())
    s.start()
    try:
        for i in range(6):
            m = msg(body=b"b", region="eu" if i % 2 else "us")
            if i == 3:
                m.born_host = ("::1", 9)
            s.put_messages([m])
        s.wait_dispatched()
        fast, slow = both_ways(s, monkeypatch, "region = 'eu'", 0, 32, None, 0)
        assert fast == slow and fast["queue_offsets"] == [1, 3, 5]
        assert fast["status"] is S.FOUND
    finally:
        s.close()


def test_scan_records_refuses_misshapen_arguments() -> None:
    import numpy as np

    from sluice.format import crc32
    from sluice.store.consumequeue import CQ_DTYPE
    units = np.zeros(2, dtype=CQ_DTYPE)

    def call(wanted, ev, names=(b"a",)):  # type: ignore[no-untyped-def]
        return C.scan_records(units, 0, wanted, bytes(2), b"", 0, 0, 0, 32, 1 << 20, 0, 0, -1, True, crc32, 0,
                              [], [], [], names, C.verdict_cache(8), lambda v: 1, ev, ev)
    with pytest.raises(ValueError, match="a byte per unit"):
        call(bytes(3), np.zeros(2, np.int32))
    with pytest.raises(ValueError, match="int32 per unit"):
        call(bytes(2), np.zeros(1, np.int32))
    with pytest.raises(TypeError, match="names must be bytes"):
        call(bytes(2), np.zeros(2, np.int32), ("a",))
    assert call(bytes(2), np.zeros(2, np.int32))[1:3] == (2, 0)  # nothing wanted: units exhausted


def test_the_verdict_cache_is_bounded_and_refills(store, monkeypatch) -> None:
    """A cache that is full starts afresh: the pulls stay the same, only judged again."""
    monkeypatch.setattr(pull_read, "MAX_VERDICTS", 3)
    base = SelectorFilter(compile_selector("SQL92", "a >= 50 OR b IS NULL"))
    base.record_verdicts = pull_read.verdict_cache()
    calls = []
    judge = SelectorFilter.judge
    monkeypatch.setattr(SelectorFilter, "judge", lambda self, values: calls.append(values) or judge(self, values))
    fast = pull(store, base, 0, 64, None, 0)
    assert C.verdict_cache_len(base.record_verdicts) <= 3
    with monkeypatch.context() as m:
        m.setattr(pull_read, "C", None)
        slow = pull(store, SelectorFilter(compile_selector("SQL92", "a >= 50 OR b IS NULL")), 0, 64, None, 0)
    assert fast == slow
    assert len(calls) > len(set(calls))  # combinations judged again after the cache emptied
    with pytest.raises(ValueError):
        C.verdict_cache(0)


def test_a_selector_reading_many_properties_is_evaluated_per_record(store, monkeypatch) -> None:
    expression = " OR ".join(f"p{i} = 'x'" for i in range(pull_read.MAX_RECORD_KEYS)) + " OR region = 'eu'"
    called = []
    monkeypatch.setattr(C, "scan_records", lambda *a: called.append(1))
    fast, slow = both_ways(store, monkeypatch, expression, 0, 32, None, 0)
    assert fast == slow and fast["status"] is S.FOUND and not called
