"""The namesrv: RouteInfoManager behind a RemotingServer, plus the broker-expiry scan.

Handled codes: REGISTER_BROKER, UNREGISTER_BROKER, GET_ROUTEINFO_BY_TOPIC,
GET_BROKER_CLUSTER_INFO, GET_ALL_TOPIC_LIST_FROM_NAMESERVER,
DELETE_TOPIC_IN_NAMESRV, PUT_KV_CONFIG, GET_KV_CONFIG, DELETE_KV_CONFIG, QUERY_DATA_VERSION.
As in RocketMQ, a broker is forgotten when it unregisters, when it has not
registered for ``broker_expiry`` seconds, or when the connection it last
registered on closes.

KV config entries are capped (``kv_max_entries``, ``kv_max_key_bytes`` for namespace and key,
``kv_max_value_bytes``): RocketMQ's KVConfigManager has no cap, but an unbounded table is memory any
client can take. A put over a cap is refused with INVALID_PARAMETER naming the cap; nothing is stored.
The connection bounds (frame budget, connection limit, idle timeout) are the RemotingServer's.
"""
from __future__ import annotations

import asyncio
import inspect
import logging
import signal
import time
from dataclasses import dataclass
from typing import Any

from sluice.acl.guard import AclGuard
from sluice.acl.policy import Need
from sluice.errors import InvalidParameterError, TopicNotExistError
from sluice.metrics_http import MetricsServer, parse_metrics_listen
from sluice.namesrv.routeinfo import RouteInfoManager
from sluice.protocol import headers as H
from sluice.protocol.bodies import DataVersion, RegisterBrokerBody, decode_body, encode_body
from sluice.protocol.codes import RequestCode, ResponseCode
from sluice.protocol.command import RemotingCommand
from sluice.transport.connection import RemotingConnection, split_addr
from sluice.protocol.frame import DEFAULT_MAX_FRAME_SIZE
from sluice.transport.limits import DEFAULT_FRAME_BUDGET, DEFAULT_IDLE_TIMEOUT, DEFAULT_MAX_CONNECTIONS
from sluice.transport.server import RemotingServer
from sluice.transport.tls import check_tls_mode, server_tls

__all__ = ["NamesrvConfig", "NamesrvServer", "run_namesrv", "ADMIN_CODES"]

#: Writes: with ACL on they need an admin account or a white address. Route and KV reads need nothing.
ADMIN_CODES = frozenset(int(c) for c in (
    RequestCode.REGISTER_BROKER, RequestCode.UNREGISTER_BROKER, RequestCode.DELETE_TOPIC_IN_NAMESRV,
    RequestCode.PUT_KV_CONFIG, RequestCode.DELETE_KV_CONFIG, RequestCode.WIPE_WRITE_PERM_OF_BROKER,
    RequestCode.ADD_WRITE_PERM_OF_BROKER))

log = logging.getLogger(__name__)


