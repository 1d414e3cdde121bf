"""Every case of the shared SQL92 conformance file (shared/conformance/sql92.json).

The shared copy is preferred; tests/filter/data/sql92.json is the fallback when
CI lays shared/ elsewhere.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from sluice.filter import FilterEvaluationError, SelectorSyntaxError, compile_selector

REPO = Path(__file__).resolve().parents[2]
SHARED = REPO.parent / "shared" / "conformance" / "sql92.json"
LOCAL = Path(__file__).resolve().parent / "data" / "sql92.json"
CASES_PATH = SHARED if SHARED.is_file() else LOCAL
CASES = json.loads(CASES_PATH.read_text(encoding="utf-8"))


def _case_id(index: int, case: dict) -> str:
    return f"{index:03d}-{case.get('id', 'case')}"


def outcome(expression: str, properties: dict[str, str]) -> object:
    try:
        selector = compile_selector("SQL92", expression)
    except SelectorSyntaxError:
        return "parse_error"
    return selector.matches(properties)


def test_cases_loaded() -> None:
    assert len(CASES) >= 200
    assert all({"expression", "properties", "accept"} <= set(c) for c in CASES)


@pytest.mark.parametrize("case", CASES, ids=[_case_id(i, c) for i, c in enumerate(CASES)])
def test_conformance_case(case: dict) -> None:
    got = outcome(case["expression"], case["properties"])
    assert got in case["accept"], f"{case['expression']!r} with {case['properties']} gave {got!r}; " \
                                   f"accepted {case['accept']} ({case.get('note', '')})"


@pytest.mark.parametrize("case", [c for c in CASES if "parse_error" not in c["accept"]],
                         ids=lambda c: c["id"])
def test_compiled_agrees_with_interpreter(case: dict) -> None:
    selector = compile_selector("SQL92", case["expression"])
    results = []
    for evaluate in (selector.evaluate, selector.interpret):
        try:
            results.append(evaluate(case["properties"]))
        except FilterEvaluationError:
            results.append("error")
    assert results[0] == results[1]


def test_parse_errors_carry_a_position() -> None:
    for case in CASES:
        if case["accept"] == ["parse_error"]:
            with pytest.raises(SelectorSyntaxError) as info:
                compile_selector("SQL92", case["expression"])
            assert info.value.position is not None
            assert 0 <= info.value.position <= len(case["expression"])


def test_local_copy_matches_shared() -> None:
    if not SHARED.is_file():
        pytest.skip("shared/ not laid out next to the repository")
    assert json.loads(LOCAL.read_text(encoding="utf-8")) == json.loads(SHARED.read_text(encoding="utf-8"))
