"""The filter SPI registry, real entry points from a distribution on disk, and the compile cache."""
from __future__ import annotations

import importlib
import logging
import sys
import textwrap
from pathlib import Path

import pytest

from sluice.errors import FilterError, FilterEvaluationError
from sluice.filter import (
    FilterRegistry,
    SelectorLimits,
    SelectorSyntaxError,
    SqlSelector,
    TagSelector,
    UnknownExpressionTypeError,
    compile_cache,
    compile_selector,
    registry,
)
from sluice.filter.registry import _CompileCache

PLUGIN = '''
class ParityFilter:
    """Expression: '<property> even' or '<property> odd'."""

    def compile(self, expression):
        name, parity = expression.split()
        if parity not in ("even", "odd"):
            raise ValueError(f"parity must be even or odd, not {parity!r}")
        want = 0 if parity == "even" else 1

        class ParitySelector:
            def evaluate(self, props):
                value = props.get(name)
                return None if value is None else int(value) % 2 == want

        return ParitySelector()


def always(expression):
    class Always:
        def matches(self, props):
            return True
    return Always()
'''


@pytest.fixture
def plugin_dist(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A tiny installed distribution: a module plus a dist-info with entry_points.txt on sys.path."""
    (tmp_path / "sluice_parity_plugin.py").write_text(PLUGIN)
    info = tmp_path / "sluice_parity_plugin-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: sluice-parity-plugin\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(textwrap.dedent("""\
        [sluice.filters]
        PARITY = sluice_parity_plugin:ParityFilter
        always = sluice_parity_plugin:always
        BROKEN = sluice_no_such_module:Nothing
        SQL92 = sluice_parity_plugin:always
        """))
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    yield tmp_path
    sys.modules.pop("sluice_parity_plugin", None)
    for name in ("PARITY", "ALWAYS", "BROKEN"):
        registry.unregister(name)
    compile_cache.clear()


def test_builtin_types() -> None:
    local = FilterRegistry(load_entry_points=False)
    assert local.types() == []
    assert "SQL92" in registry.types() and "TAG" in registry.types()
    assert isinstance(compile_selector("sql92", "a = 1"), SqlSelector)
    assert isinstance(compile_selector("Tag", "a"), TagSelector)


def test_unknown_type_lists_known_types() -> None:
    with pytest.raises(UnknownExpressionTypeError) as info:
        compile_selector("XPATH", "/a")
    assert "XPATH" in str(info.value) and "SQL92" in str(info.value) and "TAG" in str(info.value)
    assert isinstance(info.value, FilterError)


def test_register_twice_refused() -> None:
    local = FilterRegistry(load_entry_points=False)
    local.register("X", lambda e, limits: TagSelector(e))
    with pytest.raises(ValueError):
        local.register("x", lambda e, limits: TagSelector(e))
    local.register("x", lambda e, limits: TagSelector(e), replace=True)
    assert local.unregister("X") and not local.unregister("X")


def test_entry_point_plugin_compiles_and_evaluates(plugin_dist: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="sluice.filter.registry"):
        registry.reload_entry_points()
    assert "PARITY" in registry.types() and "ALWAYS" in registry.types()
    assert "BROKEN" not in registry.types()
    assert any("BROKEN" in r.getMessage() for r in caplog.records)  # logged and skipped
    assert isinstance(compile_selector("SQL92", "a = 1"), SqlSelector)  # a plugin cannot take a built-in type

    selector = compile_selector("parity", "n even")
    assert selector.expression_type == "PARITY"
    assert selector.matches({"n": "4"}) and not selector.matches({"n": "3"})
    assert selector.evaluate({}) is None and not selector.matches({})
    with pytest.raises(FilterEvaluationError):
        selector.evaluate({"n": "x"})
    assert selector.matches({"n": "x"}) is False
    assert selector.matches_batch([{"n": "2"}, {"n": "5"}]).tolist() == [True, False]
    assert "PARITY" in repr(selector)
    with pytest.raises(SelectorSyntaxError, match="parity must be"):
        compile_selector("PARITY", "n prime")
    assert compile_selector("always", "anything").matches({})


def test_fresh_registry_loads_entry_points_lazily(plugin_dist: Path) -> None:
    local = FilterRegistry()
    local.register("SQL92", lambda e, limits: SqlSelector(e, limits=limits))
    fn = local.get("PARITY")  # not registered directly: found through the entry point
    assert fn("n odd", SelectorLimits()).matches({"n": "1"})


def test_cache_returns_same_selector_and_caches_errors() -> None:
    compile_cache.clear()
    first = compile_selector("SQL92", "a > 1")
    assert compile_selector("SQL92", "a > 1") is first
    assert compile_selector("SQL92", "a >  1") is not first  # exact string key
    assert compile_selector("SQL92", "a > 1", limits=SelectorLimits(max_depth=10)) is not first
    for _ in range(3):
        with pytest.raises(SelectorSyntaxError) as info:
            compile_selector("SQL92", "a >")
        assert info.value.position == 3
    assert len(compile_cache) == 4


def test_cache_is_bounded_lru() -> None:
    cache = _CompileCache(maxsize=3)
    limits = SelectorLimits()
    sels = {i: TagSelector(f"t{i}") for i in range(5)}
    for i in range(3):
        cache.put(("TAG", f"t{i}", limits), sels[i])
    assert cache.get(("TAG", "t0", limits)) is sels[0]  # t0 becomes most recent
    cache.put(("TAG", "t3", limits), sels[3])
    assert len(cache) == 3
    assert cache.get(("TAG", "t1", limits)) is None
    assert cache.get(("TAG", "t0", limits)) is sels[0]


def test_sql_needs_an_expression() -> None:
    with pytest.raises(SelectorSyntaxError):
        compile_selector("SQL92", None)
    assert compile_selector(None, None).matches({})
    with pytest.raises(SelectorSyntaxError, match="max_length"):
        compile_selector("TAG", "a||" * 40_000)
