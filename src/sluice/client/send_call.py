"""SendCall: one send and its retries, carried by callbacks on the producer's loop.

This is DefaultMQProducerImpl.sendDefaultImpl (and sendKernelImpl) as a state
machine rather than a coroutine: a send whose topic route is cached and whose
broker connection is open costs no task, no coroutine chain and no asyncio
future. The request goes out with ``RemotingConnection.request_with`` and its
response (or timeout, or the connection's loss) comes back to
:meth:`SendCall.set_result` / :meth:`SendCall.set_exception` as the frame is
decoded, which settle the caller's future or start the next attempt. Whatever
must wait (a route to fetch, a connection to open, a transport buffer to
drain, a oneway write) runs in a task that hands its outcome to the same
methods, so there is one retry loop.

The rules are the Java client's: a retriable failure (network, timeout, the
broker's retry codes, see ``fault.is_retriable``) tries a queue of another
broker while attempts (1 + ``retry_times``) and the overall timeout last; a
stored-but-not-SEND_OK answer is retried only with
``retry_another_broker_when_not_store_ok``; ordered sends (a selector or an
explicit queue) make one attempt and raise its error as is; every attempt of
an unordered send charges its broker's latency to the fault strategy.

The outcome goes to an ``asyncio.Future`` (``AsyncProducer.send``) or a
``concurrent.futures.Future`` (the blocking ``Producer``), set on the loop.
A future cancelled by its owner starts no further attempt.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import logging
from collections.abc import Callable
from typing import Any, Protocol

from sluice.client.encoding import PreparedSend, build_send_request, parse_send_response
from sluice.client.fault import MQFaultStrategy, is_retriable
from sluice.client.instance import ClientInstance
from sluice.client.options import ProducerOptions
from sluice.client.results import MessageQueue, SendResult, SendStatus
from sluice.client.routing import QueueSelector, TopicPublishInfo
from sluice.errors import ClientError, InvalidParameterError, RemotingError, RemotingTimeoutError, SluiceError
from sluice.message import Message
from sluice.protocol.command import RemotingCommand

__all__ = ["AnyFuture", "SendCall", "Sender", "settle"]

log = logging.getLogger("sluice.client.producer")

AnyFuture = asyncio.Future[Any] | concurrent.futures.Future[Any]


class Sender(Protocol):
    """What a SendCall uses of its producer (AsyncProducer)."""

    group: str
    options: ProducerOptions
    fault: MQFaultStrategy

    @property
    def instance(self) -> ClientInstance: ...

    def publish_info_now(self, topic: str) -> TopicPublishInfo | None: ...

    async def publish_info(self, topic: str) -> TopicPublishInfo: ...


def settle(fut: AnyFuture, result: Any, exc: BaseException | None) -> None:
    """Give ``fut`` its outcome unless its owner cancelled it (on the loop that runs the send)."""
    if type(fut) is concurrent.futures.Future or isinstance(fut, concurrent.futures.Future):
        if not fut.set_running_or_notify_cancel():  # cancelled by its owner meanwhile
            return
    elif fut.done():
        return
    if exc is None:
        fut.set_result(result)
    else:
        fut.set_exception(exc)


class SendCall:
    """One send (every attempt of it); :meth:`start` it on the producer's loop. It is the response waiter
    of its current attempt (``done`` / ``set_result`` / ``set_exception``, see RemotingConnection.request_with).
    ``on_result(result)`` runs before the future gets a successful result (the Pub trace record)."""

    __slots__ = ("producer", "prepared", "msg", "fut", "timeout", "selector", "arg", "queue", "oneway", "on_result",
                 "loop", "deadline", "info", "left", "last_broker", "last_exc", "result", "tried", "mq", "begin",
                 "task", "finished", "ordered")

    def __init__(self, producer: Sender, prepared: PreparedSend, msg: Message | None, fut: AnyFuture, *,
                 timeout: float | None, selector: QueueSelector | None = None, arg: Any = None,
                 queue: MessageQueue | None = None, oneway: bool = False,
                 on_result: Callable[[SendResult], None] | None = None) -> None:
        self.producer = producer
        self.prepared = prepared
        self.msg = msg
        self.fut = fut
        self.timeout = producer.options.send_timeout if timeout is None else timeout
        self.selector = selector
        self.arg = arg
        self.queue = queue
        #: A selector or an explicit queue: one attempt, on that queue (set once: read on every attempt).
        self.ordered = selector is not None or queue is not None
        self.oneway = oneway
        self.on_result = on_result
        self.loop: asyncio.AbstractEventLoop | None = None
        self.deadline = 0.0
        self.info: TopicPublishInfo | None = None
        self.left = 1 if oneway else 1 + producer.options.retry_times
        self.last_broker: str | None = None
        self.last_exc: SluiceError | None = None
        self.result: SendResult | None = None
        self.tried: list[MessageQueue] = []  # the queues of the attempts made
        self.mq: MessageQueue | None = None
        self.begin = 0.0
        self.task: asyncio.Task[None] | None = None
        self.finished = False

    # ------------------------------------------------------------------------------ steps

    def start(self) -> None:
        """Begin on the running loop: the first attempt is written before this returns when the topic's
        route and the broker's connection are at hand."""
        try:
            if self.timeout <= 0:
                raise InvalidParameterError(f"timeout must be positive, got {self.timeout}")
            self.loop = loop = asyncio.get_running_loop()
            self.deadline = loop.time() + self.timeout
            info = self.producer.publish_info_now(self.prepared.topic)
            if info is None:
                self._spawn(self._fetch_route())
            else:
                self._routed(info)
        except Exception as exc:
            self._finish(None, exc)

    def start_from_thread(self, loop: asyncio.AbstractEventLoop) -> bool:
        """Write the first attempt from the calling thread, not ``loop``'s (the blocking Producer's sends: no
        wake-up of the loop thread before the request leaves). True once written: the response, any retry and
        the future's outcome then come on the loop, as after :meth:`start`. False, with nothing sent (drop this
        call and :meth:`start` a new one on the loop), when the send needs the loop: ordered or oneway, the
        fault strategy on (its tables are the loop's), no cached route or broker address, or a connection that
        is not open to other threads or has other bytes waiting (RemotingClient.request_from_thread)."""
        producer = self.producer
        if self.ordered or self.oneway or self.timeout <= 0 or producer.fault.enabled:
            return False
        info = producer.publish_info_now(self.prepared.topic)
        if info is None:
            return False
        inst = producer.instance
        mq = info.select_one(None)
        addr = inst.find_broker_addr(mq.broker_name)
        if addr is None:
            return False
        request = self._request(mq)
        # Everything the response's handling reads is set before the bytes leave: it may run at once.
        self.loop = loop
        self.begin = begin = loop.time()
        self.deadline = begin + self.timeout
        self.info = info
        self.left -= 1
        self.last_broker = mq.broker_name
        self.tried.append(mq)
        self.mq = mq
        return inst.remoting.request_from_thread(addr, request, self.timeout, self)

    async def _fetch_route(self) -> None:
        try:
            info = await self.producer.publish_info(self.prepared.topic)
        except Exception as exc:
            self._finish(None, exc)
            return
        self._routed(info)

    def _routed(self, info: TopicPublishInfo) -> None:
        if not self.ordered:
            self.info = info
            self._next()
            return
        try:
            queue = self.queue
            if queue is None:
                assert self.selector is not None
                queue = self.selector(list(info.queues), self.msg, self.arg)  # type: ignore[arg-type]
                if not isinstance(queue, MessageQueue):
                    raise ClientError(f"the queue selector returned {queue!r}, not a MessageQueue")
            if queue.topic != self.prepared.topic:
                raise InvalidParameterError(f"queue {queue} is not a queue of topic {self.prepared.topic!r}")
            remaining = self.deadline - self.loop.time()  # type: ignore[union-attr]
            if remaining <= 0:
                raise RemotingTimeoutError(f"send to {self.prepared.topic} timed out before it could start")
        except Exception as exc:
            self._finish(None, exc)
            return
        self.mq = queue
        self._send(queue, remaining)

    def _next(self) -> None:
        """The retry loop's next turn (unordered sends): another queue, avoiding the broker that just failed."""
        if self.tried and self.fut.cancelled():  # before a retry: the owner may have given up
            self._finish(None, None)
            return
        if self.left > 0:
            self.left -= 1
            mq = self.producer.fault.select_one_message_queue(self.info, self.last_broker)  # type: ignore[arg-type]
            self.last_broker = mq.broker_name
            self.begin = begin = self.loop.time()  # type: ignore[union-attr]
            remaining = self.deadline - begin
            if remaining > 0:
                self.tried.append(mq)
                self.mq = mq
                self._send(mq, remaining)
                return
        self._exhausted()

    def _send(self, mq: MessageQueue, remaining: float) -> None:
        """One attempt: written at once on an open, writable connection; else through a task."""
        try:
            inst = self.producer.instance
            addr = inst.find_broker_addr(mq.broker_name)
            remoting = inst.remoting
            conn = None if addr is None or self.oneway else remoting.open_connection(addr)
            if conn is None:
                self._spawn(self._kernel(mq, remaining))
                return
            remoting.request_with(conn, self._request(mq), remaining, self)
        except Exception as exc:
            self._answered(None, exc)

    def _request(self, mq: MessageQueue) -> RemotingCommand:
        o = self.producer.options
        return build_send_request(self.prepared, mq, group=self.producer.group, default_topic=o.create_topic_key,
                                  default_topic_queue_nums=o.default_topic_queue_nums, v2=o.use_v2_header,
                                  oneway=self.oneway)

    async def _kernel(self, mq: MessageQueue, timeout: float) -> None:
        """sendKernelImpl's waiting case: the broker's address from a fresh route, a connection to open, a
        transport buffer to drain, or a oneway write."""
        try:
            inst = self.producer.instance
            addr = inst.find_broker_addr(mq.broker_name)
            if addr is None:
                await self.producer.publish_info(mq.topic)
                addr = inst.find_broker_addr(mq.broker_name)
            if addr is None:
                raise ClientError(f"broker {mq.broker_name!r} has no known master address")
            request = self._request(mq)
            if self.oneway:
                try:
                    async with asyncio.timeout(timeout):
                        await inst.remoting.invoke_oneway(addr, request)
                except TimeoutError:
                    raise RemotingTimeoutError(f"oneway send to {addr} not written within {timeout:g} s") from None
                response = None
            else:
                response = await inst.remoting.invoke(addr, request, timeout)
        except asyncio.CancelledError:
            if not self.finished:  # the loop is going away (or the owner cancelled): so does the send
                self.finished = True
                self.fut.cancel()
            raise
        except Exception as exc:
            self._answered(None, exc)
            return
        self._answered(response, None)

    def _spawn(self, coro: Any) -> None:
        self.task = self.loop.create_task(coro)  # type: ignore[union-attr]

    # ------------------------------------------------------------------------------ outcomes

    def done(self) -> bool:
        return self.finished

    def set_result(self, response: RemotingCommand) -> None:
        self._answered(response, None)

    def set_exception(self, exc: BaseException) -> None:
        self._answered(None, exc)

    def _answered(self, response: RemotingCommand | None, exc: BaseException | None) -> None:
        """An attempt's outcome: the result, the next attempt, or the error (never raises: this runs inside
        the connection's frame decoding)."""
        try:
            result = None
            if exc is None and not self.oneway:
                try:
                    result = parse_send_response(response, self.prepared, self.mq)  # type: ignore[arg-type]
                except Exception as e:
                    exc = e
            if self.ordered:
                self._finish(result, exc)
                return
            mq = self.mq
            assert mq is not None
            latency = (self.loop.time() - self.begin) * 1000  # type: ignore[union-attr]
            fault = self.producer.fault
            if exc is not None:
                if not isinstance(exc, SluiceError):
                    self._finish(None, exc)
                    return
                # Unreachable, timed out, or the broker vanished from the route: charge the full isolation.
                network = isinstance(exc, (RemotingError, ClientError))
                fault.update_fault_item(mq.broker_name, latency, network)
                if not network and not is_retriable(exc):
                    self._finish(None, exc)
                    return
                self.last_exc = exc
                log.debug("send to %s failed (%s); retrying elsewhere", mq, exc)
                self._next()
                return
            fault.update_fault_item(mq.broker_name, latency, False)
            if (result is not None and result.status is not SendStatus.SEND_OK
                    and self.producer.options.retry_another_broker_when_not_store_ok):
                self.result = result
                self._next()
                return
            self._finish(result, None)
        except BaseException as bug:
            self._finish(None, bug)

    def _exhausted(self) -> None:
        if self.result is not None:  # the last stored attempt, though not as durably as asked
            self._finish(self.result, None)
            return
        topic, tried = self.prepared.topic, [f"{mq.broker_name}/{mq.queue_id}" for mq in self.tried]
        exc = self.last_exc
        if exc is None:
            self._finish(None, RemotingTimeoutError(f"send to topic {topic!r} timed out after {self.timeout:g} s "
                                                    f"(tried {', '.join(tried) or 'no queue'})"))
            return
        exc.add_note(f"sluice: send to topic {topic!r} failed after {len(tried)} attempt(s) on {', '.join(tried)}")
        self._finish(None, exc)

    def _finish(self, result: SendResult | None, exc: BaseException | None) -> None:
        if self.finished:
            return
        self.finished = True
        if exc is None and result is not None and self.on_result is not None and not self.fut.cancelled():
            self.on_result(result)  # it never raises (AsyncProducer._pub_trace)
        settle(self.fut, result, exc)
