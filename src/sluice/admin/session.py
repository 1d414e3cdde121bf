"""AdminSession: one client instance for the duration of one admin command, and the requests commands share.

The session never registers a consumer group: pulls carry their subscription
inline and offsets are written with UPDATE_CONSUMER_OFFSET, so running an admin
command against a live group does not make its consumers rebalance onto the
admin tool. A producer is started only by commands that send.
"""
from __future__ import annotations

import asyncio
import itertools
import os
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

from sluice.client.broker_api import decode_messages
from sluice.acl.signature import Credentials
from sluice.client.instance import ClientConfig, ClientInstance
from sluice.client.producer import AsyncProducer
from sluice.client.pull_consumer import process_pull_response
from sluice.protocol.headers import FLAG_SUBSCRIPTION
from sluice.client.results import MessageQueue, PullResult
from sluice.client.routing import subscribe_queues
from sluice.client.selector import MessageSelector
from sluice.errors import NotFoundError, SluiceError
from sluice.protocol import headers as H
from sluice.protocol.bodies import MASTER_ID, ClusterInfo, TopicRouteData
from sluice.protocol.codes import RequestCode
from sluice.protocol.command import RemotingCommand
from sluice.transport.tls import ClientTls

__all__ = ["ADMIN_PRODUCER_GROUP", "TOOLS_CONSUMER_GROUP", "AdminSession", "BrokerRef", "Settled", "settle"]

T = TypeVar("T")

#: MixAll.TOOLS_CONSUMER_GROUP: the group mqadmin pulls as when none is given.
TOOLS_CONSUMER_GROUP = "TOOLS_CONSUMER"
#: The producer group of sendMessage and the dead-letter resend.
ADMIN_PRODUCER_GROUP = "SLUICE_ADMIN_PRODUCER"
_ids = itertools.count()


@dataclass(frozen=True, slots=True)
class BrokerRef:
    cluster: str
    name: str
    broker_id: int
    addr: str


def _tls_options(tls: ClientTls | None) -> dict[str, Any]:
    """ClientConfig's TLS keywords for ``tls``."""
    if tls is None:
        return {}
    return {"tls": True, "tls_ca": tls.ca, "tls_server_name": tls.server_name, "tls_verify": tls.verify,
            "tls_cert": tls.cert, "tls_key": tls.key}


