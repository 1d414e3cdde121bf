"""Request-reply: SEND_REPLY_MESSAGE (324) / SEND_REPLY_MESSAGE_V2 (325) (RocketMQ's ReplyMessageProcessor).

A consumer answers a request message with a reply (``sluice.reply_to``) sent to
``<cluster>_REPLY_TOPIC``. The broker pushes it at once to the requesting client
with PUSH_REPLY_MESSAGE_TO_CLIENT (326) over that client's own connection, found
by the reply's REPLY_TO_CLIENT (the requester's client id) among the producer
and consumer channels its heartbeats registered, then — with
``store_reply_message_enable`` (default true, storeReplyMessageEnable) — stores
it in the reply topic like any message. As in RocketMQ, a push that fails
(client gone, refused, timed out) answers SYSTEM_ERROR naming the client, even
when the reply was stored.

The reply topic (one queue, read and write) is created when the broker starts,
as TopicConfigManager creates it, so it is registered with the namesrvs.
"""
from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable

from sluice.broker.appender import Appender, stored
from sluice.broker.consumers import ConsumerManager
from sluice.broker.send import check_header_ranges, check_sendable_topic
from sluice.broker.topics import TopicConfigManager
from sluice.errors import MessageIllegalError, QueueIdIllegalError, SluiceError
from sluice.protocol import properties as P
from sluice.protocol.codes import RequestCode, ResponseCode
from sluice.protocol.command import RemotingCommand
from sluice.protocol.headers import ReplyMessageRequestHeader, SendMessageRequestHeader
from sluice.protocol.record import check_topic
from sluice.store.types import StoreMessage
from sluice.transport.connection import RemotingConnection

__all__ = ["ReplyProcessor", "reply_topic"]

log = logging.getLogger(__name__)

#: Broker2Client.callClient's wait for the client's answer to a push (3 s).
PUSH_TIMEOUT_S = 3.0


def reply_topic(cluster: str) -> str:
    """MixAll.getReplyTopic: ``<cluster>_REPLY_TOPIC``."""
    return f"{cluster}_REPLY_TOPIC"


def _java_addr(host: str, port: int) -> str:
    """InetSocketAddress.toString() of an address without a host name."""
    return f"/{host}:{port}"


def _peer(conn: RemotingConnection) -> tuple[str, int]:
    host, _, port = conn.peer.rpartition(":")
    try:
        return host.strip("[]") or "127.0.0.1", int(port)
    except ValueError:
        return "127.0.0.1", 0


