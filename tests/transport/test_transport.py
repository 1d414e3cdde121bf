"""The asyncio transport over real loopback sockets: dispatch rules, opaque matching, failures."""
from __future__ import annotations

import asyncio
import dataclasses
import logging
import socket
import struct
from collections.abc import Awaitable, Callable

import pytest
from servers import free_port

from sluice.errors import InvalidParameterError, RemotingError, RemotingTimeoutError
from sluice.protocol.codes import RequestCode, ResponseCode
from sluice.protocol.command import RemotingCommand, SerializeType
from sluice.protocol.frame import NEED_DATA, FrameCodec, encode_frame
from sluice.ratelog import RateLimitedLog
from sluice.transport import connection as connection_module
from sluice.transport.blocking import LoopThread, SyncRemotingClient
from sluice.transport.client import RemotingClient
from sluice.transport.connection import Dispatcher, RemotingConnection
from sluice.transport.server import RemotingServer

ECHO, SLOW, FAIL, CRASH, ONEWAY_SINK = 9001, 9002, 9003, 9004, 9005
Handler = Callable[[RemotingConnection, RemotingCommand], object]


def run(coro_fn: Callable[[], Awaitable[None]], timeout: float = 20.0) -> None:
    async def bounded() -> None:
        async with asyncio.timeout(timeout):
            await coro_fn()
    asyncio.run(bounded())


async def make_server(extra: dict[int, Handler] | None = None,
                      **kwargs: object) -> tuple[RemotingServer, list[RemotingCommand]]:
    """A started server answering ECHO, SLOW, FAIL, CRASH and ONEWAY_SINK (which records into the list), plus
    ``extra`` handlers."""
    seen: list[RemotingCommand] = []
    server = RemotingServer("127.0.0.1", 0, **kwargs)  # type: ignore[arg-type]

    async def echo(conn: RemotingConnection, req: RemotingCommand) -> RemotingCommand:
        return req.make_response(ext_fields=req.ext_fields, body=req.body)

    async def slow(conn: RemotingConnection, req: RemotingCommand) -> RemotingCommand:
        await asyncio.sleep(float(req.ext_fields["delay"]))
        return req.make_response(ext_fields=req.ext_fields)

    async def fail(conn: RemotingConnection, req: RemotingCommand) -> RemotingCommand:
        raise InvalidParameterError("queueId is missing")

    async def crash(conn: RemotingConnection, req: RemotingCommand) -> RemotingCommand:
        raise KeyError("boom")

    async def sink(conn: RemotingConnection, req: RemotingCommand) -> RemotingCommand:
        seen.append(req)
        return req.make_response()

    for code, handler in ((ECHO, echo), (SLOW, slow), (FAIL, fail), (CRASH, crash), (ONEWAY_SINK, sink),
                          *(extra or {}).items()):
        server.register(code, handler)
    await server.start()
    return server, seen


@dataclasses.dataclass
class Wire:
    """A server from ``make_server`` and a ``RemotingClient``, for one test."""

    server: RemotingServer
    seen: list[RemotingCommand]
    client: RemotingClient

    @property
    def addr(self) -> str:
        return self.server.address

    async def call(self, code: int, fields: dict[str, object] | None = None, body: bytes = b"",
                   timeout: float | None = 5) -> RemotingCommand:
        return await self.client.invoke(self.addr, RemotingCommand.request(code, fields or {}, body), timeout)


def over_the_wire(check: Callable[[Wire], Awaitable[None]], extra: dict[int, Handler] | None = None,
                  timeout: float = 20.0, **server_kwargs: object) -> None:
    """Run ``check`` on a fresh event loop against a server and a client, closing both afterwards."""
    async def main() -> None:
        server, seen = await make_server(extra, **server_kwargs)
        client = RemotingClient()
        try:
            await check(Wire(server, seen, client))
        finally:
            await client.close()
            await server.close()
    run(main, timeout)


def test_request_response_and_dispatch_rules(caplog: pytest.LogCaptureFixture) -> None:
    async def check(w: Wire) -> None:
        resp = await w.call(ECHO, {"k": "v"}, b"body")
        assert resp.is_response and resp.code == 0 and resp.ext_fields == {"k": "v"} and resp.body == b"body"
        resp = await w.call(4242)
        assert resp.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED and "4242" in (resp.remark or "")
        resp = await w.call(FAIL)
        assert (resp.code, resp.remark) == (ResponseCode.INVALID_PARAMETER, "queueId is missing")
        with caplog.at_level(logging.ERROR):
            resp = await w.call(CRASH)
        assert resp.code == ResponseCode.SYSTEM_ERROR and "boom" in (resp.remark or "")
        assert "handler for request code 9004" in caplog.text
        # the connection survived all of that
        assert (await w.call(ECHO)).code == 0
        assert len(w.server.connections) == 1
    over_the_wire(check)


