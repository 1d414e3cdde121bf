"""Transactional messages, RocketMQ 4.x's way: half messages, END_TRANSACTION (37), check-back (39).

Sources: broker/.../processor/SendMessageProcessor.java (the half send), EndTransactionProcessor.java,
broker/.../transaction/queue/TransactionalMessageServiceImpl.java (the check), TransactionalMessageBridge.java,
AbstractTransactionalMessageCheckListener.java and client/Broker2Client.java.

* **Half.** A send with ``TRAN_MSG=true`` (or the prepared sysflag 0x4) is stored in
  ``RMQ_SYS_TRANS_HALF_TOPIC`` queue 0 with its destination in REAL_TOPIC / REAL_QID and the transaction
  bits cleared (:func:`to_half`), so it has a consume-queue unit there and none in its real topic.
* **End.** END_TRANSACTION names the half by commit-log offset. Commit writes the real message (sysflag
  COMMIT, through ``Appender.put`` as any send: delay, dispatch, bitmaps and held-pull wakes apply), then an
  op record; rollback writes the op record only. An op record is RocketMQ's: topic
  ``RMQ_SYS_TRANS_OP_HALF_TOPIC``, tag ``d``, body the half's queue offset.
* **Check.** Every ``transaction_check_interval_ms`` the undecided halves born more than
  ``transaction_timeout_ms`` ago (or CHECK_IMMUNITY_TIME_IN_SECONDS) are copied to the end of the half queue
  with TRANSACTION_CHECK_TIMES + 1 and CHECK_TRANSACTION_STATE goes oneway to a live producer of their group
  (PGROUP) naming the copy; one checked ``transaction_check_max`` times is moved to
  ``TRANS_CHECK_MAX_TIME_TOPIC`` instead. Every copy carries TRAN_PREPARED_QUEUE_OFFSET, the first half's
  queue offset: the transaction's key, so a commit quoting any copy resolves the transaction once.
* **State** is the two topics: the half queue from the progress offset on, minus the offsets op records
  name. The progress offsets of both queues are the consumer offsets of group ``CID_RMQ_SYS_TRANS`` (as
  RocketMQ keeps them), moved only past resolved halves, so a restart or kill -9 reads at worst more than
  it needs. Unlike RocketMQ, a second END_TRANSACTION for a transaction already resolved changes nothing
  (RocketMQ would store the real message again).
"""
from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from sluice.broker.appender import Appender, Prepare, stored
from sluice.broker.consumers import ConsumerManager
from sluice.broker.offsets import ConsumerOffsetManager
from sluice.broker.pool import BlockingPool
from sluice.broker.topics import TopicConfigManager
from sluice.errors import InvalidParameterError, SluiceError, TransactionStateError
from sluice.format import FLAG_TRANSACTION_COMMIT, FLAG_TRANSACTION_PREPARED, TRANSACTION_MASK
from sluice.protocol import properties as P
from sluice.protocol.codes import RequestCode
from sluice.protocol.command import RemotingCommand
from sluice.protocol.headers import CheckTransactionStateRequestHeader, EndTransactionRequestHeader
from sluice.protocol.msgid import create_offset_msg_id
from sluice.protocol.record import RecordView, decode_record, encode_record, iter_records
from sluice.store import MessageStore
from sluice.store.types import GetMessageStatus, StoreMessage
from sluice.transport.connection import RemotingConnection

__all__ = ["CHECK_MAX_TOPIC", "HALF_TOPIC", "OP_TOPIC", "SYS_GROUP", "TransactionService", "ensure_topics",
           "is_half", "to_half"]

log = logging.getLogger(__name__)

