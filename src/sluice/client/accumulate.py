"""Producer auto-batching: RocketMQ 5's ``autoBatch`` (its ProduceAccumulator), coalescing while a send is in flight.

With ``ProducerOptions.auto_batch`` on, an eligible send (``send`` or ``send_async`` of a plain
:class:`~sluice.Message` with no queue or selector, no delay and a body the producer would not compress) of a
topic with no send of this producer in flight goes at once, alone: at a low rate nothing waits. Sends of the
topic made while one is in flight wait, and go together as one SEND_BATCH_MESSAGE when it completes, when
their bodies reach ``batch_max_bytes``, or ``batch_max_delay_ms`` after the first of them, whichever comes
first. Under load a producer then sends a few large requests instead of many small ones, which costs the
broker (and this client) far less per message.

Each message keeps its own future and its own SendResult: its own ``msg_id`` and ``offset_msg_id``, the queue
the batch went to and its own queue offset in it. A batch goes to one queue, with the attempts and retries
of any send; if it fails, each of its messages fails with that error. A message that cannot be sent fails
alone, before it waits (its own validation); a batch the encoder refuses as a whole (too large once
encoded) is sent message by message instead. Everything runs on the producer's event loop, except that the
blocking Producer's send of a topic with nothing in flight or waiting is written from the calling thread
(:meth:`Accumulator.add_from_thread`), as it would be without auto-batching: the topic's entry is claimed
under a lock, and only created or removed under it.
"""
from __future__ import annotations

import asyncio
import dataclasses
import threading
from typing import Any, Protocol

from sluice.client.encoding import prepare_batch
from sluice.client.results import MessageQueue, SendResult
from sluice.client.send_call import AnyFuture, Sender, SendCall, settle
from sluice.client.trace import TraceDispatcher
from sluice.message import Message

__all__ = ["Accumulator"]


class BatchingProducer(Sender, Protocol):
    """What the accumulator uses of its producer (AsyncProducer)."""

    trace: TraceDispatcher | None

    def send_now(self, msg: Message, fut: Any, *, timeout: float | None = None) -> None: ...

    def send_from_thread_as(self, msg: Message, fut: Any, loop: asyncio.AbstractEventLoop,
                            timeout: float | None) -> bool: ...

#: (message, its future, its deadline on the loop's clock)
_Item = tuple[Message, AnyFuture, float]


class _Topic:
    """One topic's sends in flight and the messages waiting for them."""

    __slots__ = ("in_flight", "items", "bytes", "timer")

    def __init__(self) -> None:
        self.in_flight = 0
        self.items: list[_Item] = []
        self.bytes = 0
        self.timer: asyncio.TimerHandle | None = None


class _Sink:
    """What SendCall settles for an accumulated send (one message or a batch): each message's future gets
    its own outcome, and the accumulator learns the send is over."""

    __slots__ = ("acc", "topic", "items", "finished")

    def __init__(self, acc: Accumulator, topic: str, items: list[_Item]) -> None:
        self.acc, self.topic, self.items, self.finished = acc, topic, items, False

    def done(self) -> bool:
        return self.finished

    def cancelled(self) -> bool:  # SendCall asks before a retry: a batch goes on while any message waits
        return False

    def set_result(self, result: SendResult) -> None:
        self._end()
        items = self.items
        if len(items) == 1:
            settle(items[0][1], result, None)
            return
        ids, offset_ids = result.msg_ids, result.offset_msg_ids
        if len(ids) != len(items) or len(offset_ids) != len(items):
            exc = RuntimeError(f"the broker answered a batch of {len(items)} messages with {len(ids)} ids")
            for _, fut, _ in items:
                settle(fut, None, exc)
            return
        for i, (_, fut, _) in enumerate(items):
            settle(fut, dataclasses.replace(result, msg_id=ids[i], offset_msg_id=offset_ids[i],
                                            queue_offset=result.queue_offset + i), None)

    def set_exception(self, exc: BaseException) -> None:
        self._end()
        for _, fut, _ in self.items:
            settle(fut, None, exc)

    def cancel(self) -> None:  # the loop is going away mid-send
        self._end()
        for _, fut, _ in self.items:
            fut.cancel()

    def _end(self) -> None:
        if not self.finished:
            self.finished = True
            self.acc.sent(self.topic)


