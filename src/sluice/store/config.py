"""StoreConfig: every knob of the storage engine, with the reason for its default."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from sluice.errors import InvalidParameterError

GiB = 1024 * 1024 * 1024
MiB = 1024 * 1024

#: The largest frame real clients accept (RocketMQ's NettyDecoder: 16 MiB); a pull answer's body stays below
#: it with room for the frame's header (the response's ext fields are a few hundred bytes).
MAX_FRAME = 16 * MiB
PULL_BODY_CEILING = MAX_FRAME - 64 * 1024
#: A stored record's bytes beyond its body at most: fixed fields, topic (< 128 bytes), properties (< 32 KiB).
RECORD_OVERHEAD_MAX = 33 * 1024


@dataclass(frozen=True, kw_only=True, slots=True)
class StoreConfig:
    #: RocketMQ's mappedFileSizeCommitLog; tests use 1-4 MiB to exercise roll-over.
    commitlog_file_size: int = 1 * GiB
    #: RocketMQ's default (300000 * 20 = 6,000,000 bytes per consume-queue file).
    consumequeue_units_per_file: int = 300_000
    #: RocketMQ's maxMessageSize: bodies above 4 MiB are refused.
    max_message_size: int = 4 * MiB
    #: 'async' is RocketMQ's default (ASYNC_FLUSH); 'sync' acks only after fsync.
    flush_mode: Literal["sync", "async"] = "async"
    #: RocketMQ's flushIntervalCommitLog.
    flush_interval_ms: int = 500
    #: How long a synchronous put waits for its fsync (RocketMQ's syncFlushTimeout).
    sync_flush_timeout_s: float = 5.0
    #: RocketMQ's fileReservedTime.
    retention_hours: float = 72.0
    #: How often the retention service looks (RocketMQ cleans every 10 s).
    retention_check_interval_s: float = 10.0
    #: RocketMQ's maxHashSlotNum / maxIndexNum.
    index_max_hash_slots: int = 5_000_000
    index_max_index_num: int = 20_000_000
    #: Build the key index at all (a broker may turn it off, as messageIndexEnable).
    index_enable: bool = True
    #: The address written into STOREHOST and offset message ids.
    store_host: tuple[str, int] = ("127.0.0.1", 10911)
    #: How often consume queues and the index are flushed and the checkpoint written (RocketMQ: 1 s).
    checkpoint_interval_ms: int = 1000
    #: Bytes of consume queue a filtered pull scans at most (RocketMQ's maxFilterMessageSize = 16000,
    #: i.e. 800 units); a very selective filter then answers NO_MATCHED_MESSAGE with an advanced offset.
    max_filter_scan_bytes: int = 16_000
    #: When a filtered pull's first window (above) matched nothing and units were being skipped on their
    #: tag codes or bitmaps alone (cheap: no commit-log reads), it scans further windows, up to this many
    #: units in all and this many milliseconds, so a very selective filter needs few round trips.
    max_filter_scan_units: int = 64 * 1024
    max_filter_scan_ms: float = 10.0
    #: ConsumeQueueExt files (bitmaps of SQL92-filtered topics): RocketMQ's mappedFileSizeConsumeQueueExt
    #: (sparse, so a queue with few units costs little disk) and the largest bitmap a unit may hold.
    consumequeue_ext_file_size: int = 48 * MiB
    consumequeue_ext_bitmap_max: int = 64
    #: Bytes a pull returns at most when the caller does not say (RocketMQ's maxTransferBytesOnMessageInMemory,
    #: 256 KiB; the broker's max_transfer_bytes caps what a client asks). Whatever the caller says, a pull
    #: never returns more than PULL_BODY_CEILING; the first record is served even when alone it is larger
    #: than the limit, as RocketMQ's isTheBatchFull does.
    max_transfer_bytes: int = 256 * 1024
    #: Check the body CRC of every record a pull serves (a damaged record is never served).
    verify_crc_on_read: bool = True
    #: Records the dispatcher reads per batch (bounds latency of each step and memory).
    dispatch_batch_bytes: int = 4 * MiB
    #: Bytes ahead of the commit log's write position kept in the page cache by the warming thread
    #: (store/warm.py), so page faults stay off the appending thread; with sync flush its zeros are made
    #: durable, so the fsyncs after appends write no extent changes. None: 16 MiB (4 MiB with sync flush,
    #: where each fsync waits for the durable zeros being written). 0: no warming.
    commitlog_warm_ahead: int | None = None
    #: Writes are refused (DiskFullError: SERVICE_NOT_AVAILABLE, reads go on) while the store's disk is more
    #: than this percent used (RocketMQ's diskMaxUsedSpaceRatio, 75) ...
    disk_max_used_space_ratio: int = 75
    #: ... or has fewer free bytes than this. 256 MiB keeps room for what the store must still write while
    #: it refuses sends: the consume-queue, index and ext chunks of messages already in the log (allocated
    #: 64 KiB - 4 MiB at a time), a new index file's slot table (20 MB at the default sizes), checkpoints
    #: and consumer offsets (replaced whole: a temporary copy), and the broker's log. 0 turns the floor off.
    disk_min_free_bytes: int = 256 * MiB
    #: How often the disk is sampled (statvfs; never per message). RocketMQ looks every 10 s; 1 s means at
    #: most a second of appends lands beyond a limit (the floor is sized for far more than that).
    disk_check_interval_s: float = 1.0
    #: Consume queues (and their ext files) kept open at once, least recently used first to close; a closed
    #: queue reopens on its next read or write. Each open queue file costs two descriptors (the store's and
    #: the duplicate Python's mmap keeps) and a mapping, so descriptors grow with the active queues, not
    #: with every queue that ever existed.
    max_open_queues: int = 1024

    def __post_init__(self) -> None:
        if self.commitlog_file_size < 64 * 1024:
            raise InvalidParameterError(f"commitlog_file_size {self.commitlog_file_size} is below 64 KiB")
        if self.max_message_size + 64 * 1024 > self.commitlog_file_size:
            raise InvalidParameterError(
                f"max_message_size {self.max_message_size} does not fit a commit-log file of "
                f"{self.commitlog_file_size} bytes with room for its header")
        if not 1 <= self.max_transfer_bytes <= PULL_BODY_CEILING:
            raise InvalidParameterError(
                f"max_transfer_bytes {self.max_transfer_bytes} must be 1..{PULL_BODY_CEILING} (a pull answer "
                f"must fit a {MAX_FRAME}-byte frame with its header: real clients refuse bigger frames)")
        if self.max_message_size + RECORD_OVERHEAD_MAX > PULL_BODY_CEILING:
            raise InvalidParameterError(
                f"max_message_size {self.max_message_size} is too large: a stored record of that body could "
                f"not be pulled in a frame under {MAX_FRAME} bytes (at most "
                f"{PULL_BODY_CEILING - RECORD_OVERHEAD_MAX})")
        if self.consumequeue_units_per_file < 1:
            raise InvalidParameterError("consumequeue_units_per_file must be positive")
        if self.flush_mode not in ("sync", "async"):
            raise InvalidParameterError(f"flush_mode must be 'sync' or 'async', not {self.flush_mode!r}")
        if self.flush_interval_ms <= 0 or self.checkpoint_interval_ms <= 0:
            raise InvalidParameterError("flush and checkpoint intervals must be positive")
        if not 0 < self.disk_max_used_space_ratio <= 100:
            raise InvalidParameterError(f"disk_max_used_space_ratio {self.disk_max_used_space_ratio} must be 1..100")
        if self.disk_min_free_bytes < 0 or self.disk_check_interval_s <= 0:
            raise InvalidParameterError("disk_min_free_bytes must be >= 0 and disk_check_interval_s positive")
        if self.max_open_queues < 1:
            raise InvalidParameterError(f"max_open_queues {self.max_open_queues} must be at least 1")
        if self.commitlog_warm_ahead is not None and self.commitlog_warm_ahead < 0:
            raise InvalidParameterError(f"commitlog_warm_ahead {self.commitlog_warm_ahead} is negative")
