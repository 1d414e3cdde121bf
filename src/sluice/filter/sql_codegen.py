"""Compile a validated selector AST into a Python function, once per expression.

The AST is printed as one Python expression (literals via ``repr``, property
names via ``repr``), wrapped in a ``def`` and compiled with ``compile``/``exec``
in a namespace holding only the helpers below and no builtins, so nothing in
the expression text can reach Python. Numbers only ever come from literals
(properties are strings, unary minus of a property is NULL), so every operand's
Java type is known here and each comparison is specialised at compile time.

Three-valued AND/OR are inlined with walrus temporaries: left to right, stop at
the first FALSE (AND) / TRUE (OR), else NULL if any term was NULL. Two "simple"
terms (NULL exactly when their one property is missing) become nested
conditionals instead. A property read by one such term only is fetched where the
term tests it for NULL, so short-circuited terms never look it up; numbers are
parsed through per-process dict caches (one subscript on a hit).
"""
from __future__ import annotations

from collections import Counter
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
    children,
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


class _ParseCache(dict):  # type: ignore[type-arg]
    """str -> parsed number: a hit is one dict subscript, cheaper than the lru_cache call.

    Bounded (cleared when full) so distinct values cannot grow it without limit; failures raise
    from the parser and are not stored. Separate from sql_runtime's caches, which the interpreter uses."""

    __slots__ = ("parse",)

    def __init__(self, parse: Callable[[str], object]) -> None:
        super().__init__()
        self.parse = parse

    def __missing__(self, s: str) -> object:
        value = self.parse(s)
        if len(self) >= 65536:
            self.clear()
        self[s] = value
        return value


class _ParseOrBad(_ParseCache):
    """_ParseCache for the multi-expression evaluator: a value that does not parse maps to _BAD (and is
    stored too), so data that never parses costs a lookup, not an exception, per message."""

    __slots__ = ()

    def __missing__(self, s: str) -> object:
        try:
            value = self.parse(s)
        except FilterEvaluationError:
            value = _BAD
        if len(self) >= 65536:
            self.clear()
        self[s] = value
        return value


