"""The store's plug-in contracts (store/types.py): the store calls declared members only, the base classes
conform, and the pull, recovery and retention modules do not import the facade back."""
from __future__ import annotations

import ast
import inspect
from pathlib import Path

import numpy as np
import pytest
from store_testlib import TagFilter, msg, small_config

import sluice.store
from sluice.format import tag_code
from sluice.store import MessageStore
from sluice.store.types import Dispatcher, MessageFilter, RequestDispatcher, TagCodeFilter

STORE_SRC = Path(sluice.store.__file__).parent


def protocol_members(proto: type) -> set[str]:
    """The methods and attributes a Protocol declares (its own, not object's or Protocol's)."""
    names = {n for n, v in vars(proto).items() if not n.startswith("_") and callable(v)}
    return names | set(vars(proto).get("__annotations__", {}))


def positional_arity(fn) -> int:  # type: ignore[no-untyped-def]
    return sum(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in inspect.signature(fn).parameters.values())


def assert_conforms(obj: object, proto: type) -> None:
    """isinstance against the runtime-checkable Protocol, plus each method's positional arity (the store
    calls them positionally), so a renamed or reshaped hook fails here rather than in a pull."""
    assert isinstance(obj, proto), f"{type(obj).__name__} does not implement {proto.__name__}"
    for name in protocol_members(proto):
        want = getattr(proto, name, None)
        if callable(want):
            assert positional_arity(getattr(obj, name)) == positional_arity(want) - 1, (type(obj).__name__, name)


def test_the_protocols_declare_every_hook_the_store_calls() -> None:
    assert protocol_members(MessageFilter) == {"select_units", "match_record_at", "consumed", "max_evaluations",
                                                "needs_units", "record_keys", "record_verdicts", "judge", "settle"}
    assert protocol_members(Dispatcher) == {"rebuilds_bitmaps", "dispatch", "dispatch_batch"}
    for proto in (MessageFilter, Dispatcher):
        for name in protocol_members(proto) - set(proto.__annotations__):
            assert getattr(proto, name).__doc__, f"{proto.__name__}.{name} says what it means"


def test_the_base_classes_and_test_doubles_conform() -> None:
    assert_conforms(TagCodeFilter(), MessageFilter)
    assert_conforms(TagFilter("a"), MessageFilter)

    class D(RequestDispatcher):
        def dispatch(self, requests) -> None:  # type: ignore[no-untyped-def]
            pass

    assert_conforms(D(), Dispatcher)
    assert not D.rebuilds_bitmaps


def test_tag_code_filter_plans_units_from_tag_codes() -> None:
    f = TagFilter("a")
    codes = np.array([tag_code("a"), tag_code("b"), 0], dtype=np.int64)
    mask, check = f.select_units(codes, None, None)
    assert mask.tolist() == [True, False, False] and check is None
    unresolved = np.array([False, False, True])
    mask, check = f.select_units(codes, None, unresolved)  # an unreadable ext unit: its record decides
    assert mask.tolist() == [True, False, True] and check.tolist() == [False, False, True]

    class Sql(TagCodeFilter):
        needs_record = True

    mask, check = Sql().select_units(codes, None, None)
    assert mask is None and check.tolist() == [True, True, True]
    assert Sql().match_record_at(0, {}) is True


class Recording:
    """Records every public attribute the store touches on it."""

    def __getattribute__(self, name: str):  # type: ignore[no-untyped-def]
        if not name.startswith("_"):
            object.__getattribute__(self, "_touched").add(name)
        return object.__getattribute__(self, name)


class StrictFilter(Recording):
    """A filter with the Protocol's members and nothing else: tags 'a', decided on the record."""

    max_evaluations = 0
    needs_units = True

    def __init__(self) -> None:
        self._touched: set[str] = set()
        self._windows = 0

    def select_units(self, tag_codes, ext_batch, unresolved):  # type: ignore[no-untyped-def]
        n = len(tag_codes)
        return None, np.ones(n, dtype=bool)

    def match_record_at(self, index: int, properties: dict[str, str]) -> bool:
        return properties.get("TAGS") == "a"

    def consumed(self, n: int) -> None:
        self._windows += 1

    record_keys = None  # record by record: match_record_at
    record_verdicts = None

    def judge(self, values: tuple[str | None, ...]) -> int:
        raise AssertionError("judge without record_keys")

    def settle(self, indexes: np.ndarray, verdicts: np.ndarray) -> None:
        raise AssertionError("settle without record_keys")


class StrictDispatcher(Recording):
    def __init__(self, rebuilds: bool) -> None:
        self._touched: set[str] = set()
        self._rebuilds = rebuilds
        self._seen = 0

    @property
    def rebuilds_bitmaps(self) -> bool:
        return self._rebuilds

    def dispatch(self, requests) -> None:  # type: ignore[no-untyped-def]
        self._seen += len(requests)

    def dispatch_batch(self, batch) -> None:  # type: ignore[no-untyped-def]
        self._seen += len(batch)


def test_the_store_touches_declared_members_only(store_dir: Path) -> None:
    f = StrictFilter()
    d1, d2 = StrictDispatcher(True), StrictDispatcher(False)
    assert_conforms(f, MessageFilter)
    assert_conforms(d1, Dispatcher)
    f._touched.clear(), d1._touched.clear(), d2._touched.clear()
    with MessageStore(store_dir, small_config()) as s:
        s.add_dispatcher(d1)
        s.add_dispatcher(d2)
        s.put_messages([msg(TAGS="a" if i % 2 else "b") for i in range(10)])
        s.wait_dispatched()
        got = s.get_messages("T", 0, 0, 32, message_filter=f)
        assert got.queue_offsets == [1, 3, 5, 7, 9] and f._windows == 1
        s.rebuild_queue("T", 0)
        assert s.check(fix=True).ok
        assert s.get_messages("T", 0, 0, 32, message_filter=TagFilter("a")).queue_offsets == [1, 3, 5, 7, 9]
    assert f._touched <= protocol_members(MessageFilter)
    assert d1._touched | d2._touched <= protocol_members(Dispatcher)
    assert "rebuilds_bitmaps" in d2._touched
    assert d1._seen == 20 and d2._seen == 10  # only the one that rebuilds sees the rebuilt queue's records


def _calls(path: Path) -> list[tuple[int, str, str]]:
    """getattr/hasattr calls that name an attribute as a constant: probing for a member."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr") \
                and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant):
            out.append((node.lineno, node.func.id, node.args[1].value))
    return out


def test_no_attribute_probing_left_in_the_store() -> None:
    """A supplement to the test above: no store module asks whether an object has a member."""
    found = {p.name: c for p in sorted(STORE_SRC.glob("*.py")) if (c := _calls(p))}
    assert found == {}


def _imports(path: Path) -> set[str]:
    """Every module a file imports, TYPE_CHECKING blocks included."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
            out.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return out


@pytest.mark.parametrize("module", ["pull_read", "recovery", "retention", "ext_files", "dispatch", "types"])
def test_store_parts_do_not_import_the_facade(module: str) -> None:
    assert "sluice.store.message_store" not in _imports(STORE_SRC / f"{module}.py")


def test_the_store_imports_nothing_from_the_layers_above() -> None:
    above = ("sluice.filter", "sluice.broker", "sluice.client", "sluice.spark", "sluice.namesrv", "sluice.transport")
    bad = {p.name: sorted(m for m in _imports(p) if m.startswith(above)) for p in STORE_SRC.glob("*.py")}
    assert {k: v for k, v in bad.items() if v} == {}
