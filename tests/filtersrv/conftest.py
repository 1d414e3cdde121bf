"""Fixtures of the filter-server tests: one cluster (a namesrv, a broker) and one `sluice filtersrv` with
the test repository, shared by a module (each test uses its own topic and groups)."""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from filtersrv_support import FsRpc, start_filtersrv, write_repository
from servers import Cluster, SluiceProcess, running_cluster


@dataclass
class FsSetup:
    cluster: Cluster
    fs: SluiceProcess
    rpc: FsRpc
    repo: Path
    tmp: Path

    #: Classes the tests keep registered (bounds the worker processes a test may see).
    live_classes: tuple[str, ...] = ("evens:Even",) * 8

    @property
    def broker(self) -> str:
        return self.cluster.broker.addr


@pytest.fixture(scope="module")
def fs_setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FsSetup]:
    tmp = tmp_path_factory.mktemp("fs")
    repo = write_repository(tmp / "repo")
    with running_cluster(tmp) as c:
        fs = start_filtersrv(tmp, c.broker.addr, "--repository", str(repo), "--batch-deadline-ms", "3000",
                             "--worker-cpu-seconds", "2", "--worker-memory-mb", "256",
                             "--repository-check-interval", "1")
        rpc = FsRpc(c.broker.addr)
        try:
            yield FsSetup(c, fs, rpc, repo, tmp)
        finally:
            rpc.close()
            fs.stop()
