"""Which conjuncts of a batch read's ``where`` the broker (or the range planner) answers exactly.

Spark hands a Python reader top-level conjuncts as Filter objects; those kept here are not
evaluated again by Spark, so each must be exact (docs/spark.md, "Pushdown").
"""
from __future__ import annotations

import datetime

from pyspark.sql.datasource import (
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    IsNotNull,
    LessThan,
    LessThanOrEqual,
)

from sluice.filter.tags import parse_tag_subscription

__all__ = ["Pushdown"]

_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)


def _sql_quote(s: str) -> str:
    return "'" + s.replace("'", "''") + "'"


def _admitted(f: Filter, at_least: int, above: int) -> tuple[int | None, int | None]:
    """The whole numbers [lo, hi) that comparison ``f`` with a value v admits, given ``at_least``
    (the least whole number >= v) and ``above`` (the least > v); None is unbounded, (None, None)
    a comparison that is not pushed."""
    return {EqualTo: (at_least, above), GreaterThan: (above, None), GreaterThanOrEqual: (at_least, None),
            LessThan: (None, at_least), LessThanOrEqual: (None, above)}.get(type(f), (None, None))


def _intersect(lo: int | None, hi: int | None, new_lo: int | None, new_hi: int | None) -> tuple[int | None, int | None]:
    """[lo, hi) narrowed by [new_lo, new_hi); None is unbounded."""
    return (new_lo if lo is None else lo if new_lo is None else max(lo, new_lo),
            new_hi if hi is None else hi if new_hi is None else min(hi, new_hi))


class Pushdown:
    """Conjuncts the broker (or the range planner) answers exactly; the rest stay in Spark."""

    def __init__(self) -> None:
        self.tag_sets: list[frozenset[str]] = []
        self.queue_ids: frozenset[int] | None = None
        self.offset_lo: int | None = None  # inclusive
        self.offset_hi: int | None = None  # exclusive
        self.ts_lo: int | None = None  # store time in ms, inclusive
        self.ts_hi: int | None = None  # exclusive

    def take(self, f: Filter) -> bool:
        attr = f.attribute
        if attr == ("tags",):
            if isinstance(f, EqualTo) and isinstance(f.value, str):
                self.tag_sets.append(frozenset([f.value]))
                return True
            if isinstance(f, In) and f.value and all(isinstance(v, str) for v in f.value):
                self.tag_sets.append(frozenset(f.value))
                return True
            return False
        if attr in (("queue_offset",), ("queue_id",), ("store_timestamp",)) and isinstance(f, IsNotNull):
            return True  # never null
        if attr == ("queue_id",) and isinstance(f, (EqualTo, In)):
            vals = [f.value] if isinstance(f, EqualTo) else list(f.value)
            if not all(isinstance(v, int) for v in vals):
                return False
            self.queue_ids = frozenset(vals) if self.queue_ids is None else self.queue_ids & frozenset(vals)
            return True
        if attr == ("store_timestamp",) and isinstance(getattr(f, "value", None), datetime.datetime):
            return self._take_time(f)
        if attr == ("queue_offset",) and isinstance(f.value if hasattr(f, "value") else None, int):
            lo, hi = _admitted(f, f.value, f.value + 1)
            if lo is None and hi is None:
                return False
            self.offset_lo, self.offset_hi = _intersect(self.offset_lo, self.offset_hi, lo, hi)
            return True
        return False

    def _take_time(self, f: Filter) -> bool:
        """Store times only grow within a queue (the commit log stamps max(now, last)), so a bound on
        store_timestamp is a queue-offset bound the broker's search_offset finds exactly."""
        v = f.value
        if v.tzinfo is None:
            return False
        us = (v - _EPOCH) // datetime.timedelta(microseconds=1)
        floor_ms, ceil_ms = us // 1000, -(-us // 1000)
        # The column holds ms * 1000; translate each comparison on microseconds into whole ms.
        lo, hi = _admitted(f, ceil_ms, floor_ms + 1)
        if lo is None and hi is None:
            return False
        self.ts_lo, self.ts_hi = _intersect(self.ts_lo, self.ts_hi, lo, hi)
        return True

    def selector(self, selector_type: str, selector: str | None) -> tuple[str, str | None]:
        """The user's selector narrowed by the pushed tag conjuncts (still exact)."""
        if not self.tag_sets:
            return selector_type, selector
        tags = frozenset.intersection(*self.tag_sets)
        if selector_type == "TAG":
            current = parse_tag_subscription(selector)
            if current is not None:
                tags = tags & frozenset(current)
            if all(t == t.strip("".join(map(chr, range(33)))) and "||" not in t and t for t in tags):
                return "TAG", " || ".join(sorted(tags)) if tags else None
        cond = f"TAGS IN ({', '.join(_sql_quote(t) for t in sorted(tags))})" if tags else "FALSE"
        if selector_type == "SQL92" and selector:
            return "SQL92", f"({selector}) AND {cond}"
        return "SQL92", cond
