"""What every compiled selector offers, whatever its expression type."""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence

import numpy as np

from sluice.errors import FilterEvaluationError
from sluice.filter.sql_interp import Explanation


class Selector(ABC):
    """A compiled subscription expression.

    ``evaluate`` gives RocketMQ's raw outcome (True, False or None for NULL) and
    raises FilterEvaluationError where RocketMQ would throw; ``matches`` is the
    broker's decision (delivered only on TRUE; errors count as no match);
    ``matches_batch`` decides many messages at once.
    """

    expression_type: str
    expression: str

    @abstractmethod
    def evaluate(self, properties: Mapping[str, str]) -> bool | None: ...

    def matches(self, properties: Mapping[str, str]) -> bool:
        try:
            return self.evaluate(properties) is True
        except FilterEvaluationError:
            return False

    def matches_batch(self, batch: Sequence[Mapping[str, str]]) -> np.ndarray:
        """A bool array, one entry per property mapping in `batch`."""
        return np.fromiter(map(self.matches, batch), dtype=bool, count=len(batch))

    def explain(self, properties: Mapping[str, str]) -> Explanation:
        try:
            outcome = self.evaluate(properties)
        except FilterEvaluationError as exc:
            return Explanation(self.expression, False, "ERROR", self.expression, "ERROR",
                               f"evaluation error: {exc}", str(exc))
        names = {True: "TRUE", False: "FALSE", None: "NULL"}
        if outcome is True:
            return Explanation(self.expression, True, "TRUE")
        return Explanation(self.expression, False, names[outcome], self.expression, names[outcome])

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.expression_type!r}, {self.expression!r})"
