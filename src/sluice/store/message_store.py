"""MessageStore: the facade the broker uses (RocketMQ's DefaultMessageStore).

On-disk layout under ``root_dir``::

    commitlog/{20-digit offset}                  records, fixed-size segments
    consumequeue/{topic}/{queueId}/{20 digits}   20-byte units
    consumequeue_ext/{topic}/{queueId}/{20 dig.} filter bitmaps of SQL92-filtered topics (ext_files.py)
    index/{yyyyMMddHHmmssSSS}                    key index files
    checkpoint                                   what is durable (checkpoint.py)
    abort                                        present while open: its presence at start means a crash
    lock                                         flock'd while open: one process per store
    store.json                                   the layout settings the files depend on (file sizes)
    commitlog-tails/                             bytes cut from a torn tail, kept for forensics

Thread-safe: appends serialise on the commit log's lock; reads take no store
lock (files are only unmapped by retention, and a read of a vanished file
answers as "removed").
"""
from __future__ import annotations

import fcntl
import logging
import os
import threading
import time
from collections.abc import Sequence
from itertools import repeat
from pathlib import Path

import orjson

from sluice.errors import CorruptRecordError, DiskFullError, FlushDiskTimeoutError, StoreError
from sluice.message import MessageExt
from sluice.persist import fsync_dir, write_atomic
from sluice.protocol import properties as P
from sluice.protocol.msgid import decode_offset_msg_id, offset_msg_id_prefix
from sluice.protocol.record import decode_record
from sluice.speedups import C
from sluice.store.check import rebuild_queue_from_log
from sluice.store.checkpoint import Checkpoint, load_checkpoint, save_checkpoint
from sluice.store.commitlog import SYNC_WARM_AHEAD, WARM_AHEAD, CommitLog, verify_record_bytes
from sluice.store.config import StoreConfig
from sluice.store.consumequeue import PAD_SIZE, ConsumeQueueTable
from sluice.ratelog import RateLimitedLog
from sluice.store.diskspace import DiskGuard
from sluice.store.dispatch import DispatchService
from sluice.store.dispatch_columns import PutRun
from sluice.store.encode import EncodedBatch, encode_batch
from sluice.store.background_flush import BackgroundFlush
from sluice.store.flush import FlushService
from sluice.store.group_commit import GroupCommit
from sluice.store.index import IndexService
from sluice.store.ext_files import ExtTable
from sluice.store.pull_read import PullReader, locate
from sluice.store.recovery import CheckReport, Recovery, RecoveryReport
from sluice.store.retention import Retention, RetentionResult
from sluice.store.types import (
    Dispatcher,
    GetMessageResult,
    GetMessageStatus,
    MessageFilter,
    PutResult,
    StoreMessage,
)

log = logging.getLogger(__name__)

_S = GetMessageStatus
_MAX_TS = (1 << 63) - 1