HELPERS: dict[str, Any] = {
    "_NOT": {True: False, False: True, None: None},
    "_null": _null,
    "_false": _false,
    "_eq": rt.eq,
    "_pi": rt.parse_int,
    "_pl": rt.parse_long,
    "_pd": rt.parse_double,
    "_CI": _ParseCache(rt.parse_int),
    "_CL": _ParseCache(rt.parse_long),
    "_CD": _ParseCache(rt.parse_double),
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
_CACHE = {"_pi": "_CI", "_pl": "_CL", "_pd": "_CD"}


def _range_pair(node: And | Or) -> str | None:
    """The property of a fusable ``a BETWEEN x AND y`` (two comparisons of one property with integer
    literals of one type), else None."""
    terms = node.terms
    if len(terms) != 2 or not all(isinstance(t, Compare) and isinstance(t.left, Prop)
                                  and isinstance(t.right, Const) for t in terms):
        return None
    a, b = terms
    if a.left.name != b.left.name or a.right.jtype != b.right.jtype or a.right.jtype not in ("I", "L"):
        return None
    return a.left.name


def _null_first_prop(node: Node) -> str | None:
    """The property of a leaf whose code tests that one property for NULL before anything else."""
    if isinstance(node, (In, BoolCast)):
        return node.operand.name
    if isinstance(node, (IsNull, StrMatch)) and isinstance(node.operand, Prop):
        return node.operand.name
    if isinstance(node, (Eq, Compare)) and isinstance(node.left, Prop) and isinstance(node.right, Const):
        if node.right.jtype in (("I", "L", "D") if isinstance(node, Compare) else ("S", "B")):
            return node.left.name
    if isinstance(node, Compare) and isinstance(node.right, Prop) and isinstance(node.left, Const) \
            and node.left.jtype in ("I", "L", "D"):
        return node.right.name
    return None


def lazy_props(node: Node) -> set[str]:
    """Properties read at exactly one place, by a leaf that tests them for NULL first: those are
    fetched there (``(v := p.get(name)) is None``) instead of up front."""
    sites: Counter[str] = Counter()
    eager: set[str] = set()
    stack = [node]
    while stack:
        cur = stack.pop()
        if isinstance(cur, (And, Or)) and (name := _range_pair(cur)) is not None:
            sites[name] += 1
        elif isinstance(cur, (And, Or, Not)):
            stack.extend(children(cur))
        elif (name := _null_first_prop(cur)) is not None:
            sites[name] += 1
        else:
            inner = [cur]
            while inner:  # every property elsewhere is loaded up front
                sub = inner.pop()
                if isinstance(sub, Prop):
                    eager.add(sub.name)
                inner.extend(children(sub))
    return {name for name, n in sites.items() if n == 1 and name not in eager}


def _cannot_raise(node: Node) -> bool:
    """Whether evaluating `node` on string properties can never raise (no number is parsed)."""
    stack = [node]
    while stack:
        cur = stack.pop()
        if isinstance(cur, (And, Or, Not)):
            stack.extend(children(cur))
        elif isinstance(cur, Eq):
            if not all(isinstance(x, Prop) or (isinstance(x, Const) and x.jtype in ("S", "B", "N"))
                       for x in (cur.left, cur.right)):
                return False
        elif not (isinstance(cur, (In, BoolCast, Const))
                  or (isinstance(cur, (IsNull, StrMatch)) and isinstance(cur.operand, (Prop, Const)))):
            return False
    return True


class _Gen:
    def __init__(self, props: list[str], lazy: set[str] | None = None) -> None:
        self.var = {name: f"v{i}" for i, name in enumerate(props)}
        self.lazy = lazy or set()
        self.temps = 0

    def nc(self, name: str) -> str:
        """The variable of property `name` where it is first tested for NULL (fetched there if lazy)."""
        v = self.var[name]
        return f"({v} := p.get({name!r}))" if name in self.lazy else v

    def temp(self) -> str:
        self.temps += 1
        return f"t{self.temps}"

    def parse(self, fn: str, var: str) -> str:
        """Code parsing property ``var`` with ``fn`` (_pi, _pl or _pd), through its dict cache."""
        return f"{_CACHE[fn]}[{var}]"

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
            return f"(None if {self.nc(node.operand.name)} is None else False)"
        if isinstance(node, Not):
            return f"_NOT[{self.pred(node.operand)}]"
        if isinstance(node, (And, Or)):
            fused = self.range_test(node)
            if fused is not None:
                return f"(None if {fused[0]} is None else {fused[1]})"
            pair = self.simple_pair(node)
            if pair is not None:
                return pair
            stop = "False" if isinstance(node, And) else "True"
            other = "True" if isinstance(node, And) else "False"
            names = [self.temp() for _ in node.terms]
            tests = " or ".join(f"({n} := {self.pred(t)}) is {stop}" for n, t in zip(names, node.terms))
            nulls = " or ".join(f"{n} is None" for n in names)
            return f"({stop} if {tests} else (None if {nulls} else {other}))"
        if isinstance(node, IsNull):
            if isinstance(node.operand, Prop):
                return f"({self.nc(node.operand.name)} is None)"
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
            return f"(None if {self.nc(node.operand.name)} is None else {v} {op} {{{items}}})"
        if isinstance(node, StrMatch):
            return self.strmatch(node)
        raise TypeError(f"not a predicate node: {node!r}")

    def range_test(self, node: And | Or) -> tuple[str, str] | None:
        """``a BETWEEN x AND y`` (and its NOT form) on an integer literal pair: (property variable where it is tested for NULL, code
        of the two comparisons) parsing the property once; None for any other AND/OR.

        Both terms are NULL exactly when the property is missing, so the three-valued AND/OR reduces to
        Python's on the two comparisons; a value that does not parse raises at the first, as before."""
        name = _range_pair(node)
        if name is None:
            return None
        a, b = node.terms
        v = self.var[name]
        t = self.temp()
        parsed = self.parse("_pi" if a.right.jtype == "I" else "_pl", v)
        join = "and" if isinstance(node, And) else "or"
        return self.nc(name), f"(({t} := {parsed}) {a.op} ({a.right.value!r}) {join} {t} {b.op} ({b.right.value!r}))"

    def simple(self, node: Node) -> tuple[str, str] | None:
        """(NULL test, two-valued code) of a term that is NULL exactly when its one property is
        missing, i.e. whose three-valued code is ``(None if <NULL test> is None else <code>)``."""
        if isinstance(node, (And, Or)):
            name = _range_pair(node)
        elif isinstance(node, (In, Eq, Compare)):
            name = _null_first_prop(node)
        else:
            name = None
        if name is None:
            return None
        saved = self.temps
        code = self.pred(node)
        prefix = f"(None if {self.nc(name)} is None else "
        if not code.startswith(prefix):
            self.temps = saved
            return None
        return self.nc(name), code[len(prefix):-1]

    def simple_pair(self, node: And | Or) -> str | None:
        """Three-valued AND/OR of two simple terms as nested conditionals, without temporaries: the
        first term's NULL test decides; the second term's code appears twice, in branches only one
        of which runs (so a lazily fetched property is still fetched once)."""
        if len(node.terms) != 2:
            return None
        saved = self.temps
        first = self.simple(node.terms[0])
        second = None if first is None else self.simple(node.terms[1])
        if first is None or second is None:
            self.temps = saved
            return None
        (n1, c1), (n2, c2) = first, second
        p2 = f"(None if {n2} is None else {c2})"
        if isinstance(node, And):
            return (f"(({p2} if {c1} else False) if {n1} is not None"
                    f" else (False if ({n2} is not None and not {c2}) else None))")
        return (f"((True if {c1} else {p2}) if {n1} is not None"
                f" else (True if ({n2} is not None and {c2}) else None))")

    def test(self, node: Node, tail: bool = True) -> str:
        """Python code that is True exactly when ``pred(node) is True``: two-valued where that is cheaper.

        Under "delivered only on TRUE", AND is TRUE iff every term is and OR iff any term is, so
        And/Or become Python's own (left to right, short-circuit), with one catch: an error makes the
        whole expression no match, and the three-valued AND goes on past a NULL term (where Python's
        stops) and may hit one. That matters only where a later OR term could still make the result
        TRUE, i.e. unless `tail` (this node not TRUE means the whole is not TRUE). Elsewhere the code
        raises exactly when ``pred(node)`` would. Only NOT needs the three values of its operand."""
        fused = self.range_test(node) if isinstance(node, (And, Or)) else None
        if fused is not None:
            return f"({fused[0]} is not None and {fused[1]})"
        if isinstance(node, And):
            if tail or all(_cannot_raise(t) for t in node.terms[1:]):
                return "(" + " and ".join(self.test(t, tail) for t in node.terms) + ")"
            return self.exact_and(node)
        if isinstance(node, Or):
            last = len(node.terms) - 1
            return "(" + " or ".join(self.test(t, tail and i == last) for i, t in enumerate(node.terms)) + ")"
        if isinstance(node, Not):
            return f"({self.pred(node.operand)} is False)"
        if isinstance(node, In):
            v = self.var[node.operand.name]
            items = ", ".join(repr(x) for x in sorted(node.values))
            return f"({self.nc(node.operand.name)} is not None and {v} {'not in' if node.negated else 'in'} {{{items}}})"
        if isinstance(node, (Compare, Eq)) and isinstance(node.left, Prop) and isinstance(node.right, Const) \
                and node.right.jtype in ("I", "L", "S"):
            # NULL only when the property is missing: "is True" is "present and the comparison holds".
            v = self.nc(node.left.name)
            code = self.pred(node)
            prefix = f"(None if {v} is None else "
            if code.startswith(prefix):
                return f"({v} is not None and {code[len(prefix):-1]})"
        return f"({self.pred(node)} is True)"

    def exact_and(self, node: And) -> str:
        """Two-valued AND that still evaluates the second term, for its errors, after a NULL first term.

        Only for two terms with a leaf second term (whose code then appears twice, in branches only
        one of which runs); anything else is tested three-valued, so code size stays linear."""
        second = node.terms[-1]
        if len(node.terms) != 2 or (isinstance(second, (And, Or)) and _range_pair(second) is None) \
                or isinstance(second, Not):
            return f"({self.pred(node)} is True)"
        first = self.simple(node.terms[0])
        rest = self.test(second, False)
        check = f"({self.pred(second)} is None and False)"
        if first is not None:
            return f"(({first[1]} and {rest}) if {first[0]} is not None else {check})"
        t = self.temp()
        return f"((({t} := {self.pred(node.terms[0])}) is not False) and ({rest} if {t} else {check}))"

    def eq(self, node: Eq) -> str:
        lc, lk = self.value(node.left)
        rc, rk = self.value(node.right)
        if lk == "S?" and rk == "S":
            return f"(None if {self.nc(node.left.name)} is None else {lc} == {rc})"
        if lk == "S" and rk == "S?":
            return f"({lc} == {rc})"
        if lk == "S?" and rk == "S?":
            return f"((True if {rc} is None else None) if {lc} is None else {lc} == {rc})"
        if lk == "S?" and rk == "B":
            return f"(None if {self.nc(node.left.name)} is None else _bool({lc}) is {rc})"
        return f"_eq({lc}, {rc}, {lk[0]!r}, {rk[0]!r})"

    def compare(self, node: Compare) -> str:
        lc, lk = self.value(node.left)
        rc, rk = self.value(node.right)
        op = node.op
        # String against a number literal: the literal's type parses the string
        # (Integer.valueOf / Long.valueOf / Double.valueOf); doubles use Double.compare.
        if lk == "S?" and rk in ("I", "L"):
            return f"(None if {self.nc(node.left.name)} is None else {self.parse('_pi' if rk == 'I' else '_pl', lc)} {op} {rc})"
        if rk == "S?" and lk in ("I", "L"):
            return f"(None if {self.nc(node.right.name)} is None else {lc} {op} {self.parse('_pi' if lk == 'I' else '_pl', rc)})"
        if "S?" in (lk, rk) and "D" in (lk, rk):
            v, c, op = (lc, rc, op) if lk == "S?" else (rc, lc, _FLIP[op])
            n = self.nc(node.left.name if lk == "S?" else node.right.name)
            if float(c.strip("()")) != 0.0:
                # Away from zero, Double.compare is Python's order except that NaN is the largest.
                t = self.temp()
                nan = f" or {t} != {t}" if op in (">", ">=") else ""
                return f"(None if {n} is None else (({t} := {self.parse('_pd', v)}) {op} {c}{nan}))"
            return f"(None if {n} is None else _dcs({v}, {c}) {op} 0)"
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
            return f"(False if {self.nc(node.operand.name)} is None else {hit.format(v=code)})"
        if kind == "S":
            return f"({hit.format(v=code)})"
        if kind in ("I", "L", "D", "B") or code == "None":
            return "False"
        return f"_false({code})"


def generate(node: Node) -> tuple[str, list[str]]:
    """Python source of ``_evaluate(p)`` and ``_matches(p)`` for `node`, and the properties read."""
    props = properties_of(node)
    gen = _Gen(props, lazy_props(node))
    body = gen.pred(node)
    test = gen.test(node)
    # p.get(...) at each use, not a bound ``g = p.get``: the method call is specialised by CPython and
    # cheaper than making the bound method when only a few lookups run.
    loads_try = "".join(f"        {gen.var[name]} = p.get({name!r})\n" for name in props if name not in gen.lazy)
    source = (
        "def _evaluate(p):\n"
        "    try:\n"
        f"{loads_try}"
        f"        return {body}\n"
        "    except _U as e:\n"
        "        raise _FEE(_why(e)) from e\n"
        "\n"
        "def _matches(p):\n"
        "    try:\n"
        f"{loads_try}"
        f"        return {test}\n"
        "    except _E:\n"
        "        return False\n"
    )
    return source, props


def generate_multi(nodes: list[Node]) -> str:
    """Python source of ``_multi(p)``: bit i of the result is set when ``nodes[i]`` is TRUE on ``p``.

    For evaluating many expressions on each message at once (bitmaps at dispatch): one call per message,
    each property looked up once, each expression in its own try (an error there is that expression's
    "no match", as in ``_matches``).
    """
    props: list[str] = []
    for node in nodes:
        props += [name for name in properties_of(node) if name not in props]
    gen = _MultiGen(props)

    def block(i: int, node: Node, pad: str) -> list[str]:
        return [f"{pad}try:", f"{pad}    if {gen.test(node)}:", f"{pad}        m |= {1 << i}",
                f"{pad}except _E:", f"{pad}    pass"]

    # Predicate indexing: expressions that can be TRUE only when one property equals a string literal
    # (``region = 'eu' AND ...``, the usual shape of many groups filtering one topic) are tested only
    # when the message's value is that literal: one dict lookup instead of a test per expression.
    by_literal: dict[str, dict[str, list[int]]] = {}
    for i, node in enumerate(nodes):
        anchor = _anchor(node)
        if anchor is not None:
            by_literal.setdefault(anchor[0], {}).setdefault(anchor[1], []).append(i)
    indexed_prop, groups = max(by_literal.items(), key=lambda kv: sum(map(len, kv[1].values())),
                               default=(None, {}))
    indexed = {i for idx in groups.values() for i in idx} if sum(map(len, groups.values())) >= _INDEX_MIN else set()
    body: list[str] = []
    for i, node in enumerate(nodes):
        if i not in indexed:
            body += block(i, node, "    ")
    head: list[str] = []
    if indexed:
        literals = list(groups)
        head.append(f"_IDX = {{{', '.join(f'{lit!r}: {k}' for k, lit in enumerate(literals))}}}")
        body.append(f"    k = _IDX.get({gen.var[indexed_prop]})")  # type: ignore[index]
        body.append("    if k is not None:")
        body += _dispatch_tree(list(range(len(literals))), "        ",
                               lambda k, pad: [ln for i in groups[literals[k]] for ln in block(i, nodes[i], pad)])
    lines = head + ["def _multi(p):", "    g = p.get"]
    lines += [f"    {gen.var[name]} = g({name!r})" for name in props]
    # Each property is parsed as a number once per message, not once per expression; a value that does
    # not parse becomes _BAD, whose comparisons raise where the parse would have (so only there).
    for (fn, var), name in gen.parsed.items():
        lines += ["    try:", f"        {name} = None if {var} is None else {_MULTI_PARSERS[fn]}[{var}]",
                  "    except _E:", f"        {name} = _BAD"]  # a value of the wrong type (unhashable, say)
    lines.append("    m = 0")
    lines += body
    lines.append("    return m")
    return "\n".join(lines) + "\n"


class _Bad:
    """A property value that did not parse as a number: comparing it fails like parsing it did."""

    __slots__ = ()

    def _fail(self, other: object) -> bool:
        raise ValueError("not a number")

    __lt__ = __le__ = __gt__ = __ge__ = __eq__ = __ne__ = _fail  # type: ignore[assignment]
    __hash__ = None  # type: ignore[assignment]


_BAD = _Bad()
_MULTI_PARSERS = {"_pi": "_BI", "_pl": "_BL", "_pd": "_BD"}


#: index a property's literals once at least this many expressions are anchored on it
_INDEX_MIN = 4


def _anchor(node: Node) -> tuple[str, str] | None:
    """(property, literal) when ``node`` can be TRUE only if that property's value is that string: it is,
    or is an AND with a term that is, ``prop = 'literal'`` (a missing property or another value makes
    that term FALSE or NULL, so the AND is not TRUE)."""
    for t in node.terms if isinstance(node, And) else (node,):
        if isinstance(t, Eq):
            left, right = t.left, t.right
            if isinstance(left, Prop) and isinstance(right, Const) and right.jtype == "S":
                return left.name, right.value  # type: ignore[return-value]
            if isinstance(right, Prop) and isinstance(left, Const) and left.jtype == "S":
                return right.name, left.value  # type: ignore[return-value]
    return None


def _dispatch_tree(keys: list[int], pad: str, emit: Callable[[int, str], list[str]]) -> list[str]:
    """``if k == ...`` branches over ``keys`` as a binary search, so many literals cost few comparisons."""
    if len(keys) <= 3:
        out: list[str] = []
        for j, key in enumerate(keys):
            out.append(f"{pad}{'if' if j == 0 else 'elif'} k == {key}:")
            out += emit(key, pad + "    ")
        return out
    mid = len(keys) // 2
    return ([f"{pad}if k < {keys[mid]}:"] + _dispatch_tree(keys[:mid], pad + "    ", emit)
            + [f"{pad}else:"] + _dispatch_tree(keys[mid:], pad + "    ", emit))


class _MultiGen(_Gen):
    def __init__(self, props: list[str]) -> None:
        super().__init__(props)
        self.parsed: dict[tuple[str, str], str] = {}

    def parse(self, fn: str, var: str) -> str:
        name = self.parsed.get((fn, var))
        if name is None:
            name = self.parsed[(fn, var)] = f"n{len(self.parsed)}"
        return name

    def test(self, node: Node, tail: bool = True) -> str:
        code = super().test(node, tail)
        # A property compared with an integer literal is parsed once per message; one that does not parse
        # is _BAD, whose comparison raises (the expression's "no match"). Where this term not being TRUE
        # already means no match (``tail``), test for _BAD instead: raising is dear, and data that does
        # not parse would pay for it in every such expression of every message.
        if tail and isinstance(node, Compare) and isinstance(node.left, Prop) and isinstance(node.right, Const) \
                and node.right.jtype in ("I", "L"):
            v = self.var[node.left.name]
            n = self.parse("_pi" if node.right.jtype == "I" else "_pl", v)
            prefix = f"({v} is not None and {n} "
            if code.startswith(prefix):
                return f"({v} is not None and {n} is not _BAD and {n} " + code[len(prefix):]
        return code


def compile_multi(nodes: list[Node]) -> Callable[[Mapping[str, str]], int]:
    """The compiled ``_multi`` of :func:`generate_multi`."""
    namespace: dict[str, Any] = {"__builtins__": {}, "_BAD": _BAD, "_BI": _ParseOrBad(rt.parse_int),
                                 "_BL": _ParseOrBad(rt.parse_long), "_BD": _ParseOrBad(rt.parse_double)}
    namespace.update(HELPERS)
    exec(compile(generate_multi(nodes), "<selectors>", "exec"), namespace)  # noqa: S102 - from validated ASTs
    return namespace["_multi"]


def compile_ast(node: Node, name: str = "<selector>") -> tuple[Callable[[Mapping[str, str]], bool | None],
                                                                Callable[[Mapping[str, str]], bool], str]:
    """(evaluate, matches, source) for `node`; evaluate raises on evaluation errors, matches never does."""
    source, _ = generate(node)
    namespace: dict[str, Any] = {"__builtins__": {}}
    namespace.update(HELPERS)
    exec(compile(source, name, "exec"), namespace)  # noqa: S102 - source is generated from a validated AST
    return namespace["_evaluate"], namespace["_matches"], source
