"""Helpers and fixtures for SDK integration tests: real `sluice namesrv` and `sluice broker` subprocesses.

A uniquely named module (push_support.py's ``cluster`` differs): test modules import the helpers and the
fixtures from here.
"""
from __future__ import annotations

import itertools
import subprocess
import sys
from collections.abc import Iterator

import pytest
from servers import Cluster, running_cluster, start_broker, wait_for, wait_for_route  # noqa: F401 (re-exported)


def broker_available() -> bool:
    try:
        return subprocess.run([sys.executable, "-m", "sluice", "broker", "--help"], capture_output=True,
                              timeout=60).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


needs_broker = pytest.mark.skipif(not broker_available(),
                                  reason="`python -m sluice broker --help` fails: the broker is not in the repository")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """One namesrv and one broker, shared by a module's tests (each test uses its own topics)."""
    with running_cluster(tmp_path_factory.mktemp("sdk")) as c:
        yield c


_names = itertools.count()


@pytest.fixture
def topic(request: pytest.FixtureRequest) -> str:
    return f"T{next(_names)}_{request.node.name[:40].replace('[', '_').replace(']', '_').replace('-', '_')}"
