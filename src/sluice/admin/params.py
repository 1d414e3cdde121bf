"""Click parameter types of the admin commands: timestamps, ``name=value`` properties, offsets."""
from __future__ import annotations

import datetime as dt
import re
import time
from typing import Any

import click

__all__ = ["KEY_VALUE", "TIMESTAMP", "KeyValueType", "TimestampType", "parse_timestamp"]

# mqadmin's own format (UtilAll.YYYY_MM_DD_HH_MM_SS_SSS with '#'): 2024-01-31#13:45:00:000
_MQADMIN_TS = re.compile(r"^(\d{4})-(\d{2})-(\d{2})#(\d{2}):(\d{2}):(\d{2})(?::(\d{1,3}))?$")
#: Words a timestamp option takes: ``now``, and for offset resets the two ends of each queue.
_WORDS = {"earliest": 0, "latest": -1}


def parse_timestamp(text: str, *, now: float | None = None, words: bool = False) -> int:
    """Milliseconds since the epoch from ``1706708700000`` (ms), ``now``, ``2024-01-31#13:45:00:000``
    (mqadmin's form) or ISO 8601 (``2024-01-31T13:45:00``, ``...+01:00``; no zone = local time).
    With ``words``, ``earliest`` is 0 and ``latest`` -1 (a reset's "each queue's end")."""
    s = text.strip()
    if re.fullmatch(r"-?\d+", s):
        value = int(s)
        if value < 0 and not (words and value == -1):
            raise ValueError(f"a timestamp cannot be negative: {text!r}")
        return value
    low = s.lower()
    if low == "now":
        return int((time.time() if now is None else now) * 1000)
    if words and low in _WORDS:
        return _WORDS[low]
    m = _MQADMIN_TS.match(s)
    if m:
        y, mo, d, h, mi, sec, ms = m.groups()
        when = dt.datetime(int(y), int(mo), int(d), int(h), int(mi), int(sec), int((ms or "0").ljust(3, "0")) * 1000)
        return int(when.timestamp() * 1000)
    try:
        when = dt.datetime.fromisoformat(s)
    except ValueError:
        pass
    else:
        return int(when.timestamp() * 1000)  # a naive datetime is local time, as mqadmin's format is
    hint = ", earliest, latest" if words else ""
    raise ValueError(f"{text!r} is not a timestamp (milliseconds, now{hint}, yyyy-MM-dd#HH:mm:ss:SSS or ISO 8601)")


class TimestampType(click.ParamType):
    name = "timestamp"

    def __init__(self, *, words: bool = False) -> None:
        self.words = words

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int):
            return value
        try:
            return parse_timestamp(str(value), words=self.words)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


class KeyValueType(click.ParamType):
    """``name=value`` (a message property)."""

    name = "name=value"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> tuple[str, str]:
        if isinstance(value, tuple):
            return value
        name, sep, val = str(value).partition("=")
        if not sep or not name.strip():
            self.fail(f"{value!r} is not name=value", param, ctx)
        return name.strip(), val


TIMESTAMP = TimestampType()
KEY_VALUE = KeyValueType()
