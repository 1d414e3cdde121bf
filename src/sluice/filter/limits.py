"""Bounds that keep a hostile selector from costing unbounded time or memory.

Every limit is checked while the expression is read, so a selector that breaks
one is refused before any work proportional to its excess is done.
"""
from __future__ import annotations

from dataclasses import dataclass

# The parser recurses once per nesting level and the generated Python nests
# about two brackets per AST level; CPython's tokenizer stops at 200 nested
# brackets, so depth is capped well below that whatever the configuration.
HARD_MAX_DEPTH = 90


@dataclass(frozen=True, kw_only=True, slots=True)
class SelectorLimits:
    """Limits applied when a selector is compiled.

    max_length: characters of expression text (64 KiB: far beyond any real
        subscription, small enough to lex in a few milliseconds).
    max_nodes: AST nodes after parsing (4096; each IN list counts as one node).
    max_depth: nesting of the AST, parentheses and unary chains included (64; at
        most HARD_MAX_DEPTH).
    max_in_list: string literals in one IN / NOT IN list (4096).
    """

    max_length: int = 65_536
    max_nodes: int = 4_096
    max_depth: int = 64
    max_in_list: int = 4_096

    def __post_init__(self) -> None:
        for name in ("max_length", "max_nodes", "max_depth", "max_in_list"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"SelectorLimits.{name} must be a positive int, got {value!r}")
        if self.max_depth > HARD_MAX_DEPTH:
            raise ValueError(f"SelectorLimits.max_depth must be at most {HARD_MAX_DEPTH}, got {self.max_depth}")


DEFAULT_LIMITS = SelectorLimits()
