"""Hypothesis: the compiled evaluator agrees with the tree-walking interpreter on generated
expressions and messages (results and evaluation errors), and no input crashes the compiler."""
from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sluice.filter import FilterEvaluationError, SelectorSyntaxError, compile_selector
from sluice.filter.sql import SqlSelector

PROPS = ["a", "b", "c"]
VALUES = ["10", "5", "-3", "abc", "true", "TRUE", "false", "1.5", "NaN", "Infinity", "0x10p0", " 5", "+7",
          "007", "3000000000", "x", "xa", "ax", "0", "-0.0", "0.0", "1e1", "10d", "٣"]

prop = st.sampled_from(PROPS)
number = st.sampled_from(["0", "5", "10", "2147483647", "2147483648", "3000000000", "1.5", "0.0", "5.", ".5",
                          "1e1", "5L"])
string = st.sampled_from(["'x'", "'10'", "'true'", "'abc'", "''", "'5'", "'1.5'"])
literal = st.one_of(number, string, st.sampled_from(["TRUE", "FALSE", "NULL"]))


def _value(children: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    return st.one_of(
        children.map(lambda v: f"-{v}"),
        children.map(lambda v: f"({v})"),
    )


values = st.recursive(st.one_of(prop, literal), _value, max_leaves=3)


def _pred_leaf() -> st.SearchStrategy[str]:
    cmp = st.tuples(values, st.sampled_from(["=", "<>", ">", ">=", "<", "<="]), values).map(" ".join)
    between = st.tuples(values, st.sampled_from(["BETWEEN", "NOT BETWEEN"]), values, values).map(
        lambda t: f"{t[0]} {t[1]} {t[2]} AND {t[3]}")
    in_list = st.tuples(prop, st.sampled_from(["IN", "NOT IN"]), st.lists(string, min_size=1, max_size=3)).map(
        lambda t: f"{t[0]} {t[1]} ({', '.join(t[2])})")
    strop = st.tuples(values, st.sampled_from(["CONTAINS", "NOT CONTAINS", "STARTSWITH", "NOT STARTSWITH",
                                               "ENDSWITH", "NOT ENDSWITH"]), string).map(" ".join)
    isnull = st.tuples(values, st.sampled_from(["IS NULL", "IS NOT NULL"])).map(" ".join)
    return st.one_of(cmp, between, in_list, strop, isnull, prop, st.sampled_from(["TRUE", "FALSE", "NULL"]))


def _pred_node(children: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    return st.one_of(
        children.map(lambda p: f"NOT ({p})"),
        children.map(lambda p: f"NOT {p}"),
        st.tuples(children, st.sampled_from(["AND", "OR"]), children).map(" ".join),
        children.map(lambda p: f"({p})"),
        st.tuples(children, st.sampled_from(["=", "<>"]), st.sampled_from(["TRUE", "FALSE"])).map(" ".join),
        st.tuples(st.sampled_from(["TRUE", "FALSE"]), st.sampled_from(["=", "<>"]), children).map(" ".join),
        children.map(lambda p: f"({p}) IS NULL"),
        children.map(lambda p: f"({p}) CONTAINS 'x'"),
    )


predicates = st.recursive(_pred_leaf(), _pred_node, max_leaves=6)
messages = st.dictionaries(st.sampled_from(PROPS), st.sampled_from(VALUES), max_size=3)


def outcome(evaluate, props):  # type: ignore[no-untyped-def]
    try:
        return evaluate(props)
    except FilterEvaluationError:
        return "error"


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(predicates, st.lists(messages, min_size=1, max_size=6))
def test_compiled_matches_interpreter(expression: str, batch: list[dict[str, str]]) -> None:
    try:
        selector = SqlSelector(expression)
    except SelectorSyntaxError:
        return
    expected = [outcome(selector.interpret, props) for props in batch]
    assert [outcome(selector.evaluate, props) for props in batch] == expected, selector.source
    assert [selector.matches(props) for props in batch] == [e is True for e in expected]
    assert selector.matches_batch(batch).tolist() == [e is True for e in expected]


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("ab01.5'()=<>!-+ ,eLxNOTANDORISNULLINBETWEEN\n/*")), max_size=40))
def test_any_text_compiles_or_raises_syntax_error(text: str) -> None:
    try:
        selector = compile_selector("SQL92", text)
    except SelectorSyntaxError as err:
        assert err.position is not None and 0 <= err.position <= len(text)
        return
    for props in ({}, {"a": "1"}, {"a": "x", "b": "0"}):
        assert outcome(selector.evaluate, props) == outcome(selector.interpret, props)
        assert selector.matches(props) in (True, False)


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=30))
def test_arbitrary_unicode_never_crashes(text: str) -> None:
    try:
        compile_selector("SQL92", text)
    except SelectorSyntaxError as err:
        assert err.position is not None


@settings(max_examples=300, deadline=None)
@given(predicates)
def test_no_prefix_is_accepted_as_the_whole(expression: str) -> None:
    """Strict parsing: appending a stray token never leaves a shorter expression accepted."""
    for junk in (" b", " 1", " )", " 'x'"):
        try:
            compile_selector("SQL92", expression + junk)
        except SelectorSyntaxError:
            continue
        raise AssertionError(f"{expression + junk!r} was accepted")
