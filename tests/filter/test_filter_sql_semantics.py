"""Evaluation semantics: Java conversions, NULL asymmetries, three-valued logic, explain, batches."""
from __future__ import annotations

import math

import numpy as np
import pytest

from sluice.filter import FilterEvaluationError, SqlSelector, compile_selector
from sluice.filter import sql_runtime as rt

ERR = "error"


def run(expression: str, props: dict[str, str]) -> object:
    selector = compile_selector("SQL92", expression)
    try:
        got = selector.evaluate(props)
    except FilterEvaluationError:
        got = ERR
    try:
        oracle = selector.interpret(props)
    except FilterEvaluationError:
        oracle = ERR
    assert got == oracle
    assert selector.matches(props) is (got is True)
    return got


@pytest.mark.parametrize(("text", "value"), [
    ("10", 10), ("+7", 7), ("-3", -3), ("007", 7), ("2147483647", 2**31 - 1), ("-2147483648", -(2**31)),
    ("٣", 3),
])
def test_parse_int_accepts(text: str, value: int) -> None:
    assert rt.parse_int(text) == value


@pytest.mark.parametrize("text", ["", "+", "-", " 10", "10 ", "10.0", "1e1", "abc", "2147483648", "1_0", "0x10",
                                  "\U0001d7ce"])
def test_parse_int_refuses(text: str) -> None:
    with pytest.raises(FilterEvaluationError):
        rt.parse_int(text)


def test_parse_long_range() -> None:
    assert rt.parse_long("3000000000") == 3_000_000_000
    with pytest.raises(FilterEvaluationError):
        rt.parse_long("9223372036854775808")
    with pytest.raises(FilterEvaluationError):
        rt.parse_long("5.5")


@pytest.mark.parametrize(("text", "value"), [
    ("1.5", 1.5), (" 10 ", 10.0), ("\t1e2\n", 100.0), ("10d", 10.0), ("10F", 10.0), ("-Infinity", -math.inf),
    ("+Infinity", math.inf), ("0x10p0", 16.0), ("0x1.8p1", 3.0), ("-0x.8p1", -1.0), (".5", 0.5), ("5.", 5.0),
    ("1e400", math.inf), ("1e-400", 0.0),
])
def test_parse_double_accepts(text: str, value: float) -> None:
    assert rt.parse_double(text) == value


@pytest.mark.parametrize("text", ["", "abc", "nan", "inf", "infinity", "1e", "1_0", "0x10", ".", "1.5ff",
                                  "NaNd", "١"])
def test_parse_double_refuses(text: str) -> None:
    with pytest.raises(FilterEvaluationError):
        rt.parse_double(text)


def test_parse_double_nan() -> None:
    assert math.isnan(rt.parse_double("NaN"))


def test_double_compare_is_javas() -> None:
    assert rt.double_cmp(math.nan, math.inf) == 1
    assert rt.double_cmp(math.nan, math.nan) == 0
    assert rt.double_cmp(-0.0, 0.0) == -1
    assert rt.double_cmp(1.0, 2.0) == -1


def test_bool_of() -> None:
    assert rt.bool_of("TrUe") and not rt.bool_of("yes") and not rt.bool_of("1") and not rt.bool_of(" true")


# A truth table over {missing, "10", "abc", "true"} x operators (user-asks item 4).
TABLE = [
    ("a = 10", [None, True, ERR, ERR]),
    ("a <> 10", [None, False, ERR, ERR]),
    ("a > 5", [None, True, ERR, ERR]),
    ("a > 5.0", [None, True, ERR, ERR]),
    ("a >= b", [None, None, None, None]),
    ("a = 'abc'", [None, False, True, False]),
    ("'abc' = a", [False, False, True, False]),
    ("'abc' <> a", [True, True, False, True]),
    ("a = TRUE", [None, False, False, True]),
    ("a = FALSE", [None, True, True, False]),
    ("TRUE = a", [False, False, False, True]),          # deviation 3: RocketMQ throws here
    ("FALSE = a", [False, True, True, False]),
    ("TRUE <> a", [True, True, True, False]),
    ("a IN ('10', 'x')", [None, True, False, False]),
    ("a NOT IN ('10', 'x')", [None, False, True, True]),
    ("a IS NULL", [True, False, False, False]),
    ("a IS NOT NULL", [False, True, True, True]),
    ("a", [None, False, False, False]),
    ("NOT a", [None, True, True, True]),
    ("a CONTAINS 'b'", [False, False, True, False]),
    ("a NOT CONTAINS 'b'", [False, True, False, True]),
    ("NOT (a CONTAINS 'b')", [True, True, False, True]),
    ("a BETWEEN 1 AND 20", [None, True, ERR, ERR]),
    ("a NOT BETWEEN 1 AND 20", [None, False, ERR, ERR]),
    ("-a > 5", [None, None, None, None]),
    ("a = a", [True, True, True, True]),
]


@pytest.mark.parametrize(("expression", "expected"), TABLE, ids=[t[0] for t in TABLE])
def test_truth_table(expression: str, expected: list[object]) -> None:
    messages = [{}, {"a": "10"}, {"a": "abc"}, {"a": "true"}]
    assert [run(expression, m) for m in messages] == expected


