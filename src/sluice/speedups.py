"""The optional C twins of the per-message loops on the hot paths (src/csrc/speedups: sluice._speedups).

``C`` is the extension module, or None when it was not built (no compiler at
install time) or ``SLUICE_NO_EXTENSIONS=1`` is set. Every caller keeps the
pure-Python version as the reference and the fallback: where the C function
answers None (input of an unusual shape, or invalid) the Python path runs and
raises its precise error. tests/test_speedups.py holds each pair equal.

An extension that is present but was compiled against another record layout
(``_speedups.FORMAT`` differs from sluice.format.C_FORMAT: a stale build after a
format change) is refused with FormatMismatchError, never silently dropped.
"""
from __future__ import annotations

import os
from collections.abc import Mapping
from types import ModuleType

from sluice.format import C_FORMAT

__all__ = ["C", "ENABLED", "FormatMismatchError", "check_format", "check_message_ext"]


class FormatMismatchError(ImportError):
    """The C extension was built for other stored formats, or another MessageExt, than this Python code."""


def check_format(compiled: Mapping[str, int]) -> None:
    """Raise FormatMismatchError unless ``compiled`` (the extension's FORMAT) equals sluice.format's."""
    diff = {k: (compiled.get(k), v) for k, v in C_FORMAT.items() if compiled.get(k) != v}
    diff.update({k: (v, None) for k, v in compiled.items() if k not in C_FORMAT})
    if diff:
        shown = ", ".join(f"{k}: C {c!r} vs Python {p!r}" for k, (c, p) in sorted(diff.items()))
        raise FormatMismatchError(f"sluice._speedups was compiled with another format ({shown}); rebuild it "
                                  "(python setup.py build_ext --inplace) or set SLUICE_NO_EXTENSIONS=1")


def check_message_ext(cls: type, fields: tuple[str, ...] | None = None) -> None:
    """Raise FormatMismatchError unless ``cls`` has a writable slot for every field C's decode_messages
    sets (``fields``, default the extension's MESSAGE_EXT_FIELDS); without this, a renamed slot would
    only turn the C decoder off, silently."""
    if fields is None:
        if C is None:
            return
        fields = C.MESSAGE_EXT_FIELDS
    slots = set()
    for k in cls.__mro__:
        s = k.__dict__.get("__slots__", ())
        slots.update((s,) if isinstance(s, str) else s)
    missing = [f for f in fields if f not in slots]
    if missing:
        raise FormatMismatchError(f"{cls.__qualname__} has no slot for {missing} (C decode_messages sets "
                                  f"{list(fields)}); rename them in src/csrc/speedups/reads.c too and rebuild")


C: ModuleType | None
if os.environ.get("SLUICE_NO_EXTENSIONS", "") not in ("", "0"):
    C = None
else:
    try:
        from sluice import _speedups as C
    except ImportError:
        C = None
if C is not None:
    check_format(getattr(C, "FORMAT", {}))

#: True when the C functions are in use
ENABLED = C is not None
