"""Test-side helpers for real servers, each on a free loopback port: ``sluice namesrv`` / ``sluice broker``
subprocesses (launched by ``sluice.embedded.SluiceProcess``, which the demo uses too; ``Cluster`` puts a namesrv
and its brokers together) and a broker in this process (``InProcessBroker``)."""
from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sluice.embedded import SluiceProcess, free_port
from sluice.errors import SluiceError
from sluice.namesrv.client import SyncNamesrvClient
from sluice.protocol.bodies import TopicRouteData
from sluice.protocol.command import RemotingCommand
from sluice.transport.blocking import LoopThread, SyncRemotingClient
from sluice.transport.tls import ClientTls

__all__ = ["SMALL", "Cluster", "InProcessBroker", "SluiceProcess", "broker_argv", "free_port", "running_cluster",
           "start_broker", "start_cluster", "wait_for", "wait_for_route"]

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


def wait_for_route(namesrv: str, topic: str, brokers: int = 1, timeout: float = 15.0,
                   tls: ClientTls | None = None) -> TopicRouteData:
    """Wait until the namesrv routes ``topic`` to at least ``brokers`` brokers; returns that route.
    ``tls``: ask over TLS (a namesrv in tls_mode enforcing)."""
    with SyncNamesrvClient(namesrv, tls=tls) as ns:
        def ready() -> TopicRouteData | None:
            try:
                route = ns.get_route(topic)
            except SluiceError:
                return None
            return route if len(route.broker_datas) >= brokers else None
        return wait_for(ready, timeout, f"route of {topic} with {brokers} broker(s)")


def broker_argv(tmp: Path, namesrv: str, name: str, *extra: str, config: str | None = None) -> list[str]:
    """``broker`` arguments: named ``name`` (--broker-name), store tmp/store-<name>, registered with ``namesrv``;
    ``config`` is the text of a TOML file (tmp/<name>.toml) given as --config."""
    argv = ["broker", "--namesrv", namesrv, "--store", str(tmp / f"store-{name}"), "--broker-name", name]
    if config is not None:
        conf = tmp / f"{name}.toml"
        conf.write_text(config)
        argv += ["--config", str(conf)]
    return argv + list(extra)


def start_broker(tmp: Path, namesrv: str, name: str = "broker-a", *extra: str,
                 config: str | None = None) -> SluiceProcess:
    """A ``sluice broker`` subprocess (arguments as in ``broker_argv``; stderr in tmp/<name>.stderr.log)."""
    return SluiceProcess.start(broker_argv(tmp, namesrv, name, *extra, config=config), tmp, name=name)


@dataclass
class Cluster:
    """A ``sluice namesrv`` and its brokers, real subprocesses (``start_cluster``)."""

    tmp: Path
    namesrv: SluiceProcess
    brokers: list[SluiceProcess] = field(default_factory=list)
    names: list[str] = field(default_factory=list)
    argv: list[list[str]] = field(default_factory=list)  # each broker's arguments, for restarts
    tls: ClientTls | None = None  # how clients reach a TLS cluster (start_cluster's client_tls)

    @property
    def ns(self) -> str:
        return self.namesrv.addr

    @property
    def broker(self) -> SluiceProcess:
        return self.brokers[0]

    def store(self, i: int = 0) -> Path:
        """Broker ``i``'s store directory."""
        return self.tmp / f"store-{self.names[i]}"

    def restart_broker(self, i: int = 0, *, kill: bool = False) -> SluiceProcess:
        """Stop broker ``i`` (SIGTERM, or SIGKILL with ``kill``) and start it again on the same port and store."""
        old = self.brokers[i]
        if kill:
            old.kill()
        else:
            old.stop()
        self.brokers[i] = SluiceProcess.start(self.argv[i], self.tmp, name=f"{self.names[i]}-restarted",
                                              port=old.port)
        # Listening is not registered: a route asked for too early names no topic of this broker.
        wait_for_route(self.ns, "TBW102", brokers=len(self.brokers), timeout=20.0, tls=self.tls)
        return self.brokers[i]

    def stop(self) -> None:
        for b in self.brokers:
            b.stop()
        self.namesrv.stop()


def start_cluster(tmp: Path, names: Sequence[str] = ("broker-a",), *extra: str, config: str | None = None,
                  cls: type[Cluster] = Cluster, namesrv_extra: Sequence[str] = (),
                  client_tls: ClientTls | None = None) -> Cluster:
    """A namesrv and one broker per name (``broker_argv`` with ``extra`` and ``config``), returned once the
    namesrv routes TBW102 to all of them. ``cls``: a Cluster subclass with a folder's helpers.
    ``namesrv_extra``: arguments of ``sluice namesrv`` (e.g. ``--tls-mode``); ``client_tls``: how the
    readiness check (and ``Cluster.tls`` users) reach a namesrv that only speaks TLS."""
    c = cls(tmp, SluiceProcess.start(["namesrv", *namesrv_extra], tmp, name="namesrv"))
    c.tls = client_tls
    try:
        for name in names:
            argv = broker_argv(tmp, c.ns, name, *extra, config=config)
            c.brokers.append(SluiceProcess.start(argv, tmp, name=name))
            c.names.append(name)
            c.argv.append(argv)
        wait_for_route(c.ns, "TBW102", brokers=len(names), timeout=20.0, tls=client_tls)
    except BaseException:
        c.stop()
        raise
    return c


@contextmanager
def running_cluster(tmp: Path, names: Sequence[str] = ("broker-a",), *extra: str, config: str | None = None,
                    cls: type[Cluster] = Cluster, namesrv_extra: Sequence[str] = (),
                    client_tls: ClientTls | None = None) -> Iterator[Cluster]:
    """``start_cluster``, stopped on exit."""
    c = start_cluster(tmp, names, *extra, config=config, cls=cls, namesrv_extra=namesrv_extra,
                      client_tls=client_tls)
    try:
        yield c
    finally:
        c.stop()


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
