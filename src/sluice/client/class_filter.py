"""Class-filter mode on the client: registering filter classes with filter servers, pulling through them.

A consumer subscribed with ``MessageSelector.by_class("module:ClassName", source)``
never pulls that topic from a broker. For each queue it pulls from one filter
server of the queue's broker, chosen at random among those the route's
``filterServerTable`` lists for the broker's address
(PullAPIWrapper.computPullFromWhichFilterServer), with the class-filter pull
flag (0x8) set. Before the first pull to a filter server, on every heartbeat
round and whenever a route's filter servers change, the class is registered
with every filter server of the topic's brokers (REGISTER_MESSAGE_FILTER_CLASS,
302: MQClientInstance.uploadFilterClassToAllFilterServer and
MQClientAPIImpl.registerMessageFilterClass, client/src/main/java/org/apache/rocketmq/client/impl/).

Unlike RocketMQ, a broker without a filter server is an error the consumer
sees (FilterClassError), never a fallback to the broker: the broker cannot run
the class, so it would deliver unfiltered messages. Every class error (refused
registration, a class that fails on a batch) is kept per group and topic as
the consumer's last class-filter error: logged at WARNING, carried by the
group's heartbeats (``SubscriptionData.filterClassError``, a Sluice field) so
``sluice admin consumerProgress`` shows it, and raised to a pull consumer.
"""
from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from sluice.client.results import MessageQueue
from sluice.client.selector import MessageSelector
from sluice.errors import (
    FilterClassConflictError, FilterClassError, FilterClassFailedError, FilterClassImportError,
    FilterClassNotFoundError, FilterClassUploadRefusedError, RemotingError, SluiceError,
)
from sluice.protocol.bodies import TopicRouteData
from sluice.protocol.codes import RequestCode, ResponseCode
from sluice.protocol.command import RemotingCommand

if TYPE_CHECKING:
    from sluice.client.instance import ClientInstance

__all__ = ["FLAG_CLASS_FILTER", "ClassFilterState", "ClassFilters", "class_error", "filter_servers_of",
           "register_filter_class_request"]

log = logging.getLogger(__name__)

#: PullSysFlag.FLAG_CLASS_FILTER (common/src/main/java/org/apache/rocketmq/common/sysflag/PullSysFlag.java).
from sluice.protocol.headers import FLAG_CLASS_FILTER  # noqa: E402

#: Answers that are an ordinary pull status (the filter server answers exactly as a broker does).
PULL_CODES = frozenset({ResponseCode.SUCCESS, ResponseCode.PULL_NOT_FOUND, ResponseCode.PULL_RETRY_IMMEDIATELY,
                        ResponseCode.PULL_OFFSET_MOVED})

#: How often the routes' filter-server tables are compared with what the classes were registered for
#: (a local look, no request: the route refresh fetches them).
ROUTE_CHECK_INTERVAL_S = 1.0

#: Heartbeats sent early because a class error appeared are at most this often (the error reaches
#: consumerProgress without waiting for the 30 s round, and a failing batch loop cannot flood the brokers).
ERROR_HEARTBEAT_MIN_INTERVAL_S = 5.0


def filter_servers_of(route: TopicRouteData | None, broker_addr: str) -> list[str]:
    """The filter servers the route lists for this broker address (filterServerTable is keyed by address)."""
    if route is None:
        return []
    return list(route.filter_server_table.get(broker_addr) or ())


def register_filter_class_request(group: str, topic: str, selector: MessageSelector) -> RemotingCommand:
    """REGISTER_MESSAGE_FILTER_CLASS (302): header consumerGroup, topic, className, classCRC; body the source."""
    ext = {"consumerGroup": group, "topic": topic, "className": selector.expression,
           "classCRC": str(selector.class_crc)}
    return RemotingCommand.request(RequestCode.REGISTER_MESSAGE_FILTER_CLASS, ext, body=selector.class_source)


