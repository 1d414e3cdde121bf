"""AsyncProducer: the one producer implementation (the blocking Producer wraps it on a loop thread).

The API layer (this module) validates and prepares a message once — unique
id, compression — then the sender loop (:meth:`AsyncProducer._send_default`,
DefaultMQProducerImpl.sendDefaultImpl) picks a queue, sends, and on a
retriable failure tries again on a queue of another broker, within one overall
timeout. Ordered sends (a queue selector or an explicit queue) make exactly
one attempt: retrying elsewhere would break the order.
"""
from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import time
from collections.abc import Iterable, Sequence
from typing import Any

from sluice.client.encoding import PreparedSend, build_send_request, parse_send_response, prepare_batch, prepare_message
from sluice.client.fault import MQFaultStrategy, is_retriable
from sluice.client.lifecycle import AsyncClient
from sluice.client.options import ProducerOptions
from sluice.client.reply import (ReplyMessage, ReplyWaiters, RequestCallback, check_request, new_correlation_id,
                                 with_callback)
from sluice.client.results import MessageQueue, SendResult, SendStatus
from sluice.client.routing import QueueSelector, TopicPublishInfo
from sluice.client.instance import ClientConfig
from sluice.client.trace import MAX_MESSAGE_SIZE, TraceDispatcher
from sluice.errors import (ClientError, InvalidParameterError, RemotingError, RemotingTimeoutError, RequestTimeoutError,
                           SluiceError)
from sluice.message import Message, MessageExt
from sluice.protocol import properties as P
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
            trace, self.trace = self.trace, None
            if trace is not None:
                await trace.shutdown()
            await self._leave(inst)

    # ------------------------------------------------------------------------------ routes

    async def publish_info(self, topic: str) -> TopicPublishInfo:
        inst = self.instance
        route = await inst.publish_route(topic, default_topic=self.options.create_topic_key,
                                         default_queue_nums=self.options.default_topic_queue_nums)
        version = inst.route_versions.get(topic, 0)
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
        prepared = self._prepare(msg)
        trace = self.trace
        if trace is None or prepared.topic == trace.topic:
            result = await self._dispatch(prepared, msg, timeout, selector, arg, queue, oneway=False)
        else:
            begin = int(time.time() * 1000)
            result = await self._dispatch(prepared, msg, timeout, selector, arg, queue, oneway=False)
            assert result is not None
            try:
                addr = self.instance.find_broker_addr(result.queue.broker_name) or ""
                trace.pub(self.group, msg, result, begin, addr)
            except Exception as exc:  # tracing never fails a send the broker stored
                log.warning("Pub trace record of %s not made: %r", result.msg_id, exc)
        assert result is not None
        return result

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
        timeout = self.options.send_timeout if timeout is None else timeout
        if timeout <= 0:
            raise InvalidParameterError(f"timeout must be positive, got {timeout}")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        info = await self.publish_info(prepared.topic)
        if selector is not None or queue is not None:
            if queue is None:
                assert selector is not None
                queue = selector(list(info.queues), msg, arg)  # type: ignore[arg-type]
                if not isinstance(queue, MessageQueue):
                    raise ClientError(f"the queue selector returned {queue!r}, not a MessageQueue")
            if queue.topic != prepared.topic:
                raise InvalidParameterError(f"queue {queue} is not a queue of topic {prepared.topic!r}")
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise RemotingTimeoutError(f"send to {prepared.topic} timed out before it could start")
            return await self._send_kernel(prepared, queue, remaining, oneway)
        return await self._send_default(prepared, info, deadline, timeout, oneway)

    # ------------------------------------------------------------------------------ sender

    async def _send_default(self, prepared: PreparedSend, info: TopicPublishInfo, deadline: float,
                            timeout: float, oneway: bool) -> SendResult | None:
        loop = asyncio.get_running_loop()
        attempts = 1 if oneway else 1 + self.options.retry_times
        last_broker: str | None = None
        last_exc: SluiceError | None = None
        tried: list[str] = []
        result: SendResult | None = None
        for _ in range(attempts):
            mq = self.fault.select_one_message_queue(info, last_broker)
            last_broker = mq.broker_name
            begin = loop.time()
            remaining = deadline - begin
            if remaining <= 0:
                break
            tried.append(f"{mq.broker_name}/{mq.queue_id}")
            try:
                result = await self._send_kernel(prepared, mq, remaining, oneway)
            except (RemotingError, ClientError) as exc:
                # Unreachable, timed out, or the broker vanished from the route: charge the full isolation.
                self.fault.update_fault_item(mq.broker_name, (loop.time() - begin) * 1000, True)
                last_exc = exc
                log.debug("send to %s failed (%s); retrying elsewhere", mq, exc)
                continue
            except SluiceError as exc:
                self.fault.update_fault_item(mq.broker_name, (loop.time() - begin) * 1000, False)
                if not is_retriable(exc):
                    raise
                last_exc = exc
                log.debug("broker refused send to %s (%s); retrying elsewhere", mq, exc)
                continue
            self.fault.update_fault_item(mq.broker_name, (loop.time() - begin) * 1000, False)
            if (result is not None and result.status is not SendStatus.SEND_OK
                    and self.options.retry_another_broker_when_not_store_ok):
                continue
            return result
        if result is not None:  # the last attempt stored it, though not as durably as asked
            return result
        if last_exc is None:
            raise RemotingTimeoutError(f"send to topic {prepared.topic!r} timed out after {timeout:g} s "
                                       f"(tried {', '.join(tried) or 'no queue'})")
        last_exc.add_note(f"sluice: send to topic {prepared.topic!r} failed after {len(tried)} attempt(s) "
                          f"on {', '.join(tried)}")
        raise last_exc

    async def _send_kernel(self, prepared: PreparedSend, mq: MessageQueue, timeout: float,
                           oneway: bool) -> SendResult | None:
        inst = self.instance
        addr = inst.find_broker_addr(mq.broker_name)
        if addr is None:
            await self.publish_info(mq.topic)
            addr = inst.find_broker_addr(mq.broker_name)
        if addr is None:
            raise ClientError(f"broker {mq.broker_name!r} has no known master address")
        o = self.options
        request = build_send_request(prepared, mq, group=self.group, default_topic=o.create_topic_key,
                                     default_topic_queue_nums=o.default_topic_queue_nums, v2=o.use_v2_header,
                                     oneway=oneway)
        if oneway:
            try:
                async with asyncio.timeout(timeout):
                    await inst.remoting.invoke_oneway(addr, request)
            except TimeoutError:
                raise RemotingTimeoutError(f"oneway send to {addr} not written within {timeout:g} s") from None
            return None
        response = await inst.remoting.invoke(addr, request, timeout)
        return parse_send_response(response, prepared, mq)
