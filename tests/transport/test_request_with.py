"""RemotingConnection.request_with: a request whose response goes to a waiter object (no future, no task),
and the RemotingClient / SigningRemotingClient methods over it that the SDK's sends use."""
from __future__ import annotations

import asyncio
from typing import Any

import pytest
from test_transport import ECHO, SLOW, Wire, over_the_wire

from sluice.acl.signature import SIGNATURE, Credentials, signature_matches
from sluice.acl.signing import SigningRemotingClient
from sluice.errors import RemotingError, RemotingTimeoutError
from sluice.protocol.command import RemotingCommand


class Waiter:
    """Records each call; ``then`` runs after the first one (a retry, say)."""

    def __init__(self, then: Any = None) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.then = then
        self.event = asyncio.Event()

    def done(self) -> bool:
        return bool(self.calls)

    def set_result(self, response: RemotingCommand) -> None:
        self._record("result", response)

    def set_exception(self, exc: BaseException) -> None:
        self._record("error", exc)

    def _record(self, kind: str, value: Any) -> None:
        self.calls.append((kind, value))
        self.event.set()
        if self.then is not None:
            self.then()


def test_the_waiter_gets_the_response_and_the_pending_entry_goes() -> None:
    async def check(w: Wire) -> None:
        conn = w.client.open_connection(w.addr)
        assert conn is None  # nothing opened yet: the caller then goes through invoke
        await w.call(ECHO)
        conn = w.client.open_connection(w.addr)
        assert conn is not None and conn.writable
        waiter = Waiter()
        opaque = w.client.request_with(conn, RemotingCommand.request(ECHO, {"n": "1"}, b"b"), 5, waiter)
        assert opaque in conn._pending
        await asyncio.wait_for(waiter.event.wait(), 10)
        [(kind, resp)] = waiter.calls
        assert kind == "result" and resp.ext_fields == {"n": "1"} and resp.body == b"b" and resp.opaque == opaque
        assert conn._pending == {}
    over_the_wire(check)


def test_timeout_then_late_reply_is_dropped_and_forget_drops_a_waiter() -> None:
    async def check(w: Wire) -> None:
        conn = await w.client.connection(w.addr)
        waiter, forgotten = Waiter(), Waiter()
        conn.request_with(RemotingCommand.request(SLOW, {"delay": 0.3}), 0.1, waiter)
        opaque = conn.request_with(RemotingCommand.request(SLOW, {"delay": 0.1}), 5, forgotten)
        conn.forget(opaque)
        await asyncio.wait_for(waiter.event.wait(), 10)
        await asyncio.sleep(0.5)  # both replies arrive late / unasked for and are dropped
        [(kind, exc)] = waiter.calls
        assert kind == "error" and isinstance(exc, RemotingTimeoutError) and "within 0.1 s" in str(exc)
        assert forgotten.calls == [] and conn._pending == {}
    over_the_wire(check)


def test_a_closing_connection_fails_its_waiters() -> None:
    async def check(w: Wire) -> None:
        conn = await w.client.connection(w.addr)
        waiter = Waiter()
        conn.request_with(RemotingCommand.request(SLOW, {"delay": 10}), 20, waiter)
        await conn.close()
        assert [k for k, _ in waiter.calls] == ["error"] and isinstance(waiter.calls[0][1], RemotingError)
        assert not conn.writable and w.client.open_connection(w.addr) is None
        with pytest.raises(RemotingError, match="closed"):
            conn.request_with(RemotingCommand.request(ECHO), 5, Waiter())
    over_the_wire(check)


def test_a_retry_sent_from_a_timed_out_waiter_keeps_its_own_timeout() -> None:
    """The sweep that times a waiter out re-arms for the earliest deadline, the retry's included."""
    async def check(w: Wire) -> None:
        conn = await w.client.connection(w.addr)
        long = Waiter()
        conn.request_with(RemotingCommand.request(SLOW, {"delay": 5}), 8, long)
        retry = Waiter()
        first = Waiter(then=lambda: conn.request_with(RemotingCommand.request(SLOW, {"delay": 5}), 0.2, retry))
        conn.request_with(RemotingCommand.request(SLOW, {"delay": 5}), 0.1, first)
        await asyncio.wait_for(retry.event.wait(), 4)  # not the 8 s of the long one
        assert isinstance(retry.calls[0][1], RemotingTimeoutError) and long.calls == []
    over_the_wire(check)


def test_the_signing_client_signs_what_it_writes() -> None:
    creds = Credentials("ak", "secret-key-1")
    seen: list[RemotingCommand] = []

    async def record(conn: Any, req: RemotingCommand) -> RemotingCommand:
        seen.append(req)
        return req.make_response()

    async def check(w: Wire) -> None:
        client = SigningRemotingClient(creds)
        try:
            conn = await client.connection(w.addr)
            waiter = Waiter()
            client.request_with(conn, RemotingCommand.request(9100, {"topic": "T"}, b"x"), 5, waiter)
            await asyncio.wait_for(waiter.event.wait(), 10)
        finally:
            await client.close()
        [req] = seen
        assert SIGNATURE in req.ext_fields and signature_matches("secret-key-1", req.ext_fields, req.body)
    over_the_wire(check, extra={9100: record})


def test_a_write_batch_sends_what_its_calls_wrote_in_one_write_before_it_ends() -> None:
    from test_transport import fake_connection

    from sluice.transport.batching import begin_writes, end_writes

    async def main() -> None:
        conn, transport = fake_connection({})
        other, other_transport = fake_connection({})
        batch = begin_writes()
        assert batch is not None and begin_writes() is None  # nested: the outer batch keeps them
        for i in range(5):
            conn.request_with(RemotingCommand.request(ECHO, {"i": i}), 5, Waiter())
        other.request_with(RemotingCommand.request(ECHO), 5, Waiter())
        end_writes(None)
        assert transport.writes == [] and other_transport.writes == []
        end_writes(batch)
        assert len(transport.writes) == 1 and len(other_transport.writes) == 1  # at once, no iteration later
        assert [f.ext_fields["i"] for f in transport.frames()] == [str(i) for i in range(5)]
        conn.request_with(RemotingCommand.request(ECHO), 5, Waiter())  # no batch: the next iteration flushes
        assert len(transport.writes) == 1
        await asyncio.sleep(0)
        assert len(transport.writes) == 2
    asyncio.run(main())
