"""A server's bounds over real loopback sockets: the frame budget, the connection limit, the idle timeout."""
from __future__ import annotations

import asyncio
import logging
import tracemalloc
from collections.abc import Awaitable, Callable

import pytest

from sluice.protocol.command import RemotingCommand
from sluice.protocol.frame import encode_frame
from sluice.transport.client import RemotingClient
from sluice.transport.connection import RemotingConnection
from sluice.transport.limits import SMALL_FRAME, FrameBudget, RateLimitedLog
from sluice.transport.server import RemotingServer

ECHO, SINK, SLOW = 9001, 9002, 9003
MiB = 1024 * 1024


def run(coro_fn: Callable[[], Awaitable[None]], timeout: float = 30.0) -> None:
    async def bounded() -> None:
        async with asyncio.timeout(timeout):
            await coro_fn()
    asyncio.run(bounded())


async def start_server(**kwargs: object) -> RemotingServer:
    server = RemotingServer("127.0.0.1", 0, **kwargs)  # type: ignore[arg-type]

    def echo(conn: RemotingConnection, req: RemotingCommand) -> RemotingCommand:
        return req.make_response(body=req.body)

    def sink(conn: RemotingConnection, req: RemotingCommand) -> RemotingCommand:
        return req.make_response(ext_fields={"got": str(len(req.body))})

    async def slow(conn: RemotingConnection, req: RemotingCommand) -> RemotingCommand:
        await asyncio.sleep(float(req.ext_fields["delay"]))
        return req.make_response()

    server.register(ECHO, echo)
    server.register(SINK, sink)
    server.register(SLOW, slow)
    await server.start()
    return server


async def until(cond: Callable[[], bool], what: str, limit: float = 10.0) -> None:
    """Wait (bounded) for ``cond``; the limit only guards against a hang, it asserts no speed."""
    for _ in range(int(limit / 0.01)):
        if cond():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


def held_bytes(server: RemotingServer) -> int:
    return sum(c._codec.buffered for c in server.connections)


async def call(client: RemotingClient, server: RemotingServer, code: int, body: bytes = b"",
               **fields: object) -> RemotingCommand:
    return await client.invoke(server.address, RemotingCommand.request(code, fields, body), 10)


def test_partial_frames_stay_within_the_budget_while_small_requests_are_served() -> None:
    async def main() -> None:
        server = await start_server(frame_budget=4 * MiB)
        client = RemotingClient()
        frame = encode_frame(RemotingCommand.request(SINK, {}, b"x" * (2 * MiB - 1024)))
        writers = []
        try:
            for _ in range(5):  # each sends all but the last byte of a 2 MiB frame, and stops
                reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
                writer.write(frame[:-1])
                writers.append((reader, writer))
            await until(lambda: server.budget.reserved == 2 * len(frame) and server.budget.waiting == 3,
                        "two frames reserved, three waiting")
            await until(lambda: held_bytes(server) >= 2 * (len(frame) - 1), "the reserved frames received")
            for _ in range(20):  # small requests meanwhile: never paused, answered
                assert (await call(client, server, ECHO, b"ping")).body == b"ping"
            # What is held: the two reserved frames, and for the waiting ones at most what one read took.
            assert server.budget.reserved <= server.budget.limit
            assert held_bytes(server) <= 4 * MiB + 3 * 256 * 1024
            # A reserved frame that completes frees its share for the next waiter, which then completes too.
            granted = [w for w in writers if any(c.peer == "%s:%d" % w[1].get_extra_info("sockname")
                                                 and c._reserved for c in server.connections)]
            assert len(granted) == 2
            granted[0][1].write(frame[-1:])
            resp = await asyncio.wait_for(granted[0][0].read(200), 10)
            assert b'"got":"%d"' % (2 * MiB - 1024) in resp
            await until(lambda: server.budget.waiting == 2, "the next waiter granted")
            assert server.budget.reserved == 2 * len(frame)
        finally:
            for _, w in writers:
                w.close()
            await until(lambda: server.budget.reserved == 0 and not server.budget.waiting, "the budget freed")
            await client.close()
            await server.close()
    run(main)


