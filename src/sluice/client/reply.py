"""Request-reply, the client's side (RocketMQ 4.7+: DefaultMQProducer.request, MessageUtil.createReplyMessage).

A requester sends a message carrying CORRELATION_ID (a fresh UUID),
REPLY_TO_CLIENT (its client id) and TTL (the timeout, ms); the broker adds
CLUSTER. The consumer that gets it answers with ``reply_to(msg, body)``, a
message for ``<cluster>_REPLY_TOPIC`` carrying MSG_TYPE=reply and the request's
CORRELATION_ID, REPLY_TO_CLIENT and TTL, sent with an ordinary ``send``
(which uses SEND_REPLY_MESSAGE_V2, 325, for it). The broker pushes the reply to
the requester's client instance (PUSH_REPLY_MESSAGE_TO_CLIENT, 326), where
:class:`ReplyWaiters` completes the request waiting on that correlation id
(ClientRemotingProcessor.receiveReplyMessage, RequestFutureHolder).

The callback forms (DefaultMQProducer.request(msg, RequestCallback, timeout) and its selector and queue forms)
are the same request run as a task; :func:`with_callback` hands its outcome to ``callback(reply, error)``, as
RequestResponseFuture.executeRequestCallback calls onSuccess or onException: the reply, the
RequestTimeoutError of a reply that never came, or the send's own error.
"""
from __future__ import annotations

import asyncio
import logging
import time
import uuid
import zlib
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from sluice.errors import ClientError, InvalidParameterError, SluiceError
from sluice.format import FLAG_COMPRESSED
from sluice.message import Message, MessageExt
from sluice.protocol import properties as P
from sluice.protocol.codes import RequestCode, ResponseCode
from sluice.protocol.command import RemotingCommand
from sluice.protocol.headers import ReplyMessageRequestHeader
from sluice.transport.connection import RemotingConnection

__all__ = ["ReplyMessage", "ReplyWaiters", "RequestCallback", "check_request", "new_correlation_id", "reply_to",
           "with_callback"]

log = logging.getLogger(__name__)

#: ClientErrorCode.CREATE_REPLY_MESSAGE_EXCEPTION.
CREATE_REPLY_MESSAGE_EXCEPTION = 10007


class _HasProperties(Protocol):
    @property
    def properties(self) -> Mapping[str, str]: ...


@dataclass(slots=True)
class ReplyMessage(Message):
    """A reply built by :func:`reply_to`: a Message plus the system properties that route it back."""

    reply_properties: dict[str, str] = field(default_factory=dict)


#: ``callback(reply, error)``: exactly one of them is None (RequestCallback.onSuccess / onException).
RequestCallback = Callable[[MessageExt | None, BaseException | None], None]


def check_request(msg: object, timeout: float) -> None:
    """The arguments a request refuses before anything is sent (the callback forms raise these too)."""
    if not isinstance(msg, Message):
        raise InvalidParameterError(f"request takes a sluice.Message, not {type(msg).__name__}")
    if not timeout > 0:
        raise InvalidParameterError(f"timeout must be positive, got {timeout}")


def with_callback(request: Coroutine[Any, Any, MessageExt],
                  callback: RequestCallback | None) -> asyncio.Task[MessageExt]:
    """``request`` as a task on the running loop whose outcome, when it ends, goes to ``callback(reply, error)``
    (a cancelled request as a ClientError). A callback that raises is logged, as RocketMQ logs it."""
    task = asyncio.get_running_loop().create_task(request)
    if callback is not None:
        def done(t: asyncio.Task[MessageExt]) -> None:
            if t.cancelled():
                reply, error = None, ClientError("request cancelled")
            else:
                error = t.exception()
                reply = None if error is not None else t.result()
            try:
                callback(reply, error)
            except Exception:
                log.warning("request callback raised", exc_info=True)
        task.add_done_callback(done)
    return task


def new_correlation_id() -> str:
    """CorrelationIdUtil.createCorrelationId: a random UUID."""
    return str(uuid.uuid4())


