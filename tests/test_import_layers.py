"""The allowed imports between Sluice's layers, checked two ways.

Layers, bottom to top (a module may import its own package and any lower layer):

    errors, format, persist, speedups          bottom, in any order among them (sluice.protocol.codes is a
                                               leaf the errors may name)
    protocol                                   the sans-IO codec
    message                                    the message model over the codec
    transport                                  asyncio connections, server, client
    store | filter | acl                       siblings: none imports another (acl: signatures, plain_acl.yml)
    namesrv | client                           siblings; the client may use sluice.namesrv.client only,
                                               and never the store
    broker | filtersrv                         siblings: the broker starts filter servers by command line only;
                                               filtersrv may use protocol, transport, message, filter, acl
                                               and the client's broker API, never the store
    admin | spark                              siblings
    cli, demo, embedded, __main__, bench       entry points (bench: `sluice bench`, Sluice beside its peers)

* In a fresh interpreter, importing every module of a layer (or the SDK's face) loads nothing it may not.
* Statically, every ``import`` under src/sluice (also inside functions and under TYPE_CHECKING) follows the table.
"""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import sluice

SRC = Path(sluice.__file__).resolve().parent
_TOP = {"cli", "demo", "embedded", "__main__", "bench"}
RANK = {
    "errors": 0, "format": 0, "persist": 0, "ratelog": 0, "speedups": 0, "_speedups": 0,
    "logsetup": 0, "metrics_http": 0,
    "protocol": 1, "message": 2, "transport": 3, "store": 4, "filter": 4, "acl": 4, "namesrv": 5, "client": 5,
    "broker": 6, "filtersrv": 6, "admin": 7, "spark": 7, **dict.fromkeys(_TOP, 8),
}
#: Imports across packages of one rank that are allowed (within the bottom and the top rank, all are).
SAME_RANK_ALLOWED = {"client": ("sluice.namesrv.client",)}
#: Imports of a lower layer that are still forbidden.
EXTRA_FORBIDDEN = {"client": ("sluice.store",), "filtersrv": ("sluice.store", "sluice.namesrv")}
#: Leaves below their package's layer: they import nothing from sluice, so any layer may name them.
LEAVES = {"sluice.protocol.codes"}


def _module_name(path: Path) -> str:
    parts = ("sluice", *path.relative_to(SRC).with_suffix("").parts)
    return ".".join(parts[:-1]) if parts[-1] == "__init__" else ".".join(parts)


#: Every module under src/sluice by name, found by file (so none is missed behind a lazy face).
FILES = {_module_name(p): p for p in sorted(SRC.rglob("*.py"))}


def _modules(package: str) -> list[str]:
    return [m for m in FILES if m == package or m.startswith(package + ".")]


def _loaded_after(code: str) -> set[str]:
    """The names in sys.modules after `code` runs in a fresh interpreter."""
    probe = f"{code}\nimport sys\nprint('\\n'.join(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return set(out.stdout.split())


def _offending(loaded: set[str], forbidden: tuple[str, ...]) -> list[str]:
    return sorted(m for m in loaded if any(m == f or m.startswith(f + ".") for f in forbidden))


ABOVE_TRANSPORT = ("sluice.store", "sluice.filter", "sluice.acl", "sluice.broker", "sluice.filtersrv", "sluice.client",
                   "sluice.namesrv", "sluice.spark", "sluice.admin", "sluice.cli", "sluice.demo", "sluice.embedded")
SERVERS = ("sluice.store", "sluice.broker", "sluice.filtersrv", "sluice.namesrv.server", "sluice.namesrv.routeinfo",
           "sluice.spark", "sluice.admin", "pyspark")

LAYER_RULES = {
    "sluice.protocol": ("sluice.transport", "sluice.message", "asyncio", *ABOVE_TRANSPORT),
    "sluice.transport": ABOVE_TRANSPORT,
    "sluice.store": ("sluice.filter", "sluice.broker", "sluice.client", "sluice.namesrv", "sluice.spark",
                     "sluice.admin", "pyspark"),
    "sluice.filter": ("sluice.store", "sluice.broker", "sluice.client", "sluice.namesrv", "sluice.spark",
                      "sluice.admin", "pyspark"),
    "sluice.client": SERVERS,
    "sluice.acl": ("sluice.store", "sluice.filter", "sluice.broker", "sluice.client", "sluice.namesrv",
                   "sluice.spark", "sluice.admin", "pyspark"),
    "sluice.namesrv": ("sluice.store", "sluice.filter", "sluice.broker", "sluice.client", "sluice.spark",
                       "sluice.admin"),
    "sluice.broker": ("sluice.client", "sluice.spark", "sluice.admin", "sluice.cli", "pyspark", "sluice.filtersrv"),
    "sluice.filtersrv": ("sluice.store", "sluice.broker", "sluice.namesrv", "sluice.spark", "sluice.admin",
                         "sluice.cli", "pyspark"),
}


@pytest.mark.parametrize("package", sorted(LAYER_RULES))
def test_a_layer_loads_nothing_above_it(package: str) -> None:
    loaded = _loaded_after("\n".join(f"import {m}" for m in _modules(package)))
    bad = _offending(loaded, LAYER_RULES[package])
    assert bad == [], f"importing {package} loads {', '.join(bad)}"