@dataclass(slots=True)
class NamesrvConfig:
    listen: str = "127.0.0.1:9876"
    #: How often to look for silent brokers (NamesrvController: every 5 s).
    scan_interval: float = 5.0
    #: A broker silent this long is removed (RouteInfoManager.BROKER_CHANNEL_EXPIRED_TIME: 120 s).
    broker_expiry: float = 120.0
    max_frame_size: int = DEFAULT_MAX_FRAME_SIZE
    #: Bytes of big frames being received at once over all connections (transport/limits.py).
    frame_budget: int = DEFAULT_FRAME_BUDGET
    #: Connections kept at once; more are closed at accept (each client process holds one).
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    #: Seconds without a complete frame before a connection is closed (serverChannelMaxIdleTimeSeconds);
    #: brokers register and clients ask for routes every 30 s. 0 turns it off.
    idle_timeout: float = DEFAULT_IDLE_TIMEOUT
    #: KV config entries in all namespaces (RocketMQ has no cap; its users keep a few order-topic entries).
    kv_max_entries: int = 10_000
    #: Bytes (UTF-8) of a KV namespace or key; a topic name is at most 127 characters.
    kv_max_key_bytes: int = 255
    #: Bytes (UTF-8) of a KV value: ORDER_TOPIC_CONFIG values list brokers and queue counts, a few hundred bytes.
    kv_max_value_bytes: int = 64 * 1024
    #: A RocketMQ ``plain_acl.yml``: writes then need an admin account or a white address; empty: no ACL.
    acl: str = ""
    #: RocketMQ's TlsMode (transport/tls.py): "disabled" (plain only, as before TLS existed), "permissive"
    #: (TLS and plain clients on the one port) or "enforcing" (TLS only); the last two need tls_cert and
    #: tls_key, PEM files of the server's certificate chain and private key.
    tls_mode: str = "disabled"
    tls_cert: str = ""
    tls_key: str = ""
    #: Mutual TLS: TLS clients (brokers included) must present a certificate this CA file signed; empty: none asked.
    tls_client_ca: str = ""
    #: Serve Prometheus text at http://HOST:PORT/metrics (namesrv/metrics.py); empty: none.
    metrics_listen: str = ""

    def __post_init__(self) -> None:
        split_addr(self.listen)
        if self.metrics_listen:
            parse_metrics_listen(self.metrics_listen)
        if self.scan_interval <= 0 or self.broker_expiry <= 0:
            raise InvalidParameterError("scan_interval and broker_expiry must be positive")
        if self.frame_budget < 1 or self.max_connections < 1 or self.idle_timeout < 0:
            raise InvalidParameterError("frame_budget and max_connections must be positive, idle_timeout >= 0")
        if self.kv_max_entries < 0 or self.kv_max_key_bytes < 1 or self.kv_max_value_bytes < 0:
            raise InvalidParameterError("kv_max_entries and kv_max_value_bytes must be >= 0, kv_max_key_bytes >= 1")
        self.tls_mode = check_tls_mode(self.tls_mode)
        if self.tls_mode != "disabled" and not (self.tls_cert and self.tls_key):
            raise InvalidParameterError(f"tls_mode {self.tls_mode} needs tls_cert and tls_key (PEM files)")


