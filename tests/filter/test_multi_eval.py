"""The dispatcher's all-expressions-at-once evaluator agrees with each selector's own ``matches``."""
from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from test_filter_sql_property import messages, predicates  # the filter tests' strategies, in this folder

from sluice.errors import SelectorSyntaxError
from sluice.filter import compile_selector
from sluice.filter.sql_codegen import compile_multi


def _selectors(texts: list[str]):  # type: ignore[no-untyped-def]
    out = []
    for t in texts:
        try:
            out.append(compile_selector("SQL92", t))
        except SelectorSyntaxError:
            pass
    return out


@settings(max_examples=150, deadline=None)
@given(texts=st.lists(predicates, min_size=1, max_size=6), batch=st.lists(messages, min_size=1, max_size=8))
def test_multi_matches_each_selector(texts: list[str], batch: list[dict[str, str]]) -> None:
    _assert_agrees(_selectors(texts), batch)


def _assert_agrees(sels, batch: list[dict[str, str]]) -> None:  # type: ignore[no-untyped-def]
    """Bit i of the multi-evaluator's mask is each selector's own ``matches``, message by message."""
    if not sels:
        return
    multi = compile_multi([s.ast for s in sels])
    for props in batch:
        mask = multi(props)
        assert [bool(mask >> i & 1) for i in range(len(sels))] == [s.matches(props) for s in sels], props


# Predicate indexing (sql_codegen.generate_multi): expressions anchored on ``prop = 'literal'`` are only
# tested when the message's value is that literal. Many of them on one property, mixed with others,
# flipped equalities, ORs (not anchored) and values that miss every literal.
anchor_props = st.sampled_from(["a", "b"])
anchor_literals = st.sampled_from(["x", "10", "5", "", "abc", "x "])


@st.composite
def anchored(draw) -> str:  # type: ignore[no-untyped-def]
    p, lit = draw(anchor_props), draw(anchor_literals)
    eq = draw(st.sampled_from([f"{p} = '{lit}'", f"'{lit}' = {p}"]))
    shape = draw(st.sampled_from(["alone", "and", "and_first", "or"]))
    other = draw(predicates)
    return {"alone": eq, "and": f"{eq} AND ({other})", "and_first": f"({other}) AND {eq}",
            "or": f"{eq} OR ({other})"}[shape]


@settings(max_examples=150, deadline=None)
@given(texts=st.lists(anchored(), min_size=4, max_size=14), others=st.lists(predicates, max_size=3),
       batch=st.lists(messages, min_size=1, max_size=8))
def test_indexed_multi_matches_each_selector(texts: list[str], others: list[str],
                                             batch: list[dict[str, str]]) -> None:
    _assert_agrees(_selectors(texts + others), batch)


def test_indexing_is_used_for_many_anchored_expressions() -> None:
    from sluice.filter.sql_codegen import generate_multi
    sels = _selectors([f"region = 'r{g % 10}' AND price > {g}" for g in range(20)])
    src = generate_multi([s.ast for s in sels])
    assert "_IDX = {" in src and "k = _IDX.get(" in src
    multi = compile_multi([s.ast for s in sels])
    assert multi({"region": "r3", "price": "100"}) == (1 << 3) | (1 << 13)
    assert multi({"region": "r3", "price": "1.5"}) == 0  # does not parse as an int: no match, no error
    assert multi({"region": "zz", "price": "100"}) == 0
