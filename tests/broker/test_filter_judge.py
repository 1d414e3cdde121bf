"""SelectorFilter's judge/settle hooks (the store's scan path, store/pull_read.py): verdicts per value
combination and per-record counters that equal match_record_at's."""
from __future__ import annotations

import numpy as np

from sluice.broker import filtering
from sluice.broker.filter_data import FilterMetrics
from sluice.broker.filtering import SelectorFilter
from sluice.filter import compile_selector
from sluice.speedups import C


def sql(expr: str) -> SelectorFilter:
    return SelectorFilter(compile_selector("SQL92", expr))


def test_record_keys_name_the_properties_read() -> None:
    assert sql("region = 'eu' AND a >= 50").record_keys == (b"region", b"a")
    assert sql("b = 'x' OR TAGS IS NULL OR b > 3").record_keys == (b"b", b"TAGS")
    assert SelectorFilter(compile_selector("TAG", "TagA || TagB")).record_keys is None


def test_judge_and_settle_count_as_match_record_at() -> None:
    values = [("eu", "60"), ("eu", "10"), ("us", "70"), (None, "60"), ("eu", "abc"), ("eu", None), ("eu", "x")]
    by_record = sql("region = 'eu' AND a >= 50").for_pull(FilterMetrics())
    want = [by_record.match_record_at(i, {k: v for k, v in zip(("region", "a"), vs) if v is not None})
            for i, vs in enumerate(values)]
    judged = sql("region = 'eu' AND a >= 50").for_pull(FilterMetrics())
    verdicts = np.array([judged.judge(vs) for vs in values], dtype=np.int32)
    assert [v == 1 for v in verdicts] == want == [True, False, False, False, False, False, False]
    judged.settle(np.arange(len(values), dtype=np.int32), verdicts)
    assert judged.metrics == by_record.metrics and by_record.metrics.errors == 2
    assert judged.metrics.last_error == by_record.metrics.last_error and "x" in judged.metrics.last_error


def test_pull_copies_share_the_verdict_cache_until_too_many_errors(monkeypatch) -> None:
    base = sql("a > 1")
    one, two = base.for_pull(), base.for_pull()
    assert one.record_verdicts is two.record_verdicts is base.record_verdicts
    assert (base.record_verdicts is None) == (C is None)
    monkeypatch.setattr(filtering, "MAX_MESSAGES", 2)
    for v in ("x", "y", "z"):
        assert one.judge((v,)) >= 2  # an evaluation error each
    three = base.for_pull()
    assert three._messages == [] and three._messages is base._messages
    assert len(one._messages) == 3  # a pull under way keeps its own
    if C is not None:
        assert three.record_verdicts is not one.record_verdicts


def test_subscriptions_of_one_expression_share_verdicts(monkeypatch) -> None:
    """A new subscription of an expression (a new group, a new sub_version) finds the verdicts an earlier one
    judged; another expression has its own; the shared verdicts are bounded in expressions."""
    monkeypatch.setattr(filtering, "_shared_verdicts", filtering.OrderedDict())
    first, again, other = sql("region = 'eu' AND a >= 50"), sql("region = 'eu' AND a >= 50"), sql("a >= 50")
    assert again.record_verdicts is first.record_verdicts and again._messages is first._messages
    assert other._messages is not first._messages
    assert (first.record_verdicts is None) == (C is None)
    if C is not None:
        assert other.record_verdicts is not first.record_verdicts
    code = first.for_pull().judge(("eu", "x"))  # an evaluation error: its message is found by the other
    assert code >= 2 and "x" in again._messages[code - 2]
    tag = SelectorFilter(compile_selector("TAG", "TagA"))
    assert tag.record_verdicts is None and tag._shared is None
    monkeypatch.setattr(filtering, "MAX_SHARED_VERDICTS", 2)
    sql("b = 'x'")
    assert [k[1] for k in filtering._shared_verdicts] == ["a >= 50", "b = 'x'"]  # the least recent dropped


def test_starting_afresh_is_shared_with_later_subscriptions(monkeypatch) -> None:
    monkeypatch.setattr(filtering, "_shared_verdicts", filtering.OrderedDict())
    monkeypatch.setattr(filtering, "MAX_MESSAGES", 1)
    base = sql("a > 1")
    pull = base.for_pull()
    for v in ("x", "y"):
        assert pull.judge((v,)) >= 2
    fresh = base.for_pull()
    assert fresh._messages == [] and fresh._messages is base._messages
    later = sql("a > 1")
    assert later._messages is base._messages and later.record_verdicts is base.record_verdicts
