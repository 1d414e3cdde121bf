"""The filter server's class registry with real worker subprocesses: idle entries dropped with their
workers, live ones kept, a worker near its CPU lifetime replaced, malformed pull bodies refused."""
from __future__ import annotations

import ast
import asyncio
from pathlib import Path

import pytest
from filtersrv_support import write_repository

from sluice.filtersrv.registry import FilterClassRegistry
from sluice.filtersrv.repository import ClassRepository
from sluice.filtersrv.sandbox import WorkerLimits, split_records


def _registry(tmp_path: Path, **kw) -> FilterClassRegistry:
    return FilterClassRegistry(ClassRepository(write_repository(tmp_path / "repo")),
                               kw.pop("limits", WorkerLimits(memory_bytes=256 * 1024 * 1024)), **kw)


def test_idle_entries_without_live_holders_are_dropped_with_their_workers(tmp_path: Path) -> None:
    async def run() -> None:
        reg = _registry(tmp_path, idle_drop_s=0.0)
        try:
            alive = {"a": True, "b": True}
            gone = await reg.register("G1", "T", "evens:Even", 0, b"", "a", lambda: alive["a"])
            kept = await reg.register("G2", "T", "evens:Even", 0, b"", "b", lambda: alive["b"])
            assert gone.worker is not None and gone.worker.alive
            alive["a"] = False
            await reg.recheck()
            assert set(reg.entries) == {("T", "G2")}
            assert not gone.worker.alive and kept.worker is not None and kept.worker.alive
        finally:
            await reg.close()
        assert not kept.worker.alive
    asyncio.run(run())


def test_a_worker_near_its_cpu_lifetime_is_replaced(tmp_path: Path) -> None:
    async def run() -> None:
        reg = _registry(tmp_path, limits=WorkerLimits(memory_bytes=256 * 1024 * 1024, cpu_lifetime_seconds=0.001))
        try:
            entry = await reg.register("G", "T", "evens:Even", 0, b"", "a")
            first = entry.worker
            assert first is not None
            out = await reg.filter(entry, b"")
            assert out.kept == [] and out.total == 0
            assert first.worn  # it reported the CPU it used so far
            await reg.filter(entry, b"")
            assert entry.worker is not first and not first.alive and entry.worker.alive
        finally:
            await reg.close()
    asyncio.run(run())


@pytest.mark.parametrize("body, what", [(b"\x00\x00", "stray bytes"), (b"\x00\x00\x00\x40abcd", "claims 64 bytes")])
def test_a_malformed_pull_body_is_refused(body: bytes, what: str) -> None:
    with pytest.raises(ValueError, match=what):
        split_records(body)


def test_a_worker_does_not_see_the_filter_servers_credentials(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("SLUICE_FILTERSRV_SECRET_KEY", "admin-secret")
    monkeypatch.setenv("SLUICE_FILTERSRV_ACCESS_KEY", "fsadmin")
    monkeypatch.setenv("SOME_DB_PASSWORD", "pw")
    monkeypatch.setenv("SLUICE_VISIBLE", "yes")
    seen = tmp_path / "seen.txt"
    source = (f"import os\nopen({str(seen)!r}, 'w').write(repr(sorted(k for k in os.environ "
              f"if 'SLUICE' in k or 'PASSWORD' in k)))\n"
              "from sluice.filter import MessageFilter\nclass All(MessageFilter):\n"
              "    def match(self, m):\n        return True\n").encode()

    async def run() -> None:
        reg = _registry(tmp_path, uploads=True)
        try:
            await reg.register("G", "T", "spy:All", 0, source, "a")
        finally:
            await reg.close()
    asyncio.run(run())
    visible = set(ast.literal_eval(seen.read_text()))
    assert "SLUICE_VISIBLE" in visible
    assert not visible & {"SLUICE_FILTERSRV_SECRET_KEY", "SLUICE_FILTERSRV_ACCESS_KEY", "SOME_DB_PASSWORD"}
