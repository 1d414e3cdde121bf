"""A push consumer's pull on an open connection (client/push_consumer.py _PullWaiter): the answer's messages are
cached and handed to the consume service as its frame is read, before the pull task resumes; a cancelled pull
or a released queue delivers nothing; errors reach the pull task as before. No server: a recording fake."""
from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest
from test_pull_decode import record, response

from sluice.client import ConsumeResult, MessageSelector
from sluice.client.process_queue import ProcessQueue
from sluice.client.push_consumer import AsyncPushConsumer
from sluice.client.results import MessageQueue, PullStatus
from sluice.errors import RemotingError, SluiceError
from sluice.protocol.codes import ResponseCode

MQ = MessageQueue(topic="T", broker_name="b", queue_id=1)


class FakeConn:
    def __init__(self) -> None:
        self.waiters: dict[int, Any] = {}

    def forget(self, opaque: int) -> None:
        self.waiters.pop(opaque, None)


def consumer() -> tuple[AsyncPushConsumer, FakeConn, list[tuple[MessageQueue, list[int]]]]:
    c = AsyncPushConsumer("G", "127.0.0.1:1")
    c.subscribe("T", MessageSelector.by_tag("*"))
    c.register_listener(lambda msgs: ConsumeResult.SUCCESS)
    conn = FakeConn()
    submitted: list[tuple[MessageQueue, list[int]]] = []
    c.service = SimpleNamespace(submit=lambda mq, pq, msgs: submitted.append(  # type: ignore[assignment]
        (mq, [m.queue_offset for m in msgs])))

    def request_with(c_: FakeConn, request: Any, timeout: float, waiter: Any) -> int:
        opaque = len(c_.waiters) + 1
        c_.waiters[opaque] = waiter
        return opaque

    async def broker_addr_for(topic: str, name: str, *, master_only: bool = True) -> str:
        return "addr"

    remoting = SimpleNamespace(open_connection=lambda addr: conn, request_with=request_with)
    c._instance = SimpleNamespace(  # type: ignore[assignment]
        remoting=remoting, broker_addr_for=broker_addr_for, find_broker_addr=lambda name, master_only=True: "addr")
    return c, conn, submitted


async def start_pull(c: AsyncPushConsumer, conn: FakeConn, pq: ProcessQueue) -> tuple[asyncio.Task[Any], Any]:
    """A pull of MQ from offset 0 under way, and the waiter its answer goes to."""
    task = asyncio.create_task(c._pull_once(MQ, pq, 0, 32))
    await asyncio.sleep(0)
    [waiter] = conn.waiters.values()
    return task, waiter


def test_found_messages_reach_the_consume_service_as_the_answer_is_read() -> None:
    async def main() -> None:
        c, conn, submitted = consumer()
        pq = ProcessQueue()
        task, waiter = await start_pull(c, conn, pq)
        waiter.set_result(response(ResponseCode.SUCCESS, record(0) + record(1), nxt=2))
        # delivered inside set_result (the frame's decoding), before the pull task ran again
        assert submitted == [(MQ, [0, 1])] and pq.msg_count == 2 and not task.done()
        result = await task
        assert result.status is PullStatus.FOUND and result.next_begin_offset == 2 and conn.waiters == {}
    asyncio.run(main())


def test_a_released_queue_or_a_cancelled_pull_delivers_nothing() -> None:
    async def main() -> None:
        c, conn, submitted = consumer()
        pq = ProcessQueue()
        pq.dropped = True
        task, waiter = await start_pull(c, conn, pq)
        waiter.set_result(response(ResponseCode.SUCCESS, record(0), nxt=1))
        assert (await task).status is PullStatus.FOUND and submitted == [] and pq.msg_count == 0

        live = ProcessQueue()
        task, waiter = await start_pull(c, conn, live)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert waiter.done() and conn.waiters == {}  # forgotten: a late answer is dropped by the connection
        waiter.set_result(response(ResponseCode.SUCCESS, record(0), nxt=1))  # even if one came anyway
        assert submitted == [] and live.msg_count == 0
    asyncio.run(main())


def test_errors_reach_the_pull_task() -> None:
    async def main() -> None:
        c, conn, submitted = consumer()
        pq = ProcessQueue()
        task, waiter = await start_pull(c, conn, pq)
        waiter.set_exception(RemotingError("connection closed"))
        with pytest.raises(RemotingError, match="closed"):
            await task
        task, waiter = await start_pull(c, conn, pq)
        waiter.set_result(response(ResponseCode.SYSTEM_ERROR))  # an error answer: raised as the invoke path does
        with pytest.raises(SluiceError):
            await task
        assert submitted == []
    asyncio.run(main())
