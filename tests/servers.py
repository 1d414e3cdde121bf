"""Test-side helpers for real server processes; the launcher lives in ``sluice.embedded`` (the demo uses it too)."""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from sluice.embedded import SluiceProcess, free_port, port_accepts, wait_for_port
from sluice.errors import SluiceError
from sluice.namesrv.client import SyncNamesrvClient

__all__ = ["SluiceProcess", "free_port", "port_accepts", "wait_for", "wait_for_port", "wait_for_route"]


def wait_for(pred: Callable[[], Any], timeout: float = 15.0, what: str = "condition") -> Any:
    """Poll ``pred`` every 50 ms until it returns something truthy (returned), or time out."""
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not met within {timeout:g} s")
        time.sleep(0.05)


def wait_for_route(namesrv: str, topic: str, brokers: int = 1, timeout: float = 15.0) -> None:
    """Wait until the namesrv routes ``topic`` to at least ``brokers`` brokers."""
    with SyncNamesrvClient(namesrv) as ns:
        def ready() -> bool:
            try:
                return len(ns.get_route(topic).broker_datas) >= brokers
            except SluiceError:
                return False
        wait_for(ready, timeout, f"route of {topic} with {brokers} broker(s)")
