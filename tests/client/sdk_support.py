"""Helpers and fixtures for SDK integration tests: real `sluice namesrv` and `sluice broker` subprocesses.

A uniquely named module (not conftest.py, whose name other test folders share): test modules
import the helpers from here, and conftest.py re-exports the fixtures.
"""
from __future__ import annotations

import itertools
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from servers import SluiceProcess

from sluice.errors import SluiceError
from sluice.namesrv.client import SyncNamesrvClient


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


def wait_for(pred: Callable[[], object], timeout: float = 15.0, what: str = "condition") -> object:
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not met within {timeout:g} s")
        time.sleep(0.05)


def wait_for_route(namesrv: str, topic: str, brokers: int = 1, timeout: float = 15.0) -> None:
    with SyncNamesrvClient(namesrv) as ns:
        def ready() -> bool:
            try:
                return len(ns.get_route(topic).broker_datas) >= brokers
            except SluiceError:
                return False
        wait_for(ready, timeout, f"route of {topic} with {brokers} broker(s)")


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
