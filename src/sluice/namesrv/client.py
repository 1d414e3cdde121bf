"""Talking to namesrvs: route queries for clients, (un)registration for brokers, admin calls.

``NamesrvClient`` is async and works over a shared RemotingClient;
``SyncNamesrvClient`` is the same calls, blocking, over a LoopThread.
Queries go to one namesrv and fail over to the next; registration goes to
every namesrv (each keeps its own table) and reports each one's outcome.
"""
from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Coroutine, Iterable, Sequence
from typing import Any

from sluice.errors import RemotingError, RequestCodeNotSupportedError, SluiceError
from sluice.protocol import headers as H
from sluice.protocol.bodies import (
    ClusterInfo, DataVersion, RegisterBrokerBody, TopicConfig, TopicConfigSerializeWrapper, TopicList,
    TopicRouteData, decode_body, encode_body,
)
from sluice.transport.client import DEFAULT_TIMEOUT, RemotingClient
from sluice.transport.tls import ClientTls
from sluice.protocol.codes import RequestCode, ResponseCode
from sluice.protocol.command import RemotingCommand
from sluice.transport.blocking import LoopBoundClient, LoopThread

__all__ = ["NamesrvClient", "RegisterOutcome", "SyncNamesrvClient", "not_a_namesrv", "parse_namesrv_addrs"]

log = logging.getLogger(__name__)


def parse_namesrv_addrs(addrs: str | Iterable[str]) -> list[str]:
    """``"h1:9876;h2:9876"`` (RocketMQ's namesrvAddr form) or a list, to a list."""
    items = addrs.split(";") if isinstance(addrs, str) else list(addrs)
    out = [a.strip() for a in items if a and a.strip()]
    if not out:
        raise RemotingError("no namesrv address given")
    return out


@dataclasses.dataclass(frozen=True, slots=True)
class RegisterOutcome:
    """What one namesrv said to a registration: a header, or the error it failed with."""

    namesrv: str
    header: H.RegisterBrokerResponseHeader | None = None
    error: SluiceError | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


def not_a_namesrv(addr: str, code: int, remark: str | None) -> RequestCodeNotSupportedError:
    """A server that does not know a namesrv request is most likely not a namesrv (a broker's address given as
    the namesrv's is the usual slip); the bare 'request code 105 not supported' does not say so."""
    name = RequestCode(code).name if code in RequestCode._value2member_map_ else str(code)
    return RequestCodeNotSupportedError(
        f"{addr} does not serve {name} ({code}): is it a namesrv? (a broker's address given as the namesrv's "
        f"is the usual cause; it answered: {remark or 'request code not supported'})")


