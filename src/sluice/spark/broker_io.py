"""The broker calls ``format("sluice")`` makes: routes, queue offsets and pulls, with no consumer group.

RocketMQ's pull path needs no registered group: a pull carries its
subscription inline (the SUBSCRIPTION sysflag, PullSysFlag) and commits
nothing unless asked (commitOffset flag). The SDK's PullConsumer heartbeats its
group, and a heartbeat makes the broker create the group's ``%RETRY%`` topic and
record its subscription (ClientManageProcessor.heartBeat), which the admin's
consumerProgress then lists. So the source talks to a ClientInstance with no
group registered in it: nothing is announced, nothing is left behind.

One ``BrokerSession`` per planning call or task, on a loop thread of its own;
never stored on an object Spark pickles.
"""
from __future__ import annotations

import re
import time
from collections.abc import Mapping
from types import TracebackType
from typing import Any, Self

from sluice.client.broker_api import decode_messages
from sluice.client.instance import ClientConfig, ClientInstance
from sluice.client.pull_consumer import process_pull_response
from sluice.protocol.headers import FLAG_SUBSCRIPTION
from sluice.client.results import MessageQueue, PullResult
from sluice.client.routing import subscribe_queues
from sluice.client.selector import MessageSelector
from sluice.errors import InvalidParameterError, TopicNotExistError
from sluice.message import MessageExt
from sluice.protocol import headers as H
from sluice.protocol.codes import RequestCode
from sluice.protocol.command import RemotingCommand
from sluice.transport.blocking import LoopThread

__all__ = ["BrokerSession"]

_REQUEST_TIMEOUT = 10.0
_PULL_TIMEOUT = 30.0
#: Names the namesrv lists that are never data topics (RocketMQ's system and per-group topics).
_SYSTEM = re.compile(r"^(%RETRY%|%DLQ%|RMQ_SYS_|SCHEDULE_TOPIC_|TBW102$|BenchmarkTest$|OFFSET_MOVED_EVENT$|"
                     r"SELF_TEST_TOPIC$|TRANS_CHECK_MAX_TIME_TOPIC$|[^%]+_REPLY_TOPIC$|DefaultCluster$)")


class BrokerSession:
    """``with BrokerSession(namesrv, credentials) as b: b.queues("Orders")``: blocking calls on a private loop.
    ``tls``: ClientConfig's TLS keywords (options.tls_options; {} or None: plain TCP)."""

    def __init__(self, namesrv: str, credentials: Any = None, tls: Mapping[str, Any] | None = None) -> None:
        self._namesrv = namesrv
        self._config = ClientConfig(credentials=credentials, instance_name=f"spark-{id(self):x}", **(tls or {}))
        self._thread: LoopThread | None = None
        self._inst: ClientInstance | None = None

    def __enter__(self) -> Self:
        self._thread = LoopThread("sluice-spark-io")
        try:
            self._inst = self._thread.run(ClientInstance.acquire(self._namesrv, self._config), _REQUEST_TIMEOUT)
        except BaseException:
            self._thread.stop()
            raise
        return self

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        assert self._thread is not None and self._inst is not None
        try:
            self._thread.run(self._inst.release(), _REQUEST_TIMEOUT)
        finally:
            self._thread.stop()

    def _run(self, coro: Any, timeout: float = _REQUEST_TIMEOUT + 5) -> Any:
        assert self._thread is not None
        return self._thread.run(coro, timeout)

    @property
    def _instance(self) -> ClientInstance:
        assert self._inst is not None, "BrokerSession used outside its with block"
        return self._inst

    # ------------------------------------------------------------------------------ topics and queues

    def topics_matching(self, pattern: str) -> list[str]:
        """The namesrv's data topics whose whole name matches ``pattern`` (as Kafka's subscribePattern)."""
        rx = re.compile(pattern)
        names = self._run(self._instance.namesrv.get_all_topics())
        return sorted(t for t in names if not _SYSTEM.match(t) and rx.fullmatch(t))

    def queues(self, topic: str) -> list[MessageQueue]:
        """The topic's readable queues, sorted; an unknown topic is an error naming it."""
        try:
            route = self._run(self._instance.topic_route(topic, refresh=True))
        except TopicNotExistError:
            raise TopicNotExistError(f"topic {topic!r} does not exist (no route on namesrv {self._namesrv})") \
                from None
        queues = subscribe_queues(topic, route)
        if not queues:
            raise TopicNotExistError(f"topic {topic!r} has no readable queue")
        return queues

    async def _addr(self, mq: MessageQueue) -> str:
        return await self._instance.broker_addr_for(mq.topic, mq.broker_name, master_only=False)

    def bounds(self, mq: MessageQueue) -> tuple[int, int]:
        """(min offset, max offset): the queue holds [min, max)."""
        async def both() -> tuple[int, int]:
            addr = await self._addr(mq)
            api = self._instance.api
            return (await api.min_offset(addr, mq, _REQUEST_TIMEOUT), await api.max_offset(addr, mq, _REQUEST_TIMEOUT))
        return self._run(both())

    def search_offset(self, mq: MessageQueue, timestamp_ms: int) -> int:
        async def search() -> int:
            return await self._instance.api.search_offset(await self._addr(mq), mq, int(timestamp_ms),
                                                          _REQUEST_TIMEOUT)
        return self._run(search())

    # ------------------------------------------------------------------------------ pulls

    def pull(self, mq: MessageQueue, selector: MessageSelector, offset: int, max_nums: int, group: str) -> PullResult:
        """One pull that answers at once, with the subscription inline and no offset committed."""
        if offset < 0 or max_nums <= 0:
            raise InvalidParameterError(f"pull of {mq} at {offset} for {max_nums} messages")

        async def pull() -> PullResult:
            header = H.PullMessageRequestHeader(
                consumer_group=group, topic=mq.topic, queue_id=mq.queue_id, queue_offset=offset,
                max_msg_nums=max_nums, sys_flag=FLAG_SUBSCRIPTION, commit_offset=0, suspend_timeout_millis=0,
                subscription=selector.expression, sub_version=0, expression_type=selector.expression_type)
            request = RemotingCommand.request(RequestCode.PULL_MESSAGE, header.to_ext())
            response = await self._instance.remoting.invoke(await self._addr(mq), request, _PULL_TIMEOUT)
            return process_pull_response(response, selector)
        return self._run(pull(), _PULL_TIMEOUT + 5)

    # ------------------------------------------------------------------------------ lookups

    def find_by_id(self, topic: str, msg_id: str) -> MessageExt | None:
        """The stored message of ``topic`` whose UNIQ_KEY is ``msg_id`` (the brokers' key index), or None."""
        async def find() -> MessageExt | None:
            route = await self._instance.topic_route(topic, refresh=True)
            header = H.QueryMessageRequestHeader(topic=topic, key=msg_id, max_num=32, begin_timestamp=0,
                                                 end_timestamp=int(time.time() * 1000) + 60_000)
            for addr in sorted({a for a in (bd.select_broker_addr() for bd in route.broker_datas) if a}):
                body = await self._instance.api.query_message(addr, header, unique_key=True,
                                                              timeout=_REQUEST_TIMEOUT)
                for m in decode_messages(body):
                    if m.msg_id == msg_id and m.topic == topic:
                        return m
            return None
        return self._run(find())
