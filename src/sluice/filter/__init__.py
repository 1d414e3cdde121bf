"""Server-side message filtering: tags, SQL92 selectors, the filter registry, the Bloom filter.

    >>> from sluice.filter import compile_selector
    >>> sel = compile_selector("SQL92", "a > 5 AND region IN ('eu', 'us')")
    >>> sel.matches({"a": "10", "region": "eu"})
    True

See docs/filtering.md for the language, its RocketMQ semantics and Sluice's departures.
"""
from sluice.errors import FilterError, FilterEvaluationError, SelectorSyntaxError
from sluice.filter.base import Selector
from sluice.filter.bloom import BitsArray, BloomFilter, BloomFilterData
from sluice.filter.limits import DEFAULT_LIMITS, SelectorLimits
from sluice.filter.registry import (
    ENTRY_POINT_GROUP,
    FilterRegistry,
    UnknownExpressionTypeError,
    compile_cache,
    compile_selector,
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
    "Selector",
    "SelectorLimits",
    "SelectorSyntaxError",
    "SqlSelector",
    "TagSelector",
    "UnknownExpressionTypeError",
    "compile_cache",
    "compile_selector",
    "is_legacy_code",
    "java_hash_of_code",
    "java_string_hash",
    "parse_tag_subscription",
    "registry",
    "tag_code",
]
