"""SEND_MESSAGE (10), SEND_MESSAGE_V2 (310) and SEND_BATCH_MESSAGE (320) (RocketMQ's SendMessageProcessor).

Either header naming is accepted with any of the three codes; a batch is code
320 or any send whose header says ``batch=true`` (librocketmq 1.0.1 sends its
batches as code 10, zlib-compressed as a whole above 4 KiB). Every send goes to
the store through ``Appender.put`` (appender.py), which never blocks the event
loop on a synchronous flush. Sends to ``%RETRY%<group>`` that exceeded the group's
maxReconsumeTimes are stored in ``%DLQ%<group>`` instead.

Delayed messages (DELAY, TIMER_DELIVER_MS / TIMER_DELAY_MS / TIMER_DELAY_SEC)
are diverted to their schedule queue by ``ScheduleService.divert`` (schedule.py);
transactional half messages (TRAN_MSG=true or sysflag 0x4) to the half queue
(transactions.py), undelayed until committed.

Refused before anything is stored, each failing its own request only: an integer
header that does not fit its Java type (MESSAGE_ILLEGAL naming the field and its
range), a transactional half message until transactions exist, and a send to a
system topic the broker moves messages into itself (both NO_PERMISSION, as
RocketMQ's SendMessageProcessor / AbstractSendMessageProcessor.msgCheck answer).
Every refusal is logged once per client and reason a minute (refusal_log.py).
"""
from __future__ import annotations

import logging
import random
import time
import zlib
from collections.abc import Callable
from functools import partial
from itertools import repeat
from operator import attrgetter
from typing import Any

from sluice.broker.appender import Appender, Payload, Prepare, Stored
from sluice.broker.dedup import DedupWindow
from sluice.broker.deferred import Deferred
from sluice.broker.refusal_log import RefusalLog
from sluice.broker.schedule import TIMER_TOPIC
from sluice.broker.subgroups import SubscriptionGroupManager
from sluice.broker.transactions import HALF_TOPIC, ensure_topics, is_half, to_half
from sluice.broker.topics import AUTO_CREATE_TOPIC, RETRY_PREFIX, SCHEDULE_TOPIC, TopicConfigManager, dlq_topic
from sluice.errors import (InvalidParameterError, MessageIllegalError, NoPermissionError, QueueIdIllegalError,
                           SluiceError)
from sluice.format import FLAG_TRANSACTION_ROLLBACK, TRANSACTION_MASK
from sluice.protocol import properties as P
from sluice.protocol.batch import decode_batch_messages
from sluice.protocol.codes import RequestCode
from sluice.protocol.command import RemotingCommand
from sluice.protocol.headers import SendMessageRequestHeader
from sluice.protocol.record import FLAG_COMPRESSED, check_topic
from sluice.store.encode import encode_batch_body
from sluice.store.types import StoreMessage
from sluice.transport.connection import RemotingConnection

__all__ = ["SendProcessor", "check_header_ranges", "check_sendable_topic"]

log = logging.getLogger(__name__)

# Header properties a batch's messages do not inherit: each message has its own identity.
_PER_MESSAGE = frozenset({P.UNIQ_KEY, P.KEYS, P.TAGS})
_MAX_BATCH_INFLATED = 64 * 1024 * 1024
_MSG_ID = attrgetter("msg_id")

_I32 = (-(1 << 31), (1 << 31) - 1)
_I64 = (-(1 << 63), (1 << 63) - 1)
# The header's integers and their Java types (SendMessageRequestHeader.java): one that does not fit would reach
# the record encoder and fail the whole append round it was merged into.
_RANGES = (("queue_id", "queueId", _I32), ("flag", "flag", _I32), ("sys_flag", "sysFlag", _I32),
           ("born_timestamp", "bornTimestamp", _I64), ("reconsume_times", "reconsumeTimes", _I32),
           ("max_reconsume_times", "maxReconsumeTimes", _I32),
           ("default_topic_queue_nums", "defaultTopicQueueNums", _I32))
