"""SEND_MESSAGE (10), SEND_MESSAGE_V2 (310) and SEND_BATCH_MESSAGE (320) (RocketMQ's SendMessageProcessor).

Either header naming is accepted with any of the three codes; a batch is code
320 or any send whose header says ``batch=true`` (librocketmq 1.0.1 sends its
batches as code 10, zlib-compressed as a whole above 4 KiB). Every send goes to
the store through ``Appender.put`` (appender.py), which never blocks the event
loop on a synchronous flush. Sends to ``%RETRY%<group>`` that exceeded the group's
maxReconsumeTimes are stored in ``%DLQ%<group>`` instead.

Delayed messages (DELAY, TIMER_DELIVER_MS / TIMER_DELAY_MS / TIMER_DELAY_SEC)
are diverted to their schedule queue by ``ScheduleService.divert`` (schedule.py).
"""
from __future__ import annotations

import random
import time
import zlib
from collections.abc import Callable
from itertools import repeat
from operator import attrgetter
from typing import Any

from sluice.broker.appender import Appender, Payload, Prepare, Stored
from sluice.broker.dedup import DedupWindow
from sluice.broker.topics import AUTO_CREATE_TOPIC, RETRY_PREFIX, TopicConfigManager, dlq_topic
from sluice.errors import InvalidParameterError, MessageIllegalError, QueueIdIllegalError
from sluice.protocol import properties as P
from sluice.protocol.batch import decode_batch_messages
from sluice.protocol.codes import RequestCode
from sluice.protocol.command import RemotingCommand
from sluice.protocol.headers import SendMessageRequestHeader
from sluice.protocol.record import FLAG_COMPRESSED, check_topic
from sluice.store.encode import encode_batch_body
from sluice.store.types import StoreMessage
from sluice.transport.connection import RemotingConnection

__all__ = ["SendProcessor"]

# Header properties a batch's messages do not inherit: each message has its own identity.
_PER_MESSAGE = frozenset({P.UNIQ_KEY, P.KEYS, P.TAGS})
_MAX_BATCH_INFLATED = 64 * 1024 * 1024
_MSG_ID = attrgetter("msg_id")


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
                 dedup: DedupWindow, divert: Prepare, max_reconsume_times: int, store_host: tuple[str, int],
                 max_message_size: int) -> None:
        self.topics = topics
        self.topics_changed = topics_changed
        self.appender = appender
        self.dedup = dedup
        self.divert = divert  # delayed messages to their schedule queue (ScheduleService.divert)
        self.max_reconsume_times = max_reconsume_times
        self.store_host = store_host
        self.max_message_size = max_message_size

    def handle(self, conn: RemotingConnection, request: RemotingCommand) -> Any:
        """A plain handler: answered at once when the append need not wait (asynchronous flush, a batch:
        no task, no loop iteration); otherwise (single sends merged with the others of this loop
        iteration, synchronous flush, the duplicate window) returns the coroutine that finishes it."""
        header = SendMessageRequestHeader.from_command(request)
        batch = request.code == RequestCode.SEND_BATCH_MESSAGE or header.batch or _batch_flag(request)
        window = self.dedup if self.dedup.applies(header.producer_group) else None  # opted in: replays answered
        appender = self.appender
        sync = appender.sync_flush
        topic, queue_id, payload = self._build(conn, request, header, batch,
                                               encode=batch and window is None and not sync)
        result = appender.put(topic, queue_id, payload, dedup=window, sync=sync, prepare=self.divert)
        if type(result) is tuple:
            return request.make_response(ext_fields=_reply_fields(result, batch))
        return self._reply_later(request, result, batch)  # type: ignore[arg-type]

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
        topics = self.topics
        cfg = topics.get(topic)
        if cfg is None:
            cfg = topics.get_or_create_for_send(topic, h.default_topic, h.default_topic_queue_nums)
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
            limit = h.max_reconsume_times if h.max_reconsume_times is not None else self.max_reconsume_times
            if reconsume > limit:
                topic = dlq_topic(topic[len(RETRY_PREFIX):])
                if topics.get(topic) is None:
                    topics.create_retry_or_dlq(topic, 1)
                    self.topics_changed()
                queue_id = 0
        props = P.decode_properties(h.properties) if h.properties else {}
        born = _born_host(conn)
        born_ts = h.born_timestamp or int(time.time() * 1000)
        if not batch:
            if not request.body:
                raise MessageIllegalError("the message body is empty")
            return topic, queue_id, [StoreMessage(topic, request.body, queue_id, props, h.flag, h.sys_flag, born_ts,
                                                  born, reconsume)]
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
