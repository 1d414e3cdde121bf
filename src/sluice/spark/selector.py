"""A selector compiled to a Spark Column with exactly the broker's outcomes.

``selector_column("a > 5 AND region IN ('eu','us')")`` filters a DataFrame of
the ``sluice`` / ``sluice_store`` sources (columns ``tags`` and ``properties``
map<string,string>) the way the broker's ``compile_selector`` matches.

How the Java semantics (sluice.filter.sql_runtime) become Spark expressions:

* Every predicate becomes an int *state*: 0 FALSE, 1 NULL, 2 TRUE, 3 ERROR
  (RocketMQ throws; the broker counts the message as not matched). AND, OR and
  NOT combine states through 16-entry lookup tables, so each child appears once
  in the plan (no blow-up with depth) and left-to-right short-circuit is exact:
  ``FALSE AND <error>`` is FALSE, ``NULL AND <error>`` is an error. The result
  is ``state = 2``: a non-null boolean.
* Strings meet numbers only through Java's parser of the literal's type.
  ``Integer/Long.valueOf`` and ``Double.valueOf`` are reproduced by a regular
  expression that decides *whether* Java accepts the text, then ``try_cast``
  for the value: never a plain cast, so ANSI mode can never fail the job.
* ``Double.compare`` differs from SQL only on zeros (-0.0 < 0.0): the sign of
  a zero is read from its string form where a zero can meet a zero.
* Sub-expressions without properties are evaluated at compile time by the
  filter package's own interpreter.
"""
from __future__ import annotations

