"""Lexer and parser: positions, caret messages, compile-time checks, departures, limits."""
from __future__ import annotations

import pytest

from sluice.errors import FilterError, FilterEvaluationError, SluiceError
from sluice.filter import SelectorLimits, SelectorSyntaxError, compile_selector
from sluice.filter.sql_ast import And, Compare, Const, Eq, In, Not, Or, Prop
from sluice.filter.sql_lexer import tokenize
from sluice.filter import sql_parser
from sluice.filter.limits import DEFAULT_LIMITS
from sluice.filter.sql_parser import parse
from sluice.protocol.codes import ResponseCode


def error_of(expression: str, **kw: object) -> SelectorSyntaxError:
    with pytest.raises(SelectorSyntaxError) as info:
        parse(expression, **kw)  # type: ignore[arg-type]
    return info.value


def kinds(expression: str) -> list[tuple[str, str]]:
    return [(t.kind, t.text) for t in tokenize(expression)][:-1]


# -- lexer -------------------------------------------------------------------------------------------
def test_longest_match_and_keywords() -> None:
    assert kinds("nullx inside IN is") == [("identifier", "nullx"), ("identifier", "inside"),
                                          ("keyword", "IN"), ("keyword", "IS")]
    assert kinds("a<>b>=c<=d") == [("identifier", "a"), ("punct", "<>"), ("identifier", "b"), ("punct", ">="),
                                   ("identifier", "c"), ("punct", "<="), ("identifier", "d")]


def test_number_tokens() -> None:
    assert kinds("007") == [("integer", "0"), ("integer", "0"), ("integer", "7")]
    assert kinds("0x10") == [("integer", "0"), ("identifier", "x10")]
    assert kinds("0L 10L") == [("integer", "0"), ("identifier", "L"), ("integer", "10L")]
    assert kinds("5. .5 1e3 1.5E-2 1.5f") == [("float", "5."), ("float", ".5"), ("float", "1e3"),
                                              ("float", "1.5E-2"), ("float", "1.5"), ("identifier", "f")]


def test_comments() -> None:
    assert kinds("a /* x */ = -- c\n1") == [("identifier", "a"), ("punct", "="), ("integer", "1")]
    # Without a line end, -- is two minus signs.
    assert kinds("a --1") == [("identifier", "a"), ("punct", "-"), ("punct", "-"), ("integer", "1")]
    assert kinds("a --x\r\n") == [("identifier", "a")]


def test_strings() -> None:
    assert parse("a = 'it''s'").right.value == "it's"  # type: ignore[union-attr]
    assert parse("a = 'x\\y'").right.value == "x\\y"  # type: ignore[union-attr]
    assert parse("a = 'two\nlines'").right.value == "two\nlines"  # type: ignore[union-attr]


@pytest.mark.parametrize(("expression", "position", "token"), [
    ("a = \"x\"", 4, '"'),
    ("a != 1", 2, "!"),
    ("a.b = 1", 1, "."),
    ("a = 'abc", 4, "'"),
    ("a = 1 /* open", 6, "/"),
    ("a = 1 ;", 6, ";"),
    ("é = 1", 0, "é"),
])
def test_lexical_errors_point_at_the_character(expression: str, position: int, token: str) -> None:
    err = error_of(expression)
    assert err.position == position
    assert err.token == token


# -- syntax errors ---------------------------------------------------------------------------------
def test_error_message_has_position_token_and_caret() -> None:
    err = error_of("a = 1 b = 2")
    assert err.position == 6
    assert err.token == "b"
    assert err.expression == "a = 1 b = 2"
    lines = str(err).splitlines()
    assert "'b'" in lines[0] and "position 6" in lines[0]
    assert lines[1] == "  a = 1 b = 2"
    assert lines[2] == "  " + " " * 6 + "^"
    assert isinstance(err, FilterError) and isinstance(err, SluiceError)
    assert err.code == ResponseCode.SUBSCRIPTION_PARSE_FAILED


