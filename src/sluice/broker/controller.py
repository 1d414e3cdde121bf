"""BrokerController: wires the store, the managers, the request processors and the background services.

::

    broker = BrokerController(BrokerConfig.load(None, listen="127.0.0.1:10911", store="/data/sluice"))
    await broker.start()          # opens (and recovers) the store, listens, registers with the namesrvs
    ...
    await broker.stop()           # graceful: see stop()

Everything request-related runs on one asyncio loop; blocking store calls go
to a thread pool (``run_blocking``), so a synchronous flush or a cold page
never stalls other connections. Background tasks on the loop: namesrv
registration (every ``register_namesrv_period_ms`` and at once on topic
changes), offset persistence, and the 120 s client-expiry scan.
"""
from __future__ import annotations

import asyncio
import functools
import logging
import socket
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from sluice import __version__
from sluice.broker.admin import AdminProcessor
from sluice.broker.offset_reset import AdminExtProcessor
from sluice.broker.appender import Appender
from sluice.broker.backfill import BackfillManager, BackfillProcessor
from sluice.broker.client_manage import CLIENT_ID, ClientManageProcessor
from sluice.broker.config import BrokerConfig
from sluice.broker.consumers import ConsumerManager
from sluice.broker.dedup import DedupWindow
from sluice.broker.filter_admin import FilterAdminProcessor, install_filtering, persist_filter_data_loop
from sluice.broker.locks import RebalanceLockManager
from sluice.broker.longpoll import HoldService
from sluice.broker.offsets import ConsumerOffsetManager
from sluice.broker.pull import PullProcessor
from sluice.broker.queries import QueryProcessor
from sluice.broker.retry import RetryProcessor
from sluice.broker.schedule import ScheduleService
from sluice.broker.send import SendProcessor
from sluice.broker.topics import TopicConfigManager
from sluice.errors import ServiceNotAvailableError, SluiceError
from sluice.namesrv.client import NamesrvClient
from sluice.protocol import bodies as B
from sluice.transport.client import RemotingClient
from sluice.protocol.codes import RequestCode, ResponseCode
from sluice.protocol.command import RemotingCommand
from sluice.transport.connection import RemotingConnection, RequestHandler
from sluice.transport.server import RemotingServer
from sluice.store import MessageStore, StoreConfig

__all__ = ["BrokerController"]

log = logging.getLogger(__name__)
T = TypeVar("T")

#: A client silent this long is dropped (RocketMQ's channelExpiredTimeout).
CHANNEL_EXPIRY_S = 120.0
#: How often silent clients are looked for (RocketMQ's ClientHousekeepingService: 10 s).
EXPIRY_SCAN_S = 10.0
#: Threads for blocking store calls: synchronous sends wait for fsync here, so several may wait at once
#: (and get one group commit); reads are short.
STORE_THREADS = 16
#: How long a graceful stop waits for requests already being handled.
DRAIN_TIMEOUT_S = 5.0


def _advertised_ip(host: str) -> str:
    """The IPv4 address written into message ids and registrations for a listen host."""
    if host in ("", "0.0.0.0", "::"):
        return "127.0.0.1"
    try:
        return socket.gethostbyname(host)
    except OSError:
        return "127.0.0.1"