def test_concurrent_requests_are_answered_out_of_order_and_matched_by_opaque() -> None:
    async def check(w: Wire) -> None:
        delays = [0.4, 0.05, 0.3, 0.0, 0.2, 0.1]
        order: list[int] = []

        async def one(i: int) -> RemotingCommand:
            r = await w.call(SLOW, {"delay": delays[i], "i": i})
            order.append(i)
            return r
        results = await asyncio.gather(*(one(i) for i in range(len(delays))))
        assert [r.ext_fields["i"] for r in results] == [str(i) for i in range(len(delays))]
        assert order != sorted(order)  # replies really came back out of order
        assert len(w.server.connections) == 1
    over_the_wire(check)


def test_oneway_gets_no_reply_and_binary_requests_get_binary_replies() -> None:
    async def check(w: Wire) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", w.server.port)  # raw frames, not the client
        try:
            oneway = dataclasses.replace(RemotingCommand.request(ONEWAY_SINK, {"x": 1}, oneway=True), opaque=1)
            binary = dataclasses.replace(RemotingCommand.request(ECHO, {"y": "2"}), opaque=2,
                                         serialize_type=SerializeType.ROCKETMQ)
            writer.write(encode_frame(oneway) + encode_frame(binary))
            await writer.drain()
            codec = FrameCodec()
            while (frame := codec.next_frame()) is NEED_DATA:
                codec.receive_data(await reader.read(4096))
            assert isinstance(frame, RemotingCommand)
            assert frame.opaque == 2 and frame.is_response and frame.serialize_type == SerializeType.ROCKETMQ
            assert frame.ext_fields == {"y": "2"}
            assert [r.ext_fields for r in w.seen] == [{"x": "1"}]
            assert codec.buffered == 0
        finally:
            writer.close()
    over_the_wire(check)


def test_timeout_then_late_reply_is_dropped() -> None:
    async def check(w: Wire) -> None:
        with pytest.raises(RemotingTimeoutError, match="within 0.1 s"):
            await w.call(SLOW, {"delay": 0.5}, timeout=0.1)
        conn = await w.client.connection(w.addr)
        assert conn._pending == {}
        assert (await conn.request(RemotingCommand.request(ECHO), None)).code == 0  # None: no timeout
        await asyncio.sleep(0.6)  # the late reply arrives and is ignored
        assert (await w.call(ECHO)).code == 0
    over_the_wire(check)


def test_request_nowait_sends_at_once_and_its_future_takes_the_reply() -> None:
    """A pipelining client (the next pull out before the last one's records are processed)."""
    async def check(w: Wire) -> None:
        conn = await w.client.connection(w.addr)
        first = conn.request_nowait(RemotingCommand.request(ECHO, {"n": "1"}), 5)
        assert conn._wbuf == []  # already handed to the transport, not waiting for a loop iteration
        second = conn.request_nowait(RemotingCommand.request(ECHO, {"n": "2"}), 5)
        assert (await second).ext_fields["n"] == "2" and (await first).ext_fields["n"] == "1"
        assert conn._pending == {}
        late = conn.request_nowait(RemotingCommand.request(SLOW, {"delay": 0.5}), 0.1)
        with pytest.raises(RemotingTimeoutError, match="within 0.1 s"):
            await late
        held = conn.request_nowait(RemotingCommand.request(SLOW, {"delay": 5}), 10)
        await conn.close()
        with pytest.raises(RemotingError):
            await held
        with pytest.raises(RemotingError, match="closed"):
            conn.request_nowait(RemotingCommand.request(ECHO), 5)
    over_the_wire(check)


def test_closed_connection_fails_pending_requests_and_client_reconnects() -> None:
    async def check(w: Wire) -> None:
        closed: list[RemotingConnection] = []
        w.server.on_connection_close(closed.append)
        pending = asyncio.ensure_future(w.call(SLOW, {"delay": 10}))
        await asyncio.sleep(0.2)
        for conn in list(w.server.connections):
            await conn.close()
        with pytest.raises(RemotingError, match="closed"):
            await pending
        assert len(closed) == 1
        assert (await w.call(ECHO)).code == 0
    over_the_wire(check)


