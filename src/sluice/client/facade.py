"""The blocking SDK: Producer and PullConsumer run their async twins on one shared loop thread.

There is no second implementation here, only calls forwarded to
AsyncProducer / AsyncPullConsumer with ``LoopThread.run``. All blocking
clients of a process share one loop thread (and so one ClientInstance per
namesrv set); it stops when the last of them shuts down.
"""
from __future__ import annotations

import threading
from functools import partial
from collections.abc import Callable, Coroutine, Iterable, Sequence
from concurrent.futures import Future
from typing import Any, TypeVar

from sluice.client.lifecycle import AsyncClient
from sluice.client.producer import AsyncProducer
from sluice.client.reply import RequestCallback, check_request
from sluice.client.pull_consumer import AsyncPullConsumer
from sluice.client.results import MessageQueue, PullResult, SendResult
from sluice.client.routing import QueueSelector
from sluice.client.selector import MessageSelector
from sluice.errors import ClientError
from sluice.message import Message, MessageExt
from sluice.transport.blocking import LoopThread

__all__ = ["Producer", "PullConsumer"]

T = TypeVar("T")

#: Added to a call's own timeout for the outer wait: route lookups and connects come on top.
_SLACK = 10.0

_lock = threading.Lock()
_loop: LoopThread | None = None
_users = 0


def _acquire_loop() -> LoopThread:
    global _loop, _users
    with _lock:
        if _loop is None or not _loop.running:
            _loop = LoopThread("sluice-client")
        _users += 1
        return _loop


def _release_loop() -> None:
    global _loop, _users
    with _lock:
        _users -= 1
        if _users <= 0 and _loop is not None:
            _loop.stop()
            _loop, _users = None, 0


class _Facade:
    _impl: AsyncClient

    def __init__(self) -> None:
        self._loop: LoopThread | None = None

    @property
    def group(self) -> str:
        return self._impl.group

    def _run(self, coro: Coroutine[Any, Any, T], timeout: float) -> T:
        if self._loop is None:
            coro.close()
            raise ClientError(f"{type(self).__name__} {self._impl.group!r} is not started")
        return self._loop.run(coro, timeout + _SLACK)

    def _started_loop(self) -> LoopThread:
        if self._loop is None:
            raise ClientError(f"{type(self).__name__} {self._impl.group!r} is not started")
        return self._loop

    def start(self) -> None:
        if self._loop is not None:
            raise ClientError(f"{type(self).__name__} {self._impl.group!r} is already started")
        self._loop = _acquire_loop()
        try:
            self._run(self._impl.start(), self._impl.client_config.request_timeout * 4)
        except BaseException:
            self._loop = None
            _release_loop()
            raise

    def shutdown(self) -> None:
        if self._loop is None:
            return
        try:
            self._run(self._impl.shutdown(), self._impl.client_config.request_timeout * 4)
        finally:
            self._loop = None
            _release_loop()

    def __enter__(self: Any) -> Any:
        if self._loop is None:
            self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()


class Producer(_Facade):
    """``with Producer("group", namesrv="127.0.0.1:9876") as p: p.send(Message("T", b"hi"))``.

    Options: see ProducerOptions and ClientConfig (``send_timeout``, ``retry_times``,
    ``send_latency_fault_enable``, ``compress_over``, ...).
    """

    def __init__(self, group: str, namesrv: str | Iterable[str], **options: Any) -> None:
        super().__init__()
        self._impl: AsyncProducer = AsyncProducer(group, namesrv, **options)

    @property
    def async_producer(self) -> AsyncProducer:
        return self._impl

    def _timeout(self, timeout: float | None) -> float:
        return self._impl.options.send_timeout if timeout is None else timeout

    def _sent_from_here(self, loop: LoopThread, msg: Message, fut: Future[SendResult], timeout: float,
                        selector: QueueSelector | None, queue: MessageQueue | None) -> bool:
        """Whether an unordered send's request left from this thread (AsyncProducer.send_from_thread: no
        wake-up of the loop thread first); False: nothing was sent, the loop must send it."""
        if selector is not None or queue is not None or not loop.quiet():
            return False
        try:
            return self._impl.send_from_thread(msg, fut, loop.loop, timeout=timeout)
        except Exception:  # whatever it was, the loop's attempt raises it where the send's errors go
            return False

    def send(self, msg: Message, *, timeout: float | None = None, selector: QueueSelector | None = None,
             arg: Any = None, queue: MessageQueue | None = None) -> SendResult:
        t = self._timeout(timeout)
        loop = self._started_loop()
        fut: Future[SendResult] = Future()
        if self._sent_from_here(loop, msg, fut, t, selector, queue):
            return loop.wait(fut, t + _SLACK)
        return loop.run_call(partial(self._impl.send_soon, msg, fut, timeout=t, selector=selector, arg=arg,
                                     queue=queue), fut, t + _SLACK)

    def request(self, msg: Message, timeout: float = 3.0, *, selector: QueueSelector | None = None, arg: Any = None,
                queue: MessageQueue | None = None) -> MessageExt:
        """Send ``msg`` as a request and return its reply; ``selector`` / ``arg`` or ``queue`` pin the queue
        (see :meth:`AsyncProducer.request`)."""
        return self._run(self._impl.request(msg, timeout, selector=selector, arg=arg, queue=queue), timeout)

    def request_async(self, msg: Message, timeout: float = 3.0, *, selector: QueueSelector | None = None,
                      arg: Any = None, queue: MessageQueue | None = None,
                      callback: RequestCallback | None = None) -> Future[MessageExt]:
        """:meth:`request` without blocking: the Future, and ``callback(reply, error)`` on the loop thread, get
        the reply or the error (RequestTimeoutError naming the correlation id when no reply came). Invalid
        arguments raise here."""
        if self._loop is None:
            raise ClientError(f"Producer {self.group!r} is not started")
        check_request(msg, timeout)
        impl = self._impl

        async def run() -> MessageExt:  # the task (and its callback) made on the loop thread
            return await impl.request_async(msg, timeout, selector=selector, arg=arg, queue=queue, callback=callback)
        return self._loop.submit(run())

    def send_async(self, msg: Message, *, timeout: float | None = None, selector: QueueSelector | None = None,
                   arg: Any = None, queue: MessageQueue | None = None,
                   callback: Callable[[SendResult | None, BaseException | None], None] | None = None,
                   ) -> Future[SendResult]:
        """Send without blocking; the Future (and ``callback(result, error)``, on the loop thread) get
        the outcome. Retries as :meth:`send` does. An unordered send whose route and connection are at hand
        is written from this thread; sends made while the loop thread is busy reach it together, in one
        wake-up, and each is still its own request with its own result."""
        loop = self._started_loop()
        fut: Future[SendResult] = Future()
        if callback is not None:
            def done(f: Future[SendResult]) -> None:
                exc = f.exception() if not f.cancelled() else ClientError("send cancelled")
                callback(None if exc else f.result(), exc)
            fut.add_done_callback(done)
        t = self._timeout(timeout)
        if self._sent_from_here(loop, msg, fut, t, selector, queue):
            return fut
        return loop.submit_call(partial(self._impl.send_soon, msg, fut, timeout=t, selector=selector, arg=arg,
                                        queue=queue), fut)

    def send_oneway(self, msg: Message, *, selector: QueueSelector | None = None, arg: Any = None,
                    queue: MessageQueue | None = None) -> None:
        self._run(self._impl.send_oneway(msg, selector=selector, arg=arg, queue=queue), self._timeout(None))

    def send_batch(self, msgs: Sequence[Message], *, timeout: float | None = None,
                   queue: MessageQueue | None = None) -> SendResult:
        t = self._timeout(timeout)
        loop = self._started_loop()
        if queue is None and loop.quiet():
            fut: Future[SendResult] = Future()
            try:
                sent = self._impl.send_batch_from_thread(msgs, fut, loop.loop, timeout=t)
            except Exception:  # whatever it was, the loop's attempt raises it where the send's errors go
                sent = False
            if sent:
                return loop.wait(fut, t + _SLACK)
        return self._run(self._impl.send_batch(msgs, timeout=t, queue=queue), t)

    def fetch_publish_queues(self, topic: str) -> list[MessageQueue]:
        return self._run(self._impl.fetch_publish_queues(topic), self._timeout(None))