def test_big_frames_sent_at_once_are_all_served_a_budget_at_a_time() -> None:
    """Reserved frames are never paused, so several clients sending big bodies at once do not deadlock."""
    async def main() -> None:
        server = await start_server(frame_budget=2 * MiB)
        clients = [RemotingClient() for _ in range(6)]
        try:
            body = bytes(range(256)) * (4096 * 1)  # 1 MiB
            answers = await asyncio.gather(*(call(c, server, SINK, body) for c in clients))
            assert [a.ext_fields["got"] for a in answers] == [str(len(body))] * 6
            assert server.budget.waits > 0  # some had to wait their turn
            assert server.budget.reserved == 0
            # A frame bigger than the whole budget is admitted when nothing else is reserved.
            big = await call(clients[0], server, SINK, b"y" * (3 * MiB))
            assert big.ext_fields["got"] == str(3 * MiB)
        finally:
            for c in clients:
                await c.close()
            await server.close()
    run(main)


def test_memory_of_a_big_frame_is_given_back_when_it_completes() -> None:
    async def main() -> None:
        server = await start_server()
        frame = encode_frame(RemotingCommand.request(SINK, {}, b"z" * (4 * MiB)))
        tracemalloc.start()
        try:
            base = tracemalloc.get_traced_memory()[0]
            conns = [await asyncio.open_connection("127.0.0.1", server.port) for _ in range(3)]
            for _, w in conns:
                w.write(frame[:-10])
                await w.drain()
            await until(lambda: held_bytes(server) >= 3 * (len(frame) - 10), "three partial frames")
            assert tracemalloc.get_traced_memory()[0] - base >= 3 * 3 * MiB
            for r, w in conns:
                w.write(frame[-10:])
                assert b'"got":"%d"' % (4 * MiB) in await asyncio.wait_for(r.read(200), 10)
            await until(lambda: held_bytes(server) == 0 and server.budget.reserved == 0, "nothing held")
            assert tracemalloc.get_traced_memory()[0] - base < 2 * MiB  # the 12 MiB went back
            for _, w in conns:
                w.close()
        finally:
            tracemalloc.stop()
            await server.close()
    run(main)


