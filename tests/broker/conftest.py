"""Fixtures: an in-process broker on a free loopback port (helpers in broker_support.py)."""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from broker_support import BrokerHandle, Rpc


@pytest.fixture
def make_broker(tmp_path: Path) -> Iterator[Any]:
    handles: list[BrokerHandle] = []

    def make(store: Path | None = None, **settings: Any) -> BrokerHandle:
        h = BrokerHandle(store or tmp_path / f"store{len(handles)}", **settings)
        handles.append(h)
        return h

    yield make
    for h in handles:
        h.stop()


@pytest.fixture
def broker(make_broker: Any) -> BrokerHandle:
    return make_broker()


@pytest.fixture
def rpc(broker: BrokerHandle) -> Rpc:
    return broker.rpc()