class MessageStore:
    def __init__(self, root_dir: str | os.PathLike[str], config: StoreConfig | None = None) -> None:
        self.root = Path(root_dir)
        self.config = config or StoreConfig()
        c = self.config
        warm = c.commitlog_warm_ahead
        if warm is None:
            warm = WARM_AHEAD if c.flush_mode == "async" else SYNC_WARM_AHEAD
        self.commitlog = CommitLog(self.root / "commitlog", c.commitlog_file_size, warm_ahead=warm,
                                   write_by_fd=c.flush_mode == "sync", durable_warm=c.flush_mode == "sync")
        self.queues = ConsumeQueueTable(self.root / "consumequeue", c.consumequeue_units_per_file,
                                        max_open=c.max_open_queues)
        self.index: IndexService | None = (
            IndexService(self.root / "index", max_hash_slots=c.index_max_hash_slots,
                         max_index_num=c.index_max_index_num) if c.index_enable else None)
        self.dispatch = DispatchService(self.commitlog, self.queues, self.index, batch_bytes=c.dispatch_batch_bytes)
        self.ext = ExtTable(self.root / "consumequeue_ext", file_size=c.consumequeue_ext_file_size,
                            bitmap_bytes_max=c.consumequeue_ext_bitmap_max, lru=self.queues.lru)
        self.dispatch.ext = self.ext
        self.flusher = FlushService(self.commitlog, interval_ms=c.flush_interval_ms, timeout_s=c.sync_flush_timeout_s)
        self.group_commit = GroupCommit(self._append_now, self.flusher, c.sync_flush_timeout_s)
        self.reader = PullReader(self.commitlog, self.queues, self.ext, c)
        self.recovery = Recovery(self.root, self.commitlog, self.queues, self.ext, self.index)
        self.retention = Retention(self.commitlog, self.queues, self.ext, self.index, c)
        self.recovery_report: RecoveryReport | None = None
        #: Refuses puts while the disk is too full (diskspace.py); sampled by the maintenance thread.
        self.disk = DiskGuard(self.root, max_used_ratio=c.disk_max_used_space_ratio,
                              min_free_bytes=c.disk_min_free_bytes)
        self.dispatch.on_space_error = self.disk.space_error
        self._maint_log = RateLimitedLog(log, 30.0)
        self._msgid_prefix = offset_msg_id_prefix(*c.store_host)
        self._msgid_prefix_hex = self._msgid_prefix.hex().upper()
        self._msgid_format = self._msgid_prefix_hex + "%016X"  # + the commit-log offset
        self._sync = c.flush_mode == "sync"
        self._open = False
        self._was_closed = False
        self._lock_fd: int | None = None
        self._stop = threading.Event()
        self._maint: threading.Thread | None = None
        self._ckpt_lock = threading.Lock()
        self._last_retention = 0.0
        self.disk_checked_at = 0.0
        self.put_count = 0
        self.put_bytes = 0

    # ---- lifecycle ---------------------------------------------------------------------------------
    @property
    def abort_path(self) -> Path:
        return self.root / "abort"

    @property
    def checkpoint_path(self) -> Path:
        return self.root / "checkpoint"

    @property
    def pull_records_read(self) -> int:
        """Commit-log records read by pulls (served or evaluated and filtered out)."""
        return self.reader.records_read

    @property
    def pull_bytes_read(self) -> int:
        """The bytes of the records counted by ``pull_records_read``."""
        return self.reader.bytes_read

    def start(self) -> MessageStore:
        """Open the files, recover, catch dispatch up, and start the service threads."""
        if self._open:
            return self
        if self._was_closed:
            raise StoreError("a closed MessageStore cannot be started again; create a new one")
        self.root.mkdir(parents=True, exist_ok=True)
        self._take_lock()
        try:
            self._check_layout()
            self._load_and_recover()
        except BaseException:
            self._close_files()
            self._release_lock()
            raise
        self._write_abort()
        self.disk.check()  # a store opened on a full disk refuses its first put already
        self._open = True
        self._stop.clear()
        self.dispatch.start()
        if not self._sync:
            self.flusher.start_async()
        self._maint = threading.Thread(target=self._maintain, name="sluice-store-maintenance", daemon=True)
        self._maint.start()
        return self

    open = start

    def _take_lock(self) -> None:
        fd = os.open(self.root / "lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise StoreError(f"store {self.root} is open in another process") from None
        self._lock_fd = fd

    def _release_lock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def _check_layout(self) -> None:
        """Refuse a config whose file sizes differ from the ones the files were written with."""
        want = layout_of(self.config)
        path = self.root / LAYOUT_FILE
        if path.exists():
            have = read_layout(self.root)
            diff = {k: (have.get(k), v) for k, v in want.items() if have.get(k) != v}
            if diff:
                raise StoreError(f"store {self.root} was created with a different layout: " + ", ".join(
                    f"{k}={a} (config says {b})" for k, (a, b) in diff.items()))
            return
        write_atomic(path, orjson.dumps(want, option=orjson.OPT_INDENT_2))

    def _load_and_recover(self) -> None:
        abnormal = self.abort_path.exists()
        cp = load_checkpoint(self.checkpoint_path)
        cl = self.commitlog
        cl.load()
        self.queues.load()
        self.ext.load()
        if self.index is not None:
            self.index.load(trusted_offset=cp.index_offset if cp is not None else -1)
        rep = self.recovery.recover(cp, abnormal)
        end = cl.write_pos
        if abnormal or rep.cut_bytes or rep.queues_truncated:
            log.warning("store %s recovered: %s", self.root, rep)
        self.dispatch.reput_offset = rep.reput_from
        self.dispatch.reput()
        cl.queue_offsets = {(cq.topic, cq.queue_id): cq.max_offset for cq in self.queues.all()}
        cl.last_store_timestamp = cp.commitlog_time if cp else 0
        # Bytes that survived a crash in the page cache may not be on disk yet: make them durable now.
        if abnormal:
            self.flusher.reset(min(cp.commitlog_offset, end) if cp is not None else cl.min_offset)
        else:
            self.flusher.reset(end)
        self.flusher.flush()
        self.recovery_report = rep
        try:
            self._checkpoint()
        except (OSError, DiskFullError) as e:
            # A full disk must not keep the store from opening: the last checkpoint stays valid (recovery
            # repeats what it did), and the maintenance thread writes a new one once there is room.
            log.error("store %s: no checkpoint written at open (%s); reads are served, writes wait for room",
                      self.root, e)

    def _write_abort(self) -> None:
        fd = os.open(self.abort_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        fsync_dir(self.root)

    def close(self) -> None:
        """Clean shutdown: dispatch the rest, flush, checkpoint, remove the abort file."""
        if not self._open:
            return
        self._open = False
        self._was_closed = True
        self._stop.set()
        if self._maint is not None:
            self._maint.join()
            self._maint = None
        self.dispatch.stop()
        self.flusher.stop()
        clean = True
        try:
            self.dispatch.reput()
            self.flusher.flush()
            self._checkpoint()
        except (DiskFullError, OSError) as e:
            # A full disk: the abort file stays, so the next start recovers (re-dispatches) what is missing.
            clean = False
            log.error("store %s closed without its final dispatch or checkpoint (%s); the next start recovers",
                      self.root, e)
        finally:
            self._close_files()
            if clean and self.dispatch.error is None:
                try:
                    self.abort_path.unlink()
                except FileNotFoundError:
                    pass
                fsync_dir(self.root)
            self._release_lock()

    def _close_files(self) -> None:
        self.ext.close()
        self.queues.close()
        if self.index is not None:
            self.index.close()
        self.commitlog.close()

    def __enter__(self) -> MessageStore:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check_open(self) -> None:
        if not self._open:
            raise StoreError(f"store {self.root} is not open")

    # ---- services ----------------------------------------------------------------------------------
    def _checkpoint(self) -> None:
        with self._ckpt_lock:
            dispatched = self.dispatch.reput_offset  # before flushing: units below it are in the queues
            self.ext.flush()  # before the units that point into it
            self.queues.flush()
            index_offset = -1
            if self.index is not None:
                # Read before the flush: everything up to it is then durable (the index's next start
                # trusts entries up to it, IndexFile.repair), whatever dispatch adds meanwhile.
                index_offset = self.index.max_indexed_offset()
                self.index.flush()
            save_checkpoint(self.checkpoint_path, Checkpoint(
                commitlog_offset=self.flusher.flushed_offset, commitlog_time=self.flusher.flush_time,
                dispatch_offset=dispatched, index_offset=index_offset, min_offset=self.commitlog.min_offset))

    def _maintain(self) -> None:
        c = self.config
        ckpt_s = c.checkpoint_interval_ms / 1000.0
        disk_s = c.disk_check_interval_s
        last_ckpt = time.monotonic()
        while not self._stop.wait(min(ckpt_s, disk_s)):
            if not self._open:  # closing: close() checkpoints itself
                break
            now = time.monotonic()
            if now - self.disk_checked_at >= disk_s:
                self.disk_checked_at = now
                self.disk.check()
            if now - last_ckpt < ckpt_s:
                continue
            last_ckpt = now
            try:
                self._checkpoint()
                if time.monotonic() - self._last_retention >= c.retention_check_interval_s:
                    self._last_retention = time.monotonic()
                    self.delete_expired_files()
            except DiskFullError as e:  # keep the service alive; the next tick retries
                self._maint_log(logging.ERROR, "store maintenance: %s", e)
            except OSError as e:  # ENOSPC from a checkpoint replaced whole, say: once a while, not every tick
                self._maint_log(logging.ERROR, "store maintenance failed: %s", e)
            except Exception:
                if not self._open:  # close() began mid-tick (retention then finds the store closed): not a fault
                    break
                log.exception("store maintenance failed")

    def add_dispatcher(self, dispatcher: Dispatcher) -> None:
        """Register a dispatcher; it runs before the consume queues are written. Register before start()
        to see the records replayed by recovery."""
        self.dispatch.add_dispatcher(dispatcher)

    def wait_dispatched(self, timeout: float = 5.0) -> bool:
        """Block until everything appended so far is visible to readers."""
        return self.dispatch.wait_for(self.commitlog.write_pos, timeout)

    def delete_expired_files(self, now: float | None = None) -> RetentionResult:
        """Apply retention at ``now`` (seconds since the epoch; default the current time). Only what is
        flushed and dispatched may go."""
        self._check_open()
        now_ms = int((time.time() if now is None else now) * 1000)
        return self.retention.delete_expired(now_ms, min(self.dispatch.reput_offset, self.flusher.flushed_offset))

    def check(self, fix: bool = False) -> CheckReport:
        """Verify the whole store (every record's CRC, every unit, the index); ``fix`` rebuilds bad queues."""
        self._check_open()
        self.dispatch.reput()
        return self.recovery.check(self.rebuild_queue if fix else None)

    def rebuild_queue(self, topic: str, queue_id: int) -> None:
        """Throw away one consume queue and rebuild it from the commit log.

        Its ConsumeQueueExt goes too; dispatchers whose ``rebuilds_bitmaps`` is true (the broker's bitmap
        calculator) see the records again, so SQL92-filtered queues get fresh bitmaps and ext units."""
        with self.dispatch._run_lock:  # streamed in batches (store/check.py)
            rebuild_queue_from_log(self.commitlog, self.dispatch, self.queues, self.ext, topic, queue_id)

    # ---- writes ------------------------------------------------------------------------------------
    def put_message(self, msg: StoreMessage) -> PutResult:
        return self.put_messages([msg])[0]

    @property
    def sync_flush(self) -> bool:
        """True when a put is acknowledged only once its bytes are durable (flush_mode "sync")."""
        return self._sync

    def put_messages(self, batch: Sequence[StoreMessage], *, wait_durable: bool = True) -> list[PutResult]:
        """Append a batch for one topic/queue; every message is validated before anything is written.

        With synchronous flush this returns once the batch is durable, unless ``wait_durable`` is false:
        then the caller must call :meth:`wait_durable` before acknowledging it (the broker appends on its
        event loop and waits for the group commit on a pool thread)."""
        if not batch:
            return []
        if self._sync and wait_durable:  # one writer appends and fsyncs for all waiting ones (group_commit.py)
            return self.group_commit.put(batch)
        enc = encode_batch(batch, store_host=self.config.store_host, max_body=self.config.max_message_size)
        return self.put_encoded(batch[0].topic, batch[0].queue_id, enc, wait_durable=wait_durable)

    def put_encoded(self, topic: str, qid: int, enc: EncodedBatch, *, wait_durable: bool = True) -> list[PutResult]:
        """put_messages for records encoded already (encode.encode_batch or encode_batch_body)."""
        self._check_open()
        if self.disk.refusal is not None:  # one attribute per put: statvfs runs on the maintenance timer
            raise self.disk.refuse()
        # Dispatch gets the records' columns (no per-message objects; properties as stored, decoded only
        # if a dispatcher asks), so it need not parse the records back.
        run = PutRun(topic, qid, enc.sizes, enc.sysflags, enc.props, enc.tags, enc.keys, enc.uniq,
                     all_queued=enc.queued is None)
        try:
            phys, qoffs, ts, end = self.commitlog.append(enc.buf, enc.sizes, topic, qid, enc.ts_positions,
                                                         enc.queued, run)
        except DiskFullError as e:  # nothing was written; later puts are refused until the disk has room
            raise self.disk.space_error(e) from None
        # tuple.__new__ over zip: PutResults built in C (a NamedTuple's own __new__ is Python code).
        ids = C.offset_msg_ids(self._msgid_prefix_hex, phys) if C is not None and type(phys) is list \
            else map(self._msgid_format.__mod__, phys)
        results = list(map(tuple.__new__, repeat(PutResult), zip(phys, qoffs, ids, repeat(ts), enc.sizes)))
        self.put_count += len(phys)
        self.put_bytes += end - phys[0]
        if self._sync and wait_durable:
            try:
                self.flusher.wait_flushed(end)
            except FlushDiskTimeoutError as e:
                e.results = results  # stored, not confirmed durable: RocketMQ answers FLUSH_DISK_TIMEOUT
                raise
        return results

    def _append_now(self, batch: Sequence[StoreMessage]) -> list[PutResult]:
        return self.put_messages(batch, wait_durable=False)

    def wait_durable(self, end: int) -> None:
        """Block until commit-log bytes below ``end`` are durable (at once with asynchronous flush);
        FlushDiskTimeoutError after the flush timeout."""
        if self._sync:
            self.flusher.wait_flushed(end)

    def background_flush(self) -> BackgroundFlush:
        """Fsyncs asked for without waiting, each round's end signalled on an eventfd (background_flush.py):
        how an event loop waits for synchronous flush."""
        self._check_open()
        return BackgroundFlush(self.flusher)

    # ---- reads -------------------------------------------------------------------------------------
    def get_messages(self, topic: str, queue_id: int, offset: int, max_msgs: int = 32,
                     message_filter: MessageFilter | None = None, max_bytes: int | None = None,
                     scan_units: int = 0) -> GetMessageResult:
        """A pull: up to ``max_msgs`` records from queue ``offset`` that pass ``message_filter``, a filtered
        one looking at ``scan_units`` units when that is more than the store's window (pull_read.py)."""
        self._check_open()
        return self.reader.get_messages(topic, queue_id, offset, max_msgs, message_filter, max_bytes, scan_units)

    def read_record(self, commitlog_offset: int) -> bytes | None:
        """The raw stored record at a commit-log offset (CRC-checked), or None when there is none."""
        self._check_open()
        data = self.commitlog.read_record(commitlog_offset)
        if data is not None:
            try:
                verify_record_bytes(data, commitlog_offset)
            except CorruptRecordError as e:
                raise locate(self.commitlog, e, commitlog_offset) from None
        return data

    def get_message_by_offset(self, commitlog_offset: int) -> MessageExt | None:
        data = self.read_record(commitlog_offset)
        if data is None:
            return None
        return MessageExt.from_record(decode_record(data, where=f"commitlog offset {commitlog_offset}"))

    def get_message_by_id(self, offset_msg_id: str) -> MessageExt | None:
        """Look a message up by its offset message id (store host + commit-log offset)."""
        return self.get_message_by_offset(decode_offset_msg_id(offset_msg_id).offset)

    def query_messages_by_key(self, topic: str, key: str, max_num: int = 32, begin_ts: int = 0,
                              end_ts: int = _MAX_TS) -> list[MessageExt]:
        """Messages of ``topic`` whose KEYS hold ``key`` or whose UNIQ_KEY is ``key``, newest first."""
        self._check_open()
        if self.index is None or max_num <= 0:
            return []
        self.dispatch.index_deferred()  # the entries of messages already dispatched (and answered) first
        out: list[MessageExt] = []
        # Ask for more candidates than wanted: hash collisions are dropped below.
        for off in self.index.query_offsets(topic, key, max_num * 2 + 16, begin_ts, end_ts):
            try:
                m = self.get_message_by_offset(off)
            except CorruptRecordError as e:
                log.error("key query %s#%s: %s", topic, key, e)
                continue
            if m is None or m.topic != topic:
                continue
            if key in m.keys or m.properties.get(P.UNIQ_KEY) == key:
                out.append(m)
                if len(out) >= max_num:
                    break
        return out

    def get_min_offset(self, topic: str, queue_id: int) -> int:
        cq = self.queues.get(topic, queue_id)
        return cq.min_offset if cq else 0

    def get_max_offset(self, topic: str, queue_id: int) -> int:
        cq = self.queues.get(topic, queue_id)
        return cq.max_offset if cq else 0

    def _store_time_of(self, cq, qoff: int) -> int | None:
        u = cq.unit(qoff)
        if u is None or not 0 < u[1] < PAD_SIZE:
            return None
        return self.commitlog.store_timestamp_at(u[0])

    def get_offset_by_timestamp(self, topic: str, queue_id: int, timestamp: int) -> int:
        """The first queue offset whose store time is >= ``timestamp`` (max offset if none; binary search)."""
        self._check_open()
        cq = self.queues.get(topic, queue_id)
        if cq is None:
            return 0
        lo, hi = cq.min_offset, cq.max_offset
        while lo < hi:
            mid = (lo + hi) // 2
            ts = self._store_time_of(cq, mid)
            if ts is None:  # padding or removed: everything at or below is older than anything kept
                lo = mid + 1
            elif ts < timestamp:
                lo = mid + 1
            else:
                hi = mid
        return lo

    def get_earliest_message_time(self, topic: str | None = None, queue_id: int = 0) -> int:
        """Store time of the oldest message (of one queue, or of the whole store); -1 when there is none."""
        self._check_open()
        if topic is None:
            cl = self.commitlog
            if cl.write_pos <= cl.min_offset:
                return -1
            ts = cl.store_timestamp_at(cl.min_offset)
            return -1 if ts is None else ts
        cq = self.queues.get(topic, queue_id)
        if cq is None or cq.max_offset <= cq.min_offset:
            return -1
        ts = self._store_time_of(cq, cq.min_offset)
        return -1 if ts is None else ts

    def topic_queues(self) -> dict[str, list[int]]:
        """Every topic the store holds, with its queue ids."""
        out: dict[str, list[int]] = {}
        for cq in self.queues.all():
            out.setdefault(cq.topic, []).append(cq.queue_id)
        return {t: sorted(q) for t, q in sorted(out.items())}

    def stats(self) -> dict[str, object]:
        cl = self.commitlog
        return {
            "commitlog_min_offset": cl.min_offset,
            "commitlog_max_offset": cl.write_pos,
            "commitlog_flushed_offset": self.flusher.flushed_offset,
            "commitlog_segments": len(cl.queue.files),
            "dispatch_offset": self.dispatch.reput_offset,
            "dispatch_behind_bytes": cl.write_pos - self.dispatch.reput_offset,
            "dispatch_error": None if self.dispatch.error is None else str(self.dispatch.error),
            "consume_queues": len(self.queues.by_queue),
            "put_messages": self.put_count,
            "put_bytes": self.put_bytes,
            "pull_records_read": self.pull_records_read,
            "pull_bytes_read": self.pull_bytes_read,
            "consume_queue_exts": len(self.ext.by_queue),
            "fsyncs": self.flusher.fsyncs,
            "index_max_offset": self.index.max_indexed_offset() if self.index else -1,
            "flush_mode": self.config.flush_mode,
            "disk_refusal": self.disk.refusal,
            "disk_refused_puts": self.disk.refused_puts,
        }


LAYOUT_FILE = "store.json"
_LAYOUT_KEYS = ("commitlog_file_size", "consumequeue_units_per_file", "index_max_hash_slots", "index_max_index_num")


def layout_of(config: StoreConfig) -> dict[str, int]:
    c = config
    return dict(zip(_LAYOUT_KEYS, (c.commitlog_file_size, c.consumequeue_units_per_file, c.index_max_hash_slots,
                                   c.index_max_index_num)))


def read_layout(root: str | os.PathLike[str]) -> dict[str, int]:
    """The layout settings saved in a store directory ({} when it has none)."""
    try:
        data = orjson.loads((Path(root) / LAYOUT_FILE).read_bytes())
    except FileNotFoundError:
        return {}
    except orjson.JSONDecodeError as e:
        raise StoreError(f"{Path(root) / LAYOUT_FILE} is not valid JSON: {e}") from None
    return {k: int(v) for k, v in data.items() if k in _LAYOUT_KEYS}