def test_connections_past_the_limit_are_closed_at_accept(caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        server = await start_server(max_connections=3)
        clients = [RemotingClient() for _ in range(3)]
        try:
            for c in clients:
                assert (await call(c, server, ECHO, b"a")).body == b"a"
            with caplog.at_level(logging.WARNING, logger="sluice.transport.server"):
                for _ in range(3):
                    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
                    assert await asyncio.wait_for(reader.read(), 10) == b""  # refused: closed at once
                    writer.close()
            assert server.refused == 3
            assert caplog.text.count("refusing connection") == 1  # rate-limited
            for c in clients:  # those already in are still served
                assert (await call(c, server, ECHO, b"b")).body == b"b"
            await clients[0].close()
            await until(lambda: len(server.connections) == 2, "a slot freed")
            late = RemotingClient()
            assert (await call(late, server, ECHO, b"c")).body == b"c"
            await late.close()
        finally:
            for c in clients:
                await c.close()
            await server.close()
    run(main)


def test_idle_connections_are_closed_and_busy_ones_kept(caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        server = await start_server(idle_timeout=0.4, frame_budget=SMALL_FRAME * 4)
        chatty, holder = RemotingClient(), RemotingClient()
        try:
            with caplog.at_level(logging.INFO, logger="sluice.transport.server"):
                silent_r, silent_w = await asyncio.open_connection("127.0.0.1", server.port)
                partial_r, partial_w = await asyncio.open_connection("127.0.0.1", server.port)
                frame = encode_frame(RemotingCommand.request(SINK, {}, b"p" * MiB))
                partial_w.write(frame[:-1])  # holds budget, completes nothing
                held = asyncio.ensure_future(call(holder, server, SLOW, delay=1.5))  # answered after the timeout
                for _ in range(15):  # a request every 0.1 s keeps a connection open
                    assert (await call(chatty, server, ECHO, b"k")).body == b"k"
                    await asyncio.sleep(0.1)
                assert await asyncio.wait_for(silent_r.read(), 10) == b""
                assert await asyncio.wait_for(partial_r.read(), 10) == b""
                assert (await held).code == 0  # a request being served is activity
                assert (await call(chatty, server, ECHO, b"k")).body == b"k"
            assert server.idle_closed >= 2
            assert "idle for 0.4 s" in caplog.text
            await until(lambda: server.budget.reserved == 0, "the idle holder's budget freed")
            silent_w.close()
            partial_w.close()
        finally:
            await chatty.close()
            await holder.close()
            await server.close()
    run(main)


def test_budget_and_rate_limited_log_units(caplog: pytest.LogCaptureFixture) -> None:
    class Holder:
        def __init__(self) -> None:
            self.granted = 0

        def budget_granted(self) -> None:
            self.granted += 1

    budget = FrameBudget(10)
    a, b, c, d = Holder(), Holder(), Holder(), Holder()
    assert budget.reserve(a, 6) and not budget.reserve(b, 6) and not budget.reserve(c, 1)
    assert budget.reserved == 6 and budget.waiting == 2
    budget.release(c)  # a waiter that closes leaves the queue
    assert budget.waiting == 1
    budget.release(a)
    assert b.granted == 1 and budget.holding(b) == 6 and budget.reserved == 6
    assert not budget.reserve(d, 5)  # first come first served: d waits behind nothing but the budget
    budget.release(b)
    assert d.granted == 1 and budget.reserved == 5
    budget.release(d)
    assert budget.reserved == 0

    now = [0.0]
    log = logging.getLogger("test.ratelimit")
    limited = RateLimitedLog(log, 10.0, clock=lambda: now[0])
    with caplog.at_level(logging.WARNING, logger="test.ratelimit"):
        for i in range(5):
            limited.warning("refused %d", i)
        now[0] = 11.0
        limited.warning("refused %d", 5)
    assert [r.getMessage() for r in caplog.records] == [
        "refused 0", "refused 5 (4 more like it not logged in the last 10 s)"]


def test_codec_reports_the_declared_size_of_the_frame_being_received() -> None:
    from sluice.protocol.frame import NEED_DATA, FrameCodec

    small = encode_frame(RemotingCommand.request(SINK, {}, b"s" * 100))
    big = encode_frame(RemotingCommand.request(SINK, {}, b"b" * (SMALL_FRAME * 2)))
    codec = FrameCodec()
    assert codec.partial_frame_size == 0
    codec.receive_data(small + big[:3])  # a whole frame, then too little of the next to know its size
    assert codec.next_frame() is not NEED_DATA and codec.next_frame() is NEED_DATA
    assert codec.partial_frame_size == 0
    codec.receive_data(big[3:1000])
    assert codec.next_frame() is NEED_DATA and codec.partial_frame_size == len(big)
    codec.receive_data(big[1000:-1])  # collected as a big frame now
    assert codec.next_frame() is NEED_DATA and codec.partial_frame_size == len(big)
    codec.receive_data(big[-1:])
    assert len(codec.next_frame().body) == SMALL_FRAME * 2  # type: ignore[union-attr]
    assert codec.partial_frame_size == 0 and codec.buffered == 0


def test_protocol_errors_are_logged_once_per_interval(caplog: pytest.LogCaptureFixture) -> None:
    """A peer reconnecting in a loop with bad frames gets one warning per interval, then a count."""
    now = [0.0]
    limited = RateLimitedLog(logging.getLogger("sluice.test.flood"), 10.0, clock=lambda: now[0])
    with caplog.at_level(logging.WARNING, logger="sluice.test.flood"):
        for _ in range(50):
            limited.warning("closing connection %s: %s", "127.0.0.1:1", "bad frame")
        now[0] = 11.0
        limited.log(logging.WARNING, "closing connection %s: %s", "127.0.0.1:1", "bad frame")
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2
    assert "49 more like it" in lines[1]
