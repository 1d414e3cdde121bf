"""Compile a validated selector AST into a Python function, once per expression.

The AST is printed as one Python expression (literals via ``repr``, property
names via ``repr``), wrapped in a ``def`` and compiled with ``compile``/``exec``
in a namespace holding only the helpers below and no builtins, so nothing in
the expression text can reach Python. Numbers only ever come from literals
(properties are strings, unary minus of a property is NULL), so every operand's
Java type is known here and each comparison is specialised at compile time.

Three-valued AND/OR are inlined with walrus temporaries: left to right, stop at
the first FALSE (AND) / TRUE (OR), else NULL if any term was NULL.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

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


def _null(_: object) -> None:
    """Unary minus of a non-number: the operand was evaluated (it may raise), the result is NULL."""
    return None


def _false(_: object) -> bool:
    return False


def _dcmp_str(v: str, c: float) -> int:
    return rt.double_cmp(rt.parse_double(v), c)


def _ss(lv: str, rv: str) -> int:
    return rt.order_cmp(lv, rv, "S", "S")


def _ord(lv: object, rv: object, lt: str, rt_: str) -> int | None:
    return None if rv is None else rt.order_cmp(lv, rv, lt, rt_)


HELPERS: dict[str, Any] = {
    "_NOT": {True: False, False: True, None: None},
    "_null": _null,
    "_false": _false,
    "_eq": rt.eq,
    "_pi": rt.parse_int,
    "_pl": rt.parse_long,
    "_pd": rt.parse_double,
    "_bool": rt.bool_of,
    "_dcmp": rt.double_cmp,
    "_dcs": _dcmp_str,
    "_ss": _ss,
    "_ord": _ord,
    "_E": (FilterEvaluationError, TypeError, AttributeError, ValueError),
    # Anything but FilterEvaluationError (a non-str value, a mapping without .get) becomes one.
    "_U": (TypeError, AttributeError, ValueError),
    "_FEE": FilterEvaluationError,
    "_why": lambda e: f"cannot evaluate selector on these properties: {e}",
}

_FLIP = {">": "<", ">=": "<=", "<": ">", "<=": ">="}


class _Gen:
    def __init__(self, props: list[str]) -> None:
        self.var = {name: f"v{i}" for i, name in enumerate(props)}
        self.temps = 0

    def temp(self) -> str:
        self.temps += 1
        return f"t{self.temps}"

    def value(self, node: Node) -> tuple[str, str]:
        """(code, kind) of a value; kind is a jtype, 'S?' (property), 'B?' (predicate) or 'N'."""
        if isinstance(node, Prop):
            return self.var[node.name], "S?"
        if isinstance(node, Const):
            return ("None" if node.jtype == "N" else f"({node.value!r})"), node.jtype
        if isinstance(node, Neg):
            operand = node.operand
            if isinstance(operand, (Prop, Const)):
                return "None", "N"
            return f"_null({self.value(operand)[0]})", "N"
        return self.pred(node), "B?"

    def pred(self, node: Node) -> str:
        if isinstance(node, Const):
            return repr(node.value)
        if isinstance(node, BoolCast):
            return f"(None if {self.var[node.operand.name]} is None else False)"
        if isinstance(node, Not):
            return f"_NOT[{self.pred(node.operand)}]"
        if isinstance(node, (And, Or)):
            stop = "False" if isinstance(node, And) else "True"
            other = "True" if isinstance(node, And) else "False"
            names = [self.temp() for _ in node.terms]
            tests = " or ".join(f"({n} := {self.pred(t)}) is {stop}" for n, t in zip(names, node.terms))
            nulls = " or ".join(f"{n} is None" for n in names)
            return f"({stop} if {tests} else (None if {nulls} else {other}))"
        if isinstance(node, IsNull):
            code, kind = self.value(node.operand)
            return "(False)" if kind in ("I", "L", "D", "S", "B") else f"({code} is None)"
        if isinstance(node, Eq):
            return self.eq(node)
        if isinstance(node, Compare):
            return self.compare(node)
        if isinstance(node, In):
            v = self.var[node.operand.name]
            items = ", ".join(repr(s) for s in sorted(node.values))
            op = "not in" if node.negated else "in"
            return f"(None if {v} is None else {v} {op} {{{items}}})"
        if isinstance(node, StrMatch):
            return self.strmatch(node)
        raise TypeError(f"not a predicate node: {node!r}")

    def eq(self, node: Eq) -> str:
        lc, lk = self.value(node.left)
        rc, rk = self.value(node.right)
        if lk == "S?" and rk == "S":
            return f"(None if {lc} is None else {lc} == {rc})"
        if lk == "S" and rk == "S?":
            return f"({lc} == {rc})"
        if lk == "S?" and rk == "S?":
            return f"((True if {rc} is None else None) if {lc} is None else {lc} == {rc})"
        if lk == "S?" and rk == "B":
            return f"(None if {lc} is None else _bool({lc}) is {rc})"
        return f"_eq({lc}, {rc}, {lk[0]!r}, {rk[0]!r})"

    def compare(self, node: Compare) -> str:
        lc, lk = self.value(node.left)
        rc, rk = self.value(node.right)
        op = node.op
        # String against a number literal: the literal's type parses the string
        # (Integer.valueOf / Long.valueOf / Double.valueOf); doubles use Double.compare.
        if lk == "S?" and rk in ("I", "L"):
            return f"(None if {lc} is None else {'_pi' if rk == 'I' else '_pl'}({lc}) {op} {rc})"
        if rk == "S?" and lk in ("I", "L"):
            return f"(None if {rc} is None else {lc} {op} {'_pi' if lk == 'I' else '_pl'}({rc}))"
        if "S?" in (lk, rk) and "D" in (lk, rk):
            v, c, op = (lc, rc, op) if lk == "S?" else (rc, lc, _FLIP[op])
            if float(c.strip("()")) != 0.0:
                # Away from zero, Double.compare is Python's order except that NaN is the largest.
                t = self.temp()
                nan = f" or {t} != {t}" if op in (">", ">=") else ""
                return f"(None if {v} is None else (({t} := _pd({v})) {op} {c}{nan}))"
            return f"(None if {v} is None else _dcs({v}, {c}) {op} 0)"
        if lk == "S?" and rk == "S?":
            return f"(None if {lc} is None or {rc} is None else _ss({lc}, {rc}) {op} 0)"
        t = self.temp()
        return (f"(None if ({t} := {lc}) is None or ({t} := _ord({t}, {rc}, {lk[0]!r}, {rk[0]!r})) is None "
                f"else {t} {op} 0)")

    def strmatch(self, node: StrMatch) -> str:
        if not node.search:
            return "False"
        code, kind = self.value(node.operand)
        search = repr(node.search)
        if node.kind == "CONTAINS":
            hit = f"{search} in {{v}}" if not node.negated else f"{search} not in {{v}}"
        elif node.kind == "STARTSWITH":
            hit = ("not " if node.negated else "") + f"{{v}}.startswith({search})"
        else:
            hit = ("not " if node.negated else "") + f"{{v}}.endswith({search})"
        if kind == "S?":
            return f"(False if {code} is None else {hit.format(v=code)})"
        if kind == "S":
            return f"({hit.format(v=code)})"
        if kind in ("I", "L", "D", "B") or code == "None":
            return "False"
        return f"_false({code})"


def generate(node: Node) -> tuple[str, list[str]]:
    """Python source of ``_evaluate(p)`` and ``_matches(p)`` for `node`, and the properties read."""
    props = properties_of(node)
    gen = _Gen(props)
    body = gen.pred(node)
    loads_try = "".join(f"        {gen.var[name]} = g({name!r})\n" for name in props)
    source = (
        "def _evaluate(p):\n"
        "    try:\n"
        "        g = p.get\n"
        f"{loads_try}"
        f"        return {body}\n"
        "    except _U as e:\n"
        "        raise _FEE(_why(e)) from e\n"
        "\n"
        "def _matches(p):\n"
        "    try:\n"
        "        g = p.get\n"
        f"{loads_try}"
        f"        return {body} is True\n"
        "    except _E:\n"
        "        return False\n"
    )
    return source, props


def compile_ast(node: Node, name: str = "<selector>") -> tuple[Callable[[Mapping[str, str]], bool | None],
                                                                Callable[[Mapping[str, str]], bool], str]:
    """(evaluate, matches, source) for `node`; evaluate raises on evaluation errors, matches never does."""
    source, _ = generate(node)
    namespace: dict[str, Any] = {"__builtins__": {}}
    namespace.update(HELPERS)
    exec(compile(source, name, "exec"), namespace)  # noqa: S102 - source is generated from a validated AST
    return namespace["_evaluate"], namespace["_matches"], source
