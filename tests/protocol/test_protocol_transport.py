"""The asyncio transport over real loopback sockets: dispatch rules, opaque matching, failures."""
from __future__ import annotations

import asyncio
import dataclasses
import logging
import socket
import struct
from collections.abc import Awaitable, Callable

import pytest

from sluice.errors import InvalidParameterError, RemotingError, RemotingTimeoutError
from sluice.protocol.client import RemotingClient
from sluice.protocol.codes import RequestCode, ResponseCode
from sluice.protocol.command import RemotingCommand, SerializeType
from sluice.protocol.connection import RemotingConnection
from sluice.protocol.frame import NEED_DATA, FrameCodec, encode_frame
from sluice.protocol.server import RemotingServer
from sluice.protocol.sync import LoopThread, SyncRemotingClient

ECHO, SLOW, FAIL, CRASH, ONEWAY_SINK = 9001, 9002, 9003, 9004, 9005


def run(coro_fn: Callable[[], Awaitable[None]], timeout: float = 20.0) -> None:
    async def bounded() -> None:
        async with asyncio.timeout(timeout):
            await coro_fn()
    asyncio.run(bounded())


async def make_server(**kwargs: object) -> tuple[RemotingServer, list[RemotingCommand]]:
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

    for code, handler in ((ECHO, echo), (SLOW, slow), (FAIL, fail), (CRASH, crash), (ONEWAY_SINK, sink)):
        server.register(code, handler)
    await server.start()
    return server, seen


