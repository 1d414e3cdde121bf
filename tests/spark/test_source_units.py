"""The broker source's planning pieces without Spark or a broker: read limits, range splits, pushdown."""
from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

pytest.importorskip("pyspark")

from pyspark.sql.datasource import EqualTo, GreaterThan, GreaterThanOrEqual, In, IsNotNull, LessThan  # noqa: E402

from sluice.errors import InvalidParameterError  # noqa: E402
from sluice.filter import compile_selector  # noqa: E402
from sluice.spark.source import Options, Pushdown, QueueRange, _unique_key, fair_limit, split_ranges  # noqa: E402


@given(st.dictionaries(st.sampled_from(["b:0", "b:1", "b:2", "c:0"]), st.tuples(st.integers(0, 50),
                                                                                 st.integers(0, 200)), min_size=1),
       st.integers(1, 300))
def test_fair_limit_caps_total_and_never_passes_latest(queues, max_rows):
    start = {k: s for k, (s, _) in queues.items()}
    end = {k: s + n for k, (s, n) in queues.items()}
    got = fair_limit(start, end, max_rows)
    taken = {k: got[k] - start[k] for k in end}
    assert all(0 <= taken[k] <= end[k] - start[k] for k in end)
    assert sum(taken.values()) == min(max_rows, sum(end[k] - start[k] for k in end))
    # fair: a queue gets less than another only when its own backlog ran out (shares differ by at most 1)
    short = [k for k in end if taken[k] < end[k] - start[k]]
    if short:
        assert max(taken.values()) - min(taken[k] for k in short) <= 1


def test_split_ranges_covers_exactly():
    ranges = [QueueRange("b", 0, 0, 1000), QueueRange("b", 1, 5, 15), QueueRange("b", 2, 7, 7)]
    out = split_ranges(ranges, 8)
    assert len(out) >= 8
    for q, (s, e) in ((0, (0, 1000)), (1, (5, 15))):
        parts = sorted((r.start, r.end) for r in out if r.queue_id == q)
        assert parts[0][0] == s and parts[-1][1] == e
        assert all(a[1] == b[0] for a, b in zip(parts, parts[1:]))
    assert not [r for r in out if r.queue_id == 2]


def test_pushdown_keeps_only_exact_conjuncts():
    p = Pushdown()
    assert p.take(EqualTo(("tags",), "A")) and p.take(In(("tags",), ["A", "B"]))
    assert p.take(GreaterThanOrEqual(("queue_offset",), 3)) and p.take(LessThan(("queue_offset",), 9))
    assert p.take(GreaterThan(("queue_offset",), 4)) and p.take(IsNotNull(("queue_id",)))
    assert p.take(In(("queue_id",), [0, 2]))
    assert not p.take(EqualTo(("body",), b"x")) and not p.take(IsNotNull(("tags",)))
    assert not p.take(GreaterThan(("store_timestamp",), 5))
    assert (p.offset_lo, p.offset_hi, p.queue_ids) == (5, 9, frozenset([0, 2]))
    assert p.selector("TAG", "*") == ("TAG", "A")
    assert p.selector("TAG", "B || C") == ("TAG", None)  # empty intersection: nothing matches
    kind, expr = p.selector("SQL92", "a > 1")
    sel = compile_selector(kind, expr)
    assert sel.matches({"a": "2", "TAGS": "A"}) and not sel.matches({"a": "2", "TAGS": "B"})


def test_pushdown_tag_that_a_tag_subscription_cannot_carry_goes_sql():
    p = Pushdown()
    p.take(EqualTo(("tags",), " x||y"))
    kind, expr = p.selector("TAG", "*")
    assert kind == "SQL92" and compile_selector(kind, expr).matches({"TAGS": " x||y"})


def test_unique_keys_are_deterministic_and_distinct():
    assert _unique_key("q", 3, 1, 7) == _unique_key("q", 3, 1, 7)
    keys = {_unique_key("q", b, p, i) for b in range(3) for p in range(3) for i in range(50)}
    assert len(keys) == 450 and all(len(k) == 32 and k == k.upper() for k in keys)


def test_options_are_checked_on_the_driver():
    with pytest.raises(InvalidParameterError, match="namesrv"):
        Options({})
    with pytest.raises(InvalidParameterError, match="selectorType"):
        Options({"namesrv": "x:1", "topic": "T", "selectorType": "XPATH"})
    with pytest.raises(InvalidParameterError, match="maxOffsetsPerTrigger"):
        Options({"namesrv": "x:1", "topic": "T", "maxOffsetsPerTrigger": "lots"})
    with pytest.raises(Exception, match="SQL92"):
        Options({"namesrv": "x:1", "topic": "T", "selectorType": "SQL92", "selector": "a >"})


def test_a_sql92_selector_under_the_default_tag_type_is_refused_not_read_as_a_tag():
    """selectorType defaults to TAG; "region = 'eu'" as a tag expression would match nothing, silently."""
    with pytest.raises(InvalidParameterError, match="reads as SQL92.*selectorType=SQL92"):
        Options({"namesrv": "x:1", "topic": "T", "selector": "region = 'eu'"})
    with pytest.raises(InvalidParameterError, match="reads as SQL92"):
        Options({"namesrv": "x:1", "topic": "T", "selector": "TAGS IN ('A', 'B')"})
    # tag expressions, and a SQL92-looking one the user says is a tag, stay as they are
    for tags in ("TagA", "TagA || TagB", "*", "order.paid"):
        assert Options({"namesrv": "x:1", "topic": "T", "selector": tags}).selector == tags
    assert Options({"namesrv": "x:1", "topic": "T", "selectorType": "TAG", "selector": "a = b"}).selector == "a = b"
    assert Options({"namesrv": "x:1", "topic": "T", "selectorType": "SQL92",
                    "selector": "region = 'eu'"}).selector_type == "SQL92"


def test_store_timestamp_bounds_become_whole_milliseconds():
    import datetime

    utc = datetime.timezone.utc
    v = datetime.datetime(2026, 1, 1, 0, 0, 0, 1500, tzinfo=utc)  # 1.5 ms past a whole second
    ms = int(datetime.datetime(2026, 1, 1, tzinfo=utc).timestamp() * 1000)
    p = Pushdown()
    assert p.take(GreaterThanOrEqual(("store_timestamp",), v)) and p.ts_lo == ms + 2
    p = Pushdown()
    assert p.take(GreaterThan(("store_timestamp",), v)) and p.ts_lo == ms + 2
    p = Pushdown()
    assert p.take(LessThan(("store_timestamp",), v)) and p.ts_hi == ms + 2
    p = Pushdown()
    assert p.take(EqualTo(("store_timestamp",), v)) and (p.ts_lo, p.ts_hi) == (ms + 2, ms + 2)  # empty
    whole = datetime.datetime(2026, 1, 1, tzinfo=utc)
    p = Pushdown()
    assert p.take(EqualTo(("store_timestamp",), whole)) and (p.ts_lo, p.ts_hi) == (ms, ms + 1)
    assert not Pushdown().take(GreaterThan(("store_timestamp",), datetime.datetime(2026, 1, 1)))  # naive
    assert not Pushdown().take(GreaterThan(("born_timestamp",), whole))  # not ordered within a queue
