"""ThreadWritableConnection.request_from_thread (transport/thread_writes.py): requests written from other threads
than the loop's, their responses answered on the loop thread, the byte stream whole whatever the loop writes
meanwhile."""
from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
from test_request_with import Waiter
from test_transport import ECHO, SLOW, Wire, over_the_wire

from sluice.acl.signature import Credentials, signature_matches
from sluice.acl.signing import SigningRemotingClient
from sluice.errors import RemotingError, RemotingTimeoutError
from sluice.protocol.command import RemotingCommand
from sluice.transport.client import RemotingClient
from sluice.transport.connection import RemotingConnection
from sluice.transport.thread_writes import ThreadWritableConnection


class ThreadWaiter(Waiter):
    """A Waiter that also notes the thread each answer came on, and wakes a thread waiting for it."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__()
        self.loop = loop
        self.threads: list[int] = []
        self.answered = threading.Event()

    def _record(self, kind: str, value: Any) -> None:
        self.threads.append(threading.get_ident())
        super()._record(kind, value)
        self.answered.set()


async def in_thread(fn: Any, *args: Any) -> Any:
    """``fn(*args)`` on a new thread (not the loop's), awaited without blocking the loop."""
    return await asyncio.get_running_loop().run_in_executor(None, fn, *args)


def test_a_request_written_from_another_thread_is_answered_on_the_loop_thread() -> None:
    async def check(w: Wire) -> None:
        conn = await w.client.connection(w.addr)
        assert type(conn) is ThreadWritableConnection
        waiter = ThreadWaiter(asyncio.get_running_loop())
        req = RemotingCommand.request(ECHO, {"n": "1"}, b"body")
        assert await in_thread(w.client.request_from_thread, w.addr, req, 5.0, waiter)
        await asyncio.wait_for(waiter.event.wait(), 10)
        [(kind, resp)] = waiter.calls
        assert kind == "result" and resp.ext_fields == {"n": "1"} and resp.body == b"body"
        assert waiter.threads == [threading.get_ident()]  # the loop's
        assert conn.thread_writes == 1 and conn._pending == {}
    over_the_wire(check)


def test_nothing_is_sent_from_a_thread_while_frames_wait_to_be_written_or_to_an_unknown_address() -> None:
    async def check(w: Wire) -> None:
        conn = await w.client.connection(w.addr)
        loop = asyncio.get_running_loop()
        waiter = ThreadWaiter(loop)
        unsent = conn.request_with(RemotingCommand.request(ECHO, {"n": "first"}), 5, Waiter())  # this iteration's
        assert conn._wbuf
        answers: list[bool] = []

        def other_thread() -> None:
            for addr in (w.addr, "127.0.0.1:1"):
                answers.append(w.client.request_from_thread(addr, RemotingCommand.request(ECHO), 5.0, waiter))
        t = threading.Thread(target=other_thread)
        t.start()
        t.join(10)  # blocking the loop thread: the frame it collected stays unwritten meanwhile
        assert answers == [False, False]
        assert set(conn._pending) == {unsent} and conn.thread_writes == 0
        await asyncio.sleep(0.2)
        assert waiter.calls == []
    over_the_wire(check)


def test_threads_and_the_loop_writing_at_once_keep_every_frame_whole() -> None:
    """Four threads and the loop send requests of many sizes, some far over the socket's buffer (partial writes:
    the rest is carried by the loop); every response matches its request."""
    sizes = [0, 1, 100, 1024, 70_000, 300_000, 3_000_000]

    async def check(w: Wire) -> None:
        conn = await w.client.connection(w.addr)
        loop = asyncio.get_running_loop()
        results: list[tuple[bytes, ThreadWaiter]] = []
        lock = threading.Lock()

        def sender(t: int) -> int:
            direct = 0
            for i in range(40):
                body = bytes([t * 40 + i & 0xFF]) * sizes[(t + i) % len(sizes)]
                waiter = ThreadWaiter(loop)
                req = RemotingCommand.request(ECHO, {"t": t, "i": i}, body)
                if w.client.request_from_thread(w.addr, req, 30.0, waiter):
                    direct += 1
                else:  # the loop sends it, as the SDK falls back
                    asyncio.run_coroutine_threadsafe(loop_send(req, waiter), loop).result(30)
                with lock:
                    results.append((body, waiter))
            return direct

        async def loop_send(req: RemotingCommand, waiter: ThreadWaiter) -> None:
            conn.request_with(req, 30.0, waiter)

        async def loop_writer() -> None:
            for i in range(100):
                body = b"L" * sizes[i % len(sizes)]
                waiter = ThreadWaiter(loop)
                conn.request_with(RemotingCommand.request(ECHO, {"loop": i}, body), 30.0, waiter)
                with lock:
                    results.append((body, waiter))
                await asyncio.sleep(0)

        direct = await asyncio.gather(*(in_thread(sender, t) for t in range(4)), loop_writer())
        assert sum(direct[:4]) > 0
        for body, waiter in results:
            await asyncio.wait_for(waiter.event.wait(), 30)
            [(kind, resp)] = waiter.calls
            assert kind == "result" and resp.body == body
        assert conn._pending == {} and not conn.is_closed
    over_the_wire(check, timeout=60)


def test_a_thread_written_request_times_out_though_the_sweep_waited_for_a_later_deadline() -> None:
    """A held request (a long-polling pull, say) armed the sweep late; a thread's request with a short timeout
    still fails in time."""
    async def check(w: Wire) -> None:
        conn = await w.client.connection(w.addr)
        loop = asyncio.get_running_loop()
        held = Waiter()
        conn.request_with(RemotingCommand.request(SLOW, {"delay": 5}), 20, held)
        await asyncio.sleep(0.05)
        waiter = ThreadWaiter(loop)
        assert await in_thread(w.client.request_from_thread, w.addr,
                               RemotingCommand.request(SLOW, {"delay": 5}), 0.2, waiter)
        await asyncio.wait_for(waiter.event.wait(), 4)  # not the 20 s of the held one
        [(kind, exc)] = waiter.calls
        assert kind == "error" and isinstance(exc, RemotingTimeoutError) and held.calls == []
    over_the_wire(check)


def test_a_closing_connection_fails_thread_written_requests_and_takes_no_more() -> None:
    async def check(w: Wire) -> None:
        conn = await w.client.connection(w.addr)
        loop = asyncio.get_running_loop()
        waiter = ThreadWaiter(loop)
        assert await in_thread(w.client.request_from_thread, w.addr,
                               RemotingCommand.request(SLOW, {"delay": 10}), 20.0, waiter)
        await conn.close()
        [(kind, exc)] = waiter.calls
        assert kind == "error" and isinstance(exc, RemotingError)
        assert not await in_thread(conn.request_from_thread, RemotingCommand.request(ECHO), 5.0, ThreadWaiter(loop))
        assert conn._pending == {}
    over_the_wire(check)


class _Stamping(RemotingClient):
    """A client that changes requests on their way out without saying how to do it from a thread."""

    def request_with(self, conn: RemotingConnection, request: RemotingCommand, timeout: float | None,
                     waiter: Any) -> int:
        request.ext_fields["stamp"] = "1"
        return super().request_with(conn, request, timeout, waiter)


def test_the_signing_client_signs_what_it_writes_from_a_thread() -> None:
    async def check(w: Wire) -> None:
        signing = SigningRemotingClient(Credentials("ak", "secret-key-1"))
        try:
            conn = await signing.connection(w.addr)
            waiter = ThreadWaiter(asyncio.get_running_loop())
            req = RemotingCommand.request(ECHO, {"topic": "T"}, b"body")
            assert await in_thread(signing.request_from_thread, w.addr, req, 5.0, waiter)
            await asyncio.wait_for(waiter.event.wait(), 10)
        finally:
            await signing.close()
        [(kind, resp)] = waiter.calls
        assert kind == "result" and conn.thread_writes == 1
        assert resp.ext_fields["AccessKey"] == "ak"  # the echo of what went over the wire, signed
        assert signature_matches("secret-key-1", resp.ext_fields, resp.body)
    over_the_wire(check)


def test_clients_that_change_requests_on_their_way_out_and_tls_connections_are_never_written_from_threads() -> None:
    async def check(w: Wire) -> None:
        stamping = _Stamping()
        try:
            await stamping.connection(w.addr)
            waiter = ThreadWaiter(asyncio.get_running_loop())
            assert not await in_thread(stamping.request_from_thread, w.addr, RemotingCommand.request(ECHO), 5.0,
                                       waiter)
        finally:
            await stamping.close()
        assert waiter.calls == []
    over_the_wire(check)
    tls_client = RemotingClient()
    tls_client._ssl = object()  # type: ignore[assignment]  # what RemotingClient(tls=...) sets
    assert type(tls_client._new_connection()) is RemotingConnection


@pytest.mark.parametrize("size", [10, 2_000_000])
def test_the_bytes_a_thread_could_not_write_leave_before_the_loops_next_frame(size: int) -> None:
    """A partial write's rest (the carry) goes first; the loop's own frame after it arrives whole."""
    async def check(w: Wire) -> None:
        conn = await w.client.connection(w.addr)
        loop = asyncio.get_running_loop()
        first = ThreadWaiter(loop)
        body = b"t" * size
        assert await in_thread(conn.request_from_thread, RemotingCommand.request(ECHO, {"n": 1}, body), 10.0, first)
        second = Waiter()
        conn.request_with(RemotingCommand.request(ECHO, {"n": 2}, b"loop"), 10, second)
        await asyncio.wait_for(asyncio.gather(first.event.wait(), second.event.wait()), 10)
        assert first.calls[0][1].body == body and second.calls[0][1].body == b"loop"
    over_the_wire(check)