def test_request_response_and_dispatch_rules(caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        server, _ = await make_server()
        client = RemotingClient()
        try:
            resp = await client.invoke(server.address, RemotingCommand.request(ECHO, {"k": "v"}, b"body"), 5)
            assert resp.is_response and resp.code == 0 and resp.ext_fields == {"k": "v"} and resp.body == b"body"
            resp = await client.invoke(server.address, RemotingCommand.request(4242), 5)
            assert resp.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED and "4242" in (resp.remark or "")
            resp = await client.invoke(server.address, RemotingCommand.request(FAIL), 5)
            assert (resp.code, resp.remark) == (ResponseCode.INVALID_PARAMETER, "queueId is missing")
            with caplog.at_level(logging.ERROR):
                resp = await client.invoke(server.address, RemotingCommand.request(CRASH), 5)
            assert resp.code == ResponseCode.SYSTEM_ERROR and "boom" in (resp.remark or "")
            assert "handler for request code 9004" in caplog.text
            # the connection survived all of that
            assert (await client.invoke(server.address, RemotingCommand.request(ECHO), 5)).code == 0
            assert len(server.connections) == 1
        finally:
            await client.close()
            await server.close()
    run(main)


def test_concurrent_requests_are_answered_out_of_order_and_matched_by_opaque() -> None:
    async def main() -> None:
        server, _ = await make_server()
        client = RemotingClient()
        try:
            delays = [0.4, 0.05, 0.3, 0.0, 0.2, 0.1]
            order: list[int] = []

            async def one(i: int) -> RemotingCommand:
                r = await client.invoke(server.address, RemotingCommand.request(SLOW, {"delay": delays[i], "i": i}), 5)
                order.append(i)
                return r
            results = await asyncio.gather(*(one(i) for i in range(len(delays))))
            assert [r.ext_fields["i"] for r in results] == [str(i) for i in range(len(delays))]
            assert order != sorted(order)  # replies really came back out of order
            assert len(server.connections) == 1
        finally:
            await client.close()
            await server.close()
    run(main)


def test_oneway_gets_no_reply_and_binary_requests_get_binary_replies() -> None:
    async def main() -> None:
        server, seen = await make_server()
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
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
            assert [r.ext_fields for r in seen] == [{"x": "1"}]
            assert codec.buffered == 0
        finally:
            writer.close()
            await server.close()
    run(main)


def test_timeout_then_late_reply_is_dropped() -> None:
    async def main() -> None:
        server, _ = await make_server()
        client = RemotingClient()
        try:
            with pytest.raises(RemotingTimeoutError, match="within 0.1 s"):
                await client.invoke(server.address, RemotingCommand.request(SLOW, {"delay": 0.5}), 0.1)
            conn = await client.connection(server.address)
            assert conn._pending == {}
            await asyncio.sleep(0.6)  # the late reply arrives and is ignored
            assert (await client.invoke(server.address, RemotingCommand.request(ECHO), 5)).code == 0
        finally:
            await client.close()
            await server.close()
    run(main)


def test_closed_connection_fails_pending_requests_and_client_reconnects() -> None:
    async def main() -> None:
        server, _ = await make_server()
        closed: list[RemotingConnection] = []
        server.on_connection_close(closed.append)
        client = RemotingClient()
        try:
            pending = asyncio.ensure_future(
                client.invoke(server.address, RemotingCommand.request(SLOW, {"delay": 10}), 5))
            await asyncio.sleep(0.2)
            for conn in list(server.connections):
                await conn.close()
            with pytest.raises(RemotingError, match="closed"):
                await pending
            assert len(closed) == 1
            assert (await client.invoke(server.address, RemotingCommand.request(ECHO), 5)).code == 0
        finally:
            await client.close()
            await server.close()
    run(main)


@pytest.mark.parametrize("garbage", [
    b"\x00\x00\x00\x0c\x00\x00\x00\x08not-json",            # header that is not JSON
    struct.pack(">i", 64 * 1024 * 1024) + b"xxxx",           # oversized frame
    b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",                   # another protocol entirely
])
def test_malformed_input_closes_only_that_connection(garbage: bytes, caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        server, _ = await make_server(max_frame_size=1024 * 1024)
        closed: list[RemotingConnection] = []
        server.on_connection_close(closed.append)
        client = RemotingClient()
        try:
            assert (await client.invoke(server.address, RemotingCommand.request(ECHO), 5)).code == 0
            reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
            with caplog.at_level(logging.WARNING):
                writer.write(garbage)
                await writer.drain()
                assert await asyncio.wait_for(reader.read(), 5) == b""  # the server hung up
            writer.close()
            assert "closing connection" in caplog.text
            assert len(closed) == 1
            assert (await client.invoke(server.address, RemotingCommand.request(ECHO), 5)).code == 0
        finally:
            await client.close()
            await server.close()
    run(main)


def test_server_can_call_the_client_on_the_same_connection() -> None:
    async def main() -> None:
        server, _ = await make_server()
        client_conns: list[RemotingConnection] = []
        server.on_connection_open(client_conns.append)
        notified: list[str] = []
        client = RemotingClient()

        async def on_notify(conn: RemotingConnection, req: RemotingCommand) -> RemotingCommand:
            notified.append(req.ext_fields["consumerGroup"])
            return req.make_response()
        client.register(RequestCode.NOTIFY_CONSUMER_IDS_CHANGED, on_notify)
        try:
            await client.invoke(server.address, RemotingCommand.request(ECHO), 5)
            [conn] = client_conns
            resp = await conn.request(RemotingCommand.request(RequestCode.NOTIFY_CONSUMER_IDS_CHANGED,
                                                              {"consumerGroup": "G"}), 5)
            assert resp.code == 0 and notified == ["G"]
            await conn.send_oneway(RemotingCommand.request(RequestCode.NOTIFY_CONSUMER_IDS_CHANGED, {"consumerGroup": "H"}))
            deadline = asyncio.get_running_loop().time() + 5
            while notified != ["G", "H"] and asyncio.get_running_loop().time() < deadline:
                await asyncio.sleep(0.01)
            assert notified == ["G", "H"]
        finally:
            await client.close()
            await server.close()
    run(main)


def test_large_bodies_cross_intact() -> None:
    async def main() -> None:
        server, _ = await make_server()
        client = RemotingClient()
        try:
            body = bytes(range(256)) * (5 * 4096)  # 5 MiB
            resp = await client.invoke(server.address, RemotingCommand.request(ECHO, body=body), 10)
            assert resp.body == body
        finally:
            await client.close()
            await server.close()
    run(main)


def unused_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_sync_facade() -> None:
    loop = LoopThread()
    try:
        server, _ = loop.run(make_server(), 10)
        with SyncRemotingClient(loop) as client:
            assert client.invoke(server.address, RemotingCommand.request(ECHO, {"a": 1}), 5).ext_fields == {"a": "1"}
            client.invoke_oneway(server.address, RemotingCommand.request(ECHO))
            with pytest.raises(RemotingError, match="cannot connect"):
                client.invoke(f"127.0.0.1:{unused_port()}", RemotingCommand.request(ECHO), 2)
            with pytest.raises(RemotingError, match="bad address"):
                client.invoke("nowhere", RemotingCommand.request(ECHO), 2)
        loop.run(server.close(), 10)
    finally:
        loop.stop()
    assert not loop.running
    with SyncRemotingClient() as own:  # owns (and stops) its loop thread
        with pytest.raises(RemotingError):
            own.invoke(f"127.0.0.1:{unused_port()}", RemotingCommand.request(ECHO), 2)
    assert not own.loop_thread.running


def test_reading_pauses_while_too_many_requests_are_in_flight() -> None:
    async def main() -> None:
        release = asyncio.Event()
        started: list[int] = []

        async def held(conn: RemotingConnection, req: RemotingCommand) -> RemotingCommand:
            started.append(req.opaque)
            await release.wait()
            return req.make_response()

        async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            from sluice.protocol.connection import Dispatcher
            conn = RemotingConnection(reader, writer, dispatcher=Dispatcher({1: held}), max_inflight=3)
            conns.append(conn)
            conn.start()
        conns: list[RemotingConnection] = []
        srv = await asyncio.start_server(accept, "127.0.0.1", 0)
        client = RemotingClient()
        addr = f"127.0.0.1:{srv.sockets[0].getsockname()[1]}"
        try:
            calls = [asyncio.ensure_future(client.invoke(addr, RemotingCommand.request(1), 10)) for _ in range(8)]
            await asyncio.sleep(0.3)
            assert len(started) == 3  # the other five wait in the socket, not in memory
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