#: A filter server's error answers, as the sluice.errors class a user can catch (sluice/filtersrv/).
_ERRORS_BY_CODE: dict[int, type[FilterClassError]] = {
    ResponseCode.NO_PERMISSION: FilterClassUploadRefusedError,
    ResponseCode.FILTER_DATA_NOT_EXIST: FilterClassNotFoundError,
    ResponseCode.SUBSCRIPTION_PARSE_FAILED: FilterClassImportError,
    ResponseCode.SUBSCRIPTION_NOT_LATEST: FilterClassConflictError,
    ResponseCode.SYSTEM_ERROR: FilterClassFailedError,
}


def class_error(class_name: str, cause: str, *, code: int | None = None, where: str = "") -> FilterClassError:
    """The error a user sees: the class, what went wrong, and where; a filter server's answer ``code`` picks
    the FilterClassError subclass (FilterClassFailedError for a class failing on a batch, ...)."""
    at = f" ({where})" if where else ""
    # A filter server's remark names the class already; the SDK's own causes do not.
    text = cause if repr(class_name) in cause or class_name in cause.split() else f"filter class {class_name!r}: {cause}"
    cls = _ERRORS_BY_CODE.get(code, FilterClassError) if code is not None else FilterClassError
    return cls(f"{text}{at}", class_name=class_name, cause=cause, code=code)


class ClassFilterConsumer(Protocol):
    """What the service needs from a consumer with class-filter subscriptions."""

    group: str

    def class_filters(self) -> dict[str, MessageSelector]: ...


@dataclass(slots=True)
class ClassFilterState:
    """One group's last class-filter error on one topic (None once a pull through a filter server works)."""

    error: FilterClassError | None = None
    error_time_ms: int = 0


