"""The SQL92 selector: parsed and checked once, compiled once to a Python function."""
from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from sluice.filter.base import Selector
from sluice.filter.limits import DEFAULT_LIMITS, SelectorLimits
from sluice.filter.sql_ast import Node, properties_of
from sluice.filter.sql_codegen import compile_ast
from sluice.filter.sql_interp import Explanation, explain, interpret
from sluice.filter.sql_parser import parse


class SqlSelector(Selector):
    """A compiled SQL92 expression with RocketMQ's semantics (see docs/filtering.md)."""

    expression_type = "SQL92"

    def __init__(self, expression: str, *, limits: SelectorLimits = DEFAULT_LIMITS) -> None:
        self.expression = expression
        self.ast: Node = parse(expression, limits)
        self._evaluate, self._matches, self.source = compile_ast(self.ast)
        #: The property names the expression reads: its outcome depends on these alone.
        self.properties: tuple[str, ...] = tuple(properties_of(self.ast))
        # The compiled functions themselves, no wrapper call per message: evaluate raises
        # FilterEvaluationError (only), matches returns the broker's decision.
        self.evaluate = self._evaluate  # type: ignore[method-assign]
        self.matches = self._matches  # type: ignore[method-assign]

    def evaluate(self, properties: Mapping[str, str]) -> bool | None:  # replaced per instance
        return self._evaluate(properties)

    def interpret(self, properties: Mapping[str, str]) -> bool | None:
        """The same outcome as evaluate, from the tree-walking interpreter (slow; the oracle)."""
        return interpret(self.ast, properties)

    def matches_batch(self, batch: Sequence[Mapping[str, str]]) -> np.ndarray:
        return np.fromiter(map(self._matches, batch), dtype=bool, count=len(batch))

    def explain(self, properties: Mapping[str, str]) -> Explanation:
        return explain(self.ast, self.expression, properties)