def test_caret_on_the_right_line_of_a_multiline_expression() -> None:
    err = error_of("a = 1\nAND b ! 2")
    assert err.position == 12
    assert "line 2, column 7" in str(err)
    assert str(err).splitlines()[-2:] == ["  AND b ! 2", "        ^"]


@pytest.mark.parametrize(("expression", "position"), [
    ("a = 1)", 5),          # deviation 1: RocketMQ ignores the ')'
    ("a = 1 b = 2", 6),
    ("a LIKE 'x%'", 2),
    ("a + 1 > 2", 2),
    ("a = 007", 5),
    ("a = 0x10", 5),
    ("a = 1 --c", 6),
    ("a = 1 AND", 9),
    ("", 0),
    ("(a = 1", 6),
    ("a NOT LIKE 'x'", 6),
    ("a NOT = 1", 6),
    ("a IN ('x',)", 10),
    ("a IN ()", 6),
    ("a between 1 or 2", 12),
    ("a IS 5", 5),
    ("a = -", 5),
])
def test_syntax_error_positions(expression: str, position: int) -> None:
    assert error_of(expression).position == position


# -- compile-time checks (SelectorParser.jj) -------------------------------------------------------
@pytest.mark.parametrize(("expression", "position", "words"), [
    ("5", 0, "boolean"),
    ("'abc'", 0, "boolean"),
    ("a = 1 AND 5", 10, "boolean"),
    ("NOT -a", 4, "boolean"),
    ("a > 'abc'", 4, "'abc'"),
    ("a >= TRUE", 5, "TRUE"),
    ("NULL < a", 0, "NULL"),
    ("(a = 1) > 0", 1, "cannot be an operand"),
    ("NOT a > 1", 0, "cannot be an operand"),
    ("a = NULL", 4, "IS NULL"),
    ("NULL <> a", 0, "IS NULL"),
    ("TRUE = 1", 5, "cannot be compared"),
    ("FALSE = 'false'", 6, "cannot be compared"),
    ("a BETWEEN 10 AND 0", 10, "greater than"),
    ("a BETWEEN NULL AND 5", 10, "NULL"),
    ("'a' IN ('a')", 0, "property"),
    ("a = 1 IN ('x')", 4, "property"),
    ("a CONTAINS b", 11, "string literal"),
    ("a STARTSWITH 5", 13, "string literal"),
    ("a > 9223372036854775808", 4, "long"),
    ("a > 1e999", 4, "largest double"),
    ("a > 0e0", 4, "smallest"),
    ("a > 1e-400", 4, "smallest"),
])
def test_compile_time_checks(expression: str, position: int, words: str) -> None:
    err = error_of(expression)
    assert err.position == position
    assert words in str(err)


@pytest.mark.parametrize("expression", [
    "'true' = TRUE", "TRUE = FALSE", "a > 1 = TRUE", "a = 'x' IS NULL", "5 IS NULL", "NULL", "TRUE",
    "a NOT BETWEEN 10 AND 2", "a BETWEEN -1 AND -5", "TRUE = -5", "a = -NULL", "a > -'x'",
    "NOT a CONTAINS 'x'", "a CONTAINS 'x' CONTAINS 'y'", "(a) IN ('x')", "a > 9223372036854775807",
    "a > -9223372036854775807", "a > 4.9E-324", "a > 1.7976931348623157E308", "now > 5", "a > 5L",
    # deviation 2: float literals with a decimal point below Double.MIN_VALUE are accepted
    "a > 0.0", "a > .0", "a > 0.", "a > 1.0e-400",
])
def test_accepted_expressions(expression: str) -> None:
    parse(expression)