# TopicValidator.NOT_ALLOWED_SEND_TOPIC_SET, plus Sluice's timing wheel. RMQ_SYS_TRACE_TOPIC stays sendable:
# RocketMQ's clients send message traces there.
_NOT_ALLOWED_SEND = frozenset({SCHEDULE_TOPIC, TIMER_TOPIC, "TRANS_CHECK_MAX_TIME_TOPIC"})
_SYS_PREFIX = "RMQ_SYS_"
_TRACE_TOPIC = "RMQ_SYS_TRACE_TOPIC"


def check_header_ranges(h: SendMessageRequestHeader) -> None:
    """MessageIllegalError naming the first integer field that does not fit its Java type."""
    lo, hi = _I32
    r = h.reconsume_times
    m = h.max_reconsume_times
    if (lo <= h.queue_id <= hi and lo <= h.flag <= hi and lo <= h.sys_flag <= hi
            and _I64[0] <= h.born_timestamp <= _I64[1] and (r is None or lo <= r <= hi)
            and (m is None or lo <= m <= hi) and lo <= h.default_topic_queue_nums <= hi):
        return
    for attr, name, (low, high) in _RANGES:
        v = getattr(h, attr)
        if v is not None and not low <= v <= high:
            raise MessageIllegalError(f"header field {name} = {v} is out of range: it must be within {low}..{high}")


def check_sendable_topic(topic: str) -> None:
    """NoPermissionError for a topic only the broker itself writes (TopicValidator.isNotAllowedSendTopic)."""
    if topic in _NOT_ALLOWED_SEND or (topic.startswith(_SYS_PREFIX) and topic != _TRACE_TOPIC):
        raise NoPermissionError(f"Sending message to topic[{topic}] is forbidden.")


def _born_host(conn: RemotingConnection) -> tuple[str, int]:
    host, _, port = conn.peer.rpartition(":")
    try:
        return host.strip("[]") or "127.0.0.1", int(port)
    except ValueError:
        return "127.0.0.1", 0


def _batch_flag(request: RemotingCommand) -> bool:
    """librocketmq 1.0.1 writes the batch flag as "1" (Java's parseBoolean would read false)."""
    ext = request.ext_fields
    return ext.get("batch", ext.get("m", "")).strip() == "1"