def reply_to(request: _HasProperties, body: bytes, *, tags: str | None = None,
             keys: list[str] | str | None = None, properties: dict[str, str] | None = None) -> ReplyMessage:
    """The reply to a request message a consumer received (MessageUtil.createReplyMessage); send it with any
    producer's ``send``. Raises ClientError when ``request`` is not a request message (no CLUSTER property:
    it was not sent with ``request``)."""
    props = getattr(request, "properties", None)
    if props is None:
        raise ClientError("create reply message fail, requestMessage cannot be null.",
                          code=CREATE_REPLY_MESSAGE_EXCEPTION)
    cluster = props.get(P.CLUSTER)
    if not cluster:
        raise ClientError(f"create reply message fail, requestMessage error, property[{P.CLUSTER}] is null.",
                          code=CREATE_REPLY_MESSAGE_EXCEPTION)
    system = {P.MSG_TYPE: P.REPLY_MESSAGE_FLAG}
    for name in (P.CORRELATION_ID, P.REPLY_TO_CLIENT, P.TTL):
        value = props.get(name)
        if value is not None:  # MessageAccessor.putProperty skips nulls too
            system[name] = value
    return ReplyMessage(f"{cluster}_REPLY_TOPIC", body, tags=tags, keys=keys, properties=dict(properties or {}),
                        reply_properties=system)


def _host(text: str | None) -> tuple[str, int]:
    """Java's ``/127.0.0.1:10911`` (or ``name/1.2.3.4:10911``) to (host, port)."""
    if not text:
        return "", 0
    host, _, port = text.rpartition("/")[2].rpartition(":")
    try:
        return host.strip("[]"), int(port)
    except ValueError:
        return host, 0


def reply_from_push(request: RemotingCommand, received_ms: int) -> MessageExt:
    """The reply a PUSH_REPLY_MESSAGE_TO_CLIENT carries, as receiveReplyMessage builds it."""
    h = ReplyMessageRequestHeader.from_command(request)
    body = request.body or b""
    if h.sys_flag & FLAG_COMPRESSED:
        try:
            body = zlib.decompress(body)
        except zlib.error as exc:
            raise ClientError(f"reply body does not inflate: {exc}") from None
    props = P.decode_properties(h.properties) if h.properties else {}
    props[P.ARRIVE_TIME] = str(received_ms)
    store_host = _host(h.store_host)
    return MessageExt(
        topic=h.topic, body=body, properties=props, queue_id=h.queue_id, queue_offset=0, commitlog_offset=0,
        msg_id=props.get(P.UNIQ_KEY, ""), offset_msg_id="", sysflag=h.sys_flag & ~FLAG_COMPRESSED, flag=h.flag,
        born_timestamp=h.born_timestamp, born_host=_host(h.born_host), store_timestamp=h.store_timestamp,
        store_host=store_host, reconsume_times=h.reconsume_times or 0, body_crc=0, store_size=0)


class ReplyWaiters:
    """One per client instance: the requests waiting for their reply, by correlation id (RequestFutureHolder),
    and the PUSH_REPLY_MESSAGE_TO_CLIENT handler that completes them."""

    def __init__(self, inst: object) -> None:
        self.waiting: dict[str, asyncio.Future[MessageExt]] = {}
        #: Replies that arrived for no waiting request (it timed out first, or another client's).
        self.unmatched = 0
        inst.remoting.register(RequestCode.PUSH_REPLY_MESSAGE_TO_CLIENT, self._on_reply)  # type: ignore[attr-defined]

    @classmethod
    def of(cls, inst: object) -> ReplyWaiters:
        return inst.service(cls, cls)  # type: ignore[attr-defined]  # a ClientInstance

    def expect(self, correlation_id: str) -> asyncio.Future[MessageExt]:
        fut: asyncio.Future[MessageExt] = asyncio.get_running_loop().create_future()
        self.waiting[correlation_id] = fut
        return fut

    def forget(self, correlation_id: str) -> None:
        self.waiting.pop(correlation_id, None)

    async def _on_reply(self, conn: RemotingConnection, request: RemotingCommand) -> RemotingCommand:
        try:
            msg = reply_from_push(request, int(time.time() * 1000))
        except SluiceError as exc:
            log.warning("malformed PUSH_REPLY_MESSAGE_TO_CLIENT from %s: %s", conn.peer, exc)
            return request.make_response(ResponseCode.SYSTEM_ERROR, str(exc))
        cid = msg.properties.get(P.CORRELATION_ID, "")
        fut = self.waiting.pop(cid, None)
        if fut is None or fut.done():
            self.unmatched += 1
            log.warning("receive reply message, but not matched any request, CorrelationId: %s, reply from: %s",
                        cid, conn.peer)
        else:
            fut.set_result(msg)
        # RocketMQ answers SUCCESS either way: the broker's push did reach this client.
        return request.make_response()