def test_rewrites() -> None:
    assert isinstance(parse("a <> 1"), Not)
    between = parse("a BETWEEN 1 AND 2")
    assert isinstance(between, And) and [t.op for t in between.terms] == [">=", "<="]  # type: ignore[union-attr]
    not_between = parse("a NOT BETWEEN 1 AND 2")
    assert isinstance(not_between, Or) and [t.op for t in not_between.terms] == ["<", ">"]  # type: ignore
    chain = parse("a = 1 OR b = 2 OR c = 3 AND d = 4")
    assert isinstance(chain, Or) and len(chain.terms) == 3 and isinstance(chain.terms[2], And)
    neg = parse("a > -(-5)")
    assert isinstance(neg, Compare) and isinstance(neg.right, Const)
    assert (neg.right.value, neg.right.jtype, neg.right.negated) == (5, "I", True)
    assert parse("a > 2147483648").right.jtype == "L"  # type: ignore[union-attr]
    assert parse("a > 5L").right.jtype == "I"  # type: ignore[union-attr]
    assert isinstance(parse("TAGS IN ('a', 'b')"), In)
    assert parse("(a) = 1") == Eq(Prop("a", 1, 2), Const(1, "I", 6, 7), 1, 7)


# -- limits ---------------------------------------------------------------------------------------
def test_megabyte_expression_refused_before_it_is_read(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    expression = "a = 1 OR " * 120_000 + "a = 1"
    assert len(expression) > 1_000_000

    def never(*args: object) -> None:
        raise AssertionError("an expression over max_length was tokenized")

    monkeypatch.setattr(sql_parser, "_Parser", never)
    err = error_of(expression)
    assert "max_length" in str(err) and err.position == DEFAULT_LIMITS.max_length


@pytest.mark.parametrize("build", [
    lambda n: "(" * n + "a = 1" + ")" * n,
    lambda n: "NOT " * n + "a",
    lambda n: "-" * n + "5 > a",
    lambda n: "a" + " CONTAINS 'x'" * n,
    lambda n: "a = 1" + " = TRUE" * n,
])
def test_ten_thousand_deep_nesting_refused_by_the_limits(build) -> None:  # type: ignore[no-untyped-def]
    # Refused by a limit while parsing, not by Python's recursion limit (RecursionError) or a timeout.
    expression = build(10_000)
    with pytest.raises(SelectorSyntaxError) as info:
        compile_selector("SQL92", expression, limits=SelectorLimits(max_length=10**6))
    assert "max_depth" in str(info.value) or "max_nodes" in str(info.value)


def test_huge_in_list_refused() -> None:
    expression = "a IN (" + ", ".join(f"'v{i}'" for i in range(100_000)) + ")"
    err = error_of(expression, limits=SelectorLimits(max_length=10**7))
    assert "max_in_list" in str(err)
    # Refused at the first literal over the limit: the rest of the list is never collected.
    assert err.token == "'v4096'" and err.position == expression.index("'v4096'")


def test_node_limit_and_wide_expressions() -> None:
    wide = " OR ".join(f"a{i} = 'x'" for i in range(1300))
    assert compile_selector("SQL92", wide).matches({"a1299": "x"})
    with pytest.raises(SelectorSyntaxError, match="max_nodes"):
        parse(wide, SelectorLimits(max_nodes=100))


def test_limits_are_validated() -> None:
    with pytest.raises(ValueError):
        SelectorLimits(max_depth=1000)
    with pytest.raises(ValueError):
        SelectorLimits(max_length=0)
    with pytest.raises(TypeError):
        SelectorLimits(10)  # type: ignore[misc]  # keyword-only
    limits = SelectorLimits(max_depth=8)
    parse("(" * 7 + "a = 1" + ")" * 7, limits)
    with pytest.raises(SelectorSyntaxError, match="max_depth"):
        parse("(" * 9 + "a = 1" + ")" * 9, limits)


def test_deepest_allowed_expression_compiles() -> None:
    limits = SelectorLimits(max_depth=90)
    for expression in ("NOT " * 80 + "a", "(" * 80 + "a = 1" + ")" * 80, "a" + " CONTAINS 'x'" * 85):
        selector = compile_selector("SQL92", expression, limits=limits)
        for props in ({"a": "x"}, {"a": "1"}, {}):
            assert outcome(selector.evaluate, props) == outcome(selector.interpret, props)


def outcome(evaluate, props):  # type: ignore[no-untyped-def]
    try:
        return evaluate(props)
    except FilterEvaluationError:
        return "error"