HALF_TOPIC = "RMQ_SYS_TRANS_HALF_TOPIC"
OP_TOPIC = "RMQ_SYS_TRANS_OP_HALF_TOPIC"
CHECK_MAX_TOPIC = "TRANS_CHECK_MAX_TIME_TOPIC"
#: The consumer group whose offsets are the check's progress (TransactionalMessageUtil.buildConsumerGroup).
SYS_GROUP = "CID_RMQ_SYS_TRANS"
REMOVE_TAG = "d"
PREPARED_QUEUE_OFFSET = "TRAN_PREPARED_QUEUE_OFFSET"
CHECK_TIMES = "TRANSACTION_CHECK_TIMES"
CHECK_IMMUNITY = "CHECK_IMMUNITY_TIME_IN_SECONDS"
#: Records read per store call while catching up with a queue.
BATCH = 256
#: Halves resolved before the half queue was read this far: past it the read catches up (bounds the memory).
AHEAD_READ = 65_536
COMMIT, ROLLBACK, NOT_TYPE = FLAG_TRANSACTION_COMMIT, 0xC, 0
#: Properties the committed real message does not keep (RocketMQ clears REAL_* and, since 4.7.1, TRAN_MSG).
_NOT_COMMITTED = (P.REAL_TOPIC, P.REAL_QID, P.TRAN_MSG, PREPARED_QUEUE_OFFSET)


def is_half(sys_flag: int, props: dict[str, str]) -> bool:
    """A transactional half message: TRAN_MSG=true (Boolean.parseBoolean) or the prepared sysflag."""
    tran = props.get(P.TRAN_MSG)
    return sys_flag & TRANSACTION_MASK == FLAG_TRANSACTION_PREPARED or (tran is not None and tran.lower() == "true")


def to_half(m: StoreMessage) -> None:
    """Divert ``m`` in place to the half queue (TransactionalMessageBridge.parseHalfMessageInner)."""
    m.properties[P.REAL_TOPIC] = m.topic
    m.properties[P.REAL_QID] = str(m.queue_id)
    m.sysflag &= ~TRANSACTION_MASK
    m.topic, m.queue_id = HALF_TOPIC, 0


def ensure_topics(topics: TopicConfigManager) -> bool:
    """Create the half and op topics (one queue each) on first use, as RocketMQ does; True if created."""
    created = False
    for t in (HALF_TOPIC, OP_TOPIC):
        if topics.get(t) is None:
            topics.create_retry_or_dlq(t, 1)
            created = True
    return created


@dataclass(slots=True)
class _Half:
    """An undecided transaction: its latest copy in the half queue."""

    key: int  # the first half's queue offset
    qoff: int
    offset: int  # commit-log offset
    group: str
    born_ms: int
    checks: int
    immunity_ms: int


