"""MessageSelector: validated at construction, and what heartbeats and pulls carry."""
from __future__ import annotations

import pytest

from sluice import MessageSelector
from sluice.client.selector import as_selector
from sluice.errors import InvalidParameterError, SelectorSyntaxError
from sluice.filter import java_string_hash


def test_tag_selector_tags_and_expression():
    s = MessageSelector.by_tag(" TagA || TagB ||  ")
    assert s.is_tag and s.expression_type == "TAG" and s.tags == {"TagA", "TagB"}


@pytest.mark.parametrize("expr", [None, "", "*"])
def test_everything(expr):
    s = MessageSelector.by_tag(expr)
    assert s.expression == "*" and s.tags == frozenset()


def test_sql_selector_compiles_and_matches():
    s = MessageSelector.by_sql("a > 5 AND region IN ('eu', 'us')")
    assert not s.is_tag and s.tags == frozenset()
    assert s.compiled.matches({"a": "10", "region": "eu"}) and not s.compiled.matches({"a": "1", "region": "eu"})


@pytest.mark.parametrize(("expr", "position"), [("a >", 3), ("a = 1 AND", 9), ("a IN (1)", 6)])
def test_bad_sql_raises_with_position(expr: str, position: int):
    with pytest.raises(SelectorSyntaxError) as info:
        MessageSelector.by_sql(expr)
    assert info.value.position is not None and abs(info.value.position - position) <= 2


def test_subscription_data():
    d = MessageSelector.by_tag("B || A").subscription_data("T", 123)
    assert (d.topic, d.sub_string, d.tags_set, d.code_set, d.sub_version, d.expression_type) == (
        "T", "B || A", ["A", "B"], [java_string_hash("A"), java_string_hash("B")], 123, "TAG")
    q = MessageSelector.by_sql("a = 1").subscription_data("T")
    assert q.expression_type == "SQL92" and q.tags_set == [] and q.sub_version > 0


def test_equality_and_coercion():
    assert MessageSelector.by_tag("A") == as_selector("A") and as_selector(None) == MessageSelector.by_tag("*")
    assert MessageSelector.by_sql("a = 1") != MessageSelector.by_tag("a = 1")
    with pytest.raises(TypeError):
        as_selector(5)  # type: ignore[arg-type]


@pytest.mark.parametrize("expression", ["TagA | TagB", "TagA|TagB", "TagA || TagB | TagC", "|TagA"])
def test_a_single_pipe_in_a_tag_expression_is_refused_naming_the_separator(expression: str) -> None:
    with pytest.raises(InvalidParameterError, match=r"single '\|'.*'TagA \|\| TagB'"):
        MessageSelector.by_tag(expression)


def test_double_pipes_still_separate_tags() -> None:
    sel = MessageSelector.by_tag("TagA||TagB || TagC")
    assert sel.expression_type == "TAG"
