"""One client instance per event loop and namesrv set (RocketMQ's MQClientInstance).

Producers and consumers of a process share it: one RemotingClient (so one
connection per broker), the topic route cache (refreshed every 30 s, as
``pollNameServerInterval``), the broker address table rebuilt from those
routes, heartbeats to every master every 30 s (``heartbeatBrokerInterval``)
and at once to a broker seen for the first time, and the periodic consumer
offset persistence (every 5 s, ``persistConsumerOffsetInterval``). A heartbeat
asked for while one with the same data is on its way to that broker joins it
(a starting consumer's own heartbeat and the new-broker one are one request).

Instances are reference counted: :meth:`acquire` on start, :meth:`release`
on shutdown; the last release closes it.
"""
from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Protocol, TypeVar

from sluice.acl.signature import Credentials
from sluice.acl.signing import remoting_client
from sluice.client.broker_api import BrokerAPI
from sluice.client.routing import default_topic_route
from sluice.errors import ClientError, InvalidParameterError, SluiceError, TopicNotExistError
from sluice.namesrv.client import NamesrvClient, parse_namesrv_addrs
from sluice.protocol.bodies import MASTER_ID, ConsumerData, HeartbeatData, ProducerData, TopicRouteData
from sluice.protocol.msgid import local_ip
from sluice.transport.tls import ClientTls

__all__ = ["ClientConfig", "ClientInstance", "ConsumerInner"]

log = logging.getLogger(__name__)
S = TypeVar("S")  # a per-instance service (ClientInstance.service)


@dataclass(frozen=True, kw_only=True)
class ClientConfig:
    """Instance-wide settings; the first producer or consumer to create an instance sets them."""

    #: Route refresh (pollNameServerInterval, 30 s).
    poll_namesrv_interval: float = 30.0
    #: Heartbeats to all masters (heartbeatBrokerInterval, 30 s).
    heartbeat_interval: float = 30.0
    #: Offsets committed locally are sent to brokers this often (persistConsumerOffsetInterval, 5 s).
    persist_offset_interval: float = 5.0
    #: Timeout of namesrv queries and housekeeping requests (3 s, as clientCallbackExecutor calls).
    request_timeout: float = 3.0
    #: Distinguishes instances in one process (RocketMQ's instanceName); the pid by default.
    instance_name: str | None = None
    #: An ACL account: every request the instance sends is signed with it (RocketMQ's AclClientRPCHook).
    credentials: Credentials | None = None
    #: Connect to namesrvs and brokers over TLS (RocketMQ's useTLS); their servers need tls_mode permissive
    #: or enforcing. Off by default, as the servers' tls_mode is.
    tls: bool = False
    #: PEM file of the CA certificates the servers' certificates are checked with; None: the system's CAs.
    tls_ca: str | None = None
    #: The name servers' certificates must carry; None: the host of each address (IP subjectAltNames work).
    tls_server_name: str | None = None
    #: Check the servers' certificates (chain and name). False is for testing only: it gives up server
    #: authentication, leaving encryption against passive eavesdroppers.
    tls_verify: bool = True
    #: The client's own certificate chain and key (PEM), for servers that require one (their tls_client_ca).
    tls_cert: str | None = None
    tls_key: str | None = None

    @property
    def client_tls(self) -> ClientTls | None:
        """The transport's TLS settings; None: plain TCP."""
        if not self.tls:
            return None
        return ClientTls(ca=self.tls_ca, server_name=self.tls_server_name, verify=self.tls_verify,
                         cert=self.tls_cert, key=self.tls_key)

    def __post_init__(self) -> None:
        if not self.tls and (self.tls_ca or self.tls_server_name or self.tls_cert):
            raise InvalidParameterError("tls_ca / tls_server_name / tls_cert are given but tls is False: "
                                        "pass tls=True too")
        if bool(self.tls_cert) != bool(self.tls_key):
            raise InvalidParameterError("tls_cert and tls_key are given together or not at all")
        if self.credentials is not None and not isinstance(self.credentials, Credentials):
            raise InvalidParameterError("credentials must be sluice.Credentials(access_key, secret_key), not "
                                        f"{type(self.credentials).__name__}")