def _pick_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class BrokerController:
    def __init__(self, config: BrokerConfig) -> None:
        self.config = config.validate()
        host, port = config.host_port
        if port == 0:  # the store needs the real port for message ids before the server binds
            port = _pick_port(host)
        self.host, self.port = host, port
        self.address = f"{_advertised_ip(host)}:{port}"
        root = Path(config.store)
        self.store = MessageStore(root, StoreConfig(
            flush_mode=config.flush,  # type: ignore[arg-type]
            commitlog_file_size=config.commitlog_file_size, max_message_size=config.max_message_size,
            retention_hours=config.retention_hours, store_host=(_advertised_ip(host), port)))
        self.topics = TopicConfigManager(root / "config", auto_create=config.auto_create_topic,
                                         default_queue_nums=config.default_topic_queue_nums)
        self.offsets = ConsumerOffsetManager(root / "config")
        self.locks = RebalanceLockManager(config.rebalance_lock_max_live_ms)
        self.consumers = ConsumerManager(channel_expiry_s=CHANNEL_EXPIRY_S, on_change=self._consumer_ids_changed)
        self.hold = HoldService(self.store.get_max_offset, check_interval_s=config.long_polling_check_ms / 1000.0)
        # Filtering first: its bitmap dispatcher must precede every other dispatcher (filter_admin.py).
        install_filtering(self)
        self.store.add_dispatcher(self.hold)
        self.executor = ThreadPoolExecutor(max_workers=STORE_THREADS, thread_name_prefix="sluice-broker-store")
        self.appender = Appender(self.store, self.executor)
        self.store.dispatch.drive_externally()  # every append happens on the loop, which dispatches after it
        self.dedup = DedupWindow(max_keys=config.dedup_window_keys, window_ms=int(config.dedup_window_seconds * 1000),
                                 prefixes=config.dedup_producer_group_prefixes)
        self.server = RemotingServer(host, port)
        self.remoting = RemotingClient()
        self.namesrv = NamesrvClient(config.namesrv, remoting=self.remoting) if config.namesrv else None
        self.send_processor = SendProcessor(self)
        self.pull_processor = PullProcessor(self)
        for proc in (self.send_processor, self.pull_processor, ClientManageProcessor(self), QueryProcessor(self),
                     AdminProcessor(self), AdminExtProcessor(self)):
            proc.register()
        FilterAdminProcessor(self).register()
        self.backfills = BackfillManager(self)  # bitmaps from `sluice spark backfill` (backfill.py)
        BackfillProcessor(self).register()
        self.schedule = ScheduleService(self, root / "config")  # delay levels and deliver-at (schedule.py)
        self.retry_processor = RetryProcessor(self)
        self.retry_processor.register()
        self.server.on_connection_close(self._connection_closed)
        self.started_at = 0.0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._reg_task: asyncio.Task[None] | None = None
        self._reg_dirty = False
        self._reg_lock = asyncio.Lock()
        self._in_flight = 0
        self._stopping = False
        self._stopped = False

    # ---- handler registration (processors call this instead of the server directly) ---------------
    def register(self, code: int, handler: RequestHandler) -> None:
        self.server.register(code, self._guard(handler))

    def _guard(self, handler: RequestHandler) -> RequestHandler:
        """Refuse work while stopping, count requests in flight (a stop drains them), log refusals.

        A plain-function handler stays one (the remoting layer answers it without a task) and may return
        an awaitable for the requests it cannot answer at once; an ``async def`` one stays async."""
        if asyncio.iscoroutinefunction(handler):
            async def guarded(conn: RemotingConnection, request: RemotingCommand) -> RemotingCommand | None:
                if self._stopping:
                    raise ServiceNotAvailableError("the broker is shutting down")
                self._in_flight += 1
                try:
                    return await handler(conn, request)
                except SluiceError as exc:
                    self._log_refusal(conn, request, exc)
                    raise
                finally:
                    self._in_flight -= 1
            return guarded

        def guarded_now(conn: RemotingConnection, request: RemotingCommand) -> Any:
            if self._stopping:
                raise ServiceNotAvailableError("the broker is shutting down")
            self._in_flight += 1
            try:
                result = handler(conn, request)
            except BaseException as exc:
                self._in_flight -= 1
                if isinstance(exc, SluiceError):
                    self._log_refusal(conn, request, exc)
                raise
            if result is None or isinstance(result, RemotingCommand):
                self._in_flight -= 1
                return result
            return self._finish(conn, request, result)
        return guarded_now

    async def _finish(self, conn: RemotingConnection, request: RemotingCommand,
                      pending: Awaitable[RemotingCommand | None]) -> RemotingCommand | None:
        """The rest of a plain handler's request that had to wait (a held pull, say), still counted."""
        try:
            return await pending
        except SluiceError as exc:
            self._log_refusal(conn, request, exc)
            raise
        finally:
            self._in_flight -= 1

    @staticmethod
    def _log_refusal(conn: RemotingConnection, request: RemotingCommand, exc: SluiceError) -> None:
        level = logging.WARNING if exc.code == ResponseCode.SYSTEM_ERROR else logging.DEBUG
        log.log(level, "request code %d from %s refused (%s): %s", request.code, conn.peer,
                getattr(exc.code, "name", exc.code), exc)

    async def run_blocking(self, fn: Callable[..., T], *args: Any) -> T:
        """Run a blocking store call on the broker's thread pool."""
        loop = self._loop or asyncio.get_running_loop()
        return await loop.run_in_executor(self.executor, functools.partial(fn, *args))

    # ---- lifecycle ---------------------------------------------------------------------------------
    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        t0 = time.monotonic()
        await self._loop.run_in_executor(self.executor, self.store.start)
        rep = self.store.recovery_report
        log.info("store %s open in %.2f s (%s)", self.config.store, time.monotonic() - t0, rep)
        await self._loop.run_in_executor(self.executor, self.backfills.load)
        self.hold.start()
        # Opted-in sends wait for the replay window's rebuild from the commit log's tail; others do not.
        self._tasks.append(self._loop.create_task(self._rebuild_dedup(), name="dedup-rebuild"))
        await self.server.start()
        self.started_at = time.time()
        self._tasks += [
            self._loop.create_task(self._every(self.config.persist_offsets_interval_ms / 1000.0, self._persist_offsets),
                                   name="persist-offsets"),
            self._loop.create_task(self._every(EXPIRY_SCAN_S, self._expire_clients), name="client-expiry"),
            self._loop.create_task(persist_filter_data_loop(self), name="persist-filter-data"),
        ]
        self.schedule.start()
        if self.namesrv is not None:
            await self.register_all()
            self._tasks.append(self._loop.create_task(
                self._every(self.config.register_namesrv_period_ms / 1000.0, self.register_all), name="register"))
        log.info("broker %s (cluster %s) listening on %s, store %s, flush %s", self.config.broker_name,
                 self.config.cluster_name, self.address, self.config.store, self.config.flush)

    async def stop(self) -> None:
        """Graceful stop: refuse new requests, answer held pulls, drain requests in flight, close the
        server, persist offsets and topics, unregister from the namesrvs, flush/checkpoint/close the store."""
        if self._stopped:
            return
        self._stopped = True
        self._stopping = True
        log.info("broker %s stopping", self.config.broker_name)
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.hold.stop()
        await self.schedule.stop()
        deadline = time.monotonic() + DRAIN_TIMEOUT_S
        while self._in_flight > 0 and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        await self.server.close()
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, functools.partial(self.executor.shutdown, wait=True))
        try:
            self.offsets.persist(force=True)
        except OSError:
            log.exception("could not persist consumer offsets")
        try:
            self.filter_data.persist(force=True)
        except OSError:
            log.exception("could not persist consumer filter data")
        if self.namesrv is not None:
            if self._reg_task is not None:
                self._reg_task.cancel()
                await asyncio.gather(self._reg_task, return_exceptions=True)
            try:
                outcomes = await self.namesrv.unregister_broker(
                    cluster_name=self.config.cluster_name, broker_name=self.config.broker_name,
                    broker_addr=self.address, broker_id=self.config.broker_id)
                for o in outcomes:
                    if not o.ok:
                        log.warning("unregister from namesrv %s failed: %s", o.namesrv, o.error)
            except Exception:
                log.exception("unregistering from the namesrvs failed")
        await self.remoting.close()
        await loop.run_in_executor(None, self.store.close)
        log.info("broker %s stopped", self.config.broker_name)

    async def _every(self, period_s: float, fn: Callable[[], Awaitable[None]]) -> None:
        while True:
            await asyncio.sleep(period_s)
            try:
                await fn()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("periodic task %s failed", getattr(fn, "__name__", fn))

    async def _rebuild_dedup(self) -> None:
        t0 = time.monotonic()
        try:
            await self.run_blocking(self.dedup.rebuild, self.store, self.store.config.store_host)
            log.info("dedup window: %d keys from the commit log's tail in %.2f s", self.dedup.rebuilt,
                     time.monotonic() - t0)
        except Exception:
            log.exception("rebuilding the dedup window failed; replays older than this start are not caught")
        finally:
            self.dedup.open()

    async def _persist_offsets(self) -> None:
        await self.run_blocking(self.offsets.persist)

    async def _expire_clients(self) -> None:
        conns = self.consumers.expired_connections()
        for cid in self.consumers.scan_expired():
            self.locks.release_client(cid)
        for conn in conns:
            await conn.close()

    # ---- namesrv registration ----------------------------------------------------------------------
    async def register_all(self) -> None:
        """Register this broker and its topic table with every namesrv (failures are logged, not raised)."""
        if self.namesrv is None:
            return
        async with self._reg_lock:
            wire = self.topics.to_wire()
            table = {name: B.TopicConfig(topic_name=name, read_queue_nums=c["readQueueNums"],
                                         write_queue_nums=c["writeQueueNums"], perm=c["perm"],
                                         topic_filter_type=c["topicFilterType"], topic_sys_flag=c["topicSysFlag"],
                                         order=c["order"])
                     for name, c in wire["topicConfigTable"].items()}
            dv = B.DataVersion(timestamp=wire["dataVersion"]["timestamp"], counter=wire["dataVersion"]["counter"])
            outcomes = await self.namesrv.register_broker(
                cluster_name=self.config.cluster_name, broker_name=self.config.broker_name,
                broker_addr=self.address, broker_id=self.config.broker_id, topics=table, data_version=dv,
                filter_servers=[])
            for o in outcomes:
                if not o.ok:
                    log.warning("registration with namesrv %s failed: %s", o.namesrv, o.error)

    def topics_changed(self) -> None:
        """Topic table changed: re-register at once (coalescing bursts into one registration in flight)."""
        if self.namesrv is None or self._loop is None or self._stopping:
            return
        self._reg_dirty = True
        if self._reg_task is None or self._reg_task.done():
            self._reg_task = self._loop.create_task(self._register_pending())

    async def _register_pending(self) -> None:
        while self._reg_dirty:
            self._reg_dirty = False
            try:
                await self.register_all()
            except Exception:
                log.exception("registration after a topic change failed")

    # ---- clients -----------------------------------------------------------------------------------
    def _connection_closed(self, conn: RemotingConnection) -> None:
        for cid in self.consumers.connection_closed(conn):
            self.locks.release_client(cid)

    def _consumer_ids_changed(self, group: str, conns: list[RemotingConnection]) -> None:
        """Tell the group's remaining members to rebalance now (oneway, best effort)."""
        if self.consumers.get(group) is None:
            self.filter_data.unregister(group)  # the last member left: its filter data is dead from now
        if self._loop is None or self._stopping:
            return
        req = RemotingCommand.request(RequestCode.NOTIFY_CONSUMER_IDS_CHANGED, {"consumerGroup": group}, oneway=True)
        for conn in {id(c): c for c in conns}.values():
            if not conn.is_closed:
                self._loop.create_task(self._notify(conn, req))

    @staticmethod
    async def _notify(conn: RemotingConnection, req: RemotingCommand) -> None:
        try:
            await conn.send_oneway(req)
        except SluiceError as exc:
            log.debug("NOTIFY_CONSUMER_IDS_CHANGED to %s failed: %s", conn.peer, exc)

    # ---- introspection -----------------------------------------------------------------------------
    def runtime_info(self) -> dict[str, object]:
        s = self.store.stats()
        return {
            "brokerVersionDesc": f"Sluice {__version__}",
            "brokerName": self.config.broker_name,
            "clusterName": self.config.cluster_name,
            "brokerAddr": self.address,
            "bootTimestamp": int(self.started_at * 1000),
            "runtime": f"{time.time() - self.started_at:.0f} s" if self.started_at else "0 s",
            "msgPutTotalTodayNow": self.send_processor.sent_messages,
            "msgGetTotalTodayNow": self.pull_processor.pulled_messages,
            "pullHeldCount": self.hold.held_count,
            "pullWokenByArrival": self.hold.woken_by_arrival,
            "pullTimedOut": self.hold.timed_out,
            "consumerGroups": len(self.consumers.groups),
            "producerGroups": len(self.consumers.producers),
            "topics": len(self.topics.all()),
            "connections": len(self.server.connections),
            **self.filter_data.totals(),
            **self.schedule.stats(),  # delayed messages waiting (due or not) and moved
            **self.dedup.stats(),
            **{k: v for k, v in s.items()},
        }

    def client_id_of(self, conn: RemotingConnection) -> str | None:
        return conn.attributes.get(CLIENT_ID)
