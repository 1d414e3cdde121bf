"""A plain tree-walking interpreter of the selector AST: the oracle for the compiled
evaluator (property tests compare the two) and the engine behind ``explain``.

Values are ``None`` (Java null) or ``(jtype, value)`` pairs, so Integer and Long
stay apart as in Java. Results of predicates are True, False or None (NULL);
evaluation errors raise FilterEvaluationError and end the whole evaluation.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from sluice.errors import FilterEvaluationError
from sluice.filter import sql_runtime as rt
from sluice.filter.sql_ast import (
    And,
    BoolCast,
    Compare,
    Const,
    Eq,
    In,
    IsNull,
    Neg,
    Node,
    Not,
    Or,
    Prop,
    StrMatch,
    properties_of,
)

Value = tuple[str, object] | None


def _value(node: Node, props: Mapping[str, str], trace: dict[int, object] | None) -> Value:
    if isinstance(node, Prop):
        v = props.get(node.name)
        return None if v is None else ("S", v)
    if isinstance(node, Const):
        return None if node.jtype == "N" else (node.jtype, node.value)
    if isinstance(node, Neg):
        # Unary minus of anything but a number is NULL; the operand is still evaluated.
        inner = _value(node.operand, props, trace)
        if inner is not None and inner[0] in ("I", "L", "D"):
            return (inner[0], -inner[1])  # type: ignore[operator]
        return None
    result = _pred(node, props, trace)
    return None if result is None else ("B", result)


def _pred(node: Node, props: Mapping[str, str], trace: dict[int, object] | None) -> bool | None:
    try:
        result = _pred_inner(node, props, trace)
    except FilterEvaluationError as exc:
        if trace is not None and id(node) not in trace:
            trace[id(node)] = exc
        raise
    if trace is not None:
        trace[id(node)] = result
    return result


def _pred_inner(node: Node, props: Mapping[str, str], trace: dict[int, object] | None) -> bool | None:
    if isinstance(node, Const):  # TRUE, FALSE, NULL
        return node.value  # type: ignore[return-value]
    if isinstance(node, BoolCast):
        v = _value(node.operand, props, trace)
        if v is None:
            return None
        return v[1] if v[0] == "B" else False  # type: ignore[return-value]
    if isinstance(node, Not):
        r = _pred(node.operand, props, trace)
        return None if r is None else not r
    if isinstance(node, (And, Or)):
        # Left to right, stop at the first FALSE (AND) / TRUE (OR), else NULL if any term was NULL.
        stop = isinstance(node, Or)
        saw_null = False
        for term in node.terms:
            r = _pred(term, props, trace)
            if r is stop:
                return stop
            saw_null = saw_null or r is None
        return None if saw_null else not stop
    if isinstance(node, IsNull):
        return _value(node.operand, props, trace) is None
    if isinstance(node, Eq):
        lv = _value(node.left, props, trace)
        rv = _value(node.right, props, trace)
        if lv is None or rv is None:
            if lv is None and rv is None:
                return True
            return None if lv is None else False
        if lv == rv and lv[0] != "D":
            return True
        return rt.jcompare(lv[1], lv[0], rv[1], rv[0]) == 0
    if isinstance(node, Compare):
        lv = _value(node.left, props, trace)
        if lv is None:
            return None
        rv = _value(node.right, props, trace)
        if rv is None:
            return None
        return rt.ORDER_OPS[node.op](rt.order_cmp(lv[1], rv[1], lv[0], rv[0]))
    if isinstance(node, In):
        v = _value(node.operand, props, trace)
        if v is None or v[0] != "S":
            return None
        return (v[1] in node.values) != node.negated
    if isinstance(node, StrMatch):
        if not node.search:
            return False
        v = _value(node.operand, props, trace)
        if v is None or v[0] != "S":
            return False
        s: str = v[1]  # type: ignore[assignment]
        if node.kind == "CONTAINS":
            hit = node.search in s
        elif node.kind == "STARTSWITH":
            hit = s.startswith(node.search)
        else:
            hit = s.endswith(node.search)
        return hit != node.negated
    raise TypeError(f"not a predicate node: {node!r}")


def interpret(node: Node, props: Mapping[str, str]) -> bool | None:
    """TRUE, FALSE or NULL (None); raises FilterEvaluationError like RocketMQ would throw."""
    return _pred(node, props, None)


_NAMES = {True: "TRUE", False: "FALSE", None: "NULL"}


@dataclass(frozen=True)
class Explanation:
    """Why a message did or did not match a selector.

    ``outcome`` is TRUE, FALSE, NULL or ERROR for the whole expression;
    ``predicate`` is the source text of the innermost predicate that decided
    it (None when it matched), ``predicate_outcome`` that predicate's result
    and ``reason`` a short human explanation (missing properties, the error).
    """

    expression: str
    matched: bool
    outcome: str
    predicate: str | None = None
    predicate_outcome: str | None = None
    reason: str | None = None
    error: str | None = None
    missing: tuple[str, ...] = field(default_factory=tuple)

    def __str__(self) -> str:
        head = f"{self.expression!r} -> {self.outcome} ({'delivered' if self.matched else 'not delivered'})"
        if self.predicate is None:
            return head
        return f"{head}: {self.predicate} is {self.predicate_outcome}" + (f" ({self.reason})" if self.reason else "")


def _culprit(node: Node, trace: dict[int, object], want: object) -> Node:
    """Descend to the innermost traced predicate that produced `want` (FALSE, NULL or an error)."""
    while True:
        if isinstance(node, (And, Or)):
            nxt = next((t for t in node.terms if _same(trace.get(id(t), _MISSING), want)), None)
        elif isinstance(node, Not):
            inner = trace.get(id(node.operand), _MISSING)
            nxt = node.operand if isinstance(want, Exception) or inner is None or inner is (not want) else None
            if nxt is not None and not isinstance(want, Exception) and want is not None:
                want = not want
        else:
            nxt = None
            if isinstance(want, Exception):
                for child in (getattr(node, "left", None), getattr(node, "right", None), getattr(node, "operand", None)):
                    if child is not None and isinstance(trace.get(id(child), None), Exception):
                        nxt = child
                        break
        if nxt is None:
            return node
        node = nxt


class _Missing:
    pass


_MISSING = _Missing()


def _same(got: object, want: object) -> bool:
    if isinstance(want, Exception):
        return isinstance(got, Exception)
    return got is want


def explain(node: Node, expression: str, props: Mapping[str, str]) -> Explanation:
    trace: dict[int, object] = {}
    try:
        result: object = _pred(node, props, trace)
    except FilterEvaluationError as exc:
        result = exc
    if result is True:
        return Explanation(expression, True, "TRUE")
    culprit = _culprit(node, trace, result)
    text = expression[culprit.start:culprit.end]  # type: ignore[union-attr]
    missing = tuple(name for name in properties_of(culprit) if props.get(name) is None)
    got = trace.get(id(culprit), result)
    if isinstance(result, Exception):
        err = str(got if isinstance(got, Exception) else result)
        return Explanation(expression, False, "ERROR", text, "ERROR", f"evaluation error: {err}", err, missing)
    outcome = _NAMES[result]  # type: ignore[index]
    pred_outcome = _NAMES[got] if got is True or got is False or got is None else outcome  # type: ignore[index]
    if missing:
        reason = "missing propert" + ("y " if len(missing) == 1 else "ies ") + ", ".join(missing)
    else:
        values = ", ".join(f"{n}={props.get(n)!r}" for n in properties_of(culprit))
        reason = values or None
    return Explanation(expression, False, outcome, text, pred_outcome, reason, None, missing)
