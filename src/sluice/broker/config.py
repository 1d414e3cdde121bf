"""Broker settings: a TOML file (``--config``) overlaid by command-line flags, flags winning.

Every default says why it is what it is. Names are snake_case versions of
RocketMQ's BrokerConfig / MessageStoreConfig where one exists.
"""
from __future__ import annotations

import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from sluice.errors import InvalidParameterError
from sluice.logsetup import DEFAULT_BACKUPS as DEFAULT_LOG_BACKUPS
from sluice.logsetup import DEFAULT_MAX_BYTES as DEFAULT_LOG_MAX_BYTES
from sluice.logsetup import check_level
from sluice.metrics_http import parse_metrics_listen
from sluice.store.config import MAX_FRAME, PULL_BODY_CEILING
from sluice.transport.limits import DEFAULT_FRAME_BUDGET, DEFAULT_MAX_CONNECTIONS
from sluice.transport.tls import ClientTls, check_tls_mode
from sluice.errors import MessageIllegalError
from sluice.protocol.record import check_topic


def parse_address(text: str, *, what: str = "address") -> tuple[str, int]:
    """``HOST:PORT`` → (host, port), with an error that names the bad part."""
    host, sep, port = text.strip().rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise InvalidParameterError(f"{what} {text!r} is not HOST:PORT")
    return host.strip("[]"), int(port)


def parse_namesrv_list(text: str | None) -> list[str]:
    """``HOST:PORT;HOST:PORT`` (RocketMQ's separator) → list; commas are accepted too."""
    if not text:
        return []
    out = []
    for part in text.replace(",", ";").split(";"):
        if part.strip():
            host, port = parse_address(part, what="namesrv address")
            out.append(f"{host}:{port}")
    return out


#: Settings that name a file: relative in a TOML file, they are resolved against that file's folder (a flag's
#: relative path stays relative to the working directory, as any command-line path).
_FILE_SETTINGS = ("acl", "log_dir", "filter_class_repository", "tls_cert", "tls_key", "tls_client_ca", "namesrv_tls_ca",
                  "namesrv_tls_cert", "namesrv_tls_key")


