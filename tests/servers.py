"""Test-side helpers for real servers: subprocesses (the launcher lives in ``sluice.embedded``, which the demo
uses too) and a broker in this process on a free loopback port (``InProcessBroker``)."""
from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sluice.embedded import SluiceProcess, free_port, port_accepts, wait_for_port
from sluice.errors import SluiceError
from sluice.namesrv.client import SyncNamesrvClient
from sluice.protocol.command import RemotingCommand
from sluice.transport.blocking import LoopThread, SyncRemotingClient

__all__ = ["SMALL", "InProcessBroker", "SluiceProcess", "free_port", "port_accepts", "wait_for", "wait_for_port",
           "wait_for_route"]

SMALL = 8 * 1024 * 1024  # commit-log segment size for tests (must hold a 4 MiB message)


def wait_for(pred: Callable[[], Any], timeout: float = 15.0, what: str = "condition",
             interval: float = 0.05) -> Any:
    """Poll ``pred`` every ``interval`` s until it returns something truthy (returned), or time out."""
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not met within {timeout:g} s")
        time.sleep(interval)


def wait_for_route(namesrv: str, topic: str, brokers: int = 1, timeout: float = 15.0) -> None:
    """Wait until the namesrv routes ``topic`` to at least ``brokers`` brokers."""
    with SyncNamesrvClient(namesrv) as ns:
        def ready() -> bool:
            try:
                return len(ns.get_route(topic).broker_datas) >= brokers
            except SluiceError:
                return False
        wait_for(ready, timeout, f"route of {topic} with {brokers} broker(s)")


class InProcessBroker:
    """A ``BrokerController`` run on its own event-loop thread, listening on a free loopback port.

    ``call`` sends raw requests through the real ``RemotingClient``; folders subclass this to add the
    request helpers their tests speak (tests/broker/broker_support.py, filtering_support.py, ...)."""

    def __init__(self, store: Path, **settings: Any) -> None:
        from sluice.broker.config import BrokerConfig  # here: subprocess-only tests need not load the broker
        from sluice.broker.controller import BrokerController

        self.loop = LoopThread("test-broker")
        self.settings = {"listen": "127.0.0.1:0", "store": str(store), "commitlog_file_size": SMALL, **settings}
        self.broker = BrokerController(BrokerConfig.load(None, **self.settings))
        self.loop.run(self.broker.start(), 30)
        self.addr: str = self.broker.address
        self.client = SyncRemotingClient(self.loop)
        self._closers: list[Callable[[], None]] = [self.client.close]

    def call(self, code: int, fields: dict[str, Any] | None = None, body: bytes = b"",
             timeout: float = 10.0) -> RemotingCommand:
        return self.client.invoke(self.addr, RemotingCommand.request(code, fields or {}, body), timeout)

    def close_on_stop(self, close: Callable[[], None]) -> None:
        """Run ``close`` (e.g. a client's) when the broker stops, before the broker goes."""
        self._closers.append(close)

    def stop(self) -> None:
        closers, self._closers = self._closers, []
        for close in closers:
            close()
        if self.loop.running:
            self.loop.run(self.broker.stop(), 30)
            self.loop.stop()
