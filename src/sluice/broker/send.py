"""SEND_MESSAGE (10), SEND_MESSAGE_V2 (310) and SEND_BATCH_MESSAGE (320) (RocketMQ's SendMessageProcessor).

Either header naming is accepted with any of the three codes; a batch is code
320 or any send whose header says ``batch=true`` (librocketmq 1.0.1 sends its
batches as code 10, zlib-compressed as a whole above 4 KiB). The store call
runs on the broker's thread pool, so a synchronous flush never blocks the
event loop. Sends to ``%RETRY%<group>`` that exceeded the group's
maxReconsumeTimes are stored in ``%DLQ%<group>`` instead.

Delayed messages (DELAY, TIMER_DELIVER_MS / TIMER_DELAY_MS / TIMER_DELAY_SEC)
are diverted to their schedule queue by ``broker.schedule`` (schedule.py).
"""
from __future__ import annotations

import random
import time
import zlib
from itertools import repeat
from operator import attrgetter
from typing import TYPE_CHECKING, Any

from sluice.broker.topics import AUTO_CREATE_TOPIC, RETRY_PREFIX, dlq_topic
from sluice.errors import InvalidParameterError, MessageIllegalError, QueueIdIllegalError
from sluice.protocol import properties as P
from sluice.protocol.batch import decode_batch_messages
from sluice.protocol.codes import RequestCode
from sluice.protocol.command import RemotingCommand
from sluice.transport.connection import RemotingConnection
from sluice.protocol.headers import SendMessageRequestHeader
from sluice.protocol.record import FLAG_COMPRESSED, check_topic
from sluice.store.encode import EncodedBatch, encode_batch_body
from sluice.store.types import PutResult, StoreMessage

