"""Helpers and fixtures for SDK integration tests: real `sluice namesrv` and `sluice broker` subprocesses.

A uniquely named module (push_support.py's ``cluster`` differs): test modules import the helpers and the
fixtures from here.
"""
from __future__ import annotations

import itertools
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from servers import SluiceProcess, wait_for, wait_for_route  # noqa: F401 (re-exported to the tests)



def broker_available() -> bool:
    try:
        return subprocess.run([sys.executable, "-m", "sluice", "broker", "--help"], capture_output=True,
                              timeout=60).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


needs_broker = pytest.mark.skipif(not broker_available(),
                                  reason="`python -m sluice broker --help` fails: the broker is not in the repository")


def start_broker(tmp: Path, namesrv: str, name: str = "broker-a", *extra: str) -> SluiceProcess:
    return SluiceProcess.start(["broker", "--namesrv", namesrv, "--store", str(tmp / f"store-{name}"),
                                "--broker-name", name, *extra], tmp, name=name)


@dataclass
class Cluster:
    namesrv: SluiceProcess
    brokers: list[SluiceProcess]

    @property
    def ns(self) -> str:
        return self.namesrv.addr


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """One namesrv and one broker, shared by a module's tests (each test uses its own topics)."""
    tmp = tmp_path_factory.mktemp("sdk")
    with SluiceProcess.start(["namesrv"], tmp, name="namesrv") as ns:
        broker = start_broker(tmp, ns.addr)
        try:
            wait_for_route(ns.addr, "TBW102")
            yield Cluster(ns, [broker])
        finally:
            broker.stop()


_names = itertools.count()


@pytest.fixture
def topic(request: pytest.FixtureRequest) -> str:
    return f"T{next(_names)}_{request.node.name[:40].replace('[', '_').replace(']', '_').replace('-', '_')}"