@pytest.mark.parametrize("garbage", [
    b"\x00\x00\x00\x0c\x00\x00\x00\x08not-json",            # header that is not JSON
    struct.pack(">i", 64 * 1024 * 1024) + b"xxxx",           # oversized frame
    b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",                   # another protocol entirely
])
def test_malformed_input_closes_only_that_connection(garbage: bytes, caplog: pytest.LogCaptureFixture,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    # The warning is rate-limited per process: each case gets a fresh limiter so its line shows.
    monkeypatch.setattr(connection_module, "_protocol_errors", RateLimitedLog(connection_module.log))

    async def check(w: Wire) -> None:
        closed: list[RemotingConnection] = []
        w.server.on_connection_close(closed.append)
        assert (await w.call(ECHO)).code == 0
        reader, writer = await asyncio.open_connection("127.0.0.1", w.server.port)
        with caplog.at_level(logging.WARNING):
            writer.write(garbage)
            await writer.drain()
            assert await asyncio.wait_for(reader.read(), 5) == b""  # the server hung up
        writer.close()
        assert "closing connection" in caplog.text
        assert len(closed) == 1
        assert (await w.call(ECHO)).code == 0
    over_the_wire(check, max_frame_size=1024 * 1024)


def test_server_can_call_the_client_on_the_same_connection() -> None:
    async def check(w: Wire) -> None:
        client_conns: list[RemotingConnection] = []
        w.server.on_connection_open(client_conns.append)
        notified: list[str] = []

        async def on_notify(conn: RemotingConnection, req: RemotingCommand) -> RemotingCommand:
            notified.append(req.ext_fields["consumerGroup"])
            return req.make_response()
        w.client.register(RequestCode.NOTIFY_CONSUMER_IDS_CHANGED, on_notify)
        await w.call(ECHO)
        [conn] = client_conns
        resp = await conn.request(RemotingCommand.request(RequestCode.NOTIFY_CONSUMER_IDS_CHANGED,
                                                          {"consumerGroup": "G"}), 5)
        assert resp.code == 0 and notified == ["G"]
        await conn.send_oneway(RemotingCommand.request(RequestCode.NOTIFY_CONSUMER_IDS_CHANGED, {"consumerGroup": "H"}))
        deadline = asyncio.get_running_loop().time() + 5
        while notified != ["G", "H"] and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.01)
        assert notified == ["G", "H"]
    over_the_wire(check)


def test_large_bodies_cross_intact() -> None:
    async def check(w: Wire) -> None:
        body = bytes(range(256)) * (5 * 4096)  # 5 MiB
        assert (await w.call(ECHO, body=body, timeout=10)).body == body
    over_the_wire(check)


def test_sync_facade() -> None:
    loop = LoopThread()
    try:
        server, _ = loop.run(make_server(), 10)
        with SyncRemotingClient(loop) as client:
            assert client.invoke(server.address, RemotingCommand.request(ECHO, {"a": 1}), 5).ext_fields == {"a": "1"}
            client.invoke_oneway(server.address, RemotingCommand.request(ECHO))
            with pytest.raises(RemotingError, match="cannot connect"):
                client.invoke(f"127.0.0.1:{free_port()}", RemotingCommand.request(ECHO), 2)
            with pytest.raises(RemotingError, match="bad address"):
                client.invoke("nowhere", RemotingCommand.request(ECHO), 2)
        loop.run(server.close(), 10)
    finally:
        loop.stop()
    assert not loop.running
    with SyncRemotingClient() as own:  # owns (and stops) its loop thread
        with pytest.raises(RemotingError):
            own.invoke(f"127.0.0.1:{free_port()}", RemotingCommand.request(ECHO), 2)
    assert not own.loop_thread.running