class ReplyProcessor:
    def __init__(self, *, topics: TopicConfigManager, topics_changed: Callable[[], None], appender: Appender,
                 clients: ConsumerManager, cluster_name: str, store_host: tuple[str, int],
                 store_replies: bool = True, push_timeout_s: float = PUSH_TIMEOUT_S) -> None:
        self.topics = topics
        self.topics_changed = topics_changed
        self.appender = appender
        self.clients = clients
        self.store_host = store_host
        self.store_replies = store_replies
        self.push_timeout_s = push_timeout_s
        self.reply_topic = reply_topic(cluster_name)
        if topics.get(self.reply_topic) is None:  # TopicConfigManager's constructor: 1 read, 1 write queue
            topics.create_retry_or_dlq(self.reply_topic, 1)
        #: Replies pushed to their requester, and pushes that failed (client not found, refused, timed out).
        self.pushed = 0
        self.push_failed = 0

    def find_client(self, client_id: str) -> RemotingConnection | None:
        """The live connection a client's heartbeats came on (ProducerManager.findChannel; consumers too, as a
        requester may be a client instance with consumers only)."""
        c = self.clients
        for table in (*(pg.channels for pg in c.producers.values()), *(g.channels for g in c.groups.values())):
            ch = table.get(client_id)
            if ch is not None and not ch.conn.is_closed:
                return ch.conn
        return None

    async def handle(self, conn: RemotingConnection, request: RemotingCommand) -> RemotingCommand:
        h = SendMessageRequestHeader.from_command(request)
        check_header_ranges(h)
        topic = h.topic
        check_topic(topic)
        check_sendable_topic(topic)
        topics = self.topics
        cfg = topics.get(topic)
        if cfg is None:
            cfg = topics.get_or_create_for_send(topic, h.default_topic, h.default_topic_queue_nums)
            self.topics_changed()
        topics.check_writable(cfg)
        queue_id = h.queue_id
        if queue_id < 0:
            queue_id = random.randrange(cfg.write_queue_nums)
        elif queue_id >= max(cfg.write_queue_nums, cfg.read_queue_nums):
            raise QueueIdIllegalError(f"request queueId[{queue_id}] is illegal: topic {topic} has "
                                      f"{cfg.write_queue_nums} write and {cfg.read_queue_nums} read queues")
        body = request.body
        if not body:
            raise MessageIllegalError("the reply message body is empty")
        props = P.decode_properties(h.properties) if h.properties else {}
        born = _peer(conn)
        remark = await self._push(conn, h, queue_id, props, body)
        fields: dict[str, str] = {"msgId": "0", "queueId": str(queue_id), "queueOffset": "0",
                                  "MSG_REGION": "DefaultRegion", "TRACE_ON": "true"}
        if self.store_replies:
            m = StoreMessage(topic, body, queue_id, props, h.flag, h.sys_flag,
                             h.born_timestamp or int(time.time() * 1000), born, h.reconsume_times or 0)
            try:
                _, results = await stored(self.appender.put(topic, queue_id, [m]))
                fields.update(msgId=results[0].msg_id, queueOffset=str(results[0].queue_offset))
            except SluiceError as exc:  # RocketMQ logs a failed put; the push decides the answer
                log.warning("storing a reply in %s failed: %s", topic, exc)
        if remark is not None:
            return request.make_response(ResponseCode.SYSTEM_ERROR, remark, fields)
        return request.make_response(ext_fields=fields)

    async def _push(self, conn: RemotingConnection, h: SendMessageRequestHeader, queue_id: int,
                    props: dict[str, str], body: bytes) -> str | None:
        """Push the reply to its requester; None when it took it, else why not (the response's remark)."""
        client_id = props.get(P.REPLY_TO_CLIENT)
        if not client_id:
            self.push_failed += 1
            return f"reply message properties[{P.REPLY_TO_CLIENT}] is null"
        target = self.find_client(client_id)
        if target is None:
            self.push_failed += 1
            remark = f"push reply message fail, channel of <{client_id}> not found."
            log.warning(remark)
            return remark
        pushed = dict(props)
        pushed[P.PUSH_REPLY_TIME] = str(int(time.time() * 1000))
        header = ReplyMessageRequestHeader(
            producer_group=h.producer_group, topic=h.topic, default_topic=h.default_topic,
            default_topic_queue_nums=h.default_topic_queue_nums, queue_id=queue_id, sys_flag=h.sys_flag,
            born_timestamp=h.born_timestamp, flag=h.flag, properties=P.encode_properties(pushed),
            reconsume_times=h.reconsume_times, unit_mode=h.unit_mode, born_host=_java_addr(*_peer(conn)),
            store_host=_java_addr(*self.store_host), store_timestamp=int(time.time() * 1000))
        cmd = RemotingCommand.request(RequestCode.PUSH_REPLY_MESSAGE_TO_CLIENT, header.to_ext(), body)
        try:
            response = await target.request(cmd, self.push_timeout_s)
        except SluiceError as exc:
            self.push_failed += 1
            log.warning("push reply message to <%s> fail: %s", client_id, exc)
            return f"push reply message to {client_id} fail."
        if response.code != ResponseCode.SUCCESS:
            self.push_failed += 1
            log.warning("push reply message to <%s> return fail, response remark: %s", client_id, response.remark)
            return f"push reply message to {client_id} fail."
        self.pushed += 1
        return None
