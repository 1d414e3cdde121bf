"""Server-side message filtering: tags, SQL92 selectors, the filter registry, the Bloom filter.

    >>> from sluice.filter import compile_selector
    >>> sel = compile_selector("SQL92", "a > 5 AND region IN ('eu', 'us')")
    >>> sel.matches({"a": "10", "region": "eu"})
    True

See docs/filtering.md for the language, its RocketMQ semantics and Sluice's departures.
Names are imported on first use (PEP 562): the tag hash does not load the SQL compiler.
"""
from __future__ import annotations

import sys
from importlib import import_module
from types import ModuleType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sluice.errors import FilterError, FilterEvaluationError, SelectorSyntaxError
    from sluice.filter.base import Selector
    from sluice.filter.bloom import BitsArray, BloomFilter, BloomFilterData
    from sluice.filter.classfilter import MessageFilter
    from sluice.filter.limits import DEFAULT_LIMITS, SelectorLimits
    from sluice.filter.registry import (
        ENTRY_POINT_GROUP,
        FilterRegistry,
        UnknownExpressionTypeError,
        compile_cache,
        compile_selector,
        compiled_selector,
        registry,
    )
    from sluice.filter.sql import SqlSelector
    from sluice.filter.sql_interp import Explanation
    from sluice.filter.tagcode import java_hash_of_code, java_string_hash, tag_code
    from sluice.filter.tags import SUB_ALL, TagSelector, is_legacy_code, parse_tag_subscription

__all__ = [
    "DEFAULT_LIMITS",
    "ENTRY_POINT_GROUP",
    "SUB_ALL",
    "BitsArray",
    "BloomFilter",
    "BloomFilterData",
    "Explanation",
    "FilterError",
    "FilterEvaluationError",
    "FilterRegistry",
    "MessageFilter",
    "Selector",
    "SelectorLimits",
    "SelectorSyntaxError",
    "SqlSelector",
    "TagSelector",
    "UnknownExpressionTypeError",
    "compile_cache",
    "compile_selector",
    "compiled_selector",
    "is_legacy_code",
    "java_hash_of_code",
    "java_string_hash",
    "parse_tag_subscription",
    "registry",
    "tag_code",
]

# public name -> the module that defines it
_HOME: dict[str, str] = {}
for _module, _names in {
    "sluice.errors": ("FilterError", "FilterEvaluationError", "SelectorSyntaxError"),
    "sluice.filter.base": ("Selector",),
    "sluice.filter.bloom": ("BitsArray", "BloomFilter", "BloomFilterData"),
    "sluice.filter.classfilter": ("MessageFilter",),
    "sluice.filter.limits": ("DEFAULT_LIMITS", "SelectorLimits"),
    "sluice.filter.registry": ("ENTRY_POINT_GROUP", "FilterRegistry", "UnknownExpressionTypeError",
                               "compile_cache", "compile_selector", "compiled_selector", "registry"),
    "sluice.filter.sql": ("SqlSelector",),
    "sluice.filter.sql_interp": ("Explanation",),
    "sluice.filter.tagcode": ("java_hash_of_code", "java_string_hash", "tag_code"),
    "sluice.filter.tags": ("SUB_ALL", "TagSelector", "is_legacy_code", "parse_tag_subscription"),
}.items():
    _HOME.update(dict.fromkeys(_names, _module))
del _module, _names


def __getattr__(name: str) -> Any:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(home), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


class _FilterPackage(ModuleType):
    """`sluice.filter.registry` stays the FilterRegistry object, as when this face imported eagerly:
    importing the submodule of the same name would otherwise bind the module over it."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "registry" and isinstance(value, ModuleType):
            value = value.registry
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _FilterPackage