class ConsumerInner(Protocol):
    """What the instance needs from a consumer (MQConsumerInner)."""

    group: str

    def consumer_data(self) -> ConsumerData: ...

    async def persist_offsets(self) -> None: ...


class ClientInstance:
    _registry: dict[tuple[int, tuple[str, ...], str | None, Credentials | None, ClientTls | None],
                    ClientInstance] = {}

    def __init__(self, namesrv: Iterable[str], config: ClientConfig | None = None) -> None:
        self.config = config or ClientConfig()
        self.namesrv_addrs = tuple(namesrv)
        self.remoting = remoting_client(self.config.credentials, tls=self.config.client_tls)
        self.namesrv = NamesrvClient(self.namesrv_addrs, self.remoting, timeout=self.config.request_timeout)
        self.api = BrokerAPI(self.remoting)
        instance = self.config.instance_name or str(os.getpid())
        self.client_id = f"{local_ip()}@{instance}#{time.monotonic_ns()}"
        self.routes: dict[str, TopicRouteData] = {}
        self.route_versions: dict[str, int] = {}
        self.from_default: set[str] = set()  # topics still routed through TBW102
        self.broker_addrs: dict[str, dict[int, str]] = {}
        self.producers: dict[str, object] = {}
        self.consumers: dict[str, ConsumerInner] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        #: Per broker address, the heartbeat on its way and the data it carries (joined by an equal one).
        self._heartbeats: dict[str, tuple[HeartbeatData, asyncio.Task[None]]] = {}
        self._users = 0
        self._key: tuple[int, tuple[str, ...], str | None, Credentials | None, ClientTls | None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.closed = False
        self._services: dict[type, object] = {}

    def service(self, kind: type[S], make: Callable[[ClientInstance], S]) -> S:
        """This instance's one ``kind`` (RebalanceService, ClassFilters, the transaction-check and reply
        handlers), ``make(self)`` on first use. Held here, so a service lives as long as its instance and
        no longer: held in a module-level WeakKeyDictionary, a service (which holds its instance) kept every
        instance alive after its clients shut down."""
        svc = self._services.get(kind)
        if svc is None:
            svc = self._services[kind] = make(self)
        return svc  # type: ignore[return-value]

    # ------------------------------------------------------------------------------ lifecycle

    @classmethod
    async def acquire(cls, namesrv: str | Iterable[str], config: ClientConfig | None = None) -> ClientInstance:
        """The running loop's instance for these namesrvs (created and started on first use)."""
        addrs = tuple(parse_namesrv_addrs(namesrv))
        cfg = config or ClientConfig()
        loop = asyncio.get_running_loop()
        key = (id(loop), addrs, cfg.instance_name, cfg.credentials, cfg.client_tls)  # other keys: another instance
        inst = cls._registry.get(key)
        # A loop id can be reused by a later loop: an instance left unreleased on a dead loop is not shared.
        if inst is None or inst.closed or inst._loop is not loop:
            inst = cls(addrs, cfg)
            inst._key = key
            inst._loop = loop
            cls._registry[key] = inst
            inst._start()
        inst._users += 1
        return inst

    async def release(self) -> None:
        self._users -= 1
        if self._users <= 0:
            await self.close()

    def _start(self) -> None:
        c = self.config
        self._spawn(self._every(c.poll_namesrv_interval, self.refresh_routes), "route-refresh")
        self._spawn(self._every(c.heartbeat_interval, self.send_heartbeat_to_all), "heartbeat")
        self._spawn(self._every(c.persist_offset_interval, self.persist_all_offsets), "persist-offsets")

    async def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self._key is not None and self._registry.get(self._key) is self:
            del self._registry[self._key]
        tasks, self._tasks = list(self._tasks), set()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self.remoting.close()

    def _spawn(self, coro: Awaitable[None], name: str) -> None:
        task = asyncio.ensure_future(coro)
        task.set_name(f"sluice-client-{name}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _every(self, interval: float, fn: Callable[[], Awaitable[None]]) -> None:
        while True:
            await asyncio.sleep(interval)
            try:
                await fn()
            except asyncio.CancelledError:
                raise
            except Exception:  # housekeeping must never stop: log and try again next period
                log.exception("client housekeeping %s failed", getattr(fn, "__name__", fn))

    # ------------------------------------------------------------------------------ groups

    def register_producer(self, group: str, producer: object) -> None:
        if group in self.producers:
            raise ClientError(f"producer group {group!r} is already started in this client instance")
        self.producers[group] = producer

    def register_consumer(self, group: str, consumer: ConsumerInner) -> None:
        if group in self.consumers:
            raise ClientError(f"consumer group {group!r} is already started in this client instance")
        self.consumers[group] = consumer

    async def unregister(self, *, producer_group: str | None = None, consumer_group: str | None = None) -> None:
        """Forget a group and tell every master (UNREGISTER_CLIENT); failures are only logged."""
        if producer_group is not None:
            self.producers.pop(producer_group, None)
        if consumer_group is not None:
            self.consumers.pop(consumer_group, None)
        await asyncio.gather(*(
            self._quietly(self.api.unregister_client(addr, self.client_id, producer_group=producer_group,
                                                     consumer_group=consumer_group,
                                                     timeout=self.config.request_timeout), addr)
            for addr in self.master_addrs()))

    # ------------------------------------------------------------------------------ routes

    async def topic_route(self, topic: str, *, refresh: bool = False) -> TopicRouteData:
        """The cached route, fetched from the namesrv when missing; TopicNotExistError if it has none."""
        if refresh or topic not in self.routes or topic in self.from_default:
            try:
                await self._update_route(topic)
            except TopicNotExistError:
                if topic not in self.routes:
                    raise
        return self.routes[topic]

    async def publish_route(self, topic: str, *, default_topic: str, default_queue_nums: int) -> TopicRouteData:
        """tryToFindTopicPublishInfo: the topic's route, else TBW102's capped to ``default_queue_nums``
        queues per broker so the broker creates the topic on the first send."""
        if topic in self.routes:
            return self.routes[topic]
        try:
            return await self.topic_route(topic)
        except TopicNotExistError:
            pass
        try:
            base = await self.namesrv.get_route(default_topic)
        except TopicNotExistError:
            raise TopicNotExistError(
                f"no route for topic {topic!r} and none for the auto-create topic {default_topic!r} "
                f"({await self._why_no_default_route()})") from None
        if topic not in self.routes:  # a concurrent caller may have found the real route meanwhile
            self._set_route(topic, default_topic_route(base, default_queue_nums))
            self.from_default.add(topic)
        return self.routes[topic]

    async def _why_no_default_route(self) -> str:
        """The likelier of the two causes, asked of the namesrv (an error path only): no broker registered at all
        (none started, or started without this --namesrv) or brokers that do not auto-create topics."""
        try:
            info = await self.namesrv.get_cluster_info()
        except SluiceError:
            return "is autoCreateTopicEnable off on every broker?"
        if not info.broker_addr_table:
            return (f"no broker is registered with the namesrv {';'.join(self.namesrv.addrs)}: is a broker running "
                    "with --namesrv pointing at it?")
        return ("autoCreateTopicEnable is off on every broker: create the topic with "
                "`sluice admin updateTopic -t TOPIC -c CLUSTER`")

    async def _update_route(self, topic: str) -> None:
        route = await self.namesrv.get_route(topic)
        self.from_default.discard(topic)
        self._set_route(topic, route)

    def _set_route(self, topic: str, route: TopicRouteData) -> None:
        if self.routes.get(topic) == route:
            return
        self.routes[topic] = route
        self.route_versions[topic] = self.route_versions.get(topic, 0) + 1
        old = {a for addrs in self.broker_addrs.values() for a in addrs.values()}
        table: dict[str, dict[int, str]] = {}
        for r in self.routes.values():
            for bd in r.broker_datas:
                table.setdefault(bd.broker_name, {}).update(bd.broker_addrs)
        self.broker_addrs = table
        fresh = [a for a in self.master_addrs() if a not in old]
        if fresh and not self.closed:
            # A broker we never talked to learns of our groups now, not up to 30 s later.
            self._spawn(self.send_heartbeat(fresh), "heartbeat-new-broker")

    async def refresh_routes(self) -> None:
        for topic in list(self.routes):
            try:
                await self._update_route(topic)
            except TopicNotExistError:
                pass  # keep the route we have (a TBW102 one until the broker registers the topic)
            except SluiceError as exc:
                log.warning("route refresh for %s failed: %s", topic, exc)

    def find_broker_addr(self, broker_name: str, *, master_only: bool = True) -> str | None:
        addrs = self.broker_addrs.get(broker_name) or {}
        if MASTER_ID in addrs:
            return addrs[MASTER_ID]
        if master_only:
            return None
        return next(iter(addrs.values()), None)

    async def broker_addr_for(self, topic: str, broker_name: str, *, master_only: bool = True) -> str:
        """The address of ``broker_name``, refreshing ``topic``'s route once if it is unknown."""
        addr = self.find_broker_addr(broker_name, master_only=master_only)
        if addr is None:
            await self.topic_route(topic, refresh=True)
            addr = self.find_broker_addr(broker_name, master_only=master_only)
        if addr is None:
            raise ClientError(f"broker {broker_name!r} is not in the route of topic {topic!r}")
        return addr

    def master_addrs(self) -> list[str]:
        return sorted({addrs[MASTER_ID] for addrs in self.broker_addrs.values() if MASTER_ID in addrs})

    # ------------------------------------------------------------------------------ heartbeats

    def heartbeat_data(self) -> HeartbeatData:
        return HeartbeatData(
            client_id=self.client_id,
            producer_data_set=[ProducerData(group_name=g) for g in self.producers],
            consumer_data_set=[c.consumer_data() for c in self.consumers.values()],
        )

    async def send_heartbeat_to_all(self) -> None:
        await self.send_heartbeat(self.master_addrs())

    async def send_heartbeat(self, addrs: Iterable[str]) -> None:
        data = self.heartbeat_data()
        if not data.producer_data_set and not data.consumer_data_set:
            return
        await asyncio.gather(*(self._heartbeat(a, data) for a in addrs))

    def _heartbeat(self, addr: str, data: HeartbeatData) -> Awaitable[None]:
        """One heartbeat to ``addr``; one on its way there with equal data is joined, not sent again (a
        starting consumer's heartbeat and the one a new route spawns would otherwise both be handled)."""
        held = self._heartbeats.get(addr)
        if held is not None and not held[1].done() and held[0] == data:
            return asyncio.shield(held[1])
        task = asyncio.ensure_future(self._quietly(self.api.heartbeat(addr, data, self.config.request_timeout),
                                                   addr))
        self._heartbeats[addr] = (data, task)

        def forget(t: asyncio.Task[None], addr: str = addr) -> None:
            if self._heartbeats.get(addr, (None, None))[1] is t:
                del self._heartbeats[addr]
        task.add_done_callback(forget)
        return asyncio.shield(task)

    async def persist_all_offsets(self) -> None:
        for consumer in list(self.consumers.values()):
            await consumer.persist_offsets()

    @staticmethod
    async def _quietly(coro: Awaitable[None], addr: str) -> None:
        try:
            await coro
        except SluiceError as exc:
            log.info("request to broker %s failed: %s", addr, exc)
