"""The filter server: serves class-filter pulls for the groups of one broker
(RocketMQ's FiltersrvController and PullMessageForwardProcessor,
filtersrv/src/main/java/org/apache/rocketmq/filtersrv/).

* It registers with its broker (REGISTER_FILTER_SERVER, 301: header
  filterServerAddr) every ``register_interval`` seconds; the broker lists it in
  its namesrv registrations, so routes carry it in ``filterServerTable``.
* Consumers register their group's class for a topic (REGISTER_MESSAGE_FILTER_CLASS,
  302; sluice/filtersrv/registry.py), then pull (PULL_MESSAGE, 11) with the
  class-filter flag 0x8.
* A pull is forwarded to the broker as a plain ``*`` subscription pull of the
  group, the class runs on each batch in its worker, and the answer is the
  broker's with the body cut to the records the class kept, filled over several
  broker pulls (sluice/filtersrv/forward.py).
* With ``acl`` (a plain_acl.yml, the broker's) every request is checked as the
  broker checks a pull: SUB on the topic and on the group's retry topic; a 302
  that uploads source needs an admin account besides. The filter server signs
  its own requests to the broker with ``credentials`` (301 needs admin, pulls SUB).
* TLS both ways (transport/tls.py): its port takes the broker's tls_mode, certificate and client CA (a broker
  passes its own to its children), and it reaches its broker with ``broker_tls`` when that port is TLS.
"""
from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any

from sluice.acl.guard import AclGuard
from sluice.acl.policy import SUB, Need, retry_topic
from sluice.acl.signature import Credentials
from sluice.acl.signing import remoting_client
from sluice.errors import FilterClassError, InvalidParameterError
from sluice.filtersrv.forward import FLAG_CLASS_FILTER, MAX_EMPTY_ROUNDS, PullForwarder
from sluice.filtersrv.registry import FilterClassRegistry
from sluice.filtersrv.repository import ClassRepository
from sluice.filtersrv.sandbox import WorkerLimits
from sluice.protocol.codes import RequestCode, ResponseCode
from sluice.protocol.command import RemotingCommand
from sluice.transport.client import RemotingClient
from sluice.transport.connection import RemotingConnection
from sluice.transport.server import RemotingServer
from sluice.transport.tls import ClientTls, server_tls

__all__ = ["FiltersrvConfig", "FilterServer", "FLAG_CLASS_FILTER", "MAX_EMPTY_ROUNDS"]

log = logging.getLogger(__name__)



@dataclass(frozen=True, kw_only=True)
class FiltersrvConfig:
    #: The broker this filter server serves (HOST:PORT).
    broker: str
    #: Where consumers connect (HOST:PORT; port 0 picks a free one). Registered with the broker as is.
    listen: str = "127.0.0.1:0"
    #: The directory of filter-class modules (uploads off: the only source of classes).
    repository: str | None = None
    #: A base URL of filter-class modules, tried where the directory has no such module.
    repository_url: str | None = None
    #: Accept class source sent by consumers (302 body); off by default: uploaded code is code from anyone
    #: who can reach the port.
    uploads: bool = False
    limits: WorkerLimits = field(default_factory=WorkerLimits)
    #: RocketMQ's FiltersrvController registers every 10 s; the broker drops one silent for 30 s.
    register_interval: float = 10.0
    #: How often repository files are re-read for changed classes (RocketMQ: every minute).
    check_interval: float = 60.0
    #: A plain_acl.yml checked on every request (None: no ACL); uploading source needs an admin account.
    acl: str | None = None
    #: The account the filter server signs its requests to the broker with (a broker with ACL on).
    credentials: Credentials | None = None
    #: The listening port's TLS (transport/tls.py), as the broker's: tls_mode disabled|permissive|enforcing,
    #: certificate and key, and tls_client_ca for mutual TLS.
    tls_mode: str = "disabled"
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_client_ca: str | None = None
    #: How it reaches its broker over TLS (None: plain TCP).
    broker_tls: ClientTls | None = None


