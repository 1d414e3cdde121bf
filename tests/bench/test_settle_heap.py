"""The bench's harness heap is out of the cyclic collector's reach while a system is measured, and only then."""
from __future__ import annotations

import gc
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from sluice.bench import command
from sluice.bench.workload import Workload, settle_heap


@pytest.fixture(autouse=True)
def _unfrozen():
    gc.unfreeze()
    yield
    gc.unfreeze()


def test_settle_heap_freezes_what_is_held() -> None:
    held = [[i] for i in range(1000)]  # tracked containers
    settle_heap()
    assert gc.get_freeze_count() >= len(held)
    gc.unfreeze()
    assert gc.get_freeze_count() == 0


@pytest.mark.parametrize("fails", [False, True])
def test_a_peer_run_is_unfrozen_after_it_whatever_its_end(monkeypatch, tmp_path: Path, fails: bool) -> None:
    seen: dict[str, int] = {}

    def run(wl: Workload, workdir: Path, step: Any) -> dict[str, Any]:
        settle_heap()  # as every runner does once its workload is generated
        seen["frozen"] = gc.get_freeze_count()
        if fails:
            raise RuntimeError("the peer broke")
        return {"produce": {}, "drains": {}}

    monkeypatch.setitem(command.PEER_MODULES, "fake", "fake")
    monkeypatch.setattr(command.importlib, "import_module", lambda name: SimpleNamespace(run=run))
    result = command._run_peer("fake", Workload(messages=10), tmp_path, lambda s: None)
    assert seen["frozen"] > 0
    assert gc.get_freeze_count() == 0
    assert result["available"] is not fails
