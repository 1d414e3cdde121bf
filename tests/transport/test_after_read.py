"""One read, one loop iteration: what the handlers of a read's frames write (on any connection) leaves at the end
of ``data_received``, and ``after_read`` work runs right after that write, before the loop polls again."""
from __future__ import annotations

import asyncio

from sluice.protocol.command import RemotingCommand
from sluice.transport.batching import after_read, begin_writes, end_writes
from sluice.transport.connection import Dispatcher, RemotingConnection

from recording import RecordingTransport, frames, wire


def _wire(code: int, opaque: int, body: bytes = b"") -> bytes:
    return wire(RemotingCommand.request(code, {}, body), opaque)


def test_after_read_work_runs_once_the_reads_frames_are_answered_in_the_same_iteration() -> None:
    log: list[tuple[str, object]] = []

    async def main() -> None:
        loop = asyncio.get_running_loop()
        dispatcher = Dispatcher()
        other = RemotingConnection()
        other.connection_made(RecordingTransport("other", log))
        queued: list[int] = []

        def later(opaque: int) -> None:
            log.append(("after", opaque))
            batch = begin_writes()  # its writes are its own to batch (the appender's replies leave before
            req = RemotingCommand.request(1, {})  # its dispatch)
            other.answer(req, req.make_response(0))
            end_writes(batch)

        def handle(conn: RemotingConnection, request: RemotingCommand) -> RemotingCommand:
            log.append(("handler", request.opaque))
            if request.opaque in (1, 3):  # these two queue work for the end of the read
                queued.append(request.opaque)
                assert after_read(lambda o=request.opaque: later(o))
            # a write on another connection during the read (a send waking a pull held there)
            req = RemotingCommand.request(2, {})
            other.answer(req, req.make_response(0))
            return request.make_response(0)

        dispatcher.register(7, handle)
        conn = RemotingConnection(dispatcher=dispatcher)
        conn.connection_made(RecordingTransport("conn", log))
        ready_before = len(loop._ready)  # type: ignore[attr-defined]
        conn.data_received(b"".join(_wire(7, i) for i in (1, 2, 3)))
        # Nothing was left for a later iteration: no flush scheduled, nothing more written later.
        assert len(loop._ready) == ready_before  # type: ignore[attr-defined]
        assert not conn._flush_scheduled and not other._flush_scheduled
        assert not after_read(lambda: None)  # outside a read: the caller schedules its work itself
        written = len(log)
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert len(log) == written

    asyncio.run(main())
    kinds = [(name, v if not isinstance(v, bytes) else [f.opaque for f in frames(v)]) for name, v in log]
    # the three handlers, then the read's writes (one per connection), then the queued work in order, whose
    # own writes (each in its write batch) leave before the read ends
    assert kinds[:3] == [("handler", 1), ("handler", 2), ("handler", 3)]
    writes = kinds[3:5]
    assert sorted(name for name, _ in writes) == ["conn", "other"]
    assert dict(writes)["conn"] == [1, 2, 3] and len(dict(writes)["other"]) == 3
    assert [k for k in kinds[5:] if k[0] == "after"] == [("after", 1), ("after", 3)]
    other_after = [v for name, v in kinds[5:] if name == "other"]
    assert sum(len(v) for v in other_after) == 2  # both callbacks' answers, written before data_received returned


def test_a_failing_after_read_callback_is_logged_and_the_others_still_run(caplog) -> None:
    ran: list[str] = []

    async def main() -> None:
        dispatcher = Dispatcher()

        def handle(conn: RemotingConnection, request: RemotingCommand) -> RemotingCommand:
            after_read(lambda: 1 / 0)
            after_read(lambda: ran.append("second"))
            return request.make_response(0)

        dispatcher.register(7, handle)
        conn = RemotingConnection(dispatcher=dispatcher)
        conn.connection_made(RecordingTransport("conn", []))
        conn.data_received(_wire(7, 1))
        assert not after_read(lambda: None)  # the read's queue is gone, even after a failure

    asyncio.run(main())
    assert ran == ["second"]
    assert "after-read callback" in caplog.text
