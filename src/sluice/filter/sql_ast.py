"""The validated AST of a SQL92 selector, after RocketMQ's compile-time rewrites.

``<>`` is ``Not(Eq)``, ``IS NOT NULL`` is ``Not(IsNull)``, ``BETWEEN`` is an
``And`` of two comparisons and ``NOT BETWEEN`` an ``Or``; AND/OR chains are
flattened (left-to-right evaluation with short-circuit is the same). Every node
keeps the source span it came from, for errors and ``explain``.

Java value types of constants (``jtype``): ``I`` Integer, ``L`` Long, ``D``
Double, ``S`` String, ``B`` Boolean, ``N`` null.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Union


@dataclass(frozen=True, slots=True)
class Const:
    value: object
    jtype: str
    start: int
    end: int
    # A literal folded from unary minus: RocketMQ sees a UnaryExpression there,
    # not a ConstantExpression, so the constant-only compile checks skip it.
    negated: bool = False


@dataclass(frozen=True, slots=True)
class Prop:
    name: str
    start: int
    end: int


@dataclass(frozen=True, slots=True)
class Neg:
    """Unary minus of something that is not a numeric literal: always NULL at run time."""

    operand: Node
    start: int
    end: int


@dataclass(frozen=True, slots=True)
class BoolCast:
    """A bare property used as a boolean: NULL if absent, FALSE otherwise (values are strings)."""

    operand: Prop
    start: int
    end: int


@dataclass(frozen=True, slots=True)
class Not:
    operand: Node
    start: int
    end: int


@dataclass(frozen=True, slots=True)
class And:
    terms: tuple[Node, ...]
    start: int
    end: int


@dataclass(frozen=True, slots=True)
class Or:
    terms: tuple[Node, ...]
    start: int
    end: int


@dataclass(frozen=True, slots=True)
class Eq:
    left: Node
    right: Node
    start: int
    end: int


@dataclass(frozen=True, slots=True)
class IsNull:
    operand: Node
    start: int
    end: int


@dataclass(frozen=True, slots=True)
class Compare:
    op: str  # one of > >= < <=
    left: Node
    right: Node
    start: int
    end: int


@dataclass(frozen=True, slots=True)
class In:
    operand: Prop
    values: frozenset[str]
    negated: bool
    start: int
    end: int


@dataclass(frozen=True, slots=True)
class StrMatch:
    kind: str  # CONTAINS, STARTSWITH or ENDSWITH
    operand: Node
    search: str
    negated: bool
    start: int
    end: int


Node = Union[Const, Prop, Neg, BoolCast, Not, And, Or, Eq, IsNull, Compare, In, StrMatch]

BOOLEAN_NODES = (BoolCast, Not, And, Or, Eq, IsNull, Compare, In, StrMatch)


def is_boolean(node: Node) -> bool:
    """RocketMQ's `instanceof BooleanExpression`: predicates and the TRUE/FALSE/NULL literals."""
    if isinstance(node, BOOLEAN_NODES):
        return True
    return isinstance(node, Const) and node.jtype in ("B", "N") and not node.negated


def is_constant(node: Node) -> bool:
    """RocketMQ's `instanceof ConstantExpression` (a negated literal is not one)."""
    return isinstance(node, Const) and not node.negated


def children(node: Node) -> tuple[Node, ...]:
    if isinstance(node, (And, Or)):
        return node.terms
    if isinstance(node, (Eq, Compare)):
        return (node.left, node.right)
    if isinstance(node, (Neg, BoolCast, Not, IsNull, In, StrMatch)):
        return (node.operand,)
    return ()


def properties_of(node: Node) -> list[str]:
    """Property names referenced under `node`, in first-use order (iterative: trees may be wide)."""
    seen: dict[str, None] = {}
    stack = [node]
    while stack:
        cur = stack.pop()
        if isinstance(cur, Prop):
            seen.setdefault(cur.name, None)
        else:
            stack.extend(reversed(children(cur)))
    return list(seen)
