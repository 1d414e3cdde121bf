"""BrokerController: wires the store, the managers, the request processors and the background services.

::

    broker = BrokerController(BrokerConfig.load(None, listen="127.0.0.1:10911", store="/data/sluice"))
    await broker.start()          # opens (and recovers) the store, listens, registers with the namesrvs
    ...
    await broker.stop()           # graceful: see stop()

The controller builds every collaborator itself and hands each processor the
ones it uses; the request codes and their handlers come from one table
(requests.py). Everything request-related runs on one asyncio loop; blocking
store calls go to a thread pool (``pool``), so a synchronous flush or a cold
page never stalls other connections. Background tasks on the loop: namesrv
registration (every ``register_namesrv_period_ms`` and at once on topic
changes), offset and filter-data persistence, and the 120 s client-expiry scan.
"""
from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING

from sluice import __version__
from sluice.acl.guard import AclGuard
from sluice.acl.policy import PUB, Need
from sluice.acl.signature import Credentials
from sluice.acl.signing import remoting_client
from sluice.broker.admin import AdminProcessor
from sluice.broker.appender import Appender
from sluice.broker.backfill import BackfillManager, BackfillProcessor
from sluice.broker.bitmap import CalcBitmapDispatcher
from sluice.broker.client_manage import ClientManageProcessor
from sluice.broker.config import BrokerConfig
from sluice.broker.consumers import ConsumerManager
from sluice.broker.dedup import DedupWindow
from sluice.broker.filter_admin import FilterAdminProcessor, persist_filter_data_loop
from sluice.broker.filter_data import ConsumerFilterManager
from sluice.broker.filter_servers import EXPIRY_SCAN_S as FILTER_SERVER_SCAN_S
from sluice.broker.filter_servers import FilterServerChildren, FilterServerManager, child_env
from sluice.broker.filter_servers import tls_args as filtersrv_tls_args
from sluice.broker.gate import RequestGate, acl_checked
from sluice.broker.live_config import LiveConfigFile
from sluice.broker.locks import RebalanceLockManager
from sluice.broker.longpoll import HoldService
from sluice.broker.offset_reset import OffsetResetProcessor
from sluice.broker.offsets import ConsumerOffsetManager
from sluice.broker.ops import OpsProcessor
from sluice.broker.pool import BlockingPool
from sluice.broker.pull import PullProcessor
from sluice.broker.queries import QueryProcessor
from sluice.broker.requests import ROUTES, Route
from sluice.broker.retry import RetryProcessor
from sluice.broker.schedule import ScheduleService
from sluice.broker.reply import ReplyProcessor
from sluice.broker.send import SendProcessor
from sluice.broker.stats import BrokerStats
from sluice.broker.subgroups import SubscriptionGroupManager, SubscriptionGroupProcessor
from sluice.broker.sub_conflicts import SubscriptionGuard
from sluice.broker.topics import TopicConfigManager
from sluice.broker.transactions import TransactionService
from sluice.errors import SluiceError
from sluice.filter import BloomFilter
from sluice.namesrv.client import NamesrvClient
from sluice.protocol import bodies as B
from sluice.protocol.codes import RequestCode
from sluice.protocol.command import RemotingCommand
from sluice.store import MessageStore, StoreConfig
from sluice.transport.client import RemotingClient
from sluice.transport.connection import RemotingConnection
from sluice.transport.server import RemotingServer
from sluice.transport.tls import server_tls

if TYPE_CHECKING:
    from sluice.metrics_http import MetricsServer

__all__ = ["BrokerController"]

