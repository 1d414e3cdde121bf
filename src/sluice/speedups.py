"""The optional C twins of the per-message loops on the hot paths (src/csrc/speedups: sluice._speedups).

``C`` is the extension module, or None when it was not built (no compiler at
install time) or ``SLUICE_NO_EXTENSIONS=1`` is set. Every caller keeps the
pure-Python version as the reference and the fallback: where the C function
answers None (input of an unusual shape, or invalid) the Python path runs and
raises its precise error. tests/test_speedups.py holds each pair equal.
"""
from __future__ import annotations

import os
from types import ModuleType

__all__ = ["C", "ENABLED"]

C: ModuleType | None
if os.environ.get("SLUICE_NO_EXTENSIONS", "") not in ("", "0"):
    C = None
else:
    try:
        from sluice import _speedups as C
    except ImportError:
        C = None

#: True when the C functions are in use
ENABLED = C is not None
