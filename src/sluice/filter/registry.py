"""The filter SPI: one registry of expression types, and ``compile_selector`` on top of it.

TAG and SQL92 are built in. Other types come from the ``sluice.filters``
entry-point group, read lazily the first time a type is not found (or the
types are listed). An entry point's name is the type (case-insensitive); its
object is either a callable ``compile(expression) -> selector`` or an object
with such a ``compile`` method (a class is instantiated first). A plugin that
fails to load is logged and skipped. Compiled selectors and compile errors are
cached by exact (type, expression, limits), LRU-bounded, as RocketMQ caches
SelectorParser results.
"""
from __future__ import annotations

import copy
import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping
from importlib.metadata import entry_points
from typing import Any

from sluice.errors import FilterError, FilterEvaluationError, SelectorSyntaxError
from sluice.filter.base import Selector
from sluice.filter.limits import DEFAULT_LIMITS, SelectorLimits
from sluice.filter.sql import SqlSelector
from sluice.filter.sql_interp import Explanation
from sluice.filter.tags import TagSelector

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "sluice.filters"
CompileFn = Callable[[str], Any]


class UnknownExpressionTypeError(FilterError):
    """An expression type no registered filter handles."""


class _PluginSelector(Selector):
    """Gives a plugin's compiled object the full Selector surface (evaluate, matches, explain)."""

    def __init__(self, type_name: str, expression: str, inner: Any) -> None:
        self.expression_type = type_name
        self.expression = expression
        self.inner = inner

    def evaluate(self, properties: Mapping[str, str]) -> bool | None:
        try:
            if hasattr(self.inner, "evaluate"):
                result = self.inner.evaluate(properties)
            else:
                result = self.inner.matches(properties)
        except FilterError:
            raise
        except Exception as exc:  # a plugin's own failure must not escape as anything else
            raise FilterEvaluationError(f"{self.expression_type} filter failed: {exc!r}") from exc
        return result if result is None else result is True


class FilterRegistry:
    """Expression type (upper-case) -> compile function. Thread-safe."""

    def __init__(self, *, load_entry_points: bool = True) -> None:
        self._lock = threading.RLock()
        self._compilers: dict[str, Callable[[str, SelectorLimits], Selector]] = {}
        self._entry_points_loaded = not load_entry_points

    def register(self, type_name: str, compile_fn: Callable[[str, SelectorLimits], Selector], *,
                 replace: bool = False) -> None:
        """Register `compile_fn(expression, limits) -> Selector` for `type_name` (case-insensitive)."""
        key = self._key(type_name)
        with self._lock:
            if key in self._compilers and not replace:
                raise ValueError(f"filter type {key!r} is already registered")
            self._compilers[key] = compile_fn

    def register_plugin(self, type_name: str, plugin: Any, *, replace: bool = False) -> None:
        """Register a plugin object: a callable compile(expression), or a class/object with .compile."""
        if isinstance(plugin, type):
            plugin = plugin()
        fn = getattr(plugin, "compile", plugin)
        if not callable(fn):
            raise TypeError(f"filter plugin for {type_name!r} has no compile(expression): {plugin!r}")
        key = self._key(type_name)

        def compile_plugin(expression: str, limits: SelectorLimits) -> Selector:
            if not isinstance(expression, str) or len(expression) > limits.max_length:
                raise SelectorSyntaxError(f"{key} expression is not a str of at most {limits.max_length} "
                                          "characters", position=0)
            try:
                inner = fn(expression)
            except FilterError:
                raise
            except Exception as exc:
                raise SelectorSyntaxError(f"{key} expression {expression!r} does not compile: {exc}",
                                          position=0, expression=expression) from exc
            return inner if isinstance(inner, Selector) else _PluginSelector(key, expression, inner)

        self.register(key, compile_plugin, replace=replace)

    def unregister(self, type_name: str) -> bool:
        with self._lock:
            return self._compilers.pop(self._key(type_name), None) is not None

    def types(self) -> list[str]:
        self._load_entry_points()
        with self._lock:
            return sorted(self._compilers)

    def get(self, type_name: str | None) -> Callable[[str, SelectorLimits], Selector]:
        key = self._key(type_name)
        with self._lock:
            fn = self._compilers.get(key)
        if fn is None:
            self._load_entry_points()
            with self._lock:
                fn = self._compilers.get(key)
        if fn is None:
            raise UnknownExpressionTypeError(
                f"unknown filter expression type {type_name!r}; known types: {', '.join(self.types())}")
        return fn

    @staticmethod
    def _key(type_name: str | None) -> str:
        # ExpressionType.isTagType: null and "" are TAG.
        if type_name is None or type_name == "":
            return "TAG"
        if not isinstance(type_name, str):
            raise UnknownExpressionTypeError(f"filter expression type must be a str, not {type(type_name).__name__}")
        return type_name.strip().upper()

    def _load_entry_points(self) -> None:
        with self._lock:
            if self._entry_points_loaded:
                return
            self._entry_points_loaded = True
            try:
                eps = list(entry_points(group=ENTRY_POINT_GROUP))
            except Exception:  # a broken metadata directory must not break filtering
                log.exception("cannot read entry points of group %s", ENTRY_POINT_GROUP)
                return
            for ep in eps:
                if self._key(ep.name) in self._compilers:
                    log.warning("filter plugin %s (%s) ignored: type already registered", ep.name, ep.value)
                    continue
                try:
                    self.register_plugin(ep.name, ep.load())
                except Exception:
                    log.exception("filter plugin %s = %s failed to load; skipped", ep.name, ep.value)

    def reload_entry_points(self) -> None:
        """Read the entry points again (after installing a plugin at run time)."""
        with self._lock:
            self._entry_points_loaded = False
        self._load_entry_points()