log = logging.getLogger(__name__)

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
    config: BrokerConfig
    host: str
    port: int
    address: str  #: ip:port written into message ids and registrations
    store: MessageStore
    pool: BlockingPool  #: blocking store calls, off the loop
    topics: TopicConfigManager
    offsets: ConsumerOffsetManager
    subgroups: SubscriptionGroupManager  #: subscription groups (subscriptionGroup.json)
    locks: RebalanceLockManager
    consumers: ConsumerManager
    filter_data: ConsumerFilterManager
    sub_guard: SubscriptionGuard
    bitmap_dispatcher: CalcBitmapDispatcher | None  #: None with enable_calc_filter_bitmap off
    hold: HoldService
    dedup: DedupWindow
    appender: Appender
    schedule: ScheduleService
    backfills: BackfillManager
    filter_servers: FilterServerManager  #: filter servers registered with 301 (class-filter mode)
    filter_server_children: FilterServerChildren | None  #: the ``filter_server_nums`` children, if any
    send_processor: SendProcessor
    transactions: TransactionService  #: half messages, END_TRANSACTION, the check-back
    replies: ReplyProcessor  #: SEND_REPLY_MESSAGE(_V2): push to the requester, store in <cluster>_REPLY_TOPIC
    pull_processor: PullProcessor
    retry_processor: RetryProcessor
    stats: BrokerStats  #: put and get counters with minute/hour/day TPS (VIEW_BROKER_STATS_DATA, consumeTps)
    admin: AdminProcessor  #: topics, offsets, consume stats (the metrics' lag reuses its consumerProgress figures)
    metrics: MetricsServer | None  #: /metrics on ``metrics_listen``; None without it
    #: code -> its row of requests.ROUTES, for every code registered with the server
    routes: dict[int, Route]
    server: RemotingServer
    remoting: RemotingClient
    namesrv: NamesrvClient | None
    acl: AclGuard | None  #: None without ``acl``: no request is checked
    started_at: float

    def __init__(self, config: BrokerConfig) -> None:
        config = config.validate()
        # Settings changed live by UPDATE_BROKER_CONFIG before a restart win over the command line / TOML.
        self.live_file = LiveConfigFile(Path(config.store) / "config")
        self.config = config = self.live_file.overlay(config)
        host, port = config.host_port
        if port == 0:  # the store needs the real port for message ids before the server binds
            port = _pick_port(host)
        self.host, self.port = host, port
        self.address = f"{_advertised_ip(host)}:{port}"
        # TLS files are read before the store opens, so a bad certificate or CA file fails the start cleanly.
        tls_mode, ssl_context = server_tls(config.tls_mode, config.tls_cert, config.tls_key, config.tls_client_ca)
        if (namesrv_tls := config.namesrv_client_tls) is not None:
            namesrv_tls.context()
        root = Path(config.store)
        self.store = store = MessageStore(root, StoreConfig(
            flush_mode=config.flush,  # type: ignore[arg-type]
            commitlog_file_size=config.commitlog_file_size, max_message_size=config.max_message_size,
            retention_hours=config.retention_hours, store_host=(_advertised_ip(host), port),
            max_transfer_bytes=config.max_transfer_bytes,
            disk_max_used_space_ratio=config.disk_max_used_space_ratio, disk_min_free_bytes=config.disk_min_free_bytes,
            disk_check_interval_s=config.disk_check_interval_s, max_open_queues=config.max_open_queues))
        self.pool = pool = BlockingPool(STORE_THREADS)
        self.topics = topics = TopicConfigManager(root / "config", auto_create=config.auto_create_topic,
                                                  default_queue_nums=config.default_topic_queue_nums,
                                                  max_auto_created=config.max_auto_created_topics,
                                                  trace_topic=config.msg_trace_topic_name
                                                  if config.trace_topic_enable else None)
        self.offsets = offsets = ConsumerOffsetManager(root / "config")
        self.subgroups = subgroups = SubscriptionGroupManager(
            root / "config", auto_create=config.auto_create_subscription_group,
            default_retry_max_times=config.max_reconsume_times)
        self.locks = RebalanceLockManager(config.rebalance_lock_max_live_ms)
        self.consumers = consumers = ConsumerManager(channel_expiry_s=CHANNEL_EXPIRY_S,
                                                     on_change=self._consumer_ids_changed)
        # Filtering first: the bitmap dispatcher must precede every other dispatcher, so records replayed by
        # recovery get bitmaps too (docs/filtering.md).
        bloom = BloomFilter(config.max_error_rate_of_bloom_filter, config.expect_consumer_num_use_filter)
        self.filter_data = fm = ConsumerFilterManager(root / "config", bloom=bloom,
                                                      clean_span_ms=config.filter_data_clean_time_span_ms)
        fm.load(compile=False)  # compiled off the loop in start(), before recovery's dispatch needs them
        self.sub_guard = sub_guard = SubscriptionGuard()
        self.bitmap_dispatcher = CalcBitmapDispatcher(fm) if config.enable_calc_filter_bitmap else None
        if self.bitmap_dispatcher is not None:
            store.add_dispatcher(self.bitmap_dispatcher)
        self.hold = hold = HoldService(store.get_max_offset, check_interval_s=config.long_polling_check_ms / 1000.0,
                                       max_per_owner=config.max_held_pulls_per_connection,
                                       max_total=config.max_held_pulls,
                                       wakes_per_turn=config.max_held_pull_wakes_per_turn)
        store.add_dispatcher(hold)
        self.appender = appender = Appender(store)
        appender.hold = hold  # the pulls its dispatch wakes are answered right after it
        self.stats = BrokerStats(config.cluster_name)
        appender.on_put = self.stats.on_put
        store.dispatch.drive_externally()  # every append happens on the loop, which dispatches after it
        self.dedup = DedupWindow(max_keys=config.dedup_window_keys, window_ms=int(config.dedup_window_seconds * 1000),
                                 prefixes=config.dedup_producer_group_prefixes)
        # Delay levels and deliver-at (schedule.py); its divert applies to sends and retries.
        self.schedule = ScheduleService(root / "config", message_delay_level=config.message_delay_level,
                                        retention_hours=config.retention_hours, store=store, pool=pool,
                                        topics=topics, appender=appender)
        # Bitmaps from `sluice spark backfill` (backfill.py).
        self.backfills = backfills = BackfillManager(root, max_bytes=config.backfill_max_bytes, store=store,
                                                     consumers=consumers, filter_data=fm,
                                                     verify_samples=config.backfill_verify_samples)
        self.server = RemotingServer(host, port, frame_budget=config.frame_budget,
                                     max_connections=config.max_connections,
                                     idle_timeout=config.server_channel_max_idle_time_seconds,
                                     tls_mode=tls_mode, ssl_context=ssl_context)
        # ACL (sluice.acl): checks each request before its handler; the broker's own account signs its
        # namesrv registrations.
        self.acl = AclGuard(config.acl) if config.acl else None
        self.remoting = remoting_client(Credentials(config.acl_access_key, config.acl_secret_key)
                                        if config.acl_access_key else None, tls=namesrv_tls)
        self.namesrv = NamesrvClient(config.namesrv, remoting=self.remoting) if config.namesrv else None

        changed = self.topics_changed
        # Filter servers (class-filter mode): registered ones are listed in namesrv registrations, so every
        # change re-registers; the children run `sluice filtersrv` (never imported here).
        self.filter_servers = FilterServerManager(broker_name=config.broker_name, broker_id=config.broker_id,
                                                  on_change=changed)
        self.filter_server_children = FilterServerChildren(
            config.filter_server_nums, self.address, _advertised_ip(host), self._filtersrv_args(),
            env=child_env(config.acl_access_key, config.acl_secret_key)) \
            if config.filter_server_nums > 0 else None
        self.send_processor = SendProcessor(
            topics=topics, topics_changed=changed, appender=appender, dedup=self.dedup, divert=self.schedule.divert,
            subgroups=subgroups, store_host=store.config.store_host,
            max_message_size=store.config.max_message_size, reject_transactions=config.reject_transaction_message,
            cluster_name=config.cluster_name)
        # Transactional messages (transactions.py): END_TRANSACTION and the check-back to producers.
        self.transactions = TransactionService(
            store=store, pool=pool, appender=appender, topics=topics, topics_changed=changed, offsets=offsets,
            clients=consumers, divert=self.schedule.divert, store_host=store.config.store_host,
            timeout_ms=config.transaction_timeout_ms, check_interval_ms=config.transaction_check_interval_ms,
            check_max=config.transaction_check_max, authorize=self._real_topic_check() if self.acl else None)
        # Request-reply (reply.py): replies pushed to the requesting client's connection, and stored.
        self.replies = ReplyProcessor(
            topics=topics, topics_changed=changed, appender=appender, clients=consumers,
            cluster_name=config.cluster_name, store_host=store.config.store_host,
            store_replies=config.store_reply_message_enable)
        self.pull_processor = PullProcessor(
            config=config, store=store, pool=pool, topics=topics, offsets=offsets, consumers=consumers,
            filter_data=fm, sub_guard=sub_guard, backfills=backfills, hold=hold, subgroups=subgroups,
            filter_servers=self.filter_servers.addresses, is_filter_server=self.filter_servers.is_filter_server)
        self.pull_processor.on_get = self.stats.on_get
        self.retry_processor = RetryProcessor(
            store=store, pool=pool, topics=topics, topics_changed=changed, appender=appender,
            divert=self.schedule.divert, subgroups=subgroups)
        self.retry_processor.on_send_back = self.stats.on_send_back
        processors: list[object] = [
            self.send_processor, self.pull_processor, self.retry_processor, self.transactions, self.replies,
            ClientManageProcessor(consumers=consumers, topics=topics, topics_changed=changed, filter_data=fm,
                                  sub_guard=sub_guard, subgroups=subgroups, offsets=offsets,
                                  enable_property_filter=config.enable_property_filter,
                                  compiler=self.pull_processor.compiler),
            QueryProcessor(store=store, pool=pool, offsets=offsets, consumers=consumers),
            admin := AdminProcessor(
                cluster_name=config.cluster_name, broker_name=config.broker_name, store=store, pool=pool,
                topics=topics, topics_changed=changed, offsets=offsets, consumers=consumers, locks=self.locks,
                filter_data=fm, sub_guard=sub_guard, runtime_info=self.runtime_info, stats=self.stats),
            OpsProcessor(broker_name=config.broker_name, address=self.address, store=store, pool=pool, topics=topics,
                         offsets=offsets, consumers=consumers, stats=self.stats, admin=admin, live=lambda: self,
                         live_file=self.live_file),
            OffsetResetProcessor(broker_name=config.broker_name, store=store, pool=pool, topics=topics,
                                 offsets=offsets, consumers=consumers),
            FilterAdminProcessor(filter_data=fm, consumers=consumers, sub_guard=sub_guard),
            BackfillProcessor(backfills=backfills, pool=pool),
            SubscriptionGroupProcessor(subgroups=subgroups, remove_offsets=offsets.remove_group),
            self.filter_servers,
        ]
        self.admin = admin
        by_class = {type(p): p for p in processors}
        self.gate = RequestGate()  # every handler's: ACL-checked, refused while stopping, counted (gate.py)
        self.routes = {}
        for route in ROUTES:
            handler = getattr(by_class[route.processor], route.method)
            if self.acl is not None:
                handler = acl_checked(self.acl, route, handler)
            self.server.register(route.code, self.gate.guard(handler))
            self.routes[int(route.code)] = route
        self.server.on_connection_close(self._connection_closed)
        # Metrics (metrics.py): gathered at scrape time; the only hot-path cost is the put latency histogram.
        self.metrics = None
        if config.metrics_listen:  # prometheus_client is loaded only then
            from sluice.broker.metrics import BrokerCollector, PutLatency
            from sluice.metrics_http import MetricsServer

            appender.latency = PutLatency()
            self._metrics_collector = BrokerCollector(self)
            self.metrics = MetricsServer(config.metrics_listen, [self._metrics_collector])
        self.started_at = 0.0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._reg_task: asyncio.Task[None] | None = None
        self._reg_dirty = False
        self._reg_lock = asyncio.Lock()
        self._stopping = False
        self._stopped = False

    # ---- request handling ----------------------------------------------------------------------------
    def _real_topic_check(self) -> Callable[[RemotingConnection, RemotingCommand, str], None]:
        """END_TRANSACTION's need once its half message is read: PUB on the real topic."""
        acl = self.acl
        assert acl is not None

        def check(conn: RemotingConnection, request: RemotingCommand, topic: str) -> None:
            acl.check(conn.peer, request.ext_fields, request.body,
                      Need(int(RequestCode.END_TRANSACTION), resources={topic: PUB}))
        return check

    # ---- lifecycle ---------------------------------------------------------------------------------
    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        t0 = time.monotonic()
        fm = self.filter_data
        fm.install_compiled(await self.pull_processor.compiler.run(fm.compile_restored))
        await self.pool.run(self.store.start)
        rep = self.store.recovery_report
        log.info("store %s open in %.2f s: %s", self.config.store, time.monotonic() - t0,
                 rep.describe() if rep is not None else "no recovery report")
        await self.pool.run(self.backfills.load)
        await self.transactions.load()  # undecided half messages, before END_TRANSACTION can arrive
        self.hold.start()
        # Opted-in sends wait for the replay window's rebuild from the commit log's tail; others do not.
        self._tasks.append(self._loop.create_task(self._rebuild_dedup(), name="dedup-rebuild"))
        await self.server.start()
        self.started_at = time.time()
        if self.metrics is not None:  # after the store opened; a taken port fails the start (cli.py exits 1)
            self._metrics_collector.bind(self._loop)
            self.metrics.start()
            log.info("metrics at http://%s:%d/metrics", self.metrics.host, self.metrics.port)
        self._tasks += [
            self._loop.create_task(self._every(self.config.persist_offsets_interval_ms / 1000.0, self._persist_offsets),
                                   name="persist-offsets"),
            self._loop.create_task(self._every(EXPIRY_SCAN_S, self._expire_clients), name="client-expiry"),
            self._loop.create_task(persist_filter_data_loop(self.filter_data, self.pool), name="persist-filter-data"),
            self._loop.create_task(self._every(FILTER_SERVER_SCAN_S, self._expire_filter_servers),
                                   name="filter-server-expiry"),
        ]
        if self.filter_server_children is not None:
            self.filter_server_children.start()
        self.schedule.start()
        self.transactions.start()
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
        self._stopping = self.gate.stopping = True
        log.info("broker %s stopping", self.config.broker_name)
        if self.metrics is not None:
            self.metrics.close()
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.hold.stop()
        await self.schedule.stop()
        await self.transactions.stop()  # records its progress among the consumer offsets persisted below
        if self.filter_server_children is not None:
            await self.filter_server_children.stop()
        deadline = time.monotonic() + DRAIN_TIMEOUT_S
        while self.gate.in_flight > 0 and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        await self.server.close()
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, self.pool.shutdown)
        await loop.run_in_executor(None, self.appender.close)  # its fsync thread, after the last append
        self.pull_processor.compiler.shutdown()
        try:
            self.offsets.persist(force=True)
        except OSError:
            log.exception("could not persist consumer offsets")
        for table in (self.topics, self.subgroups):  # auto-created entries still on their saver's thread
            try:
                table.flush()
            except OSError:
                log.exception("could not save %s", table)
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
            await self.pool.run(self.dedup.rebuild, self.store, self.store.config.store_host)
            log.info("dedup window: %d keys from the commit log's tail in %.2f s", self.dedup.rebuilt,
                     time.monotonic() - t0)
        except Exception:
            log.exception("rebuilding the dedup window failed; replays older than this start are not caught")
        finally:
            self.dedup.open()

    async def _expire_filter_servers(self) -> None:
        self.filter_servers.expire()

    def _filtersrv_args(self) -> list[str]:
        """The children's `sluice filtersrv` flags from this broker's filter_* settings."""
        c = self.config
        args = ["--uploads" if c.filter_class_uploads else "--no-uploads",
                "--worker-cpu-seconds", str(c.filter_worker_cpu_seconds),
                "--worker-memory-mb", str(c.filter_worker_memory_mb),
                "--batch-deadline-ms", str(c.filter_batch_deadline_ms)]
        if c.filter_class_repository:
            args += ["--repository", str(Path(c.filter_class_repository).absolute())]
        if c.filter_class_repository_url:
            args += ["--repository-url", c.filter_class_repository_url]
        if c.acl:  # the broker's ACL guards its filter servers too
            args += ["--acl", str(Path(c.acl).absolute())]
        return args + filtersrv_tls_args(c.tls_mode, c.tls_cert, c.tls_key, c.tls_client_ca)

    async def _persist_offsets(self) -> None:
        await self.pool.run(self.offsets.persist)

    async def _expire_clients(self) -> None:
        self.stats.drop_idle()
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
                filter_servers=self.filter_servers.addresses())
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
        # First let the request that changed the table answer: its answer leaves at a flush scheduled after
        # this task's first step, which builds the whole table (a new push group's heartbeat waited 0.2-0.8 ms
        # for it).
        await asyncio.sleep(0)
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
        sg = self.subgroups.get(group)
        if sg is not None and not sg.notify_consumer_ids_changed_enable:  # the group's own setting
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
            "msgPutTotalTodayNow": self.appender.messages,  # every message stored, as RocketMQ's putMessageTimesTotal
            "msgGetTotalTodayNow": self.pull_processor.pulled_messages,
            "pullHeldCount": self.hold.held_count,
            "pullWokenByArrival": self.hold.woken_by_arrival,
            "pullTimedOut": self.hold.timed_out,
            "pullNotHeldOverLimit": self.hold.refused_full,  # max_held_pulls[_per_connection] reached
            "pullWakesDeferred": self.hold.wake_turns_deferred,  # max_held_pull_wakes_per_turn reached
            "consumerGroups": len(self.consumers.groups),
            "filterServers": ";".join(self.filter_servers.addresses()),  # registered with 301 (class filters)
            "filterServerRestarts": self.filter_server_children.restarts if self.filter_server_children else 0,
            "producerGroups": len(self.consumers.producers),
            "topics": len(self.topics.all()),
            "connections": len(self.server.connections),
            "connectionsRefused": self.server.refused,  # max_connections reached at accept
            "connectionsIdleClosed": self.server.idle_closed,  # server_channel_max_idle_time_seconds
            "frameBudgetReserved": self.server.budget.reserved,  # bytes of big frames being received (frame_budget)
            "frameBudgetWaiting": self.server.budget.waiting,  # connections paused until the budget frees
            **self.filter_data.totals(),
            **self.schedule.stats(),
            **self.transactions.stats(),  # delayed messages waiting (due or not) and moved
            **self.dedup.stats(),
            **{k: v for k, v in s.items()},
        }