class PullConsumer(_Facade):
    """``with PullConsumer("group", namesrv=...) as c: c.pull(mq, MessageSelector.by_tag("A"), 0)``."""

    def __init__(self, group: str, namesrv: str | Iterable[str], **options: Any) -> None:
        super().__init__()
        self._impl: AsyncPullConsumer = AsyncPullConsumer(group, namesrv, **options)

    @property
    def async_consumer(self) -> AsyncPullConsumer:
        return self._impl

    @property
    def _rt(self) -> float:
        return self._impl.options.request_timeout

    def fetch_message_queues(self, topic: str) -> list[MessageQueue]:
        return self._run(self._impl.fetch_message_queues(topic), self._rt)

    def pull(self, mq: MessageQueue, selector: MessageSelector | str | None, offset: int, max_nums: int = 32, *,
             timeout: float | None = None) -> PullResult:
        t = self._impl.options.pull_timeout if timeout is None else timeout
        return self._run(self._impl.pull(mq, selector, offset, max_nums, timeout=t), t)

    def pull_block_if_not_found(self, mq: MessageQueue, selector: MessageSelector | str | None, offset: int,
                                max_nums: int = 32, *, suspend_timeout: float | None = None,
                                timeout: float | None = None) -> PullResult:
        t = self._impl.options.consumer_timeout_when_suspend if timeout is None else timeout
        return self._run(self._impl.pull_block_if_not_found(mq, selector, offset, max_nums,
                                                            suspend_timeout=suspend_timeout, timeout=t), t)

    def update_consumer_offset(self, mq: MessageQueue, offset: int) -> None:
        """Kept locally until :meth:`commit`, the 5 s persistence or shutdown sends it."""
        async def update() -> None:  # on the loop thread, which also iterates the pending offsets
            self._impl.update_consumer_offset(mq, offset)
        self._run(update(), self._rt)

    def commit(self) -> None:
        self._run(self._impl.commit(), self._rt)

    def fetch_consume_offset(self, mq: MessageQueue, from_store: bool = True) -> int:
        return self._run(self._impl.fetch_consume_offset(mq, from_store), self._rt)

    def min_offset(self, mq: MessageQueue) -> int:
        return self._run(self._impl.min_offset(mq), self._rt)

    def max_offset(self, mq: MessageQueue) -> int:
        return self._run(self._impl.max_offset(mq), self._rt)

    def search_offset(self, mq: MessageQueue, timestamp_ms: int) -> int:
        return self._run(self._impl.search_offset(mq, timestamp_ms), self._rt)

    def earliest_msg_store_time(self, mq: MessageQueue) -> int:
        return self._run(self._impl.earliest_msg_store_time(mq), self._rt)

    def view_message(self, offset_msg_id: str, topic: str | None = None) -> MessageExt:
        return self._run(self._impl.view_message(offset_msg_id, topic), self._rt)

    def query_message(self, topic: str, key: str, max_num: int, begin: int, end: int, *,
                      unique_key: bool = False) -> list[MessageExt]:
        return self._run(self._impl.query_message(topic, key, max_num, begin, end, unique_key=unique_key),
                         self._rt)