class NamesrvServer:
    def __init__(self, config: NamesrvConfig | None = None) -> None:
        self.config = config or NamesrvConfig()
        host, port = split_addr(self.config.listen)
        self.routes = RouteInfoManager()
        c = self.config
        tls_mode, ssl_context = server_tls(c.tls_mode, c.tls_cert, c.tls_key, c.tls_client_ca)
        self.server = RemotingServer(host, port, max_frame_size=c.max_frame_size, frame_budget=c.frame_budget,
                                     max_connections=c.max_connections, idle_timeout=c.idle_timeout,
                                     tls_mode=tls_mode, ssl_context=ssl_context)
        self._scan_task: asyncio.Task[None] | None = None
        self.acl = AclGuard(self.config.acl) if self.config.acl else None
        handlers = {
            RequestCode.REGISTER_BROKER: self._register_broker,
            RequestCode.UNREGISTER_BROKER: self._unregister_broker,
            RequestCode.GET_ROUTEINFO_BY_TOPIC: self._get_route,
            RequestCode.GET_BROKER_CLUSTER_INFO: self._cluster_info,
            RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER: self._all_topics,
            RequestCode.DELETE_TOPIC_IN_NAMESRV: self._delete_topic,
            RequestCode.PUT_KV_CONFIG: self._put_kv,
            RequestCode.GET_KV_CONFIG: self._get_kv,
            RequestCode.DELETE_KV_CONFIG: self._delete_kv,
            RequestCode.QUERY_DATA_VERSION: self._query_data_version,
            RequestCode.WIPE_WRITE_PERM_OF_BROKER: self._wipe_write_perm,
            RequestCode.ADD_WRITE_PERM_OF_BROKER: self._add_write_perm,
        }
        #: request code -> requests handled (sluice_namesrv_requests_total)
        self.request_counts: dict[int, int] = {}
        for code, handler in handlers.items():
            if self.acl is not None and code in ADMIN_CODES:
                handler = self._admin_only(self.acl, code, handler)
            self.server.register(code, self._counted(int(code), handler))
        self.server.on_connection_close(self._connection_closed)
        self.metrics: MetricsServer | None = None
        if c.metrics_listen:  # prometheus_client is loaded only then
            from sluice.namesrv.metrics import NamesrvCollector

            self._collector = NamesrvCollector(self)
            self.metrics = MetricsServer(c.metrics_listen, [self._collector])

    @property
    def address(self) -> str:
        return self.server.address

    @staticmethod
    def _admin_only(acl: AclGuard, code: int, handler: Any) -> Any:
        """A write behind the ACL: a white address, or a request signed by an admin account."""
        need = Need(int(code), admin=True)

        async def checked(conn: RemotingConnection, req: RemotingCommand) -> RemotingCommand:
            acl.check(conn.peer, req.ext_fields, req.body, need)
            result = handler(conn, req)
            return await result if inspect.isawaitable(result) else result
        return checked

    def _counted(self, code: int, handler: Any) -> Any:
        counts = self.request_counts
        counts[code] = 0

        def counted(conn: RemotingConnection, req: RemotingCommand) -> Any:
            counts[code] += 1
            return handler(conn, req)  # the handler's coroutine: the dispatcher awaits it
        return counted

    async def start(self) -> None:
        await self.server.start()
        if self.metrics is not None:
            self._collector.bind(asyncio.get_running_loop())
            try:
                self.metrics.start()
            except BaseException:
                await self.server.close()
                raise
            log.info("metrics at http://%s:%d/metrics", self.metrics.host, self.metrics.port)
        self._scan_task = asyncio.get_running_loop().create_task(self._scan_loop(), name="namesrv-scan")
        log.info("namesrv serving on %s (broker expiry %gs, scan every %gs)",
                 self.address, self.config.broker_expiry, self.config.scan_interval)

    async def close(self) -> None:
        if self.metrics is not None:
            self.metrics.close()
        if self._scan_task is not None:
            self._scan_task.cancel()
            await asyncio.gather(self._scan_task, return_exceptions=True)
        await self.server.close()

    async def _scan_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.scan_interval)
            for addr in self.routes.scan_not_active_brokers(time.monotonic(), self.config.broker_expiry):
                log.warning("broker %s expired: no registration for %gs", addr, self.config.broker_expiry)

    def _connection_closed(self, conn: RemotingConnection) -> None:
        for addr in self.routes.remove_brokers_of_connection(conn):
            log.info("broker %s removed: its connection %s closed", addr, conn.peer)

    # ------------------------------------------------------------------------------------ handlers

    async def _register_broker(self, conn: RemotingConnection, req: RemotingCommand) -> RemotingCommand:
        header = H.RegisterBrokerRequestHeader.from_command(req)
        if header.compressed:
            raise InvalidParameterError("compressed REGISTER_BROKER bodies are not supported; send JSON")
        body = decode_body(RegisterBrokerBody, req.body) if req.body else RegisterBrokerBody()
        result = self.routes.register_broker(
            cluster_name=header.cluster_name, broker_addr=header.broker_addr, broker_name=header.broker_name,
            broker_id=header.broker_id, ha_server_addr=header.ha_server_addr,
            topic_config_wrapper=body.topic_config_serialize_wrapper, filter_server_list=body.filter_server_list,
            now=time.monotonic(), conn_key=conn,
        )
        log.debug("broker %s (%s id %d) registered %d topics", header.broker_addr, header.broker_name,
                  header.broker_id, len(body.topic_config_serialize_wrapper.topic_config_table))
        reply = H.RegisterBrokerResponseHeader(ha_server_addr=result.ha_server_addr, master_addr=result.master_addr)
        return req.make_response(ext_fields=reply.to_ext())

    async def _unregister_broker(self, conn: RemotingConnection, req: RemotingCommand) -> RemotingCommand:
        header = H.UnRegisterBrokerRequestHeader.from_command(req)
        self.routes.unregister_broker(cluster_name=header.cluster_name, broker_addr=header.broker_addr,
                                      broker_name=header.broker_name, broker_id=header.broker_id)
        log.info("broker %s (%s id %d) unregistered", header.broker_addr, header.broker_name, header.broker_id)
        return req.make_response()

    async def _get_route(self, conn: RemotingConnection, req: RemotingCommand) -> RemotingCommand:
        topic = H.GetRouteInfoRequestHeader.from_command(req).topic
        route = self.routes.pick_topic_route_data(topic)
        if route is None:
            raise TopicNotExistError(f"No topic route info in name server for the topic: {topic}")
        return req.make_response(body=encode_body(route))

    async def _cluster_info(self, conn: RemotingConnection, req: RemotingCommand) -> RemotingCommand:
        return req.make_response(body=encode_body(self.routes.cluster_info()))

    async def _all_topics(self, conn: RemotingConnection, req: RemotingCommand) -> RemotingCommand:
        return req.make_response(body=encode_body(self.routes.all_topics()))

    async def _delete_topic(self, conn: RemotingConnection, req: RemotingCommand) -> RemotingCommand:
        topic = H.DeleteTopicRequestHeader.from_command(req).topic
        self.routes.delete_topic(topic)
        return req.make_response()

    async def _wipe_write_perm(self, conn: RemotingConnection, req: RemotingCommand) -> RemotingCommand:
        name = H.WipeWritePermOfBrokerRequestHeader.from_command(req).broker_name
        count = self.routes.change_write_perm(name, writable=False)
        log.info("write permission of broker %s wiped on %d topic(s), asked by %s", name, count, conn.peer)
        return req.make_response(ext_fields={"wipeTopicCount": count})

    async def _add_write_perm(self, conn: RemotingConnection, req: RemotingCommand) -> RemotingCommand:
        name = H.WipeWritePermOfBrokerRequestHeader.from_command(req).broker_name
        count = self.routes.change_write_perm(name, writable=True)
        log.info("write permission of broker %s given back on %d topic(s), asked by %s", name, count, conn.peer)
        return req.make_response(ext_fields={"addTopicCount": count})

    async def _put_kv(self, conn: RemotingConnection, req: RemotingCommand) -> RemotingCommand:
        h = H.PutKVConfigRequestHeader.from_command(req)
        try:
            self._check_kv(h.namespace, h.key, h.value)
        except InvalidParameterError as exc:
            log.warning("PUT_KV_CONFIG from %s refused: %s", conn.peer, exc)
            raise
        self.routes.put_kv(h.namespace, h.key, h.value)
        return req.make_response()

    def _check_kv(self, namespace: str, key: str, value: str) -> None:
        """Refuse a put over a KV cap (the module docstring), naming the cap."""
        c = self.config
        for what, text, cap, name in (("namespace", namespace, c.kv_max_key_bytes, "kv_max_key_bytes"),
                                      ("key", key, c.kv_max_key_bytes, "kv_max_key_bytes"),
                                      ("value", value, c.kv_max_value_bytes, "kv_max_value_bytes")):
            size = len(text.encode("utf-8", "surrogatepass"))
            if size > cap:
                raise InvalidParameterError(f"KV config {what} of {size} bytes exceeds the namesrv's limit of "
                                            f"{cap} bytes ({name}); nothing stored")
        if self.routes.get_kv(namespace, key) is None:
            count = sum(len(table) for table in self.routes.kv_config.values())
            if count >= c.kv_max_entries:
                raise InvalidParameterError(f"KV config is full: {count} entries is the namesrv's limit "
                                            f"(kv_max_entries); Namespace: {namespace} Key: {key} not stored")

    async def _get_kv(self, conn: RemotingConnection, req: RemotingCommand) -> RemotingCommand:
        h = H.GetKVConfigRequestHeader.from_command(req)
        value = self.routes.get_kv(h.namespace, h.key)
        if value is None:
            return req.make_response(ResponseCode.QUERY_NOT_FOUND,
                                     f"No config item, Namespace: {h.namespace} Key: {h.key}")
        return req.make_response(ext_fields=H.GetKVConfigResponseHeader(value=value).to_ext())

    async def _delete_kv(self, conn: RemotingConnection, req: RemotingCommand) -> RemotingCommand:
        h = H.GetKVConfigRequestHeader.from_command(req)  # DeleteKVConfigRequestHeader: the same two fields
        self.routes.delete_kv(h.namespace, h.key)
        return req.make_response()

    async def _query_data_version(self, conn: RemotingConnection, req: RemotingCommand) -> RemotingCommand:
        h = H.QueryDataVersionRequestHeader.from_command(req)
        version = decode_body(DataVersion, req.body)
        changed = self.routes.is_topic_config_changed(h.broker_addr, version)
        if not changed:
            self.routes.touch(h.broker_addr, time.monotonic())
        held = self.routes.data_version_of(h.broker_addr)
        return req.make_response(ext_fields=H.QueryDataVersionResponseHeader(changed=changed).to_ext(),
                                 body=encode_body(held) if held is not None else b"")


async def run_namesrv(config: NamesrvConfig, *, ready: asyncio.Event | None = None) -> None:
    """Serve until SIGTERM or SIGINT, then close connections and return."""
    server = NamesrvServer(config)
    await server.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    if ready is not None:
        ready.set()
    try:
        await stop.wait()
        log.info("namesrv stopping")
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
        await server.close()