class Accumulator:
    """A producer's waiting sends, by topic (see the module's docstring); used on the producer's loop."""

    def __init__(self, producer: BatchingProducer) -> None:
        o = producer.options
        self.producer = producer
        self.delay_s = o.batch_max_delay_ms / 1000
        self.max_bytes = o.batch_max_bytes
        self.compress_over = o.compress_over
        self.max_size = o.max_message_size
        self._topics: dict[str, _Topic] = {}
        #: held to add or remove an entry of ``_topics`` (the caller-thread road claims one); the loop's
        #: other steps change only entries that exist
        self._lock = threading.Lock()
        self._idle: asyncio.Event | None = None
        #: batches sent (more than one message) and the messages in them
        self.batches = 0
        self.batched_messages = 0

    def takes(self, msg: Message, selector: Any, queue: MessageQueue | None) -> bool:
        """Whether ``msg`` may wait and go in a batch: a plain, unpinned, undelayed message whose body the
        producer would not compress (batches are never compressed), on an untraced producer."""
        return (selector is None and queue is None and type(msg) is Message and not msg.delay_level
                and msg.deliver_at is None and msg.delay is None and type(msg.body) is bytes
                and len(msg.body) < self.compress_over and self.producer.trace is None)

    def add(self, msg: Message, fut: AnyFuture, timeout: float | None) -> None:
        """Send ``msg`` now, or once the topic's send in flight is over (``takes(msg)`` must be true)."""
        try:
            msg.validate(self.max_size)  # a bad message fails alone, not the batch it would join
        except Exception as exc:
            settle(fut, None, exc)
            return
        loop = asyncio.get_running_loop()
        item = (msg, fut, loop.time() + (self.producer.options.send_timeout if timeout is None else timeout))
        t = self._topics.get(msg.topic)
        if t is None:
            with self._lock:
                t = self._topics.setdefault(msg.topic, _Topic())
        if t.in_flight == 0 and not t.items:
            self._send(msg.topic, t, [item])
            return
        t.items.append(item)
        t.bytes += len(msg.body)
        if t.bytes >= self.max_bytes:
            self._flush(msg.topic)
        elif t.timer is None:
            t.timer = loop.call_later(self.delay_s, self._flush, msg.topic)

    def add_from_thread(self, msg: Message, fut: AnyFuture, timeout: float | None,
                        loop: asyncio.AbstractEventLoop) -> bool:
        """From the blocking Producer's calling thread (not ``loop``'s): when no send of the topic is in flight
        or waiting, write ``msg`` from this thread (AsyncProducer.send_from_thread's road) and return True;
        its outcome then comes on the loop. False, with nothing sent, otherwise: call :meth:`add` on the
        loop (``takes(msg)`` must be true)."""
        topic = msg.topic
        if topic in self._topics:  # a send in flight or waiting: the loop decides (checked again below)
            return False
        t = _Topic()
        t.in_flight = 1
        with self._lock:
            if self._topics.setdefault(topic, t) is not t:
                return False
        sent = False
        try:
            timeout = self.producer.options.send_timeout if timeout is None else timeout
            sink = _Sink(self, topic, [(msg, fut, loop.time() + timeout)])
            sent = self.producer.send_from_thread_as(msg, sink, loop, timeout)
        finally:
            if not sent:  # give the claim back on the loop, where whatever joined meanwhile then goes
                loop.call_soon_threadsafe(self.sent, topic)
        return sent

    def sent(self, topic: str) -> None:
        """A send of ``topic`` is over: what waited for it goes now."""
        t = self._topics[topic]
        t.in_flight -= 1
        if t.items:
            if t.in_flight == 0:
                self._flush(topic)
            return
        if t.in_flight == 0:
            with self._lock:
                del self._topics[topic]
            if not self._topics and self._idle is not None:
                self._idle.set()

    def _flush(self, topic: str) -> None:
        t = self._topics.get(topic)
        if t is None:
            return
        if t.timer is not None:
            t.timer.cancel()
            t.timer = None
        items, t.items, t.bytes = t.items, [], 0
        chunk: list[_Item] = []
        size = 0
        for item in items:  # batches of at most max_bytes of bodies (one message may exceed it alone)
            n = len(item[0].body)
            if chunk and size + n > self.max_bytes:
                self._send(topic, t, chunk)
                chunk, size = [], 0
            chunk.append(item)
            size += n
        if chunk:
            self._send(topic, t, chunk)

    def _send(self, topic: str, t: _Topic, items: list[_Item]) -> None:
        producer = self.producer
        timeout = max(0.001, min(deadline for _, _, deadline in items) - asyncio.get_running_loop().time())
        if len(items) == 1:
            t.in_flight += 1
            producer.send_now(items[0][0], _Sink(self, topic, items), timeout=timeout)
            return
        try:
            prepared = prepare_batch([m for m, _, _ in items], max_size=self.max_size)
        except Exception:  # refused as a whole (too large once encoded): each alone, each with its own outcome
            for item in items:
                self._send(topic, t, [item])
            return
        t.in_flight += 1
        self.batches += 1
        self.batched_messages += len(items)
        SendCall(producer, prepared, None, _Sink(self, topic, items), timeout=timeout).start()  # type: ignore[arg-type]

    async def close(self, timeout: float) -> None:
        """Send everything waiting now and wait (at most ``timeout`` seconds) for the sends in flight."""
        for topic in list(self._topics):
            self._flush(topic)
        if self._topics:
            self._idle = asyncio.Event()
            try:
                async with asyncio.timeout(timeout):
                    await self._idle.wait()
            except TimeoutError:
                pass
