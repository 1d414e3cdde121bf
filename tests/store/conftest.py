"""Fixtures for the store tests; helpers live in store_testlib.py."""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from store_testlib import small_config

from sluice.store import MessageStore


@pytest.fixture
def store_dir(tmp_path: Path) -> Path:
    return tmp_path / "store"


@pytest.fixture
def store(store_dir: Path) -> Iterator[MessageStore]:
    s = MessageStore(store_dir, small_config())
    s.start()
    try:
        yield s
    finally:
        s.close()
