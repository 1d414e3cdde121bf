"""selector_column against compile_selector: the same messages must match, in ANSI mode."""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sluice.errors import SelectorSyntaxError
from sluice.filter import compile_selector
from sluice.spark.selector import selector_column

pytestmark = [pytest.mark.spark, pytest.mark.slow]

SCHEMA = "id int, tags string, properties map<string,string>"

# Values chosen to hit every conversion rule: ints, longs, overflow, doubles in every Java form,
# whitespace (Long.valueOf refuses, Double.valueOf trims), Unicode digits, booleans, junk.
VALUES = ["0", "-0", "+0", "5", "6", "10", "-3", "007", " 5", "5 ", "\t5\n", "2147483647", "2147483648",
          "-2147483649", "9223372036854775807", "9223372036854775808", "3000000000", "5.0", "5.5", "-0.0",
          "0.0", ".5", "5.", "1e3", "1E-2", "5d", "5.5f", "0x1p3", "NaN", "-Infinity", "Infinity", "nan",
          "inf", "\u0665", "\u0661\u0660", "\uff15", "true", "TRUE", "True", "false", "yes", "t", "1", "",
          "abc", "eu", "us", "a b", "1_0", "+-1", "5\n"]
NAMES = ["a", "b", "region"]
LITERALS = ["5", "0", "10", "2147483647", "3000000000", "5.0", "0.0", "-0.0", "5.5", "1e3", "-3", "'5'", "'eu'",
            "'abc'", "''", "TRUE", "FALSE", "NULL", "9223372036854775807", "-5"]


def _rows(props_list):
    rows = []
    for i, props in enumerate(props_list):
        rows.append((i, props.get("TAGS"), props))
    return rows


def _check(spark, expression, props_list):
    sel = compile_selector("SQL92", expression)
    want = {i for i, p in enumerate(props_list) if sel.matches(p)}
    df = spark.createDataFrame(_rows(props_list), SCHEMA)
    got = {r.id for r in df.filter(selector_column(expression)).select("id").collect()}
    assert got == want, f"{expression!r}: spark-only {sorted(got - want)} broker-only {sorted(want - got)}"


def _fixed_messages():
    msgs = [{}]
    for v in VALUES:
        msgs.append({"a": v})
        msgs.append({"a": v, "b": "5", "region": "eu", "TAGS": "TagA"})
        msgs.append({"b": v, "a": "0", "TAGS": "TagB"})
    return msgs


TABLE = [
    "a > 5", "a >= 5", "a < 5", "a <= 5", "a = 5", "a <> 5", "a > 3000000000", "a = 2147483647",
    "a > 5.0", "a = 5.0", "a = 0.0", "a = -0.0", "a < 0.0", "a >= -0.0", "a > 1e3", "a = 0", "a < -5",
    "a = 9223372036854775807", "a > b", "a = b", "a >= b", "b < a", "a = TRUE", "a = FALSE", "TRUE = a",
    "a <> TRUE", "a = '5'", "'5' = a", "a IS NULL", "a IS NOT NULL", "a IN ('5', 'eu')", "a NOT IN ('5')",
    "a BETWEEN 0 AND 10", "a NOT BETWEEN 0 AND 10", "a BETWEEN 0.0 AND 5.5", "a CONTAINS '5'",
    "a NOT CONTAINS '5'", "a STARTSWITH 'a'", "a ENDSWITH ''", "TAGS = 'TagA'", "TAGS IN ('TagB')",
    "a > 5 AND b = 5", "a = 'abc' OR a > 5", "NOT (a > 5)", "region = 'eu' AND a > 5 AND b IS NOT NULL",
    "(a > 5) = TRUE", "(a > 5) = b", "a = (b > 1)", "-a = 5", "-a IS NULL", "a", "NOT a",
    "a > 5 OR NOT (b < 5.0)", "(a > 5 OR a = 'x') AND NOT (b = 3 OR region IS NULL)",
    "b > 1 AND a > 5", "b > 1 OR a > 5", "a > 5 AND FALSE", "FALSE AND a > 5", "TRUE OR a > 5",
]


