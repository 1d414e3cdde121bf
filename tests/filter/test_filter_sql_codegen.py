"""Code generation details of the compiled evaluator: lazily fetched properties, nested-conditional
AND/OR of simple terms, the parse caches, and that each agrees with the interpreter exhaustively."""
from __future__ import annotations

import itertools
from collections.abc import Iterator

import pytest

from sluice.filter import FilterEvaluationError
from sluice.filter import sql_runtime as rt
from sluice.filter.sql import SqlSelector
from sluice.filter.sql_codegen import _ParseCache, lazy_props
from sluice.filter.sql_parser import parse

ERR = "error"


class Recording(dict):  # type: ignore[type-arg]
    """A message whose property lookups are recorded."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        self.fetched: list[str] = []

    def get(self, key: str, default: object = None) -> object:  # type: ignore[override]
        self.fetched.append(key)
        return super().get(key, default)


def outcome(fn, props):  # type: ignore[no-untyped-def]
    try:
        return fn(props)
    except FilterEvaluationError:
        return ERR


# Simple terms (NULL exactly when their property is missing), two of which make an AND/OR of nested
# conditionals; the values cover missing, matching, not matching and not parsing.
SIMPLE = ["{p} IN ('x', 'y')", "{p} NOT IN ('x')", "{p} = 'x'", "{p} > 5", "5 > {p}", "{p} <= 3000000000",
          "{p} > 1.5", "{p} < 0.0", "{p} = TRUE", "{p} BETWEEN 1 AND 9", "{p} NOT BETWEEN 1 AND 9"]
VALUES = [None, "x", "y", "5", "7", "-1", "abc", "1.5", "NaN", "true", "3000000000", "0"]


def simple_pairs() -> Iterator[str]:
    for left, right in itertools.product(SIMPLE, repeat=2):
        for op in ("AND", "OR"):
            yield f"{left.format(p='a')} {op} {right.format(p='b')}"


@pytest.mark.parametrize("expression", list(simple_pairs()))
def test_simple_pairs_agree_with_interpreter(expression: str) -> None:
    selector = SqlSelector(expression)
    for a, b in itertools.product(VALUES, repeat=2):
        props = {k: v for k, v in (("a", a), ("b", b)) if v is not None}
        expected = outcome(selector.interpret, props)
        assert outcome(selector.evaluate, props) == expected, (props, selector.source)
        assert selector.matches(props) is (expected is True), (props, selector.source)


def test_simple_pair_uses_nested_conditionals_without_temporaries() -> None:
    source = SqlSelector("a IN ('x') AND b = 'y'").source.split("def _matches")[0]
    assert ":= p.get('a')" in source and ":= p.get('b')" in source
    assert "t1" not in source


def test_unreached_properties_are_not_fetched() -> None:
    selector = SqlSelector("(a = 'x' AND b > 5) OR (c IN ('z') AND d BETWEEN 1 AND 9)")
    for props, fetched in [({"a": "y", "c": "q"}, ["a", "c"]),
                           ({"a": "x", "b": "6"}, ["a", "b"]),
                           ({"a": "x", "b": "4", "c": "z", "d": "3"}, ["a", "b", "c", "d"])]:
        for fn in (selector.evaluate, selector.matches):
            message = Recording(props)
            fn(message)
            assert message.fetched == fetched, (fn, props)


def test_properties_read_twice_are_loaded_once_up_front() -> None:
    assert lazy_props(parse("a > 5 OR a = 'x'")) == set()
    assert lazy_props(parse("a > 5 OR a < 2")) == {"a"}  # NOT BETWEEN: one fused test
    assert lazy_props(parse("a BETWEEN 1 AND 5 OR b = 'x'")) == {"a", "b"}
    assert lazy_props(parse("a = b OR c IS NULL")) == {"c"}
    assert lazy_props(parse("-a = 5 OR a = 'x'")) == set()
    selector = SqlSelector("a > 5 OR a = 'x'")
    assert "v0 = p.get('a')" in selector.source
    assert selector.evaluate({"a": "9"}) is True and selector.evaluate({}) is None


def test_mapping_without_get_is_an_evaluation_error() -> None:
    selector = SqlSelector("a IN ('x') AND b > 5")
    with pytest.raises(FilterEvaluationError):
        selector.evaluate([])  # type: ignore[arg-type]
    assert selector.matches([]) is False  # type: ignore[arg-type]


def test_wide_expressions_compile_linearly() -> None:
    terms = [f"p{i} IN ('x') AND q{i} > {i}" for i in range(200)]
    selector = SqlSelector(" OR ".join(f"({t})" for t in terms))
    assert len(selector.source) < 200 * 1000
    props = {"p199": "x", "q199": "200"}
    assert selector.evaluate(props) is True and selector.interpret(props) is True


def test_parse_cache_is_bounded_and_does_not_store_failures() -> None:
    cache = _ParseCache(rt.parse_int)
    assert cache["42"] == 42 and cache[" 7".strip()] == 7
    with pytest.raises(FilterEvaluationError):
        cache["abc"]
    assert "abc" not in cache
    for i in range(70_000):
        cache[str(i)]
    assert 0 < len(cache) <= 65536
    assert cache["69999"] == 69999


def test_error_after_a_null_term_is_no_match_even_if_a_later_term_is_true() -> None:
    # The three-valued AND goes on past NULL (a missing) and fails on b: RocketMQ delivers nothing.
    selector = SqlSelector("(a = 'q' AND b > 5) OR c = 'z'")
    props = {"b": "abc", "c": "z"}
    with pytest.raises(FilterEvaluationError):
        selector.interpret(props)
    assert selector.matches(props) is False
    assert selector.matches({"c": "z"}) is True and selector.matches({"a": "q", "b": "6"}) is True


LEAVES = ["{p} IN ('x')", "{p} > 5", "{p} IS NULL", "{p} BETWEEN 1 AND 9", "{p} = 5", "{p} < 1.5"]
SHAPES = ["({0} AND {1}) OR {2}", "({0} AND {1} AND {2}) OR {0}", "NOT (({0} AND {1}) OR {2})",
          "(({0} OR {1}) AND {2}) OR {1}", "({0} AND ({1} OR {2})) OR {0}"]
FEW_VALUES = [None, "x", "7", "abc", "3", "NaN"]


@pytest.mark.parametrize("shape", SHAPES)
def test_and_or_shapes_agree_with_interpreter(shape: str) -> None:
    for leaves in itertools.product(LEAVES, repeat=3):
        expression = shape.format(*(leaf.format(p=p) for leaf, p in zip(leaves, "abc")))
        selector = SqlSelector(expression)
        for values in itertools.product(FEW_VALUES, repeat=3):
            props = {k: v for k, v in zip("abc", values) if v is not None}
            expected = outcome(selector.interpret, props)
            assert outcome(selector.evaluate, props) == expected, (expression, props, selector.source)
            assert selector.matches(props) is (expected is True), (expression, props, selector.source)


def test_deep_alternating_and_or_compiles_at_the_depth_limit() -> None:
    from sluice.filter.limits import SelectorLimits
    expression = "a > 1"
    for i in range(40):
        expression = f"(({expression}) AND b{i} IN ('x')) OR c{i} > 2" if i % 2 else f"({expression}) OR b{i} = 'y'"
    try:
        selector = SqlSelector(expression, limits=SelectorLimits(max_depth=90))
    except Exception as exc:  # refused by the depth limit is fine; nothing else is
        from sluice.errors import SelectorSyntaxError
        assert isinstance(exc, SelectorSyntaxError), exc
        return
    assert len(selector.source) < 100_000
    for props in ({"a": "2"}, {"a": "0", "c39": "3"}, {"a": "abc", "b0": "y"}, {}):
        assert outcome(selector.evaluate, props) == outcome(selector.interpret, props)
        assert selector.matches(props) is (outcome(selector.interpret, props) is True)
