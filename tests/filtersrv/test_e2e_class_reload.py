"""A repository class changed on disk is reloaded by the filter server (a new CRC), and the same group's
pulls are filtered by the new version; here with a `sluice filtersrv` started by hand beside a broker."""
from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from sdk_class_support import (EVEN_SOURCE, ODD_SOURCE, pull_numbers, running_cluster, send_numbered,
                               wait_for_filter_servers, write_repository)
from servers import SluiceProcess

from sluice import MessageSelector

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(300)]

N = 30


def test_a_changed_repository_class_is_reloaded(tmp_path: Path):
    repo = write_repository(tmp_path)
    (repo / "parity.py").write_text(EVEN_SOURCE.replace("Even", "Parity"))
    with running_cluster(tmp_path) as c:
        fs = SluiceProcess.start(["filtersrv", "--broker", c.broker.addr, "--repository", str(repo),
                                  "--repository-check-interval", "0.5", "--register-interval", "1"], tmp_path,
                                 name="filtersrv")
        try:
            wait_for_filter_servers(c.ns, 1)
            send_numbered(c.ns, "Reload", 0, N)
            sel = MessageSelector.by_class("parity:Parity")
            first = asyncio.run(pull_numbers(c.ns, "reload_g", "Reload", sel))
            assert sorted(first) == [i for i in range(N) if i % 2 == 0]
            (repo / "parity.py").write_text(ODD_SOURCE.replace("Odd", "Parity"))
            odds = [i for i in range(N) if i % 2 == 1]
            deadline = time.monotonic() + 30
            got: list[int] = []
            while time.monotonic() < deadline:
                got = sorted(asyncio.run(pull_numbers(c.ns, "reload_g", "Reload", sel)))
                if got == odds:
                    break
                time.sleep(0.5)
            assert got == odds
        finally:
            fs.stop()