def test_table_of_expressions(spark):
    msgs = _fixed_messages()
    df = spark.createDataFrame(_rows(msgs), SCHEMA).cache()
    failures = []
    for expression in TABLE:
        sel = compile_selector("SQL92", expression)
        want = {i for i, p in enumerate(msgs) if sel.matches(p)}
        got = {r.id for r in df.filter(selector_column(expression)).select("id").collect()}
        if got != want:
            failures.append((expression, sorted(got - want)[:5], sorted(want - got)[:5]))
    df.unpersist()
    assert not failures, failures


def test_ansi_mode_is_on_and_bad_values_do_not_fail_the_job(spark):
    assert spark.conf.get("spark.sql.ansi.enabled") == "true"
    _check(spark, "a > 5 AND a = 5.0", [{"a": "abc"}, {"a": "6.5"}, {"a": "99999999999999999999"}, {"a": "6"}])


def test_tag_selector_column(spark):
    df = spark.createDataFrame([(0, "TagA", {}), (1, "TagB", {}), (2, None, {})], SCHEMA)
    assert {r.id for r in df.filter(selector_column("TagA || TagB", "TAG")).collect()} == {0, 1}
    assert df.filter(selector_column("*", "TAG")).count() == 3


def test_bad_expression_is_refused():
    with pytest.raises(SelectorSyntaxError):
        selector_column("a >")


# ---- generated expressions ----------------------------------------------------------------------
_prop = st.sampled_from(NAMES + ["TAGS"])
_lit = st.sampled_from(LITERALS)


def _comparison():
    return st.one_of(
        st.tuples(_prop, st.sampled_from(["=", "<>", ">", ">=", "<", "<="]), st.one_of(_lit, _prop)).map(" ".join),
        st.tuples(_lit, st.sampled_from(["=", "<>"]), _prop).map(" ".join),
        _prop.map(lambda p: f"{p} IS NULL"), _prop.map(lambda p: f"{p} IS NOT NULL"),
        st.tuples(_prop, st.lists(st.sampled_from(VALUES[:20] + ["eu", "TagA"]), min_size=1, max_size=3))
        .map(lambda t: f"{t[0]} IN ({', '.join(repr(v) if chr(39) not in v else repr(v) for v in t[1])})"),
        st.tuples(_prop, st.sampled_from(["0", "5", "0.0", "-1.5"]), st.sampled_from(["5", "10", "5.5"]))
        .map(lambda t: f"{t[0]} BETWEEN {t[1]} AND {t[2]}"),
        st.tuples(_prop, st.sampled_from(["CONTAINS", "NOT CONTAINS", "STARTSWITH", "ENDSWITH"]),
                  st.sampled_from(["'5'", "'e'", "''", "'Tag'"])).map(" ".join),
    )


_expr = st.recursive(
    _comparison(),
    lambda inner: st.one_of(
        st.tuples(inner, st.sampled_from(["AND", "OR"]), inner).map(lambda t: f"({t[0]} {t[1]} {t[2]})"),
        inner.map(lambda e: f"NOT ({e})"),
        st.tuples(inner, st.sampled_from(["TRUE", "FALSE", "a"])).map(lambda t: f"({t[0]}) = {t[1]}"),
    ),
    max_leaves=5,
)
# Generated numeric-looking text: integers past every range, Python float and hex-float forms, and
# strings from the characters Java's parsers care about (signs, exponents, suffixes, blanks, NUL,
# Unicode digits), besides the fixed VALUES.
_numeric_text = st.one_of(
    st.integers(-(2**64), 2**64).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.floats(allow_nan=False, allow_infinity=False).map(float.hex),
    st.text(alphabet="0123456789+-.eEdDfFxXpP \t\n\x00\x0b\u0660\u0966\uff10NaInfty", max_size=8),
)
_value = st.one_of(st.sampled_from(VALUES + ["TagA", "eu"]), _numeric_text)
_message = st.dictionaries(st.sampled_from(NAMES + ["TAGS"]), _value, max_size=4)


def _compiles(expression: str) -> bool:
    try:
        compile_selector("SQL92", expression)
    except SelectorSyntaxError:
        return False
    return True


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(expression=_expr.filter(_compiles), messages=st.lists(_message, min_size=30, max_size=60))
def test_generated_expressions_match_the_broker(spark, expression, messages):
    _check(spark, expression, _fixed_messages()[::3] + messages)