@dataclass(frozen=True, kw_only=True)
class BrokerConfig:
    #: Where clients connect; RocketMQ's listenPort is 10911.
    listen: str = "127.0.0.1:10911"
    #: The namesrvs to register with; empty runs the broker alone (tests, embedded demo).
    namesrv: list[str] = field(default_factory=list)
    #: Store root directory.
    store: str = "./sluice-store"
    broker_name: str = "broker-a"
    cluster_name: str = "DefaultCluster"
    #: 0 is the master in RocketMQ; Sluice has no slaves yet.
    broker_id: int = 0
    #: 'async' is RocketMQ's default; 'sync' acknowledges a send only after fsync.
    flush: str = "async"
    #: On by default, as in RocketMQ's quick start (autoCreateTopicEnable).
    auto_create_topic: bool = True
    #: A heartbeat or send-back of an unknown consumer group creates its subscription group
    #: (autoCreateSubscriptionGroup, on in RocketMQ); off, such groups must be made with updateSubGroup first.
    auto_create_subscription_group: bool = True
    #: Queues of the auto-create topic TBW102 (RocketMQ's defaultTopicQueueNums on the broker is 8).
    default_topic_queue_nums: int = 8
    #: RocketMQ's enablePropertyFilter is false; Sluice filters by SQL92 out of the box.
    enable_property_filter: bool = True
    #: New (uncached) subscription compilations one client connection may start per minute; past it the
    #: pull or heartbeat is refused with SYSTEM_BUSY. Generous for real clients (one per subscription
    #: change), and it stops a client from keeping the compile thread busy with ever-new SQL92 selectors.
    max_selector_compiles_per_client_per_minute: int = 600
    #: Records one pull evaluates (SQL92 on properties) at most; the pull then answers what it has, with
    #: nextBeginOffset after the last record looked at. Bounds the CPU one pull takes, as
    #: max_filter_scan_units bounds its units.
    max_evaluations_per_pull: int = 4096
    #: Bloom-filter bitmaps at dispatch time (RocketMQ's enableCalcFilterBitMap); on by default in Sluice.
    enable_calc_filter_bitmap: bool = True
    #: Bloom sizing: expected consumers using filters and error rate in percent (RocketMQ's 32 and 20).
    expect_consumer_num_use_filter: int = 32
    max_error_rate_of_bloom_filter: int = 20
    #: Remove filter data that has been dead this long (RocketMQ's filterDataCleanTimeSpan, 24 h).
    filter_data_clean_time_span_ms: int = 24 * 3600 * 1000
    #: Hold pulls that found nothing until a message arrives (longPollingEnable); off = short polling.
    long_polling_enable: bool = True
    #: With long polling off, a pull is held this long at most (shortPollingTimeMills).
    short_polling_ms: int = 1000
    #: Serve pulls on the event loop: they read page-cache-resident mmap and take no store lock, and a
    #: thread hop costs more than the read (figures: docs/broker.md, benchmarks/produce_pull.py).
    #: Turn off when cold reads from a slow disk would stall other connections. Sends always use the pool.
    pull_on_event_loop: bool = True
    #: Held pulls are re-checked this often besides being woken by arrivals (PullRequestHoldService: 5 s).
    long_polling_check_ms: int = 5000
    #: Bytes one pull answer carries at most, whatever its maxMsgBytes (maxTransferBytesOnMessageInMemory,
    #: 256 KiB); the first record goes even when larger. Refused above 16 MiB - 64 KiB: real clients refuse
    #: frames over 16 MiB.
    max_transfer_bytes: int = 256 * 1024
    #: Messages one pull answer carries at most, whatever its maxMsgNums (RocketMQ's in-memory count is 32;
    #: 1024 is the largest pull_batch_size of Sluice's SDK, and max_transfer_bytes bounds the memory).
    max_transfer_count: int = 1024
    #: Pulls held (long polling) at most per connection and in all; a pull over either is answered
    #: PULL_NOT_FOUND at once, unheld (docs/broker.md). A client holds one per queue it consumes.
    max_held_pulls_per_connection: int = 4096
    max_held_pulls: int = 65_536
    #: Held pulls woken per event-loop iteration at most when a burst of messages matches many of them; the
    #: rest are woken in the next iterations, so other clients' requests are read and answered in between
    #: (each woken pull reads the store and answers on the loop). RocketMQ has no such bound.
    max_held_pull_wakes_per_turn: int = 256
    #: Broker → namesrv registration period (registerNameServerPeriod).
    register_namesrv_period_ms: int = 30_000
    #: Committed offsets are written to disk this often (flushConsumerOffsetInterval).
    persist_offsets_interval_ms: int = 5000
    #: Body size limit (maxMessageSize).
    max_message_size: int = 4 * 1024 * 1024
    #: Commit-log segment size (mappedFileSizeCommitLog); tests use small ones.
    commitlog_file_size: int = 1024 * 1024 * 1024
    #: Keep commit-log segments this long (fileReservedTime).
    retention_hours: float = 72.0
    #: Attempts before a message goes to %DLQ%: the retryMaxTimes of auto-created subscription groups
    #: (RocketMQ's SubscriptionGroupConfig default, 16); a group's own retryMaxTimes wins (updateSubGroup -r).
    max_reconsume_times: int = 16
    #: The 18 delay levels (messageDelayLevel).
    message_delay_level: str = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"
    #: Refuse transactional half messages with NO_PERMISSION (rejectTransactionMessage); off, as in RocketMQ.
    reject_transaction_message: bool = False
    #: A half message undecided this long after it was born is checked with its producer
    #: (transactionTimeOut: 6 s, the time a local transaction is given before the broker asks).
    transaction_timeout_ms: int = 6_000
    #: How often undecided half messages are looked at (transactionCheckInterval: 60 s).
    transaction_check_interval_ms: int = 60_000
    #: Checks before an undecided half message is given up (transactionCheckMax: 15), kept in
    #: TRANS_CHECK_MAX_TIME_TOPIC.
    transaction_check_max: int = 15
    #: Store replies (SEND_REPLY_MESSAGE) in ``<cluster>_REPLY_TOPIC`` besides pushing them to the requesting
    #: client (storeReplyMessageEnable: true), so they can be queried and traced like any message.
    store_reply_message_enable: bool = True
    #: Queue locks for orderly consumers expire after this (REBALANCE_LOCK_MAX_LIVE_TIME).
    rebalance_lock_max_live_ms: int = 60_000
    #: Sends whose producer group starts with one of these are checked for replays (broker/dedup.py); the
    #: Spark writer's groups are ``spark-sluice-writer-*``. Empty: no send is ever checked.
    dedup_producer_group_prefixes: tuple[str, ...] = ("spark-sluice-writer-",)
    #: A replay later than this (by store time) is stored again: covers a failed micro-batch retried after
    #: a driver or broker restart of a few minutes; longer windows mean a longer tail walk at broker start.
    dedup_window_seconds: float = 600.0
    #: At most this many keys in the window (oldest evicted first): ~0.5 KB each, so ~100 MB at the
    #: default, enough for a replayed micro-batch of 200,000 rows.
    dedup_window_keys: int = 200_000
    #: Backfill bitmaps (broker/backfill.py) held at most (bytes over every group and queue; 1 bit per message).
    backfill_max_bytes: int = 256 * 1024 * 1024
    #: A backfill upload is checked against the store (broker/backfill.py): the selector is evaluated on the
    #: records at this many random offsets the bitmap marks 0 (plus the first and last), so a forged bitmap
    #: hiding matches is caught with high probability while an upload reads a bounded number of records.
    backfill_verify_samples: int = 256
    #: At most this many topics are created by sends to unknown topics (broker/topics.py): each keeps files
    #: and a route entry for good, so a client sending to random names could otherwise exhaust descriptors
    #: and disk. Topics created by admin (UPDATE_AND_CREATE_TOPIC), retry and DLQ topics are not counted.
    max_auto_created_topics: int = 1000
    #: traceTopicEnable (off in RocketMQ): create ``msg_trace_topic_name`` (1 queue) at start, so clients
    #: with enable_trace find it even with auto_create_topic off. With auto-creation on, the first trace
    #: send creates it anyway; either way it is stored and key-indexed like any topic.
    trace_topic_enable: bool = False
    #: msgTraceTopicName.
    msg_trace_topic_name: str = "RMQ_SYS_TRACE_TOPIC"
    #: A RocketMQ 4.x ``plain_acl.yml`` (sluice.acl.policy); empty: no ACL, every request is served as before.
    acl: str = ""
    #: The account the broker signs its namesrv registrations with, for a namesrv run with ``--acl``
    #: (RocketMQ brokers carry one too); empty: unsigned, so the broker's address must be whitelisted there.
    acl_access_key: str = ""
    acl_secret_key: str = ""
    #: Bytes of frames over 256 KiB being received at once, over all connections: four 16 MiB batch sends; a
    #: connection whose frame does not fit stops reading until one completes (transport/limits.py).
    frame_budget: int = DEFAULT_FRAME_BUDGET
    #: Connections kept at once (one per client process); more are closed at accept with a log line.
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    #: A connection with no complete frame for this long, and no request of its own still being served
    #: (a held pull counts), is closed: RocketMQ's serverChannelMaxIdleTimeSeconds (120). 0 never closes.
    server_channel_max_idle_time_seconds: float = 120.0
    #: RocketMQ's TlsMode (tls.server.mode; transport/tls.py) for the broker's port: "disabled" keeps today's
    #: plain TCP (and no per-connection TLS work); "permissive" serves TLS and plain clients on the one port,
    #: told apart by their first byte; "enforcing" closes plain clients. RocketMQ defaults to permissive
    #: with a self-signed certificate; Sluice stays plain until given a certificate clients can check.
    tls_mode: str = "disabled"
    #: PEM files of the broker's certificate chain and private key (tls.server.certPath / keyPath); needed
    #: by permissive and enforcing.
    tls_cert: str = ""
    tls_key: str = ""
    #: Mutual TLS (tls.server.need.client.auth = require, tls.server.trustCertPath): TLS clients must present a
    #: certificate this CA file signed; empty asks for none (client identity is then the ACL's job).
    tls_client_ca: str = ""
    #: Connect to the namesrvs over TLS (for registration; tls.client.*): off by default, as the namesrv's
    #: own tls_mode is. namesrv_tls_ca: the CA file their certificates are checked with (empty: the system's
    #: CAs); namesrv_tls_server_name: the name checked (empty: each namesrv's host); namesrv_tls_verify: false
    #: skips the check (testing only: it gives up namesrv authentication).
    namesrv_tls: bool = False
    namesrv_tls_ca: str = ""
    namesrv_tls_server_name: str = ""
    namesrv_tls_verify: bool = True
    #: The broker's own certificate and key for namesrvs that require one (their tls_client_ca); empty: none.
    namesrv_tls_cert: str = ""
    namesrv_tls_key: str = ""
    #: Sends are refused (SERVICE_NOT_AVAILABLE, "service not available now, maybe disk full" with the
    #: figures; pulls and commits go on) while the store's disk is more than this percent used: RocketMQ's
    #: diskMaxUsedSpaceRatio (75), which keeps room for the page cache's write-back and for operators to act.
    disk_max_used_space_ratio: int = 75
    #: ... or has fewer free bytes than this: room for what the broker must still write while it refuses
    #: sends (consume-queue and index chunks of messages already stored, a new index file's 20 MB slot
    #: table, checkpoints, consumer offsets replaced whole, its log). 0 turns the floor off.
    disk_min_free_bytes: int = 256 * 1024 * 1024
    #: How often the disk is sampled (statvfs on a timer, never per message).
    disk_check_interval_s: float = 1.0
    #: Consume queues (with their ext files) kept open at once; the least recently used are closed and
    #: reopen on their next read or write, so descriptors grow with the active queues, not with every
    #: queue that ever existed (each open consume-queue file holds two: the store's and the duplicate
    #: Python's mmap keeps).
    max_open_queues: int = 1024
    #: Filter servers (`sluice filtersrv`, class-filter mode) the broker runs as child processes and restarts
    #: when they exit; 0, as RocketMQ's filterServerNums: class filters are opt-in, each server costs a process.
    filter_server_nums: int = 0
    #: Let consumers upload filter-class source to those filter servers: off, because uploaded code is code
    #: from anyone who can reach the port; classes then come from filter_class_repository.
    filter_class_uploads: bool = False
    #: The directory of filter-class modules the filter servers load ('mod:Cls' is DIR/mod.py); None: none.
    filter_class_repository: str | None = None
    #: A base URL of filter-class modules ('mod:Cls' is URL/mod.py), read where the directory has none.
    filter_class_repository_url: str | None = None
    #: CPU seconds a filter class may spend on one pulled batch (RLIMIT_CPU in its worker): far above what
    #: a predicate over a 32-message batch needs, short enough that a spinning class frees its core soon.
    filter_worker_cpu_seconds: float = 5.0
    #: Address space of a filter worker, MiB (RLIMIT_AS): an interpreter, the decoded batch and a class's
    #: own tables fit many times over; a class that hoards memory fails alone instead of swapping the host.
    filter_worker_memory_mb: int = 512
    #: Wall time a filter class may take on one batch before its worker is killed: within the consumer's
    #: pull timeout (RocketMQ clients wait 30 s on a suspended pull, 15 s of which the broker may hold it).
    filter_batch_deadline_ms: int = 5000
    #: Serve Prometheus text at http://HOST:PORT/metrics (metrics.py); empty: no endpoint, and the hot path
    #: pays nothing for metrics. Bound exactly as given: 127.0.0.1 keeps it local.
    metrics_listen: str = ""
    #: The lag side of a scrape (group diffs, filtered diffs, consumer and topic offsets, latency by store
    #: time) reads consume queues and counts every group's filtered lag: it is computed at most once per this
    #: many seconds and served from the last computation in between (a scrape that finds it due starts the
    #: next count and gets the last one; 0: every scrape counts and waits). rocketmq-exporter collects these
    #: once a minute; Prometheus scrapes every 15 s by default.
    metrics_lag_refresh_s: float = 15.0
    #: Root log level (DEBUG, INFO, WARNING, ERROR); the SLUICE_LOG_LEVEL environment variable when unset.
    log_level: str = ""
    #: A directory for broker.log, rotated by size (logsetup.py); empty: stderr only, as before.
    log_dir: str = ""
    #: Bytes of broker.log before it rotates, and how many old files are kept: 64 MiB x 10 bounds the directory.
    log_max_bytes: int = DEFAULT_LOG_MAX_BYTES
    log_backups: int = DEFAULT_LOG_BACKUPS

    @property
    def host_port(self) -> tuple[str, int]:
        return parse_address(self.listen, what="listen address")

    @property
    def namesrv_client_tls(self) -> ClientTls | None:
        """How the broker's namesrv connections use TLS; None: plain."""
        if not self.namesrv_tls:
            return None
        return ClientTls(ca=self.namesrv_tls_ca or None, server_name=self.namesrv_tls_server_name or None,
                         verify=self.namesrv_tls_verify, cert=self.namesrv_tls_cert or None,
                         key=self.namesrv_tls_key or None)

    def validate(self) -> BrokerConfig:
        self.host_port  # noqa: B018 - raises on a bad address
        for ns in self.namesrv:
            parse_address(ns, what="namesrv address")
        if self.flush not in ("sync", "async"):
            raise InvalidParameterError(f"flush must be 'sync' or 'async', got {self.flush!r}")
        if self.broker_id != 0:
            raise InvalidParameterError("only master brokers (broker_id = 0) are supported")
        if bool(self.acl_access_key) != bool(self.acl_secret_key):
            raise InvalidParameterError("acl_access_key and acl_secret_key are given together or not at all")
        if self.dedup_window_seconds <= 0 or self.dedup_window_keys < 1:
            raise InvalidParameterError("dedup_window_seconds and dedup_window_keys must be positive")
        if isinstance(self.dedup_producer_group_prefixes, (str, list)):  # TOML gives lists, flags strings
            prefixes = self.dedup_producer_group_prefixes
            object.__setattr__(self, "dedup_producer_group_prefixes",
                               tuple(prefixes.split(",") if isinstance(prefixes, str) else prefixes))
        if self.frame_budget < 1 or self.max_connections < 1:
            raise InvalidParameterError("frame_budget and max_connections must be positive")
        object.__setattr__(self, "tls_mode", check_tls_mode(self.tls_mode))
        if self.tls_mode != "disabled" and not (self.tls_cert and self.tls_key):
            raise InvalidParameterError(f"tls_mode {self.tls_mode} needs tls_cert and tls_key (PEM files)")
        if not self.namesrv_tls and (self.namesrv_tls_ca or self.namesrv_tls_server_name or self.namesrv_tls_cert):
            raise InvalidParameterError("namesrv_tls_ca / namesrv_tls_server_name / namesrv_tls_cert are set but "
                                        "namesrv_tls is off")
        if self.tls_client_ca and self.tls_mode == "disabled":
            raise InvalidParameterError("tls_client_ca needs tls_mode permissive or enforcing")
        if self.filter_server_nums < 0 or self.filter_worker_cpu_seconds <= 0 or self.filter_worker_memory_mb < 0 \
                or self.filter_batch_deadline_ms <= 0:
            raise InvalidParameterError("filter_server_nums, filter_worker_memory_mb must not be negative and "
                                        "filter_worker_cpu_seconds, filter_batch_deadline_ms must be positive")
        if self.server_channel_max_idle_time_seconds < 0:
            raise InvalidParameterError("server_channel_max_idle_time_seconds must not be negative (0: never)")
        if not 1 <= self.max_transfer_bytes <= PULL_BODY_CEILING:
            raise InvalidParameterError(
                f"max_transfer_bytes {self.max_transfer_bytes} must be 1..{PULL_BODY_CEILING}: a pull answer must "
                f"fit a {MAX_FRAME}-byte frame with its header (real clients refuse bigger frames)")
        if self.max_transfer_count < 1:
            raise InvalidParameterError(f"max_transfer_count {self.max_transfer_count} must be positive")
        if self.max_held_pulls_per_connection < 0 or self.max_held_pulls < 0:
            raise InvalidParameterError("max_held_pulls_per_connection and max_held_pulls must not be negative")
        if self.max_held_pull_wakes_per_turn < 1:
            raise InvalidParameterError("max_held_pull_wakes_per_turn must be positive")
        if self.max_selector_compiles_per_client_per_minute < 1 or self.max_evaluations_per_pull < 1:
            raise InvalidParameterError("max_selector_compiles_per_client_per_minute and max_evaluations_per_pull "
                                        "must be positive")
        if self.transaction_timeout_ms < 0 or self.transaction_check_interval_ms < 1 or self.transaction_check_max < 1:
            raise InvalidParameterError("transaction_timeout_ms must not be negative; transaction_check_interval_ms "
                                        "and transaction_check_max must be positive")
        if self.metrics_listen:
            parse_metrics_listen(self.metrics_listen)
        if not self.metrics_lag_refresh_s >= 0:
            raise InvalidParameterError(f"metrics_lag_refresh_s must be 0 or more, got {self.metrics_lag_refresh_s}")
        if self.log_level:
            object.__setattr__(self, "log_level", check_level(self.log_level))
        if self.log_max_bytes < 1 or self.log_backups < 0:
            raise InvalidParameterError("log_max_bytes must be positive and log_backups not negative")
        if not 1 <= self.max_error_rate_of_bloom_filter < 100:
            raise InvalidParameterError("max_error_rate_of_bloom_filter must be 1..99 (percent)")
        try:
            check_topic(self.msg_trace_topic_name)
        except MessageIllegalError as exc:
            raise InvalidParameterError(f"msg_trace_topic_name: {exc}") from None
        return self

    @classmethod
    def load(cls, path: str | Path | None = None, **overrides: Any) -> BrokerConfig:
        """Read a TOML file (keys as the field names, top level or under ``[broker]``), then apply overrides.

        Overrides that are None are ignored, so unset command-line flags do not win. A relative ``acl`` path
        in the file is resolved against the file's folder.
        """
        values: dict[str, Any] = {}
        if path is not None:
            try:
                doc = tomllib.loads(Path(path).read_text())
            except (OSError, tomllib.TOMLDecodeError) as e:
                raise InvalidParameterError(f"cannot read broker config {path}: {e}") from None
            values.update(doc.get("broker", doc))
            base = Path(path).absolute().parent
            for key in _FILE_SETTINGS:  # a relative path in the file names a file beside it, not in the cwd
                if isinstance(values.get(key), str) and values[key] and not Path(values[key]).is_absolute():
                    values[key] = str(base / values[key])
        values.update({k: v for k, v in overrides.items() if v is not None})
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise InvalidParameterError(f"unknown broker setting(s): {', '.join(unknown)}")
        if isinstance(values.get("namesrv"), str):
            values["namesrv"] = parse_namesrv_list(values["namesrv"])
        return cls(**values).validate()