def _compile_tag(expression: str, limits: SelectorLimits) -> Selector:
    if expression is not None and not isinstance(expression, str):
        raise SelectorSyntaxError(f"a TAG subscription must be a str, not {type(expression).__name__}", position=0)
    if expression is not None and len(expression) > limits.max_length:
        raise SelectorSyntaxError(f"TAG subscription is longer than {limits.max_length} characters "
                                  "(SelectorLimits.max_length)", position=limits.max_length)
    return TagSelector(expression)


def _compile_sql(expression: str, limits: SelectorLimits) -> Selector:
    return SqlSelector(expression, limits=limits)


registry = FilterRegistry()
registry.register("TAG", _compile_tag)
registry.register("SQL92", _compile_sql)


class _CompileCache:
    """LRU of compiled selectors and compile errors, keyed by the exact (type, expression, limits)."""

    def __init__(self, maxsize: int) -> None:
        self.maxsize = maxsize
        self._data: OrderedDict[tuple[str, str | None, SelectorLimits], Selector | FilterError] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: tuple[str, str | None, SelectorLimits]) -> Selector | FilterError | None:
        with self._lock:
            value = self._data.get(key)
            if value is not None:
                self._data.move_to_end(key)
            return value

    def put(self, key: tuple[str, str | None, SelectorLimits], value: Selector | FilterError) -> None:
        with self._lock:
            self._data[key] = value
            self._data.move_to_end(key)
            while len(self._data) > self.maxsize:
                self._data.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._data.clear()

    def __len__(self) -> int:
        return len(self._data)


compile_cache = _CompileCache(maxsize=1024)


def compiled_selector(expression_type: str | None, expression: str | None, *,
                      limits: SelectorLimits = DEFAULT_LIMITS) -> Selector | None:
    """The selector :func:`compile_selector` would return from its cache, without compiling (None when it
    is not there, or the expression failed): how a caller learns the work is already done."""
    try:
        key = _cache_key(FilterRegistry._key(expression_type), expression, limits)
    except UnknownExpressionTypeError:
        return None
    cached = compile_cache.get(key) if key is not None else None
    return cached if isinstance(cached, Selector) else None


def _cache_key(key_type: str, expression: str | None, limits: SelectorLimits
               ) -> tuple[str, str | None, SelectorLimits] | None:
    """The compile cache's key; None for an expression over the length limit (refused, never cached)."""
    if expression is not None and len(expression) > limits.max_length:
        return None
    return key_type, expression, limits


def compile_selector(expression_type: str | None, expression: str | None, *,
                     limits: SelectorLimits = DEFAULT_LIMITS) -> Selector:
    """Compile a subscription expression of the given type (TAG, SQL92 or a plugin type).

    None or "" as the type means TAG. Raises SelectorSyntaxError (with
    ``.position``) for a bad expression and UnknownExpressionTypeError for a
    type nobody registered. Results and errors are cached (LRU).
    """
    key_type = FilterRegistry._key(expression_type)
    if key_type != "TAG" and expression is None:
        raise SelectorSyntaxError(f"a {key_type} subscription needs an expression", position=0)
    cache_key = _cache_key(key_type, expression, limits)
    if cache_key is not None:
        cached = compile_cache.get(cache_key)
        if isinstance(cached, Selector):
            return cached
        if cached is not None:
            raise copy.copy(cached)
    compile_fn = registry.get(key_type)
    try:
        selector = compile_fn(expression, limits)  # type: ignore[arg-type]
    except FilterError as exc:
        if cache_key is not None and not isinstance(exc, UnknownExpressionTypeError):
            compile_cache.put(cache_key, exc.with_traceback(None))
        raise
    if cache_key is not None:
        compile_cache.put(cache_key, selector)
    return selector


__all__ = [
    "ENTRY_POINT_GROUP",
    "Explanation",
    "FilterRegistry",
    "UnknownExpressionTypeError",
    "compile_cache",
    "compiled_selector",
    "compile_selector",
    "registry",
]