class TransactionService:
    """The END_TRANSACTION handler and the check-back service (a loop task)."""

    def __init__(self, *, store: MessageStore, pool: BlockingPool, appender: Appender, topics: TopicConfigManager,
                 topics_changed: Callable[[], None], offsets: ConsumerOffsetManager, clients: ConsumerManager,
                 divert: Prepare, store_host: tuple[str, int], timeout_ms: int, check_interval_ms: int,
                 check_max: int, authorize: Callable[[RemotingConnection, RemotingCommand, str], None] | None = None,
                 ) -> None:
        self.store = store
        self.pool = pool
        self.appender = appender
        self.topics = topics
        self.topics_changed = topics_changed
        self.offsets = offsets
        self.clients = clients
        self.divert = divert
        self.store_host = store_host
        self.timeout_ms = timeout_ms
        self.check_interval_ms = check_interval_ms
        self.check_max = check_max
        #: Checks PUB on the real topic of a request that does not name it (ACL on); raises NoPermissionError.
        self.authorize = authorize
        self.pending: dict[int, _Half] = {}  # key -> latest copy
        self._resolving: dict[int, int] = {}  # key -> latest copy's queue offset, while its writes are in flight
        self._moving: dict[int, int] = {}  # key -> queue offset being copied by the check
        self._named: dict[int, int] = {}  # half queue offset an op names -> the op's queue offset
        self._half_read = 0  # next half-queue offset to read
        self._ahead: set[int] = set()  # keys resolved before the half-queue read reached them
        self._reader: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()  # one catch-up at a time
        self._task: asyncio.Task[None] | None = None
        self.committed = self.rolled_back = self.checks_sent = self.discarded = self.no_producer = 0

    # ---- state from the two topics -------------------------------------------------------------------
    async def _read(self, topic: str, start: int) -> AsyncIterator[list[tuple[int, RecordView]]]:
        """The records of ``topic`` queue 0 from ``start`` on, a batch at a time: (queue offset, record)."""
        store, off = self.store, start
        while off < store.get_max_offset(topic, 0):
            res = await self.pool.run(store.get_messages, topic, 0, off, BATCH)
            if res.status is not GetMessageStatus.FOUND:
                if res.next_begin_offset <= off:
                    break
                log.warning("%s: %s at %d, going on at %d", topic, res.status.name, off, res.next_begin_offset)
                off = res.next_begin_offset
                continue
            off = res.next_begin_offset
            if topic == HALF_TOPIC:
                self._half_read = off
            yield list(zip(res.queue_offsets, iter_records(res.data, check_crc=False)))

    async def load(self) -> None:
        """Rebuild the undecided transactions (broker start, before it serves requests)."""
        store = self.store
        h = max(self.offsets.query(SYS_GROUP, HALF_TOPIC, 0), store.get_min_offset(HALF_TOPIC, 0), 0)
        o = max(self.offsets.query(SYS_GROUP, OP_TOPIC, 0), store.get_min_offset(OP_TOPIC, 0), 0)
        named: set[int] = set()
        async for ops in self._read(OP_TOPIC, o):
            for op_qoff, rec in ops:
                q = _op_target(rec)
                if q is not None:
                    named.add(q)
                    if q >= h:
                        self._named.setdefault(q, op_qoff)
        self._half_read = h
        await self._catch_up(resolved=named)
        log.info("transactions: %d undecided half message(s) from half-queue offset %d", len(self.pending), h)

    async def _catch_up(self, resolved: set[int] | None = None) -> None:
        """Read the half messages stored since the last read into :attr:`pending`; ``resolved`` (at load):
        the half offsets op records name."""
        loading = resolved is not None
        resolved = resolved or set()
        done: set[int] = set()
        async with self._lock:  # one read at a time; each batch is applied before the next is read
            async for halves in self._read(HALF_TOPIC, self._half_read):
                self._apply(halves, resolved, done, loading)
        for key in done:
            self.pending.pop(key, None)

    def _apply(self, halves: list[tuple[int, RecordView]], resolved: set[int], done: set[int],
               loading: bool) -> None:
        for qoff, rec in halves:
            props = P.decode_properties(rec.properties)
            key = _key(props, qoff)
            if qoff in resolved or key in resolved:
                done.add(key)
            if key in done or key in self._resolving or key in self._moving:
                continue  # the check copying it sets its entry itself
            if key in self._ahead:  # resolved before this read reached it
                self._ahead.discard(key)
                continue
            cur = self.pending.get(key)
            if cur is not None and cur.qoff >= qoff or (cur is None and qoff != key and not loading):
                continue  # an older copy; or a copy of a transaction resolved meanwhile
            self.pending[key] = _half_of(key, qoff, rec, props, self.timeout_ms)

    def progress(self) -> tuple[int, int]:
        """(half, op) queue offsets before which nothing undecided or needed is left; recorded as the
        consumer offsets of ``CID_RMQ_SYS_TRANS`` (persisted with the other consumer offsets)."""
        h = min((*(p.qoff for p in self.pending.values()), *self._resolving.values(), *self._moving.values()),
                default=self._half_read)
        for q in [q for q in self._named if q < h]:
            del self._named[q]
        o = min(self._named.values(), default=self.store.get_max_offset(OP_TOPIC, 0))
        self.offsets.commit(SYS_GROUP, HALF_TOPIC, 0, h)
        self.offsets.commit(SYS_GROUP, OP_TOPIC, 0, o)
        return h, o

    # ---- END_TRANSACTION -----------------------------------------------------------------------------
    async def end_transaction(self, conn: RemotingConnection, request: RemotingCommand) -> RemotingCommand:
        h = EndTransactionRequestHeader.from_command(request)
        kind = h.commit_or_rollback
        if kind not in (COMMIT, ROLLBACK, NOT_TYPE):
            raise InvalidParameterError(f"commitOrRollback {kind} is none of 8 (commit), 12 (rollback), 0 (unknown)")
        if kind == NOT_TYPE:  # the producer does not know yet: the check asks again (RocketMQ answers nothing)
            return request.make_response(remark="transaction state unknown: left for the check")
        # On the loop, as pulls are by default: the half was just appended, its page is in memory.
        data = self.store.read_record(h.commit_log_offset)
        rec = decode_record(data) if data is not None else None
        if rec is None or rec.topic != HALF_TOPIC:
            raise TransactionStateError(f"Find prepared transaction message failed: no half message at commit-log "
                                        f"offset {h.commit_log_offset}")
        props = P.decode_properties(rec.properties)
        # EndTransactionProcessor.checkPrepareMessage
        if props.get(P.PGROUP) != h.producer_group:
            raise TransactionStateError("The producer group wrong")
        if rec.queue_offset != h.tran_state_table_offset:
            raise TransactionStateError("The transaction state table offset wrong")
        real = props.get(P.REAL_TOPIC, "")
        if self.authorize is not None and h.topic != real:  # the ACL checked a topic the header named, if any
            self.authorize(conn, request, real)
        key = _key(props, rec.queue_offset)
        half = self.pending.pop(key, None)
        if half is None and key == rec.queue_offset >= self._half_read and key not in self._ahead:
            # A half the service has not read yet (the usual commit, seconds after its send) is undecided: only
            # the check copies halves, after reading them. Resolved now; the read skips it when it gets there.
            half = _half_of(key, rec.queue_offset, rec, props, self.timeout_ms)
            self._ahead.add(key)
            if len(self._ahead) >= AHEAD_READ and (self._reader is None or self._reader.done()):
                self._reader = asyncio.get_running_loop().create_task(self._catch_up())  # bounds _ahead
        if half is None:  # resolved already (or discarded): a repeat changes nothing
            # DEBUG: a producer answering a check after its own commit repeats itself routinely (no line per request)
            log.debug("END_TRANSACTION %s for half offset %d from %s: already resolved", _KIND[kind],
                     rec.queue_offset, conn.peer)
            return request.make_response(remark="transaction already resolved")
        self._resolving[key] = half.qoff
        try:
            if kind == COMMIT:
                await self._commit(rec, props, real, h.commit_log_offset)
            await self._op({rec.queue_offset, half.qoff})
        except BaseException:
            self.pending.setdefault(key, half)
            raise
        finally:
            self._resolving.pop(key, None)
        if kind == COMMIT:
            self.committed += 1
        else:
            self.rolled_back += 1
        return request.make_response()

    async def _commit(self, rec: RecordView, props: dict[str, str], real: str, half_offset: int) -> None:
        """EndTransactionProcessor.endMessageTransaction: the real message, stored as any send."""
        try:
            qid = int(props.get(P.REAL_QID, ""))
        except ValueError:
            raise TransactionStateError(f"half message at {half_offset} has no valid REAL_QID") from None
        if not real:
            raise TransactionStateError(f"half message at {half_offset} has no REAL_TOPIC")
        real_props = {k: v for k, v in props.items() if k not in _NOT_COMMITTED}
        msg = StoreMessage(real, rec.body, qid, real_props, rec.flag, (rec.sysflag & ~TRANSACTION_MASK) | COMMIT,
                           rec.born_timestamp, rec.born_host, rec.reconsume_times, half_offset)
        await stored(self.appender.put(real, qid, [msg], prepare=self.divert))

    async def _op(self, half_qoffs: set[int]) -> None:
        """Op records naming these half-queue offsets (TransactionalMessageBridge.addRemoveTagInTransactionOp)."""
        if ensure_topics(self.topics):
            self.topics_changed()
        now = int(time.time() * 1000)
        msgs = [StoreMessage(OP_TOPIC, str(q).encode(), 0, {P.TAGS: REMOVE_TAG}, 0, 0, now, self.store_host)
                for q in sorted(half_qoffs)]
        _, results = await stored(self.appender.put(OP_TOPIC, 0, msgs))
        for q, r in zip(sorted(half_qoffs), results):
            self._named.setdefault(q, r.queue_offset)

    # ---- the check -----------------------------------------------------------------------------------
    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="transaction-check")

    async def stop(self) -> None:
        for task in (self._task, self._reader):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        self._task = self._reader = None
        self.progress()

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.check_interval_ms / 1000.0)
            try:
                await self.check()
            except asyncio.CancelledError:
                raise
            except Exception:  # the next interval tries again from the same state
                log.exception("transaction check failed")

    async def check(self, now_ms: int | None = None) -> int:
        """One check pass (TransactionalMessageServiceImpl.check); returns how many halves were due."""
        await self._catch_up()
        now = int(time.time() * 1000) if now_ms is None else now_ms
        due = sorted((p for p in self.pending.values() if now - p.born_ms >= p.immunity_ms), key=_QOFF)
        for half in due:
            cur = self.pending.get(half.key)
            if cur is None or cur.qoff != half.qoff:
                continue  # resolved while this pass waited
            if half.checks >= self.check_max:
                await self._discard(half)
            else:
                await self._check_one(half)
        self.progress()
        return len(due)

    async def _record(self, half: _Half) -> tuple[RecordView, dict[str, str]] | None:
        data = await self.pool.run(self.store.read_record, half.offset)
        if data is None:
            log.error("transaction %d: its half message at commit-log offset %d is gone; dropped", half.key,
                      half.offset)
            self.pending.pop(half.key, None)
            return None
        rec = decode_record(data)
        return rec, P.decode_properties(rec.properties)

    async def _discard(self, half: _Half) -> None:
        """Checked ``transaction_check_max`` times: kept in TRANS_CHECK_MAX_TIME_TOPIC for an operator
        (AbstractTransactionalMessageCheckListener.resolveDiscardMsg), and an op record so a restart agrees."""
        got = await self._record(half)
        if got is None:
            return
        rec, props = got
        if self.topics.get(CHECK_MAX_TOPIC) is None:
            self.topics.create_retry_or_dlq(CHECK_MAX_TOPIC, 1)
            self.topics_changed()
        self.pending.pop(half.key, None)
        self._resolving[half.key] = half.qoff
        try:
            msg = StoreMessage(CHECK_MAX_TOPIC, rec.body, 0, props, rec.flag, rec.sysflag, rec.born_timestamp,
                               rec.born_host, rec.reconsume_times)
            await stored(self.appender.put(CHECK_MAX_TOPIC, 0, [msg]))
            await self._op({half.qoff})
        except BaseException:
            self.pending.setdefault(half.key, half)
            raise
        finally:
            self._resolving.pop(half.key, None)
        self.discarded += 1
        log.warning("transaction %s of group %s discarded after %d checks (kept in %s)",
                    props.get(P.UNIQ_KEY, half.key), half.group, half.checks, CHECK_MAX_TOPIC)

    async def _check_one(self, half: _Half) -> None:
        """Copy the half to the queue's end with one more check counted (putBackHalfMsgQueue), then ask a
        live producer of its group about the copy (sendCheckMessage)."""
        got = await self._record(half)
        if got is None:
            return
        rec, props = got
        props[CHECK_TIMES] = str(half.checks + 1)
        props[PREPARED_QUEUE_OFFSET] = str(half.key)
        copy = StoreMessage(HALF_TOPIC, rec.body, 0, props, rec.flag, rec.sysflag, rec.born_timestamp,
                            rec.born_host, rec.reconsume_times)
        self._moving[half.key] = half.qoff
        try:
            _, (r,) = await stored(self.appender.put(HALF_TOPIC, 0, [copy]))
        finally:
            self._moving.pop(half.key, None)
        new = _Half(half.key, r.queue_offset, r.commitlog_offset, half.group, half.born_ms, half.checks + 1,
                    half.immunity_ms)
        if half.key not in self.pending:  # resolved while copying: that resolution named the old copy only
            await self._op({new.qoff})
            return
        self.pending[half.key] = new
        conn = self._producer(half.group)
        if conn is None:
            self.no_producer += 1
            log.warning("transaction %s: no live producer of group %s to check (check %d of %d)",
                        props.get(P.UNIQ_KEY, half.key), half.group, new.checks, self.check_max)
            return
        uniq = props.get(P.UNIQ_KEY)
        header = CheckTransactionStateRequestHeader(
            tran_state_table_offset=new.qoff, commit_log_offset=new.offset, msg_id=uniq, transaction_id=uniq,
            offset_msg_id=create_offset_msg_id(self.store_host[0], self.store_host[1], new.offset))
        body = _check_body(rec, props, new, r.store_timestamp, self.store_host)
        req = RemotingCommand.request(RequestCode.CHECK_TRANSACTION_STATE, header.to_ext(), body, oneway=True)
        try:
            await conn.send_oneway(req)
            self.checks_sent += 1
        except SluiceError as exc:
            log.warning("CHECK_TRANSACTION_STATE to %s failed: %s", conn.peer, exc)

    def _producer(self, group: str) -> RemotingConnection | None:
        """A live connection of the group (ProducerManager.getAvailableChannel: any active one)."""
        pg = self.clients.producers.get(group)
        live = [ch.conn for ch in pg.channels.values() if not ch.conn.is_closed] if pg is not None else []
        return random.choice(live) if live else None

    def stats(self) -> dict[str, Any]:
        return {"transactionsPending": len(self.pending), "transactionsCommitted": self.committed,
                "transactionsRolledBack": self.rolled_back, "transactionChecksSent": self.checks_sent,
                "transactionsDiscarded": self.discarded}