class SendProcessor:
    def __init__(self, *, topics: TopicConfigManager, topics_changed: Callable[[], None], appender: Appender,
                 dedup: DedupWindow, divert: Prepare, subgroups: SubscriptionGroupManager,
                 store_host: tuple[str, int], max_message_size: int, reject_transactions: bool = False,
                 cluster_name: str = "DefaultCluster") -> None:
        self.topics = topics
        self.topics_changed = topics_changed
        self.appender = appender
        self.dedup = dedup
        self.divert = divert  # delayed messages to their schedule queue (ScheduleService.divert)
        self.subgroups = subgroups  # a send to %RETRY%<group>: the group's retryMaxTimes
        self.store_host = store_host
        self.max_message_size = max_message_size
        self.reject_transactions = reject_transactions  # rejectTransactionMessage
        self.cluster_name = cluster_name
        self.refusals = RefusalLog(log, "send")

    def handle(self, conn: RemotingConnection, request: RemotingCommand) -> Any:
        """A plain handler: answered at once when the append need not wait (asynchronous flush, a batch:
        no task, no loop iteration). A single send is merged with the others of its read (Appender): it
        returns a Deferred (broker/deferred.py: the gate counts it in flight, so a stop waits for it) and
        the reply is written by a callback once the merged append is done, or under synchronous flush once
        the fsync round covers it (with the round's other replies), with no task per request. With the
        duplicate window it returns the coroutine that finishes it. A batch is encoded straight to records
        under either flush mode: under synchronous flush it is appended at once too and only its reply
        waits for the iteration's group commit."""
        appender = self.appender
        sync = appender.sync_flush
        try:
            header = SendMessageRequestHeader.from_command(request)
            check_header_ranges(header)
            batch = request.code == RequestCode.SEND_BATCH_MESSAGE or header.batch or _batch_flag(request)
            window = self.dedup if self.dedup.applies(header.producer_group) else None  # opted in: replays answered
            topic, queue_id, payload = self._build(conn, request, header, batch,
                                                   encode=batch and window is None)
        except SluiceError as exc:  # refused before anything is stored: the caller's error, logged rate-limited
            self.refusals.refused(conn.peer, exc)
            raise
        # A half message is never delayed: its DELAY applies when it is committed.
        prepare = self.divert if type(payload) is not list or payload[0].topic != HALF_TOPIC else None
        if window is None:
            deferred = Deferred()
            result = appender.put(topic, queue_id, payload, sync=sync, prepare=prepare,
                                  then=partial(self._answer, conn, request, batch, deferred))
            if result is None:  # answered by _answer, never before put returned
                conn.busy += 1
                return deferred
        else:
            result = appender.put(topic, queue_id, payload, dedup=window, sync=sync, prepare=prepare)
        if type(result) is tuple:
            return request.make_response(ext_fields=_reply_fields(result, batch))
        return self._reply_later(request, result, batch)  # type: ignore[arg-type]

    def _answer(self, conn: RemotingConnection, request: RemotingCommand, batch: bool, deferred: Deferred,
                stored: Stored | None, error: BaseException | None) -> None:
        """A stored request's reply, once stored (durable under sync flush) or failed (on the loop, from the
        Appender); settling the Deferred ends the request for the gate, which logs a refusal as it logs a
        handler's."""
        conn.busy -= 1
        response: RemotingCommand | Exception
        try:
            if error is not None:
                raise error
            response = request.make_response(ext_fields=_reply_fields(stored, batch))  # type: ignore[arg-type]
        except Exception as exc:
            response = exc
        conn.answer(request, response)
        deferred.settle(response if isinstance(response, Exception) else None)

    @staticmethod
    async def _reply_later(request: RemotingCommand, pending: Any, batch: bool) -> RemotingCommand:
        return request.make_response(ext_fields=_reply_fields(await pending, batch))

    # ---- building the store messages (event loop, no I/O) -----------------------------------------
    def _build(self, conn: RemotingConnection, request: RemotingCommand, h: SendMessageRequestHeader,
               batch: bool, encode: bool = False) -> tuple[str, int, Payload]:
        """(topic, queue id, the request's messages); with ``encode``, a batch the C encoder takes comes
        back as its records instead of messages."""
        topic = h.topic
        check_topic(topic)
        if topic == AUTO_CREATE_TOPIC:
            raise MessageIllegalError(f"topic {topic} is the auto-create template; send to a topic of your own")
        check_sendable_topic(topic)
        topics = self.topics
        cfg = topics.get(topic)
        if cfg is None:
            cfg = topics.get_or_create_for_send(topic, h.default_topic, h.default_topic_queue_nums,
                                                 by=conn.peer)
            self.topics_changed()  # clients find the new topic's route through the namesrvs
        topics.check_writable(cfg)
        queue_id = h.queue_id
        if queue_id < 0:
            queue_id = random.randrange(cfg.write_queue_nums)  # RocketMQ's randomQueueId
        elif queue_id >= max(cfg.write_queue_nums, cfg.read_queue_nums):  # as RocketMQ's msgCheck
            raise QueueIdIllegalError(f"request queueId[{queue_id}] is illegal: topic {topic} has "
                                      f"{cfg.write_queue_nums} write and {cfg.read_queue_nums} read queues")
        reconsume = h.reconsume_times or 0
        if topic.startswith(RETRY_PREFIX):
            # SendMessageProcessor.handleRetryAndDLQ: the header's limit, else the group's retryMaxTimes
            limit = h.max_reconsume_times if h.max_reconsume_times is not None else \
                self.subgroups.require(topic[len(RETRY_PREFIX):]).retry_max_times
            if reconsume > limit:
                topic = dlq_topic(topic[len(RETRY_PREFIX):])
                if topics.get(topic) is None:
                    topics.create_retry_or_dlq(topic, 1)
                    self.topics_changed()
                queue_id = 0
        props = P.decode_properties(h.properties) if h.properties else {}
        if P.REPLY_TO_CLIENT in props and not batch:
            # A request message: its replier builds the reply topic from CLUSTER (MessageUtil.createReplyMessage).
            # RocketMQ's SendMessageProcessor puts it on every message; here only on requests, leaving every
            # other record as its producer sent it.
            props[P.CLUSTER] = self.cluster_name
        half = is_half(h.sys_flag, props)
        if half or h.sys_flag & TRANSACTION_MASK == FLAG_TRANSACTION_ROLLBACK:
            # A half message goes to the half queue (transactions.py); RocketMQ refuses it when the broker
            # rejects transactional messages (SendMessageProcessor). A rolled-back type would be stored
            # without a consume-queue unit: acknowledged and never delivered, so it is refused too.
            if self.reject_transactions or not half:
                raise NoPermissionError(f"the broker[{self.store_host[0]}] sending transaction message is forbidden")
            if batch:  # SendMessageProcessor.sendBatchMessage
                raise MessageIllegalError("batch message does not support transaction")
        born = _born_host(conn)
        born_ts = h.born_timestamp or int(time.time() * 1000)
        if not batch:
            if not request.body:
                raise MessageIllegalError("the message body is empty")
            m = StoreMessage(topic, request.body, queue_id, props, h.flag, h.sys_flag, born_ts, born, reconsume)
            if half:
                to_half(m)
                if ensure_topics(topics):
                    self.topics_changed()
            return topic, queue_id, [m]
        body = request.body
        sysflag = h.sys_flag
        if sysflag & FLAG_COMPRESSED:  # librocketmq compresses a whole batch body
            try:
                body = zlib.decompressobj().decompress(body, _MAX_BATCH_INFLATED)
            except zlib.error as exc:
                raise MessageIllegalError(f"compressed batch body does not inflate: {exc}") from None
            sysflag &= ~FLAG_COMPRESSED
        # Column-wise (in C where built): no BatchEntry object per message.
        inherited = {k: v for k, v in props.items() if k not in _PER_MESSAGE}
        if encode:
            enc = encode_batch_body(body, topic=topic, queue_id=queue_id, sysflag=sysflag, born_timestamp=born_ts,
                                    born_host=born, store_host=self.store_host, reconsume_times=reconsume,
                                    inherited=inherited, max_body=self.max_message_size)
            if enc is not None:
                return topic, queue_id, enc
        bodies, dicts, flags = decode_batch_messages(body, inherited)
        if not bodies:
            raise MessageIllegalError("the batch holds no message")
        if not all(bodies):
            raise MessageIllegalError(f"message {bodies.index(b'')} of the batch has an empty body")
        return topic, queue_id, list(map(StoreMessage, repeat(topic), bodies, repeat(queue_id), dicts, flags,
                                         repeat(sysflag), repeat(born_ts), repeat(born), repeat(reconsume)))


def _reply_fields(stored: Stored, batch: bool) -> dict[str, str]:
    queue_id, results = stored
    if not results:
        raise InvalidParameterError("nothing was stored")
    msg_id = ",".join(map(_MSG_ID, results)) if batch else results[0].msg_id
    return {"msgId": msg_id, "queueId": str(queue_id), "queueOffset": str(results[0].queue_offset),
            "MSG_REGION": "DefaultRegion", "TRACE_ON": "true"}