def test_reading_pauses_while_too_many_requests_are_in_flight() -> None:
    async def main() -> None:
        release = asyncio.Event()
        started: list[int] = []

        async def held(conn: RemotingConnection, req: RemotingCommand) -> RemotingCommand:
            started.append(req.opaque)
            await release.wait()
            return req.make_response()

        def new_connection() -> RemotingConnection:
            conn = RemotingConnection(dispatcher=Dispatcher({1: held}), max_inflight=3)
            conns.append(conn)
            return conn
        conns: list[RemotingConnection] = []
        srv = await asyncio.get_running_loop().create_server(new_connection, "127.0.0.1", 0)
        client = RemotingClient()
        addr = f"127.0.0.1:{srv.sockets[0].getsockname()[1]}"
        try:
            calls = [asyncio.ensure_future(client.invoke(addr, RemotingCommand.request(1), 10)) for _ in range(8)]
            await asyncio.sleep(0.3)
            assert len(started) == 3  # the other five wait (reading is paused) until a slot frees
            release.set()
            assert [r.code for r in await asyncio.gather(*calls)] == [0] * 8
            assert len(started) == 8
        finally:
            await client.close()
            for c in conns:
                await c.close()
            srv.close()
            await srv.wait_closed()
    run(main)


# ---------------------------------------------------------------------------------------------- plain handlers

def test_plain_function_handlers_follow_the_same_reply_rules(caplog: pytest.LogCaptureFixture) -> None:
    seen: list[str] = []

    def answer(conn: RemotingConnection, req: RemotingCommand) -> RemotingCommand:
        return req.make_response(ext_fields={"got": req.ext_fields.get("k", "")})

    def refuse(conn: RemotingConnection, req: RemotingCommand) -> RemotingCommand:
        raise InvalidParameterError("queueId is missing")

    def crash(conn: RemotingConnection, req: RemotingCommand) -> RemotingCommand:
        raise KeyError("boom")

    def silent(conn: RemotingConnection, req: RemotingCommand) -> None:
        seen.append(req.ext_fields["k"])

    def later(conn: RemotingConnection, req: RemotingCommand) -> Awaitable[RemotingCommand]:
        async def finish() -> RemotingCommand:
            await asyncio.sleep(0.01)
            if req.ext_fields.get("fail"):
                raise InvalidParameterError("late refusal")
            return req.make_response(ext_fields={"late": "yes"})
        return finish()

    async def check(w: Wire) -> None:
        assert (await w.call(1, {"k": "v"})).ext_fields == {"got": "v"}
        resp = await w.call(2)
        assert (resp.code, resp.remark) == (ResponseCode.INVALID_PARAMETER, "queueId is missing")
        with caplog.at_level(logging.ERROR):
            resp = await w.call(3)
        assert resp.code == ResponseCode.SYSTEM_ERROR and "boom" in (resp.remark or "")
        assert "handler for request code 3" in caplog.text and "KeyError" in caplog.text
        with pytest.raises(RemotingTimeoutError):  # None: no reply
            await w.call(4, {"k": "a"}, timeout=0.3)
        assert (await w.call(5)).ext_fields == {"late": "yes"}
        resp = await w.call(5, {"fail": 1})
        assert (resp.code, resp.remark) == (ResponseCode.INVALID_PARAMETER, "late refusal")
        await w.client.invoke_oneway(w.addr, RemotingCommand.request(4, {"k": "b"}))
        await w.client.invoke_oneway(w.addr, RemotingCommand.request(1, {"k": "oneway gets no reply"}))
        assert (await w.call(1, {"k": "after"})).ext_fields == {"got": "after"}
        assert seen == ["a", "b"]
        assert len(w.server.connections) == 1
    over_the_wire(check, extra={1: answer, 2: refuse, 3: crash, 4: silent, 5: later})


def test_dispatcher_handle_runs_both_kinds() -> None:
    async def main() -> None:
        async def coro(conn: RemotingConnection, req: RemotingCommand) -> RemotingCommand:
            return req.make_response(remark="async")

        def plain(conn: RemotingConnection, req: RemotingCommand) -> RemotingCommand:
            raise InvalidParameterError("plain")
        d = Dispatcher({1: coro, 2: plain})
        conn = RemotingConnection(dispatcher=d)
        assert 1 in d and 3 not in d
        assert (await d.handle(conn, RemotingCommand.request(1))).remark == "async"  # type: ignore[union-attr]
        assert (await d.handle(conn, RemotingCommand.request(2))).code == ResponseCode.INVALID_PARAMETER  # type: ignore[union-attr]
        assert (await d.handle(conn, RemotingCommand.request(3))).code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED  # type: ignore[union-attr]
        assert await d.handle(conn, RemotingCommand.request(1, oneway=True)) is None
    run(main)