import re

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sluice.errors import FilterEvaluationError, InvalidParameterError, SelectorSyntaxError
from sluice.filter import sql_runtime as rt
from sluice.filter.limits import DEFAULT_LIMITS
from sluice.filter.sql_ast import (
    And,
    BoolCast,
    Compare,
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
from sluice.filter.sql_interp import _value as _static_value
from sluice.filter.sql_interp import interpret
from sluice.filter.sql_parser import parse
from sluice.filter.tags import parse_tag_subscription

if TYPE_CHECKING:
    from pyspark.sql import Column

F_, N_, T_, E_ = 0, 1, 2, 3
_NOT = (T_, N_, F_, E_)
_AND = (0, 0, 0, 0, 0, 1, 1, 3, 0, 1, 2, 3, 3, 3, 3, 3)
_OR = (0, 1, 2, 3, 1, 1, 2, 3, 2, 2, 2, 2, 3, 3, 3, 3)

# Java accepts these for Integer/Long.valueOf (after mapping Unicode decimal digits to ASCII),
# and these (after String.trim) for Double.valueOf. \A..\z: Java's $ would accept a final newline.
_INT_RE = r"\A[+-]?[0-9]+\z"
_DOUBLE_RE = (r"\A(?:[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?[fFdD]?"
              r"|[+-]?0[xX](?:[0-9a-fA-F]+\.?|[0-9a-fA-F]*\.[0-9a-fA-F]+)[pP][+-]?[0-9]+[fFdD]?"
              r"|[+-]?NaN|[+-]?Infinity)\z")
_JAVA_TRIM = "".join(chr(c) for c in range(33))


def _unicode_digits() -> tuple[str, str]:
    """Every non-ASCII BMP decimal digit (what Python's \\d and Character.digit accept) and its value."""
    src, dst = [], []
    for c in range(0x80, 0x10000):
        ch = chr(c)
        if ch.isdecimal():
            src.append(ch)
            dst.append(str(int(ch)))
    return "".join(src), "".join(dst)


_UDIGITS_FROM, _UDIGITS_TO = _unicode_digits()


@dataclass(slots=True)
class _Val:
    """A compiled value: its Java type, and either a constant or a Column (null = Java null)."""

    jtype: str  # I L D S B N
    col: Column | None = None
    const: object = None
    err: Column | None = None  # true where evaluating it throws (None: never)

    @property
    def is_const(self) -> bool:
        return self.col is None


def _F():
    from pyspark.sql import functions as F

    return F


def check_selector(expression_type: str, expression: str | None) -> None:
    """Refuse, in one short error, a selector the broker would refuse, and a SQL92 one naming the
    DataFrame's ``tags`` column: in SQL92 a message's tag is ``TAGS`` (upper case) and ``tags`` is an
    ordinary property, which messages rarely carry, so such a selector would match nothing."""
    from sluice.filter import compile_selector

    kind = (expression_type or "TAG").upper()
    try:
        compile_selector(kind, expression)
    except SelectorSyntaxError as exc:
        raise SelectorSyntaxError(f"option selector: {exc}", position=exc.position).with_traceback(None) \
            from None
    if kind == "SQL92" and expression is not None:
        _refuse_tags_name(expression)


_ONE_WORD = re.compile(r"[\w.\-]+")


def reads_as_sql92(expression: str) -> bool:
    """Whether ``expression`` is SQL92 rather than a tag expression: it compiles as SQL92 and is more
    than one word ("TagA" compiles too, as a property test, but is a tag; "TagA || TagB" and "*" do not
    compile), so a TAG selector that does was written as SQL92."""
    from sluice.filter import compile_selector

    if _ONE_WORD.fullmatch(expression.strip()):
        return False
    try:
        compile_selector("SQL92", expression)
    except SelectorSyntaxError:
        return False
    return True


def _refuse_tags_name(expression: str) -> None:
    named = [n for n in properties_of(parse(expression, DEFAULT_LIMITS)) if n.upper() == "TAGS" and n != "TAGS"]
    if named:
        raise SelectorSyntaxError(
            f"SQL92 selector {expression!r} names {named[0]!r}: the tag is TAGS in SQL92 (upper case; "
            f"{named[0]!r} would be a message property, which matches nothing here): write TAGS",
            position=expression.find(named[0]))


def selector_column(expression: str, expression_type: str = "SQL92", *, tags: str = "tags",
                    properties: str = "properties") -> Column:
    """A boolean Column that is true exactly where the broker would deliver the message.

    ``TAGS`` reads the ``tags`` column, every other name the ``properties`` map.
    ``expression_type`` is SQL92 or TAG (``*`` or ``A || B``). Raises SelectorSyntaxError
    for an expression the broker would refuse.
    """
    F = _F()
    kind = (expression_type or "TAG").upper()
    if kind == "TAG":
        wanted = parse_tag_subscription(expression)
        if wanted is None:
            return F.lit(True)
        return F.coalesce(F.col(tags).isin(list(wanted)), F.lit(False))
    if kind != "SQL92":
        raise InvalidParameterError(f"selector type {expression_type!r} has no Spark form (TAG or SQL92)")
    ast = parse(expression, DEFAULT_LIMITS)
    _refuse_tags_name(expression)
    state = _Compiler(tags, properties).pred(ast)
    return (state == F.lit(T_)) if not isinstance(state, int) else F.lit(state == T_)


class _Compiler:
    def __init__(self, tags: str, properties: str) -> None:
        self.F = _F()
        self.tags = tags
        self.properties = properties

    # ---- helpers -----------------------------------------------------------------------------------
    def lit(self, v: object) -> Column:
        return self.F.lit(v)

    def prop(self, name: str) -> Column:
        F = self.F
        if name == "TAGS":
            return F.col(self.tags)
        return F.col(self.properties).getItem(name)

    def table(self, tab: tuple[int, ...], index: Column) -> Column:
        F = self.F
        return F.get(F.array(*[F.lit(x) for x in tab]), index)

    def case(self, *branches: tuple[Column | None, int], default: int | Column) -> Column | int:
        """CASE WHEN cond THEN state ...; a None condition is 'never'."""
        F = self.F
        out = None
        for cond, state in branches:
            if cond is None:
                continue
            out = F.when(cond, F.lit(state)) if out is None else out.when(cond, F.lit(state))
        dflt = F.lit(default) if isinstance(default, int) else default
        if out is None:
            return default
        return out.otherwise(dflt)

    # ---- Java parsing in Spark ---------------------------------------------------------------------
    def java_integer(self, s: Column, jtype: str) -> tuple[Column, Column]:
        """(value or null, conversion failed) for Integer.valueOf (I) / Long.valueOf (L)."""
        F = self.F
        digits = F.translate(s, _UDIGITS_FROM, _UDIGITS_TO)
        value = F.when(digits.rlike(_INT_RE), digits.try_cast("bigint"))
        if jtype == "I":
            value = F.when((value >= rt.INT_MIN) & (value <= rt.INT_MAX), value)
        return value, value.isNull()

    def java_double(self, s: Column) -> tuple[Column, Column]:
        F = self.F
        t = F.trim(s, F.lit(_JAVA_TRIM))
        value = F.when(t.rlike(_DOUBLE_RE), t.try_cast("double"))
        return value, value.isNull()

    def neg_zero(self, x: Column | float) -> Column | bool:
        if not hasattr(x, "isNull"):
            return x == 0.0 and math.copysign(1.0, x) < 0  # type: ignore[arg-type]
        F = self.F
        return (x == F.lit(0.0)) & x.cast("string").startswith("-")  # type: ignore[union-attr]

    def double_cmp_holds(self, op: str, x: Column, y: Column | float) -> Column:
        """Double.compare(x, y) <op> 0; SQL order agrees with it except on -0.0 vs 0.0 (and NaN, which
        Spark also puts above everything and equal to itself)."""
        F = self.F
        ylit = y if hasattr(y, "isNull") else F.lit(float(y))  # type: ignore[arg-type]
        zero_possible = hasattr(y, "isNull") or y == 0.0
        if not zero_possible:
            return {"=": x == ylit, ">": x > ylit, ">=": x >= ylit, "<": x < ylit, "<=": x <= ylit}[op]
        nx, ny = self.neg_zero(x), self.neg_zero(y)
        nx_c = nx if hasattr(nx, "isNull") else F.lit(nx)
        ny_c = ny if hasattr(ny, "isNull") else F.lit(ny)
        # On SQL-equal operands the tie-break is the zero sign: -0.0 sorts first.
        cmp = (F.when(x < ylit, F.lit(-1)).when(x > ylit, F.lit(1))
               .otherwise(ny_c.cast("int") - nx_c.cast("int")))
        return {"=": cmp == 0, ">": cmp > 0, ">=": cmp >= 0, "<": cmp < 0, "<=": cmp <= 0}[op]

    # ---- values ------------------------------------------------------------------------------------
    def value(self, node: Node) -> _Val:
        F = self.F
        if not properties_of(node):
            try:
                v = _static_value(node, {}, None)
            except FilterEvaluationError:
                return _Val("N", err=F.lit(True))
            return _Val("N") if v is None else _Val(v[0], const=v[1])
        if isinstance(node, Prop):
            return _Val("S", col=self.prop(node.name))
        if isinstance(node, Neg):
            inner = self.value(node.operand)
            if inner.jtype in ("I", "L", "D") and inner.is_const:
                return _Val(inner.jtype, const=-inner.const)  # type: ignore[operator]
            # Minus of a string or boolean is NULL; evaluating the operand may still throw.
            return _Val("N", err=inner.err)
        state = self.pred(node)
        if isinstance(state, int):
            if state == E_:
                return _Val("N", err=F.lit(True))
            return _Val("N") if state == N_ else _Val("B", const=state == T_)
        null = F.lit(None).cast("boolean")
        as_bool = F.get(F.array(F.lit(False), null, F.lit(True), null), state)
        return _Val("B", col=as_bool, err=state == F.lit(E_))

    def vcol(self, v: _Val) -> Column:
        F = self.F
        if not v.is_const:
            return v.col  # type: ignore[return-value]
        if v.jtype == "N":
            return F.lit(None)
        if v.jtype == "D":
            return F.lit(float(v.const))  # type: ignore[arg-type]
        if v.jtype in ("I", "L"):
            return F.lit(int(v.const)).cast("bigint")  # type: ignore[call-overload]
        return F.lit(v.const)

    def isnull(self, v: _Val) -> Column | None:
        """Where the value is Java null (None when it never is)."""
        if v.is_const:
            return self.F.lit(True) if v.jtype == "N" else None
        return v.col.isNull()  # type: ignore[union-attr]

    def compare(self, l: _Val, r: _Val, op: str) -> tuple[Column | None, Column]:
        """(conversion failed, Java comparison holds) for non-null l and r; op is = or an ordering."""
        F = self.F
        lt, rt_ = l.jtype, r.jtype
        if lt == "S" and rt_ == "S":
            if op == "=":
                return None, self.vcol(l) == self.vcol(r)
            lv, lfail = self.java_double(self.vcol(l))
            rv, rfail = self.java_double(self.vcol(r))
            return lfail | rfail, self.double_cmp_holds(op, lv, rv)
        if lt == "B" or rt_ == "B":
            if lt == "S":
                lb = self.bool_of(self.vcol(l))
                return None, self.int_cmp(op, lb.cast("int"), self.vcol(r).cast("int"))
            if rt_ == "S":
                rb = self.bool_of(self.vcol(r))
                return None, self.int_cmp(op, self.vcol(l).cast("int"), rb.cast("int"))
            if lt == rt_:
                return None, self.int_cmp(op, self.vcol(l).cast("int"), self.vcol(r).cast("int"))
            return None, F.lit({"=": False, ">": False, ">=": False, "<": True, "<=": True}[op])
        if lt == "S" or rt_ == "S":
            s, num = (l, r) if lt == "S" else (r, l)
            if num.jtype == "D":
                parsed, fail = self.java_double(self.vcol(s))
            else:
                parsed, fail = self.java_integer(self.vcol(s), num.jtype)
            pv: _Val = _Val(num.jtype, col=parsed)
            ll, rr = (pv, num) if lt == "S" else (num, pv)
            return fail, self.num_cmp(op, ll, rr)
        return None, self.num_cmp(op, l, r)

    def num_cmp(self, op: str, l: _Val, r: _Val) -> Column:
        if l.jtype == "D" or r.jtype == "D":
            lc = self.vcol(l).cast("double")
            if r.is_const:
                return self.double_cmp_holds(op, lc, float(r.const))  # type: ignore[arg-type]
            if l.is_const:  # flip: c op x  ==  x flip(op) c
                flip = {"=": "=", ">": "<", ">=": "<=", "<": ">", "<=": ">="}[op]
                return self.double_cmp_holds(flip, self.vcol(r).cast("double"), float(l.const))  # type: ignore
            return self.double_cmp_holds(op, lc, self.vcol(r).cast("double"))
        return self.int_cmp(op, self.vcol(l), self.vcol(r))

    @staticmethod
    def int_cmp(op: str, a: Column, b: Column) -> Column:
        return {"=": a == b, ">": a > b, ">=": a >= b, "<": a < b, "<=": a <= b}[op]

    def bool_of(self, s: Column) -> Column:
        F = self.F
        return (F.length(s) == 4) & (F.lower(s) == "true")

    # ---- predicates --------------------------------------------------------------------------------
    def pred(self, node: Node) -> Column | int:
        F = self.F
        if not properties_of(node):
            try:
                r = interpret(node, {})
            except FilterEvaluationError:
                return E_
            return N_ if r is None else (T_ if r else F_)
        if isinstance(node, Not):
            s = self.pred(node.operand)
            return _NOT[s] if isinstance(s, int) else self.table(_NOT, s)
        if isinstance(node, (And, Or)):
            tab = _AND if isinstance(node, And) else _OR
            acc: Column | int = self.pred(node.terms[0])
            for term in node.terms[1:]:
                if isinstance(acc, int) and tab[acc * 4] == tab[acc * 4 + 3]:
                    return tab[acc * 4]  # decided before the term is evaluated (short-circuit)
                s = self.pred(term)
                if isinstance(acc, int) and isinstance(s, int):
                    acc = tab[acc * 4 + s]
                    continue
                a = F.lit(acc) if isinstance(acc, int) else acc
                b = F.lit(s) if isinstance(s, int) else s
                acc = self.table(tab, a * 4 + b)
            return acc
        if isinstance(node, BoolCast):
            return self.case((self.prop(node.operand.name).isNull(), N_), default=F_)
        if isinstance(node, IsNull):
            v = self.value(node.operand)
            return self.case((v.err, E_), (self.isnull(v), T_), default=F_)
        if isinstance(node, In):
            col = self.prop(node.operand.name)
            hit = col.isin(sorted(node.values))
            return self.case((col.isNull(), N_), (~hit if node.negated else hit, T_), default=F_)
        if isinstance(node, StrMatch):
            if not node.search:
                return F_
            v = self.value(node.operand)
            if v.jtype != "S" or v.is_const:
                return self.case((v.err, E_), default=F_)
            c = v.col
            hit = {"CONTAINS": c.contains, "STARTSWITH": c.startswith, "ENDSWITH": c.endswith}[node.kind](
                node.search)
            return self.case((c.isNull(), F_), (~hit if node.negated else hit, T_), default=F_)
        if isinstance(node, Eq):
            lv, rv = self.value(node.left), self.value(node.right)
            lnull, rnull = self.isnull(lv), self.isnull(rv)
            both = lnull & rnull if lnull is not None and rnull is not None else None
            fail, holds = self.compare(lv, rv, "=") if lv.jtype != "N" and rv.jtype != "N" else (None, F.lit(False))
            return self.case((lv.err, E_), (rv.err, E_), (both, T_), (lnull, N_), (rnull, F_), (fail, E_),
                             (holds, T_), default=F_)
        if isinstance(node, Compare):
            lv, rv = self.value(node.left), self.value(node.right)
            if lv.jtype == "N" or rv.jtype == "N":
                return self.case((lv.err, E_), (self.isnull(lv), N_), (rv.err, E_), default=N_)
            fail, holds = self.compare(lv, rv, node.op)
            return self.case((lv.err, E_), (self.isnull(lv), N_), (rv.err, E_), (self.isnull(rv), N_),
                             (fail, E_), (holds, T_), default=F_)
        raise InvalidParameterError(f"selector node {type(node).__name__} has no Spark form")