@pytest.mark.parametrize(("expression", "props", "expected"), [
    ("a = 10.0", {"a": "10"}, True),
    ("a = 10", {"a": "10.0"}, ERR),
    ("a > 3000000000", {"a": "5.5"}, ERR),
    ("a > 2147483647", {"a": "3000000000"}, ERR),
    ("a > 5.0", {"a": "NaN"}, True),
    ("a = 0.0", {"a": "-0.0"}, False),
    ("a < 0.0", {"a": "-0.0"}, True),
    ("a = b", {}, True),
    ("a <> b", {}, False),
    ("a <> b", {"a": "1"}, True),
    ("a <> b", {"b": "1"}, None),
    ("a >= b AND a <= b", {"a": "1", "b": "1.0"}, True),
    ("b = 'x' OR a > 5", {"b": "x", "a": "abc"}, True),
    ("a > 5 OR b = 'x'", {"b": "x", "a": "abc"}, ERR),
    ("b = 'y' AND a > 5", {"b": "x", "a": "abc"}, False),
    ("'10' = 10", {}, True),
    ("10 = '10'", {}, True),
    ("'abc' = 5", {}, ERR),
    ("5 = 5.0", {}, True),
    ("2147483648 = 2147483648.0", {}, True),
    ("a > -(-5)", {"a": "6"}, True),
    ("a > -b", {"a": "6", "b": "1"}, None),
    ("a > -(b > 1)", {"a": "6", "b": "x"}, ERR),
    ("(a > 1) = TRUE", {"a": "2"}, True),
    ("(a > 1) = 1", {"a": "2"}, False),
    ("(a > 1) = b", {"a": "2", "b": "TRUE"}, True),
    ("(a > 1) CONTAINS 'x'", {"a": "z"}, ERR),
    ("(a > 1) CONTAINS ''", {"a": "z"}, False),
    ("a CONTAINS '中'", {"a": "中文"}, True),
    ("a STARTSWITH 'x' OR a ENDSWITH 'x'", {"a": "axb"}, False),
])
def test_semantics(expression: str, props: dict[str, str], expected: object) -> None:
    assert run(expression, props) == expected


def test_evaluation_errors_never_escape_matches() -> None:
    selector = compile_selector("SQL92", "a > 5")
    assert selector.matches({"a": "abc"}) is False
    assert selector.matches({"a": 7}) is False  # type: ignore[dict-item]  # not a string
    with pytest.raises(FilterEvaluationError):
        selector.evaluate({"a": 7})  # type: ignore[dict-item]
    with pytest.raises(FilterEvaluationError):
        selector.evaluate(None)  # type: ignore[arg-type]
    assert selector.matches(None) is False  # type: ignore[arg-type]


def test_generated_code_has_no_builtins() -> None:
    selector = SqlSelector("a = 'x' OR b > 5")
    assert "__import__" not in selector.source
    assert selector._evaluate.__globals__["__builtins__"] == {}


def test_hostile_literals_stay_data() -> None:
    payload = "'); __import__(\"os\").system(\"false\") #\\"
    expression = "a = '" + payload.replace("'", "''") + "' OR b IN ('}}', '{{x}}')"
    selector = compile_selector("SQL92", expression)
    assert selector.matches({"a": payload})
    assert selector.matches({"b": "{{x}}"})
    assert not selector.matches({"a": "x"})


def test_batch_matches_loop() -> None:
    selector = compile_selector("SQL92", "a > 5 AND region IN ('eu', 'us')")
    batch = [{"a": str(i), "region": r} for i in range(12) for r in ("eu", "us", "ap")] + [{"a": "x"}, {}]
    mask = selector.matches_batch(batch)
    assert mask.dtype == np.bool_ and mask.shape == (len(batch),)
    assert mask.tolist() == [selector.matches(p) for p in batch]
    assert int(mask.sum()) == 12
    assert selector.matches_batch([]).shape == (0,)


def test_explain() -> None:
    selector = compile_selector("SQL92", "region = 'eu' AND (a > 5 OR b IS NOT NULL)")
    ok = selector.explain({"region": "eu", "a": "6"})
    assert ok.matched and ok.outcome == "TRUE" and ok.predicate is None
    wrong = selector.explain({"region": "us", "a": "6"})
    assert (wrong.outcome, wrong.predicate, wrong.predicate_outcome) == ("FALSE", "region = 'eu'", "FALSE")
    assert "region='us'" in str(wrong)
    missing = selector.explain({"a": "6"})
    assert (missing.outcome, missing.predicate, missing.missing) == ("NULL", "region = 'eu'", ("region",))
    assert "missing property region" in str(missing)
    error = selector.explain({"region": "eu", "a": "abc"})
    assert (error.outcome, error.predicate, error.predicate_outcome) == ("ERROR", "a > 5", "ERROR")
    assert "abc" in (error.error or "") and "abc" in str(error)
    negated = compile_selector("SQL92", "NOT (a = 'x')").explain({"a": "x"})
    assert (negated.predicate, negated.predicate_outcome) == ("a = 'x'", "TRUE")