@pytest.mark.parametrize("names", ["Credentials", "Producer", "PushConsumer", "PullConsumer", "MessageSelector",
                                   "Producer, PushConsumer, PullConsumer, MessageSelector, Message"])
def test_the_sdk_face_loads_no_server(names: str) -> None:
    loaded = _loaded_after(f"from sluice import {names}")
    bad = _offending(loaded, SERVERS)
    assert bad == [], f"from sluice import {names} loads {', '.join(bad)}"


def test_the_codec_loads_no_numpy() -> None:
    loaded = _loaded_after("\n".join(f"import {m}" for m in _modules("sluice.protocol")))
    assert "numpy" not in loaded


@pytest.mark.parametrize("face", ["sluice", "sluice.client", "sluice.filter", "sluice.store", "sluice.spark"])
def test_a_lazy_face_loads_nothing_until_asked_and_keeps_every_name(face: str) -> None:
    assert _offending(_loaded_after(f"import {face}"), ("sluice.",)) == []
    # Every public name still resolves (pyspark is not needed to resolve sluice.spark's names).
    code = (f"import importlib\nface = importlib.import_module({face!r})\n"
            "for name in face.__all__: getattr(face, name)\n"
            "assert set(face.__all__) <= set(dir(face))")
    _loaded_after(code)


def test_the_filter_registry_name_stays_the_registry() -> None:
    _loaded_after("import sluice.filter.registry\nfrom sluice.filter import FilterRegistry, registry\n"
                  "assert isinstance(registry, FilterRegistry)")


# ---------------------------------------------------------------------------------------------- static


def _raw_imports(module: str) -> list[tuple[str, str | None, str | None, int]]:
    """(module, name, as-name, line) for every import in a module's file, wherever it stands
    (inside functions and under TYPE_CHECKING too); relative imports made absolute."""
    path = FILES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: list[tuple[str, str | None, str | None, int]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(a.name, None, a.asname, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([node.module] if node.module else []))
            found += [(base, a.name, a.asname, node.lineno) for a in node.names]
    return found


def _face(package: str) -> dict[str, str]:
    """What a package's __init__ serves: public name -> the module it is imported from (lazily or not)."""
    return {asname or name: base for base, name, asname, _ in _raw_imports(package)
            if name is not None and base.startswith("sluice.")}


FACES = {m: _face(m) for m, p in FILES.items() if p.name == "__init__.py" and m != "sluice"}


def _imported(module: str) -> list[tuple[str, int]]:
    """(module, line) for every sluice module a module imports: submodules by their own name, a name from a
    package's face by the module that defines it; the bare face ``sluice`` (for __version__) is left out."""
    found = set()
    for base, name, _, line in _raw_imports(module):
        if not base.startswith("sluice"):
            continue
        if name is None or f"{base}.{name}" in FILES:
            target = f"{base}.{name}" if name is not None else base
        elif base == "sluice":
            if name == "__version__":
                continue
            target = f"sluice.{name}" if name in RANK else sluice._HOME[name]
        else:
            target = FACES.get(base, {}).get(name, base)
        if target != "sluice":
            found.add((target, line))
    return sorted(found, key=lambda t: t[1])


def _allowed(source: str, target: str) -> bool:
    if target == "sluice" or target in LEAVES:
        return True
    src_pkg, dst_pkg = source.split(".")[1], target.split(".")[1]
    if src_pkg == dst_pkg:
        return True
    if any(target == f or target.startswith(f + ".") for f in EXTRA_FORBIDDEN.get(src_pkg, ())):
        return False
    if RANK[dst_pkg] < RANK[src_pkg]:
        return True
    if RANK[dst_pkg] == RANK[src_pkg]:
        return RANK[src_pkg] in (0, RANK["cli"]) or any(target == f or target.startswith(f + ".")
                                      for f in SAME_RANK_ALLOWED.get(src_pkg, ()))
    return False


def test_every_import_in_the_source_follows_the_layers() -> None:
    bad = []
    for source, path in FILES.items():
        if source == "sluice":
            continue  # the face itself names what it serves
        for target, line in _imported(source):
            if not _allowed(source, target):
                bad.append(f"{path.relative_to(SRC.parent)}:{line}: {source} imports {target}")
    assert bad == [], "imports against the layers:\n" + "\n".join(bad)


def test_no_import_circles() -> None:
    """No module reaches itself through imports (counting those in functions and under TYPE_CHECKING):
    a part a module builds takes a narrow interface, not the module that builds it."""
    graph = {m: {t for t, _ in _imported(m) if t in FILES and t != m} for m in FILES if m != "sluice"}
    circles, index, low, stack, on_stack = [], {}, {}, [], set()

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for module in graph:
        if module not in index:
            visit(module)
    lines = []
    for circle in sorted(circles):
        lines.append(" <-> ".join(circle))
        lines += [f"    {FILES[m].relative_to(SRC.parent)}:{line}: imports {t}"
                  for m in circle for t, line in _imported(m) if t in circle]
    assert circles == [], "import circles:\n" + "\n".join(lines)


def test_the_leaves_import_nothing_from_sluice() -> None:
    for leaf in LEAVES:
        assert _imported(leaf) == [], leaf


def test_every_package_has_a_rank() -> None:
    packages = {m.split(".")[1] for m in FILES if m != "sluice"}
    assert packages <= set(RANK), packages - set(RANK)
