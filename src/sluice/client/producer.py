"""AsyncProducer: the one producer implementation (the blocking Producer wraps it on a loop thread).

The API layer (this module) validates and prepares a message once — unique
id, compression — then a SendCall (client/send_call.py,
DefaultMQProducerImpl.sendDefaultImpl) picks a queue, sends, and on a
retriable failure tries again on a queue of another broker, within one overall
timeout. Ordered sends (a queue selector or an explicit queue) make exactly
one attempt: retrying elsewhere would break the order.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import functools
import itertools
import logging
import time
from collections.abc import Iterable, Sequence
from typing import Any

from sluice.client.accumulate import Accumulator
from sluice.client.encoding import PreparedSend, prepare_batch, prepare_message
from sluice.client.fault import MQFaultStrategy
from sluice.client.lifecycle import AsyncClient
from sluice.client.options import ProducerOptions
from sluice.client.reply import (ReplyMessage, ReplyWaiters, RequestCallback, check_request, new_correlation_id,
                                 with_callback)
from sluice.client.results import MessageQueue, SendResult
from sluice.client.routing import QueueSelector, TopicPublishInfo
from sluice.client.send_call import AnyFuture, SendCall, settle
from sluice.client.instance import ClientConfig
from sluice.client.trace import MAX_MESSAGE_SIZE, TraceDispatcher
from sluice.errors import ClientError, InvalidParameterError, RequestTimeoutError
from sluice.message import Message, MessageExt
from sluice.protocol import properties as P
from sluice.protocol.bodies import TopicRouteData
from sluice.protocol.trace import TRACE_PRODUCER_GROUP

__all__ = ["AsyncProducer", "started_trace"]

log = logging.getLogger(__name__)
_trace_instances = itertools.count(1)


async def started_trace(namesrv: str | list[str], client_config: ClientConfig, enable: bool,
                        topic: str) -> TraceDispatcher | None:
    """A traced client's started TraceDispatcher (None when ``enable`` is off), whose inner producer (group
    _INNER_TRACE_PRODUCER, 5 s send timeout, AsyncTraceDispatcher's 128,000-byte limit) runs on a client instance
    of its own, as RocketMQ's PID_CLIENT_INNER_TRACE_PRODUCER does, with the traced client's connection settings
    (ACL, TLS)."""
    if not enable:
        return None
    cfg = {f.name: getattr(client_config, f.name) for f in dataclasses.fields(ClientConfig)}
    cfg["instance_name"] = f"PID_CLIENT_INNER_TRACE_PRODUCER_{next(_trace_instances)}"
    producer = AsyncProducer(TRACE_PRODUCER_GROUP, namesrv, send_timeout=5.0,
                             max_message_size=MAX_MESSAGE_SIZE + 10_000, **cfg)
    trace = TraceDispatcher(producer, topic)
    await trace.start()
    return trace


class AsyncProducer(AsyncClient):
    """``async with AsyncProducer("group", namesrv="127.0.0.1:9876") as p: await p.send(msg)``.

    Options (keywords): see :class:`sluice.client.options.ProducerOptions` and
    :class:`sluice.client.instance.ClientConfig`.
    """

    _kind = "producer"
    _role = "producer"

    def __init__(self, group: str, namesrv: str | Iterable[str], **options: Any) -> None:
        self.options = self._setup(group, namesrv, ProducerOptions, options)
        self.fault = MQFaultStrategy(self.options.send_latency_fault_enable, self.options.latency_table)
        self._publish: dict[str, tuple[int, TopicPublishInfo]] = {}
        #: The trace dispatcher while started with enable_trace (None: tracing costs one test per send).
        self.trace: TraceDispatcher | None = None
        #: auto_batch's waiting sends (client/accumulate.py); None when off.
        self.accumulator = Accumulator(self) if self.options.auto_batch else None

    # ------------------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        inst = await self._join()
        await inst.send_heartbeat_to_all()
        try:
            self.trace = await started_trace(self.namesrv, self.client_config, self.options.enable_trace,
                                             self.options.trace_topic)
        except BaseException:
            await self._leave(inst)
            raise

    async def shutdown(self) -> None:
        inst = self._instance
        if inst is not None:
            if self.accumulator is not None:  # what waits goes now; its sends get send_timeout to finish
                await self.accumulator.close(self.options.send_timeout)
            trace, self.trace = self.trace, None
            if trace is not None:
                await trace.shutdown()
            await self._leave(inst)

    # ------------------------------------------------------------------------------ routes

    def publish_info_now(self, topic: str) -> TopicPublishInfo | None:
        """The topic's publish info when its route is cached (what :meth:`publish_info` returns without
        waiting), else None."""
        route = self.instance.routes.get(topic)
        return None if route is None else self._publish_info_of(topic, route)

    async def publish_info(self, topic: str) -> TopicPublishInfo:
        info = self.publish_info_now(topic)
        if info is not None:
            return info
        route = await self.instance.publish_route(topic, default_topic=self.options.create_topic_key,
                                                  default_queue_nums=self.options.default_topic_queue_nums)
        return self._publish_info_of(topic, route)

    def _publish_info_of(self, topic: str, route: TopicRouteData) -> TopicPublishInfo:
        version = self.instance.route_versions.get(topic, 0)
        cached = self._publish.get(topic)
        if cached is not None and cached[0] == version:
            return cached[1]
        info = TopicPublishInfo(topic, route)
        if not info.ok:
            raise ClientError(f"topic {topic!r} has no writable queue on a broker with a master")
        self._publish[topic] = (version, info)
        return info

    async def fetch_publish_queues(self, topic: str) -> list[MessageQueue]:
        """The queues a send to ``topic`` chooses from (what a queue selector receives)."""
        return list((await self.publish_info(topic)).queues)

    # ------------------------------------------------------------------------------ API

    async def send(self, msg: Message, *, timeout: float | None = None, selector: QueueSelector | None = None,
                   arg: Any = None, queue: MessageQueue | None = None) -> SendResult:
        """Send and wait for the broker's answer. ``selector(queues, msg, arg)`` or ``queue`` pins the
        queue (ordered sends; one attempt)."""
        fut: asyncio.Future[SendResult] = asyncio.get_running_loop().create_future()
        self.send_soon(msg, fut, timeout=timeout, selector=selector, arg=arg, queue=queue)
        return await fut

    def send_soon(self, msg: Message, fut: AnyFuture, *, timeout: float | None = None,
                  selector: QueueSelector | None = None, arg: Any = None, queue: MessageQueue | None = None) -> None:
        """:meth:`send` without a coroutine, on this producer's loop: the SendResult or the error goes to ``fut``
        (an asyncio or a concurrent.futures Future; the blocking Producer passes the latter), set on the loop.
        The request is written before this returns when the topic's route and the broker's connection are
        at hand. With ``auto_batch`` a message it may batch waits while a send of its topic is in flight
        (client/accumulate.py)."""
        acc = self.accumulator
        if acc is not None and acc.takes(msg, selector, queue):
            acc.add(msg, fut, timeout)
            return
        self.send_now(msg, fut, timeout=timeout, selector=selector, arg=arg, queue=queue)

    def send_now(self, msg: Message, fut: AnyFuture, *, timeout: float | None = None,
                 selector: QueueSelector | None = None, arg: Any = None, queue: MessageQueue | None = None) -> None:
        """:meth:`send_soon` without waiting for a batch."""
        try:
            prepared = self._prepare(msg)
        except Exception as exc:
            settle(fut, None, exc)
            return
        trace = self.trace
        pub = None
        if trace is not None and prepared.topic != trace.topic:
            pub = functools.partial(self._pub_trace, trace, msg, int(time.time() * 1000))
        SendCall(self, prepared, msg, fut, timeout=timeout, selector=selector, arg=arg, queue=queue,
                 on_result=pub).start()

    def send_from_thread(self, msg: Message, fut: concurrent.futures.Future[SendResult],
                         loop: asyncio.AbstractEventLoop, *, timeout: float | None = None) -> bool:
        """:meth:`send_soon`'s first attempt written from the calling thread, which is not ``loop``'s (the
        blocking Producer's ``send`` and ``send_async``): True once written, ``fut`` then settled on the loop as
        send_soon's is. False, with nothing sent, when the send needs the loop (SendCall.start_from_thread) or
        the message is invalid, or with ``auto_batch`` when a message it batches has a send of its topic in
        flight or waiting: then call send_soon on the loop, which raises the error."""
        acc = self.accumulator
        if acc is not None and acc.takes(msg, None, None):
            return acc.add_from_thread(msg, fut, timeout, loop)
        return self.send_from_thread_as(msg, fut, loop, timeout)

    def send_from_thread_as(self, msg: Message, fut: Any, loop: asyncio.AbstractEventLoop,
                            timeout: float | None) -> bool:
        """:meth:`send_from_thread` without auto-batching: ``fut`` (a concurrent.futures Future, or what an
        accumulated send settles) gets the outcome on the loop."""
        try:
            prepared = self._prepare(msg)
        except Exception:
            return False
        trace = self.trace
        pub = None
        if trace is not None and prepared.topic != trace.topic:
            pub = functools.partial(self._pub_trace, trace, msg, int(time.time() * 1000))
        return SendCall(self, prepared, msg, fut, timeout=timeout, on_result=pub).start_from_thread(loop)

    def send_batch_from_thread(self, msgs: Sequence[Message], fut: concurrent.futures.Future[SendResult],
                               loop: asyncio.AbstractEventLoop, *, timeout: float | None = None) -> bool:
        """:meth:`send_batch`'s first attempt written from the calling thread, as :meth:`send_from_thread` does
        for one message (the blocking Producer's ``send_batch``: no wake-up of the loop thread, no task). False,
        with nothing sent, when tracing is on, the batch is invalid or the send needs the loop: then await
        :meth:`send_batch` there, which raises the error."""
        if self.trace is not None:
            return False
        try:
            prepared = prepare_batch(list(msgs), max_size=self.options.max_message_size)
        except Exception:
            return False
        return SendCall(self, prepared, None, fut, timeout=timeout).start_from_thread(loop)

    def _pub_trace(self, trace: TraceDispatcher, msg: Message, begin: int, result: SendResult) -> None:
        try:
            addr = self.instance.find_broker_addr(result.queue.broker_name) or ""
            trace.pub(self.group, msg, result, begin, addr)
        except Exception as exc:  # tracing never fails a send the broker stored
            log.warning("Pub trace record of %s not made: %r", result.msg_id, exc)

    async def send_oneway(self, msg: Message, *, selector: QueueSelector | None = None, arg: Any = None,
                          queue: MessageQueue | None = None) -> None:
        """Write the message and return without waiting for (or getting) an answer; one attempt."""
        await self._dispatch(self._prepare(msg), msg, None, selector, arg, queue, oneway=True)

    async def send_batch(self, msgs: Sequence[Message], *, timeout: float | None = None,
                         queue: MessageQueue | None = None) -> SendResult:
        """One SEND_BATCH_MESSAGE for messages of one topic; ``msg_id`` lists their ids, comma-joined."""
        prepared = prepare_batch(list(msgs), max_size=self.options.max_message_size)
        sending = self._dispatch(prepared, None, timeout, None, None, queue, oneway=False)
        result = await (sending if self.trace is None else self.trace.traced_send(self, msgs, sending))  # trace hook
        assert result is not None
        return result

    async def request(self, msg: Message, timeout: float = 3.0, *, selector: QueueSelector | None = None,
                      arg: Any = None, queue: MessageQueue | None = None) -> MessageExt:
        """Send ``msg`` as a request and return the reply a consumer sent with ``sluice.reply_to``
        (DefaultMQProducerImpl.request). ``timeout`` covers the send and the wait; RequestTimeoutError names
        the correlation id when no reply came in time. ``selector(queues, msg, arg)`` or ``queue`` pins the
        queue as for :meth:`send` (request(msg, selector, arg, timeout) / request(msg, mq, timeout))."""
        check_request(msg, timeout)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        inst = self.instance
        prepared = self._prepare(msg)
        correlation_id = new_correlation_id()
        props = P.decode_properties(prepared.properties)
        props[P.CORRELATION_ID] = correlation_id
        props[P.REPLY_TO_CLIENT] = inst.client_id
        props[P.TTL] = str(int(timeout * 1000))
        prepared = dataclasses.replace(prepared, properties=P.encode_properties(props))
        if prepared.topic not in inst.routes:
            # prepareSendRequest: a broker seen for the first time must know this client before it pushes to it.
            await self.publish_info(prepared.topic)
            await inst.send_heartbeat_to_all()
        waiters = ReplyWaiters.of(inst)
        reply = waiters.expect(correlation_id)
        try:
            sending = self._dispatch(prepared, msg, max(deadline - loop.time(), 0.001), selector, arg, queue,
                                     oneway=False)
            await (sending if self.trace is None else self.trace.traced_send(self, msg, sending))  # trace hook
            try:
                async with asyncio.timeout_at(deadline):
                    return await reply
            except TimeoutError:
                raise RequestTimeoutError(
                    f"send request message to <{prepared.topic}> OK, but wait reply message timeout, "
                    f"{int(timeout * 1000)} ms (correlation id {correlation_id})",
                    correlation_id=correlation_id) from None
        finally:
            waiters.forget(correlation_id)

    def request_async(self, msg: Message, timeout: float = 3.0, *, selector: QueueSelector | None = None,
                      arg: Any = None, queue: MessageQueue | None = None,
                      callback: RequestCallback | None = None) -> asyncio.Task[MessageExt]:
        """:meth:`request` without waiting (request(msg, RequestCallback, timeout) and its selector and queue
        forms): the task, and ``callback(reply, error)`` on the loop, get the reply or the error (a
        RequestTimeoutError naming the correlation id, or the send's). Invalid arguments raise here."""
        check_request(msg, timeout)
        return with_callback(self.request(msg, timeout, selector=selector, arg=arg, queue=queue), callback)

    def _prepare(self, msg: Message) -> PreparedSend:
        if not isinstance(msg, Message):
            raise InvalidParameterError(f"send takes a sluice.Message, not {type(msg).__name__}")
        o = self.options
        prepared = prepare_message(msg, max_size=o.max_message_size, compress_over=o.compress_over,
                                   compress_level=o.compress_level)
        if isinstance(msg, ReplyMessage):  # reply_to's routing properties, which users may not set themselves
            props = P.decode_properties(prepared.properties)
            props.update(msg.reply_properties)
            prepared = dataclasses.replace(prepared, properties=P.encode_properties(props),
                                           reply=props.get(P.MSG_TYPE) == P.REPLY_MESSAGE_FLAG)
        return prepared

    async def _dispatch(self, prepared: PreparedSend, msg: Message | None, timeout: float | None,
                        selector: QueueSelector | None, arg: Any, queue: MessageQueue | None,
                        *, oneway: bool) -> SendResult | None:
        """Send a prepared message (its attempts: client/send_call.py) and wait for the outcome."""
        fut: asyncio.Future[SendResult | None] = asyncio.get_running_loop().create_future()
        SendCall(self, prepared, msg, fut, timeout=timeout, selector=selector, arg=arg, queue=queue,
                 oneway=oneway).start()
        return await fut