class AdminSession:
    """``async with AdminSession("127.0.0.1:9876", timeout=3.0) as s: await s.cluster_info()``."""

    def __init__(self, namesrv: str, *, timeout: float = 3.0, credentials: Credentials | None = None,
                 tls: ClientTls | None = None) -> None:
        self.namesrv_addr = namesrv
        self.timeout = timeout
        self.credentials = credentials  #: an ACL account: every request is signed with it
        self.tls = tls  #: connect over TLS, checking certificates as it says
        self._instance: ClientInstance | None = None
        self._producer: AsyncProducer | None = None

    async def __aenter__(self) -> AdminSession:
        # A name of its own, so an admin call made inside a process that also runs clients never shares them.
        cfg = ClientConfig(request_timeout=self.timeout, instance_name=f"sluice-admin-{os.getpid()}-{next(_ids)}",
                           credentials=self.credentials, **_tls_options(self.tls))
        self._instance = await ClientInstance.acquire(self.namesrv_addr, cfg)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._producer is not None:
            producer, self._producer = self._producer, None
            await producer.shutdown()
        if self._instance is not None:
            inst, self._instance = self._instance, None
            await inst.release()

    @property
    def instance(self) -> ClientInstance:
        assert self._instance is not None, "AdminSession used outside 'async with'"
        return self._instance

    # ------------------------------------------------------------------------------ raw requests

    async def invoke(self, addr: str, code: int, header: H.Header | dict[str, Any] | None = None,
                     body: bytes = b"") -> RemotingCommand:
        """The SUCCESS response of ``addr``; an error response raises its SluiceError class."""
        ext = header.to_ext() if isinstance(header, H.Header) else (header or {})
        request = RemotingCommand.request(code, ext, body)
        return (await self.instance.remoting.invoke(addr, request, self.timeout)).raise_for_code()

    async def gather_per_broker(self, brokers: Iterable[BrokerRef],
                                fn: Callable[[BrokerRef], Awaitable[T]]) -> list[tuple[BrokerRef, T | SluiceError]]:
        """``fn`` on every broker concurrently; each broker's result or the SluiceError it failed with."""
        async def one(b: BrokerRef) -> tuple[BrokerRef, T | SluiceError]:
            try:
                return b, await fn(b)
            except SluiceError as exc:
                return b, exc
        return list(await asyncio.gather(*(one(b) for b in brokers)))

    # ------------------------------------------------------------------------------ namesrv

    async def cluster_info(self) -> ClusterInfo:
        return await self.instance.namesrv.get_cluster_info()

    async def brokers(self, cluster: str | None = None, *, masters_only: bool = True) -> list[BrokerRef]:
        """Brokers registered with the namesrv (of one cluster), sorted by name and id."""
        info = await self.cluster_info()
        if cluster is not None and cluster not in info.cluster_addr_table:
            known = ", ".join(sorted(info.cluster_addr_table)) or "none"
            raise NotFoundError(f"cluster {cluster!r} is not registered with the namesrv (known: {known})")
        out = []
        for name, bd in sorted(info.broker_addr_table.items()):
            if cluster is not None and bd.cluster != cluster:
                continue
            for bid, addr in sorted(bd.broker_addrs.items()):
                if masters_only and bid != MASTER_ID:
                    continue
                out.append(BrokerRef(bd.cluster, name, bid, addr))
        if not out:
            raise NotFoundError("no broker is registered with the namesrv"
                                + (f" in cluster {cluster!r}" if cluster else ""))
        return out

    async def broker_by_addr(self, addr: str) -> BrokerRef:
        """The registered broker at ``addr`` (or an unnamed one: a broker not registered is still asked)."""
        try:
            for b in await self.brokers(masters_only=False):
                if b.addr == addr:
                    return b
        except NotFoundError:
            pass
        return BrokerRef("", "", MASTER_ID, addr)

    async def route(self, topic: str) -> TopicRouteData:
        """The topic's route from the namesrv; TopicNotExistError when no broker registered it."""
        return await self.instance.topic_route(topic, refresh=True)

    async def read_queues(self, topic: str) -> list[MessageQueue]:
        return subscribe_queues(topic, await self.route(topic))

    async def master_addr(self, topic: str, broker_name: str) -> str:
        return await self.instance.broker_addr_for(topic, broker_name, master_only=False)

    # ------------------------------------------------------------------------------ messages

    async def pull(self, mq: MessageQueue, selector: MessageSelector, offset: int, max_nums: int, *,
                   group: str = TOOLS_CONSUMER_GROUP) -> PullResult:
        """One non-blocking pull with the subscription inline (no heartbeat, no group membership)."""
        header = H.PullMessageRequestHeader(
            consumer_group=group, topic=mq.topic, queue_id=mq.queue_id, queue_offset=offset, max_msg_nums=max_nums,
            sys_flag=FLAG_SUBSCRIPTION, commit_offset=0, suspend_timeout_millis=0, subscription=selector.expression,
            sub_version=0, expression_type=selector.expression_type)
        request = RemotingCommand.request(RequestCode.PULL_MESSAGE, header.to_ext())
        response = await self.instance.remoting.invoke(await self.master_addr(mq.topic, mq.broker_name), request,
                                                       self.timeout)
        return process_pull_response(response, selector)

    async def view_message(self, addr: str, commitlog_offset: int) -> bytes:
        return await self.instance.api.view_message(addr, commitlog_offset, self.timeout)

    async def query_by_key(self, topic: str, key: str, max_num: int, begin: int, end: int, *,
                           unique_key: bool) -> list[Any]:
        """Stored messages the key index finds on every broker of ``topic``, checked exactly (the index
        matches hashes) and deduplicated by store host and commit-log offset; newest first."""
        route = await self.route(topic)
        header = H.QueryMessageRequestHeader(topic=topic, key=key, max_num=max_num, begin_timestamp=begin,
                                             end_timestamp=end)
        addrs = sorted({a for a in (bd.select_broker_addr() for bd in route.broker_datas) if a})
        bodies = await asyncio.gather(*(self.instance.api.query_message(a, header, unique_key=unique_key,
                                                                        timeout=self.timeout) for a in addrs))
        seen: set[str] = set()
        out = []
        for body in bodies:
            for m in decode_messages(body):
                hit = (m.msg_id == key) if unique_key else (key in m.keys)
                if hit and m.topic == topic and m.offset_msg_id not in seen:
                    seen.add(m.offset_msg_id)
                    out.append(m)
        out.sort(key=lambda m: m.store_timestamp, reverse=True)
        return out

    # ------------------------------------------------------------------------------ offsets

    async def committed_offset(self, addr: str, group: str, mq: MessageQueue) -> int:
        return await self.instance.api.query_consumer_offset(addr, group, mq, self.timeout)

    async def commit_offset(self, addr: str, group: str, mq: MessageQueue, offset: int) -> None:
        await self.instance.api.update_consumer_offset(addr, group, mq, offset, self.timeout)

    async def min_offset(self, addr: str, mq: MessageQueue) -> int:
        return await self.instance.api.min_offset(addr, mq, self.timeout)

    async def max_offset(self, addr: str, mq: MessageQueue) -> int:
        return await self.instance.api.max_offset(addr, mq, self.timeout)

    async def search_offset(self, addr: str, mq: MessageQueue, timestamp_ms: int) -> int:
        return await self.instance.api.search_offset(addr, mq, timestamp_ms, self.timeout)

    # ------------------------------------------------------------------------------ sending

    async def producer(self) -> AsyncProducer:
        """The session's producer, started on first use (it only heartbeats as a producer group)."""
        if self._producer is None:
            p = AsyncProducer(ADMIN_PRODUCER_GROUP, self.namesrv_addr, send_timeout=max(self.timeout, 3.0),
                              request_timeout=self.timeout, instance_name=self.instance.config.instance_name,
                              credentials=self.credentials, **_tls_options(self.tls))
            await p.start()
            self._producer = p
        return self._producer



@dataclass(slots=True)
class Settled:
    """Per-broker outcomes split into successes and failures, with one warning line per failure."""

    ok: list[tuple[BrokerRef, Any]]
    failed: list[tuple[BrokerRef, SluiceError]]

    @property
    def warnings(self) -> list[str]:
        return [f"broker {b.name or '?'} ({b.addr}): {e}" for b, e in self.failed]


def settle(outcomes: list[tuple[BrokerRef, Any]], what: str) -> Settled:
    """All failed raises the first error (its exit status is the command's); otherwise the split."""
    ok = [(b, r) for b, r in outcomes if not isinstance(r, SluiceError)]
    failed = [(b, r) for b, r in outcomes if isinstance(r, SluiceError)]
    if failed and not ok:
        exc = failed[0][1]
        if len(failed) > 1:
            exc.add_note(f"sluice: {what} failed on all {len(failed)} brokers: "
                         + "; ".join(f"{b.name or b.addr}: {e}" for b, e in failed[1:]))
        raise exc
    return Settled(ok, failed)