if TYPE_CHECKING:
    from sluice.broker.controller import BrokerController

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
    def __init__(self, broker: BrokerController) -> None:
        self.broker = broker
        self.sent_messages = 0

    def register(self) -> None:
        server = self.broker
        for code in (RequestCode.SEND_MESSAGE, RequestCode.SEND_MESSAGE_V2, RequestCode.SEND_BATCH_MESSAGE):
            server.register(code, self.handle)

    def handle(self, conn: RemotingConnection, request: RemotingCommand) -> Any:
        """A plain handler: with asynchronous flush a batch is appended and answered at once (no task, no
        loop iteration: the append never waits for the disk). Single messages go through the appender,
        which merges those that arrive together into one append; a send that must wait (synchronous
        flush, the duplicate window) returns the coroutine that finishes it."""
        header = SendMessageRequestHeader.from_command(request)
        batch = request.code == RequestCode.SEND_BATCH_MESSAGE or header.batch or _batch_flag(request)
        dedup = self.broker.dedup.applies(header.producer_group)
        sync = self.broker.store.sync_flush
        msgs = self._build(conn, request, header, batch, encode=batch and not dedup and not sync)
        if type(msgs) is tuple:  # a batch body encoded straight to records (encode.encode_batch_body)
            topic, queue_id, enc = msgs
            results = self.broker.appender.put_encoded(topic, queue_id, enc)
            self.sent_messages += len(results)
            return request.make_response(ext_fields=self._reply_fields(results, queue_id, batch))
        queue_id = msgs[0].queue_id  # the reply names the queue asked for, also for a delayed message
        if dedup:  # opted in: replays answered from the window
            return self._handle_dedup(request, msgs, queue_id, batch, header.producer_group)
        if sync or len(msgs) == 1:
            # Single sends go through the appender's merge: those arriving together share one append.
            return self._handle_merged(request, msgs, queue_id, batch)
        self.broker.schedule.divert(msgs)
        results = self.broker.appender.put_now(msgs)
        self.sent_messages += len(results)
        return request.make_response(ext_fields=self._reply_fields(results, queue_id, batch))

    async def _handle_merged(self, request: RemotingCommand, msgs: list[StoreMessage], queue_id: int,
                              batch: bool) -> RemotingCommand:
        results = await self._store(msgs)
        return request.make_response(ext_fields=self._reply_fields(results, queue_id, batch))

    async def _handle_dedup(self, request: RemotingCommand, msgs: list[StoreMessage], queue_id: int,
                            batch: bool, group: str) -> RemotingCommand:
        originals = await self.broker.dedup.put(msgs[0].topic, msgs, self._store)
        if all(o.queue_id == originals[0].queue_id for o in originals):
            queue_id = originals[0].queue_id  # a pure replay names the queue its originals are in
        return request.make_response(ext_fields=self._reply_fields([o.result for o in originals], queue_id, batch))

    async def _store(self, msgs: list[StoreMessage]) -> list[PutResult]:
        self.broker.schedule.divert(msgs)
        results = await self.broker.appender.put(msgs)
        self.sent_messages += len(results)
        return results

    # ---- building the store messages (event loop, no I/O) -----------------------------------------
    def _build(self, conn: RemotingConnection, request: RemotingCommand, h: SendMessageRequestHeader,
               batch: bool, encode: bool = False) -> list[StoreMessage] | tuple[str, int, EncodedBatch]:
        """The request's messages; with ``encode``, a batch the C encoder takes comes back as (topic, queue
        id, its records) instead."""
        topic = h.topic
        check_topic(topic)
        if topic == AUTO_CREATE_TOPIC:
            raise MessageIllegalError(f"topic {topic} is the auto-create template; send to a topic of your own")
        topics = self.broker.topics
        cfg = topics.get(topic)
        if cfg is None:
            cfg = topics.get_or_create_for_send(topic, h.default_topic, h.default_topic_queue_nums)
            self.broker.topics_changed()  # clients find the new topic's route through the namesrvs
        topics.check_writable(cfg)
        queue_id = h.queue_id
        if queue_id < 0:
            queue_id = random.randrange(cfg.write_queue_nums)  # RocketMQ's randomQueueId
        elif queue_id >= max(cfg.write_queue_nums, cfg.read_queue_nums):  # as RocketMQ's msgCheck
            raise QueueIdIllegalError(f"request queueId[{queue_id}] is illegal: topic {topic} has "
                                      f"{cfg.write_queue_nums} write and {cfg.read_queue_nums} read queues")
        reconsume = h.reconsume_times or 0
        if topic.startswith(RETRY_PREFIX):
            limit = h.max_reconsume_times if h.max_reconsume_times is not None \
                else self.broker.config.max_reconsume_times
            if reconsume > limit:
                topic = dlq_topic(topic[len(RETRY_PREFIX):])
                if topics.get(topic) is None:
                    topics.create_retry_or_dlq(topic, 1)
                    self.broker.topics_changed()
                queue_id = 0
        props = P.decode_properties(h.properties) if h.properties else {}
        born = _born_host(conn)
        born_ts = h.born_timestamp or int(time.time() * 1000)
        if not batch:
            if not request.body:
                raise MessageIllegalError("the message body is empty")
            return [StoreMessage(topic, request.body, queue_id, props, h.flag, h.sys_flag, born_ts, born,
                                 reconsume)]
        body = request.body
        sysflag = h.sys_flag
        if sysflag & FLAG_COMPRESSED:  # librocketmq compresses a whole batch body
            try:
                body = zlib.decompressobj().decompress(body, _MAX_BATCH_INFLATED)
            except zlib.error as exc:
                raise MessageIllegalError(f"compressed batch body does not inflate: {exc}") from None
            sysflag &= ~FLAG_COMPRESSED
        # Column-wise (in C where built): no BatchEntry per message (a few µs each at 1 KiB sends).
        inherited = {k: v for k, v in props.items() if k not in _PER_MESSAGE}
        if encode:
            store = self.broker.store
            enc = encode_batch_body(body, topic=topic, queue_id=queue_id, sysflag=sysflag, born_timestamp=born_ts,
                                    born_host=born, store_host=store.config.store_host, reconsume_times=reconsume,
                                    inherited=inherited, max_body=store.config.max_message_size)
            if enc is not None:
                return topic, queue_id, enc
        bodies, dicts, flags = decode_batch_messages(body, inherited)
        if not bodies:
            raise MessageIllegalError("the batch holds no message")
        if not all(bodies):
            raise MessageIllegalError(f"message {bodies.index(b'')} of the batch has an empty body")
        return list(map(StoreMessage, repeat(topic), bodies, repeat(queue_id), dicts, flags, repeat(sysflag),
                        repeat(born_ts), repeat(born), repeat(reconsume)))

    @staticmethod
    def _reply_fields(results: list[PutResult], queue_id: int, batch: bool) -> dict[str, str]:
        if not results:
            raise InvalidParameterError("nothing was stored")
        msg_id = ",".join(map(_MSG_ID, results)) if batch else results[0].msg_id
        return {"msgId": msg_id, "queueId": str(queue_id), "queueOffset": str(results[0].queue_offset),
                "MSG_REGION": "DefaultRegion", "TRACE_ON": "true"}