# ---------------------------------------------------------------------------------------------- without sockets

class FakeTransport(asyncio.Transport):
    """Records writes and reading/writing state; the test plays the kernel."""

    def __init__(self, conn: RemotingConnection) -> None:
        super().__init__()
        self.conn = conn
        self.writes: list[bytes] = []
        self.reading = True
        self.closed = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.writes.append(bytes(data))

    def get_extra_info(self, name: str, default: object = None) -> object:
        return ("127.0.0.1", 4242) if name == "peername" else default

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            asyncio.get_running_loop().call_soon(self.conn.connection_lost, None)

    def frames(self) -> list[RemotingCommand]:
        codec = FrameCodec()
        codec.receive_data(b"".join(self.writes))
        out = []
        while (frame := codec.next_frame()) is not NEED_DATA:
            out.append(frame)  # type: ignore[arg-type]
        return out


def fake_connection(handlers: dict[int, Handler]) -> tuple[RemotingConnection, FakeTransport]:
    """A connection dispatching to ``handlers``, made on a FakeTransport."""
    conn = RemotingConnection(dispatcher=Dispatcher(handlers))  # type: ignore[arg-type]
    transport = FakeTransport(conn)
    conn.connection_made(transport)
    return conn, transport


def request_bytes(code: int, n: int, start: int = 0, **fields: object) -> bytes:
    return b"".join(encode_frame(dataclasses.replace(RemotingCommand.request(code, fields), opaque=start + i))
                    for i in range(n))


def test_answers_of_one_read_leave_in_one_write_and_task_answers_coalesce() -> None:
    async def main() -> None:
        async def coro(conn: RemotingConnection, req: RemotingCommand) -> RemotingCommand:
            return req.make_response()

        def plain(conn: RemotingConnection, req: RemotingCommand) -> RemotingCommand:
            # a handler may hand back a response with any opaque/flag/serialize type: the transport fixes them
            return RemotingCommand(code=0, opaque=-1, remark="plain", serialize_type=SerializeType.ROCKETMQ)
        conn, transport = fake_connection({1: plain, 2: coro})
        conn.data_received(request_bytes(1, 100))
        assert len(transport.writes) == 1  # plain handlers: answered within data_received, one write
        frames = transport.frames()
        assert [f.opaque for f in frames] == list(range(100))
        assert all(f.is_response and f.remark == "plain" and f.serialize_type == SerializeType.JSON for f in frames)
        transport.writes.clear()
        conn.data_received(request_bytes(2, 100, start=1000))
        assert transport.writes == []  # the tasks have not run yet
        for _ in range(3):
            await asyncio.sleep(0)
        assert len(transport.writes) == 1  # a hundred tasks, one write
        assert sorted(f.opaque for f in transport.frames()) == list(range(1000, 1100))
        await conn.close()
        assert transport.closed and conn.is_closed
    run(main)


def test_big_bodies_are_written_without_joining() -> None:
    async def main() -> None:
        body = b"b" * (1024 * 1024)

        def big(conn: RemotingConnection, req: RemotingCommand) -> RemotingCommand:
            return req.make_response(body=body)
        conn, transport = fake_connection({1: big})
        conn.data_received(request_bytes(1, 2))
        assert [len(w) for w in transport.writes][1::2] == [len(body), len(body)]
        assert [f.body for f in transport.frames()] == [body, body]
    run(main)


def test_paused_writing_holds_requests_stops_reading_and_blocks_senders() -> None:
    async def main() -> None:
        handled: list[int] = []

        def plain(conn: RemotingConnection, req: RemotingCommand) -> RemotingCommand:
            handled.append(req.opaque)
            return req.make_response()
        conn, transport = fake_connection({1: plain})
        conn.data_received(request_bytes(1, 3))
        conn.pause_writing()  # the peer stopped reading its responses
        conn.data_received(request_bytes(1, 5, start=3))
        assert handled == [0, 1, 2] and not transport.reading  # the rest is held, and no more is read
        sent = asyncio.ensure_future(conn.send(RemotingCommand(code=0, flag=1, opaque=99)))
        await asyncio.sleep(0.05)
        assert not sent.done()  # send() waits like StreamWriter.drain()
        conn.resume_writing()
        await asyncio.wait_for(sent, 5)
        await asyncio.sleep(0)
        assert handled == list(range(8)) and transport.reading
        await asyncio.sleep(0)
        assert sorted(f.opaque for f in transport.frames()) == [*range(8), 99]
        conn.pause_writing()
        waiting = asyncio.ensure_future(conn.send(RemotingCommand(code=0, flag=1)))
        await asyncio.sleep(0.01)
        conn.connection_lost(None)
        with pytest.raises(RemotingError, match="closed"):
            await waiting
    run(main)


