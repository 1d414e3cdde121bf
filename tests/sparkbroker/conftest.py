"""Fixtures for the broker side of the Spark pipeline (helpers in sparkbroker_support.py)."""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sparkbroker_support import Broker


@pytest.fixture
def make_broker(tmp_path: Path) -> Iterator[Any]:
    handles: list[Broker] = []

    def make(store: Path | None = None, **settings: Any) -> Broker:
        h = Broker(store or tmp_path / "store", **settings)
        handles.append(h)
        return h

    yield make
    for h in handles:
        h.stop()
