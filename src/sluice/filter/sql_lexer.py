"""Tokens of RocketMQ's SQL92 selector language (SelectorParser.jj), with positions.

Lexing follows JavaCC's longest-match rule: at each position every token
pattern is tried and the longest match wins, keywords beating identifiers of
the same length. A ``--`` comment needs a line end, otherwise it is two ``-``.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from sluice.errors import SelectorSyntaxError

KEYWORDS = frozenset(
    {"NOT", "AND", "OR", "BETWEEN", "IN", "TRUE", "FALSE", "NULL", "IS", "CONTAINS", "STARTSWITH", "ENDSWITH"}
)

# Token kinds.
KEYWORD = "keyword"
IDENT = "identifier"
INT = "integer"
FLOAT = "float"
STRING = "string"
PUNCT = "punct"
EOF = "end of expression"

_WS = re.compile(r"[ \t\n\r\f]+")
_EOL = re.compile(r"[\n\r]")
_BLOCK_COMMENT = re.compile(r"/\*.*?\*/", re.S)
_STRING = re.compile(r"'(?:[^']|'')*'")
_FLOAT = re.compile(r"[0-9]+\.[0-9]*(?:[eE][+-]?[0-9]+)?|\.[0-9]+(?:[eE][+-]?[0-9]+)?|[0-9]+[eE][+-]?[0-9]+")
_DECIMAL = re.compile(r"[1-9][0-9]*[lL]?|0")
_IDENT = re.compile(r"[a-zA-Z_$][a-zA-Z0-9_$]*")
_PUNCT = re.compile(r"<>|>=|<=|[=><(),+\-]")


@dataclass(frozen=True, slots=True)
class Token:
    kind: str
    text: str  # source text; keywords upper-cased
    start: int
    end: int

    def describe(self) -> str:
        if self.kind == EOF:
            return "end of expression"
        return repr(self.text) if self.kind != STRING else self.text


def highlight(expression: str, position: int, width: int = 60) -> str:
    """The line of `expression` holding `position` (clipped to `width`) with a caret under it."""
    position = max(0, min(position, len(expression)))
    line_start = expression.rfind("\n", 0, position) + 1
    line_end = expression.find("\n", position)
    if line_end < 0:
        line_end = len(expression)
    line = expression[line_start:line_end].replace("\r", " ").replace("\t", " ")
    col = position - line_start
    lo = max(0, col - width // 2)
    hi = min(len(line), lo + width)
    snippet = ("..." if lo > 0 else "") + line[lo:hi] + ("..." if hi < len(line) else "")
    caret_col = col - lo + (3 if lo > 0 else 0)
    return f"  {snippet}\n  {' ' * caret_col}^"


def syntax_error(expression: str, position: int, message: str, token: str | None = None) -> SelectorSyntaxError:
    """A SelectorSyntaxError whose text says where: position, line/column and a caret line."""
    line = expression.count("\n", 0, position) + 1
    column = position - (expression.rfind("\n", 0, position) + 1) + 1
    text = f"Invalid SQL92 selector: {message} at position {position} (line {line}, column {column})\n"
    text += highlight(expression, position)
    return SelectorSyntaxError(text, position=position, expression=expression, token=token)


def tokenize(expression: str) -> list[Token]:
    """All tokens of `expression`, ending with an EOF token; lexical errors raise SelectorSyntaxError."""
    tokens: list[Token] = []
    pos = 0
    n = len(expression)
    eol = -1  # index of the next line end at or after the last '--' seen (n if none)
    append = tokens.append
    while pos < n:
        ch = expression[pos]
        m = _WS.match(expression, pos)
        if m:
            pos = m.end()
            continue
        if ch == "-" and expression.startswith("--", pos):
            # The comment needs a line end; finding it once per line keeps "-----..." linear.
            if eol < pos:
                m = _EOL.search(expression, pos)
                eol = m.start() if m else n
            if eol < n:
                pos = eol + (2 if expression.startswith("\r\n", eol) else 1)
                continue
        if ch == "/":
            m = _BLOCK_COMMENT.match(expression, pos)
            if m is None:
                raise syntax_error(expression, pos, "unterminated or stray '/' (comments are /* ... */)", "/")
            pos = m.end()
            continue
        if ch == "'":
            m = _STRING.match(expression, pos)
            if m is None:
                raise syntax_error(expression, pos, "unterminated string literal", "'")
            append(Token(STRING, m.group(), pos, m.end()))
            pos = m.end()
            continue
        if ch.isascii() and (ch.isdigit() or ch == "."):
            mf = _FLOAT.match(expression, pos)
            md = _DECIMAL.match(expression, pos)
            fl = mf.end() if mf else -1
            dl = md.end() if md else -1
            if fl < 0 and dl < 0:
                raise syntax_error(expression, pos, "unexpected character '.'", ".")
            if fl >= dl:
                append(Token(FLOAT, expression[pos:fl], pos, fl))
                pos = fl
            else:
                append(Token(INT, expression[pos:dl], pos, dl))
                pos = dl
            continue
        m = _IDENT.match(expression, pos)
        if m:
            word = m.group()
            upper = word.upper()
            if upper in KEYWORDS:
                append(Token(KEYWORD, upper, pos, m.end()))
            else:
                append(Token(IDENT, word, pos, m.end()))
            pos = m.end()
            continue
        m = _PUNCT.match(expression, pos)
        if m:
            append(Token(PUNCT, m.group(), pos, m.end()))
            pos = m.end()
            continue
        hint = ""
        if ch == '"':
            hint = " (string literals use single quotes)"
        elif ch == "!":
            hint = " (use <> or NOT)"
        raise syntax_error(expression, pos, f"unexpected character {ch!r}{hint}", ch)
    append(Token(EOF, "", n, n))
    return tokens