class ClassFilters:
    """One per client instance (:meth:`of`): which classes each filter server holds, the groups' class
    errors, and the task that registers the consumers' classes every heartbeat round and with filter
    servers that appear in a route."""

    def __init__(self, inst: ClientInstance, *, rng: Callable[[list[str]], str] = random.choice) -> None:
        self.inst = inst
        self._choose = rng
        self.consumers: dict[str, ClassFilterConsumer] = {}
        self._task: asyncio.Task[None] | None = None
        self._seen_tables: dict[str, dict[str, list[str]]] = {}
        self._spawned: set[asyncio.Task[None]] = set()
        #: (filter server, group, topic) -> the class CRC it accepted.
        self.registered: dict[tuple[str, str, str], tuple[str, int]] = {}
        self.states: dict[tuple[str, str], ClassFilterState] = {}
        self._locks: dict[tuple[str, str, str], asyncio.Lock] = {}
        self._last_error_heartbeat = 0.0

    @classmethod
    def of(cls, inst: ClientInstance) -> ClassFilters:
        return inst.service(cls, cls)

    def attach(self, consumer: ClassFilterConsumer) -> None:
        """Keep ``consumer``'s classes registered (call on the instance's loop once it started)."""
        self.consumers[consumer.group] = consumer
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run(), name="sluice-filter-classes")

    async def detach(self, consumer: ClassFilterConsumer) -> None:
        if self.consumers.get(consumer.group) is consumer:
            del self.consumers[consumer.group]
        self.forget(consumer.group)
        if not self.consumers and self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def _run(self) -> None:
        next_round = time.monotonic() + self.inst.config.heartbeat_interval
        while self.consumers and not self.inst.closed:
            await asyncio.sleep(ROUTE_CHECK_INTERVAL_S)
            try:
                if time.monotonic() >= next_round:
                    next_round = time.monotonic() + self.inst.config.heartbeat_interval
                    await self.upload_all()
                else:
                    await self._check_routes()
            except asyncio.CancelledError:
                raise
            except Exception:  # registration must never stop: log and try again next period
                log.exception("registering filter classes failed")

    async def _check_routes(self) -> None:
        """Filter servers that appeared in (or changed in) a route get the topic's classes now."""
        for topic in sorted({t for c in list(self.consumers.values()) for t in c.class_filters()}):
            route = self.inst.routes.get(topic)
            table = route.filter_server_table if route is not None else {}
            if self._seen_tables.get(topic) != table:
                self._seen_tables[topic] = {k: list(v) for k, v in table.items()}
                await self.upload_topic(topic)

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._spawned.add(task)
        task.add_done_callback(self._spawned.discard)

    # ------------------------------------------------------------------------------ errors

    def last_error(self, group: str, topic: str) -> FilterClassError | None:
        st = self.states.get((group, topic))
        return None if st is None else st.error

    def note_error(self, group: str, topic: str, err: FilterClassError) -> None:
        """Keep ``err`` as the group's current error on ``topic``; a new one is logged and heartbeated early."""
        st = self.states.setdefault((group, topic), ClassFilterState())
        # One log line per new cause (not per queue or filter server reporting it).
        fresh = st.error is None or (st.error.class_name, st.error.cause) != (err.class_name, err.cause)
        st.error, st.error_time_ms = err, int(time.time() * 1000)
        if fresh:
            log.warning("consumer group %s on topic %s: %s", group, topic, err)
            now = time.monotonic()
            if now - self._last_error_heartbeat >= ERROR_HEARTBEAT_MIN_INTERVAL_S and not self.inst.closed:
                self._last_error_heartbeat = now
                self._spawn(self._heartbeat_quietly())

    async def _heartbeat_quietly(self) -> None:
        try:
            await self.inst.send_heartbeat_to_all()
        except SluiceError as exc:
            log.info("heartbeat after a class-filter error failed: %s", exc)

    def note_ok(self, group: str, topic: str) -> None:
        st = self.states.get((group, topic))
        if st is not None and st.error is not None:
            log.warning("consumer group %s on topic %s: filter class %r works again", group, topic,
                        st.error.class_name)
            st.error = None

    def forget(self, group: str) -> None:
        """The group left this instance: its registrations and errors go (filter servers expire theirs)."""
        for key in [k for k in self.registered if k[1] == group]:
            del self.registered[key]
        for key in [k for k in self.states if k[0] == group]:
            del self.states[key]

    # ------------------------------------------------------------------------------ registration

    async def register(self, fs_addr: str, group: str, topic: str, selector: MessageSelector, *,
                       force: bool = False) -> None:
        """Register the class with one filter server (once per CRC unless ``force``); FilterClassError when
        the filter server refuses it (uploads off, not in its repository, import failure, conflict)."""
        key = (fs_addr, group, topic)
        want = (selector.expression, selector.class_crc)
        lock = self._locks.setdefault(key, asyncio.Lock())
        async with lock:  # concurrent pulls of one group's queues register once
            if not force and self.registered.get(key) == want:
                return
            request = register_filter_class_request(group, topic, selector)
            response = await self.inst.remoting.invoke(fs_addr, request, self.inst.config.request_timeout)
            if response.code != ResponseCode.SUCCESS:
                self.registered.pop(key, None)
                raise class_error(selector.expression, response.remark or f"registration answered code "
                                  f"{response.code}", code=response.code, where=f"filter server {fs_addr}")
            self.registered[key] = want
            log.info("filter class %r of group %s on %s registered with filter server %s", selector.expression,
                     group, topic, fs_addr)

    async def register_everywhere(self, group: str, topic: str, selector: MessageSelector, *,
                                  force: bool = False) -> None:
        """uploadFilterClassToAllFilterServer: every filter server of every broker of the topic's route.
        Failures are kept as the group's error (and logged), never raised: pulls raise them."""
        route = self.inst.routes.get(topic)
        servers = sorted({fs for addrs in (route.filter_server_table.values() if route else ()) for fs in addrs})
        if not servers:
            return

        async def one(fs: str) -> None:
            try:
                await self.register(fs, group, topic, selector, force=force)
            except FilterClassError as exc:
                self.note_error(group, topic, exc)
            except SluiceError as exc:  # unreachable filter server: the next round or pull tries again
                log.info("registering filter class %r with %s failed: %s", selector.expression, fs, exc)
        await asyncio.gather(*(one(fs) for fs in servers))

    async def upload_all(self) -> None:
        """Every class subscription of every consumer of the instance (each heartbeat round, as
        MQClientInstance.sendHeartbeatToAllBrokerWithLock uploads filter classes)."""
        for consumer in list(self.consumers.values()):
            for topic, sel in sorted(consumer.class_filters().items()):
                await self.register_everywhere(consumer.group, topic, sel, force=True)

    async def upload_topic(self, topic: str) -> None:
        """The route's filter servers changed: register the topic's classes with the ones we have not."""
        for consumer in list(self.consumers.values()):
            sel = consumer.class_filters().get(topic)
            if sel is not None:
                await self.register_everywhere(consumer.group, topic, sel)

    # ------------------------------------------------------------------------------ pulling

    async def pick(self, mq: MessageQueue, selector: MessageSelector) -> str:
        """A filter server of the queue's broker (refreshing the route once when it lists none)."""
        inst = self.inst
        broker_addr = await inst.broker_addr_for(mq.topic, mq.broker_name, master_only=False)
        servers = filter_servers_of(inst.routes.get(mq.topic), broker_addr)
        if not servers:
            try:
                await inst.topic_route(mq.topic, refresh=True)
                broker_addr = await inst.broker_addr_for(mq.topic, mq.broker_name, master_only=False)
            except SluiceError as exc:  # no fresher route: the cached one decides
                log.info("refreshing the route of %s failed: %s", mq.topic, exc)
            servers = filter_servers_of(inst.routes.get(mq.topic), broker_addr)
        if not servers:
            raise class_error(selector.expression,
                              f"no filter server runs beside broker {mq.broker_name} ({broker_addr}) for topic "
                              f"{mq.topic!r}; a class filter is served only by filter servers (broker setting "
                              "filter_server_nums), never by the broker itself")
        return self._choose(sorted(servers))

    async def pull(self, group: str, mq: MessageQueue, selector: MessageSelector, header_ext: dict[str, str],
                   timeout: float) -> RemotingCommand:
        """PULL_MESSAGE to a filter server with the class-filter flag; the answer when it is a pull status.

        A filter server that does not know the group (restarted: SUBSCRIPTION_NOT_EXIST) gets the class
        again and the pull is retried once; any other error answer is the class's error (FilterClassError,
        kept as the group's last error). Network errors are raised as they are (the caller retries)."""
        try:
            fs = await self.pick(mq, selector)
        except FilterClassError as exc:
            self.note_error(group, mq.topic, exc)
            raise
        for attempt in (0, 1):
            try:
                await self.register(fs, group, mq.topic, selector)
            except FilterClassError as exc:
                self.note_error(group, mq.topic, exc)
                raise
            ext = dict(header_ext)
            ext["sysFlag"] = str(int(ext.get("sysFlag", "0")) | FLAG_CLASS_FILTER)
            try:
                response = await self.inst.remoting.invoke(
                    fs, RemotingCommand.request(RequestCode.PULL_MESSAGE, ext), timeout)
            except RemotingError:
                self.registered.pop((fs, group, mq.topic), None)  # a restarted server must get the class again
                raise
            if response.code in PULL_CODES:
                self.note_ok(group, mq.topic)
                return response
            if response.code == ResponseCode.SUBSCRIPTION_NOT_EXIST and attempt == 0:
                log.info("filter server %s does not know group %s on %s (%s); registering again", fs, group,
                         mq.topic, response.remark)
                self.registered.pop((fs, group, mq.topic), None)
                continue
            err = class_error(selector.expression, response.remark or f"pull answered code {response.code}",
                              code=response.code, where=f"filter server {fs}, queue {mq.broker_name}/"
                                                        f"{mq.queue_id}")
            self.note_error(group, mq.topic, err)
            raise err
        raise AssertionError("unreachable")  # pragma: no cover
