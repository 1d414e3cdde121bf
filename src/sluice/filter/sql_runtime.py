"""Java value semantics of RocketMQ's selector evaluation, in Python.

Property values are Java Strings; literals are Integer (I), Long (L), Double (D),
String (S) or Boolean (B). A string meets a number only through Java's own
parsers (Integer.valueOf, Long.valueOf, Double.valueOf), whose exact rules are
copied here: they decide which messages match. A parse failure is an
evaluation error (FilterEvaluationError), which the broker counts as no match.
"""
from __future__ import annotations

import math
import re
from functools import lru_cache

from sluice.errors import FilterEvaluationError

INT_MIN, INT_MAX = -(2**31), 2**31 - 1
LONG_MIN, LONG_MAX = -(2**63), 2**63 - 1

_ASCII_INT = re.compile(r"[+-]?[0-9]+")
# Character.digit(c, 10) accepts every Unicode decimal digit (category Nd) of the BMP.
_UNICODE_INT = re.compile(r"[+-]?\d+")
_DEC_DOUBLE = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?[fFdD]?")
_HEX_DOUBLE = re.compile(r"([+-]?)0[xX]((?:[0-9a-fA-F]+\.?)|(?:[0-9a-fA-F]*\.[0-9a-fA-F]+))[pP]([+-]?[0-9]+)[fFdD]?")
_SPECIAL_DOUBLE = {"NaN": math.nan, "+NaN": math.nan, "-NaN": math.nan,
                   "Infinity": math.inf, "+Infinity": math.inf, "-Infinity": -math.inf}
_TRIM = "".join(chr(c) for c in range(33))  # String.trim() strips every char <= U+0020


def _java_integer(s: str, lo: int, hi: int, name: str) -> int:
    if not (_ASCII_INT.fullmatch(s) if s.isascii() else
            (_UNICODE_INT.fullmatch(s) and all(ord(c) < 0x10000 for c in s))):
        raise FilterEvaluationError(f"For input string: {s!r} ({name}.valueOf)")
    value = int(s)
    if value < lo or value > hi:
        raise FilterEvaluationError(f"For input string: {s!r} is out of range of a Java {name.lower()}")
    return value


# Property values repeat (regions, codes, small numbers): caching the parsed value makes
# the common case one C-level lookup. Failures raise and are not cached.
@lru_cache(maxsize=65536)
def parse_int(s: str) -> int:
    """Java ``Integer.valueOf(s)``: optional sign, decimal digits, 32-bit range; no spaces."""
    return _java_integer(s, INT_MIN, INT_MAX, "Integer")


@lru_cache(maxsize=65536)
def parse_long(s: str) -> int:
    """Java ``Long.valueOf(s)``."""
    return _java_integer(s, LONG_MIN, LONG_MAX, "Long")


@lru_cache(maxsize=65536)
def parse_double(s: str) -> float:
    """Java ``Double.valueOf(s)``: trims, accepts NaN/Infinity, f/d suffixes and hex floats."""
    t = s.strip(_TRIM)
    special = _SPECIAL_DOUBLE.get(t)
    if special is not None:
        return special
    if _DEC_DOUBLE.fullmatch(t):
        if t[-1] in "fFdD":
            t = t[:-1]
        return float(t)
    m = _HEX_DOUBLE.fullmatch(t)
    if m:
        value = float.fromhex(f"0x{m.group(2)}p{m.group(3)}")
        return -value if m.group(1) == "-" else value
    raise FilterEvaluationError(f"For input string: {s!r} (Double.valueOf)")


def bool_of(s: str) -> bool:
    """Java ``Boolean.valueOf(s)``: true only for "true" in any letter case."""
    return len(s) == 4 and s.lower() == "true"


def double_cmp(a: float, b: float) -> int:
    """Java ``Double.compare``: a total order with -0.0 < 0.0 and NaN above everything."""
    if a < b:
        return -1
    if a > b:
        return 1
    a_nan, b_nan = a != a, b != b
    if a_nan or b_nan:
        return 0 if a_nan and b_nan else (1 if a_nan else -1)
    if a == 0.0:
        sa, sb = math.copysign(1.0, a), math.copysign(1.0, b)
        return 0 if sa == sb else (-1 if sa < sb else 1)
    return 0


def _int_cmp(a: int, b: int) -> int:
    return (a > b) - (a < b)


def _parse_as(s: str, jtype: str) -> object:
    if jtype == "I":
        return parse_int(s)
    if jtype == "L":
        return parse_long(s)
    return parse_double(s)


def jcompare(lv: object, lt: str, rv: object, rt: str) -> int:
    """``ComparisonExpression.__compare`` with string conversion on, for non-null values.

    Types that cannot be converted compare as -1 (so '=' is FALSE). The one
    change from RocketMQ: Boolean against String converts the String with
    Boolean.valueOf instead of throwing ClassCastException (``TRUE = a``).
    """
    if lt == rt:
        if lt == "D":
            return double_cmp(lv, rv)  # type: ignore[arg-type]
        if lt == "S":
            return 0 if lv == rv else (-1 if lv < rv else 1)  # type: ignore[operator]
        return _int_cmp(lv, rv)  # type: ignore[arg-type]  # I, L and B (False < True)
    if lt == "B" or rt == "B":
        if lt == "S":
            return _int_cmp(bool_of(lv), rv)  # type: ignore[arg-type]
        if rt == "S":
            return _int_cmp(lv, bool_of(rv))  # type: ignore[arg-type]
        return -1
    if lt == "S":
        lv = _parse_as(lv, rt)  # type: ignore[arg-type]
        lt = rt
    elif rt == "S":
        rv = _parse_as(rv, lt)  # type: ignore[arg-type]
        rt = lt
    if lt == "D" or rt == "D":
        return double_cmp(float(lv), float(rv))  # type: ignore[arg-type]
    return _int_cmp(lv, rv)  # type: ignore[arg-type]


def eq(lv: object, rv: object, lt: str, rt: str) -> bool | None:
    """``l = r``: left NULL gives NULL, right NULL gives FALSE, both NULL give TRUE."""
    if lv is None:
        return True if rv is None else None
    if rv is None:
        return False
    if lt == rt and lt != "D":
        return lv == rv
    return jcompare(lv, lt, rv, rt) == 0


def order_cmp(lv: object, rv: object, lt: str, rt: str) -> int:
    """The comparison result behind ``> >= < <=`` for non-null operands."""
    if lt == "S" and rt == "S":
        try:
            return double_cmp(parse_double(lv), parse_double(rv))  # type: ignore[arg-type]
        except FilterEvaluationError:
            raise FilterEvaluationError(
                f"It's illegal to compare string by '>=', '>', '<', '<='. lv={lv}, rv={rv}") from None
    return jcompare(lv, lt, rv, rt)


ORDER_OPS = {
    ">": lambda c: c > 0,
    ">=": lambda c: c >= 0,
    "<": lambda c: c < 0,
    "<=": lambda c: c <= 0,
}