_KIND = {COMMIT: "commit", ROLLBACK: "rollback", NOT_TYPE: "unknown"}


def _QOFF(h: _Half) -> int:
    return h.qoff


def _key(props: dict[str, str], qoff: int) -> int:
    try:
        return int(props[PREPARED_QUEUE_OFFSET])
    except (KeyError, ValueError):
        return qoff


def _op_target(rec: RecordView) -> int | None:
    """The half-queue offset an op record names (RocketMQ 4.x: one decimal number, tag ``d``)."""
    try:
        return int(rec.body.decode())
    except (UnicodeDecodeError, ValueError):
        log.warning("op record at commit-log offset %d does not name a half offset; ignored", rec.physical_offset)
        return None


def _half_of(key: int, qoff: int, rec: RecordView, props: dict[str, str], timeout_ms: int) -> _Half:
    try:
        checks = int(props.get(CHECK_TIMES, "0"))
    except ValueError:
        checks = 0
    try:  # AbstractTransactionalMessageCheckListener / TransactionalMessageUtil.getImmunityTime
        immunity = max(int(props[CHECK_IMMUNITY]) * 1000, timeout_ms)
    except (KeyError, ValueError):
        immunity = timeout_ms
    return _Half(key, qoff, rec.physical_offset, props.get(P.PGROUP, ""), rec.born_timestamp, checks, immunity)


def _check_body(rec: RecordView, props: dict[str, str], copy: _Half, store_ts: int,
                store_host: tuple[str, int]) -> bytes:
    """The copy as MessageDecoder.encode writes it for Broker2Client.checkProducerTransactionState: its real
    topic and queue, its half-queue and commit-log offsets."""
    try:
        qid = int(props.get(P.REAL_QID, "0"))
    except ValueError:
        qid = 0
    return bytes(encode_record(
        topic=props.get(P.REAL_TOPIC) or HALF_TOPIC, body=rec.body, properties=P.encode_properties(props),
        queue_id=qid, flag=rec.flag, sysflag=rec.sysflag, born_timestamp=rec.born_timestamp,
        born_host=rec.born_host, store_host=store_host, store_timestamp=store_ts,
        reconsume_times=rec.reconsume_times, queue_offset=copy.qoff, physical_offset=copy.offset))