def test_unread_responses_bound_what_the_server_buffers() -> None:
    """A peer that sends requests but never reads its responses: the server stops reading it."""
    async def main() -> None:
        handled: list[int] = []
        body = b"r" * (64 * 1024)

        def big(conn: RemotingConnection, req: RemotingCommand) -> RemotingCommand:
            handled.append(req.opaque)
            return req.make_response(body=body)
        def small_buffers(sock: socket.socket) -> None:  # keeps the kernel's share (and the test) small
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 32 * 1024)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 32 * 1024)
        server = RemotingServer("127.0.0.1", 0)
        server.register(1, big)
        server.on_connection_open(lambda conn: small_buffers(conn._transport.get_extra_info("socket")))
        await server.start()
        sock = socket.socket()
        small_buffers(sock)
        sock.connect(("127.0.0.1", server.port))
        sock.setblocking(False)
        try:
            loop = asyncio.get_running_loop()
            chunk = request_bytes(1, 100)
            sent = bytearray()
            idle = 0
            rest = chunk
            while idle < 50:  # write until the server has stopped taking our requests for a while
                try:
                    n = sock.send(rest)
                    sent += rest[:n]
                    rest = rest[n:] or chunk
                    idle = 0
                except BlockingIOError:
                    idle += 1
                await asyncio.sleep(0.005)
            await asyncio.sleep(0.2)
            stuck = len(handled)
            await asyncio.sleep(0.3)
            assert len(handled) == stuck  # no progress while we do not read
            want = len(decode_all(bytes(sent)))
            assert stuck < want  # the rest waits in TCP buffers (or held), not answered into memory
            [conn] = server.connections
            assert conn._reading_paused
            # reading the responses lets everything through
            got = 0
            codec = FrameCodec()
            while got < want:
                codec.receive_data(await asyncio.wait_for(loop.sock_recv(sock, 1 << 20), 10))
                while (frame := codec.next_frame()) is not NEED_DATA:
                    got += 1
            assert got == want and len(handled) == want
        finally:
            sock.close()
            await server.close()
    run(main, timeout=60)


def decode_all(data: bytes) -> list[RemotingCommand]:
    """The whole frames at the start of ``data`` (a cut-off last frame is left out)."""
    codec = FrameCodec()
    codec.receive_data(data)
    out = []
    while (frame := codec.next_frame()) is not NEED_DATA:
        out.append(frame)  # type: ignore[arg-type]
    return out


def test_timeouts_of_different_lengths_each_fire_on_time() -> None:
    async def check(w: Wire) -> None:
        loop = asyncio.get_running_loop()
        slow = asyncio.ensure_future(w.call(SLOW, {"delay": 0.5}))
        await asyncio.sleep(0.05)
        t0 = loop.time()
        with pytest.raises(RemotingTimeoutError, match="within 0.2 s"):
            await w.call(SLOW, {"delay": 3}, timeout=0.2)
        assert 0.15 < loop.time() - t0 < 1.0  # the shorter timeout did not wait for the longer one
        assert (await slow).code == 0  # and the longer request is still answered
        conn = await w.client.connection(w.addr)
        assert conn._pending == {}
    over_the_wire(check)


def test_close_cancels_awaitables_of_plain_handlers_only_once_they_run() -> None:
    """A plain handler's awaitable is always started, so its cleanup runs even if the connection closes first."""
    async def main() -> None:
        events: list[str] = []

        def counted(conn: RemotingConnection, req: RemotingCommand) -> Awaitable[RemotingCommand]:
            events.append("begun")

            async def rest() -> RemotingCommand:
                try:
                    await asyncio.sleep(10)
                    return req.make_response()
                finally:
                    events.append("cleaned up")
            return rest()
        conn, transport = fake_connection({1: counted})
        conn.data_received(request_bytes(1, 2))
        conn.connection_lost(None)  # before the tasks ran
        for _ in range(5):
            await asyncio.sleep(0)
        assert events == ["begun", "begun", "cleaned up", "cleaned up"]
        assert transport.writes == []
    run(main)
