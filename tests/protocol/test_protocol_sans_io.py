"""R1: the wire codec modules import no I/O (asyncio, socket, selectors, ...)."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

import sluice.protocol

CODEC_MODULES = ["command", "frame", "fields", "headers", "bodies", "batch", "codes", "properties", "record"]
FORBIDDEN = {"asyncio", "socket", "selectors", "ssl", "threading", "subprocess"}


@pytest.mark.parametrize("name", CODEC_MODULES)
def test_codec_module_is_sans_io(name: str) -> None:
    path = Path(sluice.protocol.__file__).parent / f"{name}.py"
    tree = ast.parse(path.read_text(), str(path))
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module.split(".")[0])
            if node.module.startswith("sluice.protocol."):
                assert node.module.rsplit(".", 1)[1] in CODEC_MODULES, f"{name} imports the I/O layer {node.module}"
    assert not imported & FORBIDDEN, f"{name}.py imports {imported & FORBIDDEN}"