class FilterServer:
    def __init__(self, config: FiltersrvConfig, *, remoting: RemotingClient | None = None) -> None:
        self.config = config
        host, _, port = config.listen.rpartition(":")
        if not host or not port.isdigit():
            raise InvalidParameterError(f"listen address {config.listen!r} is not HOST:PORT")
        tls_mode, ssl_context = server_tls(config.tls_mode, config.tls_cert, config.tls_key, config.tls_client_ca)
        self.server = RemotingServer(host, int(port), tls_mode=tls_mode, ssl_context=ssl_context)
        self.remoting = remoting or remoting_client(config.credentials, tls=config.broker_tls)
        self.acl = AclGuard(config.acl) if config.acl else None
        self.registry = FilterClassRegistry(ClassRepository(config.repository, config.repository_url), config.limits,
                                            uploads=config.uploads, check_interval=config.check_interval)
        self.forwarder = PullForwarder(self.registry, self.remoting, config.broker)
        self.broker_name: str | None = None
        self.broker_id: int | None = None
        self.server.register(RequestCode.REGISTER_MESSAGE_FILTER_CLASS, self._checked(self.register_class))
        self.server.register(RequestCode.PULL_MESSAGE, self._checked(self.pull))
        self.server.on_connection_close(self.registry.forget_owner)
        self._tasks: list[asyncio.Task[None]] = []
        self.registered = asyncio.Event()

    @property
    def address(self) -> str:
        return self.server.address

    async def start(self) -> None:
        await self.server.start()
        self.registry.start()
        loop = asyncio.get_running_loop()
        self._tasks.append(loop.create_task(self._register_loop(), name="filtersrv-register"))
        log.info("filter server %s serving broker %s (repository %s, uploads %s, TLS %s, to the broker %s)",
                 self.address, self.config.broker, self.config.repository or "-",
                 "on" if self.config.uploads else "off", self.server.tls_mode,
                 "TLS" if self.config.broker_tls else "plain")

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.server.close()
        await self.registry.close()
        await self.remoting.close()

    def _checked(self, handler: Any) -> Any:
        """``handler`` behind the ACL (when on): SUB on the topic and the group's retry topic, admin to upload."""
        acl = self.acl
        if acl is None:
            return handler

        async def checked(conn: RemotingConnection, request: RemotingCommand) -> RemotingCommand:
            ext = request.ext_fields
            resources = {}
            if ext.get("topic"):
                resources[ext["topic"]] = SUB
            if ext.get("consumerGroup"):
                resources[retry_topic(ext["consumerGroup"])] = SUB
            upload = request.code == RequestCode.REGISTER_MESSAGE_FILTER_CLASS and bool(request.body)
            acl.check(conn.peer, ext, request.body, Need(request.code, admin=upload, resources=resources))
            return await handler(conn, request)
        return checked

    # ------------------------------------------------------------------------------------------ 301

    async def register_with_broker(self) -> None:
        """REGISTER_FILTER_SERVER (301): raises the broker's error."""
        req = RemotingCommand.request(RequestCode.REGISTER_FILTER_SERVER, {"filterServerAddr": self.address})
        resp = (await self.remoting.invoke(self.config.broker, req, timeout=3.0)).raise_for_code()
        name, bid = resp.ext_fields.get("brokerName"), resp.ext_fields.get("brokerId", "0")
        if self.broker_name != name:
            log.info("filter server %s registered with broker %s (%s, id %s)", self.address, name,
                     self.config.broker, bid)
        self.broker_name, self.broker_id = name, int(bid)
        self.registered.set()

    async def _register_loop(self) -> None:
        """Register every interval, and at once when the connection to the broker closes: the broker drops
        a filter server whose connection closed, so waiting for the next tick would leave it out of routes."""
        failing = False
        again = asyncio.Event()
        watched: RemotingConnection | None = None
        while True:
            again.clear()
            try:
                await self.register_with_broker()
                failing = False
                conn = await self.remoting.connection(self.config.broker)
                if conn is not watched:
                    watched = conn
                    conn.on_close(lambda _c: again.set())
            except Exception as exc:  # the broker may be restarting: keep trying, log once per outage
                if not failing:
                    log.warning("filter server %s: registering with broker %s failed: %s", self.address,
                                self.config.broker, exc)
                failing = True
            try:
                # while failing, try every second: the broker is likely restarting and routes miss us meanwhile
                async with asyncio.timeout(min(1.0, self.config.register_interval) if failing
                                           else self.config.register_interval):
                    await again.wait()
                await asyncio.sleep(0.2)  # a broker going down: do not spin on refused connections
            except TimeoutError:
                pass

    # ------------------------------------------------------------------------------------------ 302

    async def register_class(self, conn: RemotingConnection, request: RemotingCommand) -> RemotingCommand:
        ext = request.ext_fields
        group, topic, class_name = ext.get("consumerGroup"), ext.get("topic"), ext.get("className")
        if not group or not topic or not class_name:
            raise InvalidParameterError("REGISTER_MESSAGE_FILTER_CLASS needs consumerGroup, topic and className")
        try:
            crc = int(ext.get("classCRC") or 0) & 0xFFFFFFFF  # Java sends a signed int
        except ValueError:
            raise InvalidParameterError(f"classCRC {ext.get('classCRC')!r} is not an integer") from None
        try:
            await self.registry.register(group, topic, class_name, crc, request.body or b"", conn,
                                         lambda: not conn.is_closed)
        except FilterClassError as exc:
            log.warning("filter class %s for %s@%s from %s refused: %s", class_name, topic, group, conn.peer, exc)
            raise
        return request.make_response(ResponseCode.SUCCESS)

    # ------------------------------------------------------------------------------------------ pull

    async def pull(self, conn: RemotingConnection, request: RemotingCommand) -> RemotingCommand:
        return await self.forwarder.pull(request)
