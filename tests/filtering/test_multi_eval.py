"""The dispatcher's all-expressions-at-once evaluator agrees with each selector's own ``matches``."""
from __future__ import annotations

import sys
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.errors import SelectorSyntaxError
from sluice.filter import compile_selector
from sluice.filter.sql_codegen import compile_multi

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "filter"))
from test_filter_sql_property import messages, predicates  # noqa: E402  (the filter package's strategies)


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
    sels = _selectors(texts)
    if not sels:
        return
    multi = compile_multi([s.ast for s in sels])
    for props in batch:
        mask = multi(props)
        assert [bool(mask >> i & 1) for i in range(len(sels))] == [s.matches(props) for s in sels], props
