"""Recursive-descent parser for RocketMQ's SQL92 selectors, one method per precedence level.

Grammar (SelectorParser.java), lowest precedence first::

    or   := and ( OR and )*
    and  := eq ( AND eq )*
    eq   := cmp ( '=' cmp | '<>' cmp | IS NULL | IS NOT NULL )*
    cmp  := unary ( ('>'|'>='|'<'|'<=') unary | [NOT] (CONTAINS|STARTSWITH|ENDSWITH) string
                  | [NOT] BETWEEN unary AND unary | [NOT] IN '(' string (',' string)* ')' )*
    unary:= '+' unary | '-' unary | NOT unary | primary
    primary := literal | identifier | '(' or ')'

RocketMQ's compile-time checks (filter/src/main/java/org/apache/rocketmq/filter/parser/SelectorParser.jj,
filter/.../expression/ComparisonExpression.java) are made as nodes are built. Unlike
RocketMQ the whole input must be consumed: a token after a complete expression
is an error pointing at it.
"""
from __future__ import annotations

from collections.abc import Callable

from sluice.errors import SelectorSyntaxError
from sluice.filter.limits import DEFAULT_LIMITS, SelectorLimits
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
    is_boolean,
    is_constant,
)
from sluice.filter.sql_lexer import EOF, FLOAT, IDENT, INT, KEYWORD, PUNCT, STRING, Token, syntax_error, tokenize

JAVA_INT_MAX = 2**31 - 1
JAVA_LONG_MAX = 2**63 - 1
DOUBLE_MAX = 1.7976931348623157e308

_ORDERING = (">", ">=", "<", "<=")
_STRING_OPS = ("CONTAINS", "STARTSWITH", "ENDSWITH")
_OPERAND_HINT = "an operand (property, literal or '(')"