class NamesrvClient:
    def __init__(self, addrs: str | Iterable[str], remoting: RemotingClient | None = None,
                 timeout: float = DEFAULT_TIMEOUT, *, tls: ClientTls | None = None) -> None:
        """``tls``: connect over TLS (only when this client makes its own ``remoting``; a given one has its own)."""
        self.addrs = parse_namesrv_addrs(addrs)
        self.remoting = remoting or RemotingClient(tls=tls)
        self._owns_remoting = remoting is None
        self.timeout = timeout
        self._next = 0

    async def close(self) -> None:
        if self._owns_remoting:
            await self.remoting.close()

    async def _query(self, request: RemotingCommand) -> RemotingCommand:
        """Ask namesrvs in turn until one answers; error codes are raised (they are answers too)."""
        last: Exception | None = None
        for i in range(len(self.addrs)):
            addr = self.addrs[(self._next + i) % len(self.addrs)]
            try:
                response = await self.remoting.invoke(addr, request, self.timeout)
            except RemotingError as exc:
                log.debug("namesrv %s failed: %s", addr, exc)
                last = exc
                continue
            self._next = (self._next + i) % len(self.addrs)
            if response.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED:
                raise not_a_namesrv(addr, request.code, response.remark)
            return response.raise_for_code()
        raise RemotingError(f"no namesrv answered (tried {', '.join(self.addrs)}): {last}")

    async def get_route(self, topic: str) -> TopicRouteData:
        """The topic's route; TopicNotExistError if no namesrv knows it."""
        req = RemotingCommand.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, H.GetRouteInfoRequestHeader(topic=topic).to_ext())
        return decode_body(TopicRouteData, (await self._query(req)).body)

    async def get_cluster_info(self) -> ClusterInfo:
        resp = await self._query(RemotingCommand.request(RequestCode.GET_BROKER_CLUSTER_INFO))
        return decode_body(ClusterInfo, resp.body)

    async def get_all_topics(self) -> list[str]:
        resp = await self._query(RemotingCommand.request(RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER))
        return decode_body(TopicList, resp.body).topic_list

    async def get_kv(self, namespace: str, key: str) -> str | None:
        req = RemotingCommand.request(RequestCode.GET_KV_CONFIG,
                                      H.GetKVConfigRequestHeader(namespace=namespace, key=key).to_ext())
        try:
            resp = await self._query(req)
        except SluiceError as exc:
            if exc.code == ResponseCode.QUERY_NOT_FOUND:
                return None
            raise
        return H.GetKVConfigResponseHeader.from_command(resp).value

    # ------------------------------------------------------------------ calls that go to every namesrv

    async def _broadcast(self, request: RemotingCommand) -> list[tuple[str, RemotingCommand | SluiceError]]:
        async def one(addr: str) -> tuple[str, RemotingCommand | SluiceError]:
            try:
                response = await self.remoting.invoke(addr, request, self.timeout)
                if response.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED:
                    raise not_a_namesrv(addr, request.code, response.remark)
                return addr, response.raise_for_code()
            except SluiceError as exc:
                return addr, exc

        # Concurrently: one dead namesrv must not delay the others by a whole timeout.
        return list(await asyncio.gather(*(one(a) for a in self.addrs)))

    async def register_broker(
        self, *, cluster_name: str, broker_name: str, broker_addr: str, broker_id: int = 0,
        ha_server_addr: str = "", topics: Iterable[TopicConfig] | dict[str, TopicConfig] = (),
        data_version: DataVersion | None = None, filter_servers: Sequence[str] = (),
    ) -> list[RegisterOutcome]:
        """Register with every namesrv; never raises for one namesrv's failure (see each outcome)."""
        table = dict(topics) if isinstance(topics, dict) else {t.topic_name: t for t in topics}
        body = RegisterBrokerBody(
            topic_config_serialize_wrapper=TopicConfigSerializeWrapper(
                topic_config_table=table, data_version=data_version or DataVersion()),
            filter_server_list=list(filter_servers),
        )
        header = H.RegisterBrokerRequestHeader(broker_name=broker_name, broker_addr=broker_addr,
                                               cluster_name=cluster_name, ha_server_addr=ha_server_addr,
                                               broker_id=broker_id)
        req = RemotingCommand.request(RequestCode.REGISTER_BROKER, header.to_ext(), encode_body(body))
        outcomes = []
        for addr, result in await self._broadcast(req):
            if isinstance(result, SluiceError):
                outcomes.append(RegisterOutcome(addr, error=result))
            else:
                outcomes.append(RegisterOutcome(addr, header=H.RegisterBrokerResponseHeader.from_command(result)))
        return outcomes

    async def unregister_broker(self, *, cluster_name: str, broker_name: str, broker_addr: str,
                                broker_id: int = 0) -> list[RegisterOutcome]:
        header = H.UnRegisterBrokerRequestHeader(broker_name=broker_name, broker_addr=broker_addr,
                                                 cluster_name=cluster_name, broker_id=broker_id)
        req = RemotingCommand.request(RequestCode.UNREGISTER_BROKER, header.to_ext())
        return [RegisterOutcome(addr, error=r if isinstance(r, SluiceError) else None)
                for addr, r in await self._broadcast(req)]

    async def delete_topic(self, topic: str) -> None:
        req = RemotingCommand.request(RequestCode.DELETE_TOPIC_IN_NAMESRV, H.DeleteTopicRequestHeader(topic=topic).to_ext())
        for addr, result in await self._broadcast(req):
            if isinstance(result, SluiceError):
                raise result

    async def change_write_perm(self, broker_name: str, *, writable: bool) -> list[tuple[str, int | SluiceError]]:
        """WIPE_WRITE_PERM_OF_BROKER (or ADD_WRITE_PERM_OF_BROKER with ``writable``) on every namesrv: each one's
        count of topics changed, or its error."""
        code = RequestCode.ADD_WRITE_PERM_OF_BROKER if writable else RequestCode.WIPE_WRITE_PERM_OF_BROKER
        field = "addTopicCount" if writable else "wipeTopicCount"
        req = RemotingCommand.request(code, H.WipeWritePermOfBrokerRequestHeader(broker_name=broker_name).to_ext())
        return [(addr, r if isinstance(r, SluiceError) else int(r.ext_fields.get(field, 0)))
                for addr, r in await self._broadcast(req)]

    async def put_kv(self, namespace: str, key: str, value: str) -> None:
        req = RemotingCommand.request(RequestCode.PUT_KV_CONFIG,
                                      H.PutKVConfigRequestHeader(namespace=namespace, key=key, value=value).to_ext())
        for addr, result in await self._broadcast(req):
            if isinstance(result, SluiceError):
                raise result


    async def delete_kv(self, namespace: str, key: str) -> None:
        req = RemotingCommand.request(RequestCode.DELETE_KV_CONFIG,
                                      H.GetKVConfigRequestHeader(namespace=namespace, key=key).to_ext())
        for addr, result in await self._broadcast(req):
            if isinstance(result, SluiceError):
                raise result


class SyncNamesrvClient(LoopBoundClient):
    """Blocking NamesrvClient: the same methods, run on a LoopThread."""

    def __init__(self, addrs: str | Iterable[str], *, loop_thread: LoopThread | None = None,
                 timeout: float = DEFAULT_TIMEOUT, tls: ClientTls | None = None) -> None:
        super().__init__(loop_thread, "sluice-namesrv-client")
        self._client = NamesrvClient(addrs, timeout=timeout, tls=tls)
        self._bound = timeout * len(self._client.addrs) + self._client.remoting.connect_timeout * 2 + 5.0

    def _run(self, name: str, *args: Any, **kwargs: Any) -> Any:
        return self.loop_thread.run(getattr(self._client, name)(*args, **kwargs), self._bound)

    def get_route(self, topic: str) -> TopicRouteData:
        return self._run("get_route", topic)

    def get_cluster_info(self) -> ClusterInfo:
        return self._run("get_cluster_info")

    def get_all_topics(self) -> list[str]:
        return self._run("get_all_topics")

    def get_kv(self, namespace: str, key: str) -> str | None:
        return self._run("get_kv", namespace, key)

    def put_kv(self, namespace: str, key: str, value: str) -> None:
        self._run("put_kv", namespace, key, value)

    def delete_kv(self, namespace: str, key: str) -> None:
        self._run("delete_kv", namespace, key)

    def register_broker(self, **kwargs: Any) -> list[RegisterOutcome]:
        return self._run("register_broker", **kwargs)

    def unregister_broker(self, **kwargs: Any) -> list[RegisterOutcome]:
        return self._run("unregister_broker", **kwargs)

    def delete_topic(self, topic: str) -> None:
        self._run("delete_topic", topic)

    def _close_async(self) -> Coroutine[Any, Any, None]:
        return self._client.close()
