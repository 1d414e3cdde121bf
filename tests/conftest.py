"""Suite-wide settings and fixtures.

Hypothesis deadlines are off: CI shares two cores with servers the tests start, so a slow example is load,
not a bug (each property still bounds its own work by max_examples)."""
from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from servers import InProcessBroker

settings.register_profile("sluice", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("sluice")


@pytest.fixture
def make_broker(tmp_path: Path) -> Iterator[Callable[..., Any]]:
    """``make_broker(store=None, *, handle=InProcessBroker, **settings)`` starts an in-process broker (a
    ``handle`` subclass adds a folder's request helpers); all are stopped after the test. A folder or module
    narrows ``handle`` by overriding this fixture with ``functools.partial(make_broker, handle=...)``."""
    handles: list[InProcessBroker] = []

    def make(store: Path | None = None, *, handle: type[InProcessBroker] = InProcessBroker,
             **settings: Any) -> InProcessBroker:
        h = handle(store or tmp_path / f"store{len(handles)}", **settings)
        handles.append(h)
        return h

    yield make
    for h in handles:
        h.stop()