class _Parser:
    def __init__(self, expression: str, limits: SelectorLimits) -> None:
        self.expr = expression
        self.limits = limits
        self.tokens = tokenize(expression)
        self.i = 0
        self.nesting = 0
        self.nodes = 0
        self.depths: dict[int, int] = {}

    # -- token helpers -------------------------------------------------------------------------
    @property
    def tok(self) -> Token:
        return self.tokens[self.i]

    def advance(self) -> Token:
        tok = self.tokens[self.i]
        self.i += 1
        return tok

    def at(self, kind: str, text: str | None = None) -> bool:
        tok = self.tokens[self.i]
        return tok.kind == kind and (text is None or tok.text == text)

    def error(self, message: str, pos: int, token: str | None = None) -> SelectorSyntaxError:
        return syntax_error(self.expr, pos, message, token)

    def unexpected(self, expected: str) -> SelectorSyntaxError:
        tok = self.tok
        what = "end of expression" if tok.kind == EOF else f"token {tok.describe()}"
        return self.error(f"unexpected {what}; expected {expected}", tok.start, tok.text or None)

    def expect(self, kind: str, text: str | None, expected: str) -> Token:
        if not self.at(kind, text):
            raise self.unexpected(expected)
        return self.advance()

    def text_of(self, node: Node) -> str:
        return self.expr[node.start : node.end]  # type: ignore[union-attr]

    # -- node bookkeeping ----------------------------------------------------------------------
    def mk(self, node: Node) -> Node:
        """Count a new node and its depth; refuse it past the limits."""
        self.nodes += 1
        if self.nodes > self.limits.max_nodes:
            raise self.error(f"expression has more than {self.limits.max_nodes} nodes (SelectorLimits.max_nodes)",
                             node.start)  # type: ignore[union-attr]
        depth = 1 + max((self.depths.get(id(c), 1) for c in children(node)), default=0)
        if depth > self.limits.max_depth:
            raise self.error(f"expression is nested deeper than {self.limits.max_depth} (SelectorLimits.max_depth)",
                             node.start)  # type: ignore[union-attr]
        self.depths[id(node)] = depth
        return node

    def enter(self, tok: Token) -> None:
        self.nesting += 1
        if self.nesting > self.limits.max_depth:
            raise self.error(f"expression is nested deeper than {self.limits.max_depth} (SelectorLimits.max_depth)",
                             tok.start, tok.text)

    def as_bool(self, node: Node) -> Node:
        if is_boolean(node):
            return node
        if isinstance(node, Prop):
            return self.mk(BoolCast(node, node.start, node.end))
        raise self.error(f"expression {self.text_of(node)!r} will not result in a boolean value", node.start,
                         self.text_of(node))

    # -- grammar -------------------------------------------------------------------------------
    def parse(self) -> Node:
        node = self.parse_or()
        if not self.at(EOF):
            tok = self.tok
            raise self.error(f"unexpected token {tok.describe()} after a complete expression "
                             "(LIKE, arithmetic, '!=' and '==' are not part of the language)", tok.start, tok.text)
        return self.as_bool(node)

    def parse_or(self) -> Node:
        return self._chain("OR", self.parse_and, Or)

    def parse_and(self) -> Node:
        return self._chain("AND", self.parse_eq, And)

    def _chain(self, keyword: str, parse_term: Callable[[], Node], node_type: type[And] | type[Or]) -> Node:
        """``term ( keyword term )*``: one term stands as it is; more become one n-ary node of booleans."""
        terms = [parse_term()]
        while self.at(KEYWORD, keyword):
            self.advance()
            terms.append(parse_term())
        if len(terms) == 1:
            return terms[0]
        return self.mk(node_type(tuple(self.as_bool(t) for t in terms), terms[0].start, terms[-1].end))  # type: ignore

    def parse_eq(self) -> Node:
        left = self.parse_cmp()
        while True:
            tok = self.tok
            if tok.kind == PUNCT and tok.text in ("=", "<>"):
                self.advance()
                right = self.parse_cmp()
                node = self.make_eq(left, right, tok)
                left = node if tok.text == "=" else self.mk(Not(node, node.start, node.end))
            elif tok.kind == KEYWORD and tok.text == "IS":
                self.advance()
                negated = self.at(KEYWORD, "NOT")
                if negated:
                    self.advance()
                end = self.expect(KEYWORD, "NULL", "NULL after IS" + ("" if negated else " or IS NOT")).end
                node = self.mk(IsNull(left, left.start, end))  # type: ignore[union-attr]
                left = self.mk(Not(node, node.start, end)) if negated else node
            else:
                return left

    def make_eq(self, left: Node, right: Node, op: Token) -> Node:
        for side in (left, right):
            if is_constant(side) and side.jtype == "N":  # type: ignore[union-attr]
                raise self.error(f"NULL cannot be compared with '{op.text}'; use IS NULL or IS NOT NULL",
                                 side.start, "NULL")  # type: ignore[union-attr]
        if is_constant(left) and is_constant(right) and is_boolean(left) and not is_boolean(right):
            raise self.error(f"{self.text_of(left)} cannot be compared with {self.text_of(right)} using '{op.text}'",
                             op.start, op.text)
        return self.mk(Eq(left, right, left.start, right.end))  # type: ignore[union-attr]

    def check_ordering_operand(self, node: Node, op: Token) -> None:
        if is_constant(node):
            if node.jtype in ("I", "L", "D"):  # type: ignore[union-attr]
                return
        elif not is_boolean(node):
            return
        raise self.error(f"{self.text_of(node)} cannot be an operand of '{op.text}' (only numbers and properties can)",
                         node.start, self.text_of(node))  # type: ignore[union-attr]

    def make_compare(self, op: Token, left: Node, right: Node) -> Node:
        self.check_ordering_operand(left, op)
        self.check_ordering_operand(right, op)
        return self.mk(Compare(op.text, left, right, left.start, right.end))  # type: ignore[union-attr]

    def parse_cmp(self) -> Node:
        left = self.parse_unary()
        while True:
            tok = self.tok
            if tok.kind == PUNCT and tok.text in _ORDERING:
                self.advance()
                left = self.make_compare(tok, left, self.parse_unary())
                continue
            if tok.kind != KEYWORD or tok.text not in ("NOT", "BETWEEN", "IN") + _STRING_OPS:
                return left
            self.advance()
            negated = tok.text == "NOT"
            op = tok
            if negated:
                op = self.tok
                if not (op.kind == KEYWORD and op.text in ("BETWEEN", "IN") + _STRING_OPS):
                    raise self.unexpected("CONTAINS, STARTSWITH, ENDSWITH, BETWEEN or IN after NOT")
                self.advance()
            if op.text in _STRING_OPS:
                lit = self.expect(STRING, None, f"a string literal after {op.text}")
                left = self.mk(StrMatch(op.text, left, _unquote(lit.text), negated, left.start, lit.end))  # type: ignore
            elif op.text == "BETWEEN":
                left = self.parse_between(left, op, tok, negated)
            else:
                left = self.parse_in(left, op, negated)

    def parse_between(self, value: Node, op: Token, first: Token, negated: bool) -> Node:
        low = self.parse_unary()
        self.expect(KEYWORD, "AND", "AND between the BETWEEN bounds")
        high = self.parse_unary()
        if not negated and is_constant(low) and is_constant(high):
            lv, hv = low.value, high.value  # type: ignore[union-attr]
            if lv is None or hv is None:
                raise self.error("BETWEEN bounds cannot be NULL", (low if lv is None else high).start, "NULL")
            if low.jtype in "ILD" and high.jtype in "ILD" and hv < lv:  # type: ignore
                raise self.error(f"BETWEEN lower bound {self.text_of(low)} is greater than upper bound "
                                 f"{self.text_of(high)}", low.start, self.text_of(low))  # type: ignore[union-attr]
        if negated:
            terms = (self.make_compare(_tok("<", first), value, low), self.make_compare(_tok(">", first), value, high))
            return self.mk(Or(terms, value.start, high.end))  # type: ignore[union-attr]
        terms = (self.make_compare(_tok(">=", first), value, low), self.make_compare(_tok("<=", first), value, high))
        return self.mk(And(terms, value.start, high.end))  # type: ignore[union-attr]

    def parse_in(self, left: Node, op: Token, negated: bool) -> Node:
        self.expect(PUNCT, "(", f"'(' after {op.text}")
        values: list[str] = []
        while True:
            lit = self.expect(STRING, None, f"a string literal in the {op.text} list")
            values.append(_unquote(lit.text))
            if len(values) > self.limits.max_in_list:
                raise self.error(f"{op.text} list has more than {self.limits.max_in_list} items "
                                 "(SelectorLimits.max_in_list)", lit.start, lit.text)
            if self.at(PUNCT, ","):
                self.advance()
                continue
            end = self.expect(PUNCT, ")", f"',' or ')' in the {op.text} list").end
            break
        if not isinstance(left, Prop):
            raise self.error(f"the left side of {'NOT ' if negated else ''}IN must be a property, not "
                             f"{self.text_of(left)!r}", left.start, self.text_of(left))  # type: ignore[union-attr]
        return self.mk(In(left, frozenset(values), negated, left.start, end))

    def parse_unary(self) -> Node:
        tok = self.tok
        if tok.kind == PUNCT and tok.text in ("+", "-"):
            self.advance()
            self.enter(tok)
            operand = self.parse_unary()
            self.nesting -= 1
            if tok.text == "+":
                return operand
            if isinstance(operand, Const) and operand.jtype in ("I", "L", "D"):
                return self.mk(Const(-operand.value, operand.jtype, tok.start, operand.end, negated=True))  # type: ignore
            return self.mk(Neg(operand, tok.start, operand.end))  # type: ignore[union-attr]
        if tok.kind == KEYWORD and tok.text == "NOT":
            self.advance()
            self.enter(tok)
            operand = self.as_bool(self.parse_unary())
            self.nesting -= 1
            return self.mk(Not(operand, tok.start, operand.end))  # type: ignore[union-attr]
        return self.parse_primary()

    def parse_primary(self) -> Node:
        tok = self.tok
        kind = tok.kind
        if kind == IDENT:
            self.advance()
            return self.mk(Prop(tok.text, tok.start, tok.end))
        if kind == STRING:
            self.advance()
            return self.mk(Const(_unquote(tok.text), "S", tok.start, tok.end))
        if kind == INT:
            self.advance()
            return self.mk(self.int_literal(tok))
        if kind == FLOAT:
            self.advance()
            return self.mk(self.float_literal(tok))
        if kind == KEYWORD and tok.text in ("TRUE", "FALSE", "NULL"):
            self.advance()
            if tok.text == "NULL":
                return self.mk(Const(None, "N", tok.start, tok.end))
            return self.mk(Const(tok.text == "TRUE", "B", tok.start, tok.end))
        if kind == PUNCT and tok.text == "(":
            self.advance()
            self.enter(tok)
            node = self.parse_or()
            self.nesting -= 1
            self.expect(PUNCT, ")", "')'")
            return node
        raise self.unexpected(_OPERAND_HINT)

    def int_literal(self, tok: Token) -> Const:
        text = tok.text.rstrip("lL")
        value = int(text)
        if value > JAVA_LONG_MAX:
            raise self.error(f"integer literal {tok.text} does not fit in a Java long", tok.start, tok.text)
        return Const(value, "I" if value <= JAVA_INT_MAX else "L", tok.start, tok.end)

    def float_literal(self, tok: Token) -> Const:
        value = float(tok.text)
        if value > DOUBLE_MAX:
            raise self.error(f"float literal {tok.text} is greater than the largest double", tok.start, tok.text)
        # RocketMQ refuses anything below Double.MIN_VALUE, 0.0 included. Sluice accepts
        # such literals when written with a decimal point (0.0, .0, 1.0e-400); the exponent
        # form without one (0e0, 1e-400) keeps RocketMQ's refusal (conformance D-num-24).
        if value == 0.0 and "." not in tok.text:
            raise self.error(f"float literal {tok.text} is below the smallest positive double "
                             "(write 0 or 0.0)", tok.start, tok.text)
        return Const(value, "D", tok.start, tok.end)


def _unquote(text: str) -> str:
    return text[1:-1].replace("''", "'")


def _tok(op: str, at: Token) -> Token:
    return Token(PUNCT, op, at.start, at.end)


def parse(expression: str, limits: SelectorLimits = DEFAULT_LIMITS) -> Node:
    """The validated AST of `expression`; any problem raises SelectorSyntaxError with a position."""
    if not isinstance(expression, str):
        raise SelectorSyntaxError(f"a selector expression must be a str, not {type(expression).__name__}",
                                  position=0, expression=None)
    if len(expression) > limits.max_length:
        raise SelectorSyntaxError(
            f"Invalid SQL92 selector: expression is {len(expression)} characters long, more than "
            f"{limits.max_length} (SelectorLimits.max_length)", position=limits.max_length,
            expression=expression[:200])
    return _Parser(expression, limits).parse()
