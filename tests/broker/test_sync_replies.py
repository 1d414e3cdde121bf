"""Synchronous-flush replies answered by a callback (Appender.put's ``then``, SendProcessor, and
RemotingConnection.answer): after their bytes are durable, with the round's error when it failed, and
written in one transport write per connection per round."""
from __future__ import annotations

import asyncio
import dataclasses
import os
import threading
import time
from functools import partial
from pathlib import Path

import pytest

from sluice.broker.appender import Appender
from sluice.broker.dedup import DedupWindow
from sluice.broker.durable import DurableWaiter
from sluice.errors import FlushDiskTimeoutError, MessageIllegalError
from sluice.protocol.codes import ResponseCode
from sluice.protocol.command import RemotingCommand
from sluice.speedups import C
from sluice.store import MessageStore, StoreConfig, StoreMessage
from sluice.store.background_flush import BackgroundFlush
from sluice.store.encode import encode_batch
from sluice.transport.connection import RemotingConnection

from recording import RecordingTransport, frames
from spark_side_support import Broker


@pytest.fixture(params=["python", pytest.param("c", marks=pytest.mark.skipif(C is None, reason="no C extension"))])
def store(request: pytest.FixtureRequest, tmp_path: Path):
    s = MessageStore(tmp_path, StoreConfig(flush_mode="sync", commitlog_file_size=1 << 20, max_message_size=1024))
    s.background_flush = lambda: BackgroundFlush(s.flusher, use_c=request.param == "c")  # type: ignore[method-assign]
    s.start()
    s.dispatch.drive_externally()
    yield s
    s.close()


def test_then_gets_each_result_once_after_its_bytes_are_durable(store: MessageStore) -> None:
    appender = Appender(store)
    seen: list[tuple[int, int]] = []  # (end of the request's bytes, flushed offset when told)
    errors: list[BaseException] = []

    def then(stored: object, error: BaseException | None) -> None:
        if error is not None:
            errors.append(error)
            return
        last = stored[1][-1]  # type: ignore[index]
        seen.append((last.commitlog_offset + last.size, store.flusher.flushed_offset))

    async def main() -> None:
        for rnd in range(20):
            for i in range(12):  # singles (merged) and encoded batches in the same iterations
                if i % 3:
                    payload: object = [StoreMessage("T", b"m%d-%d" % (rnd, i), i % 2, {})]
                else:
                    payload = encode_batch([StoreMessage("T", b"b%d" % k, 0, {}) for k in range(4)],
                                           store_host=store.config.store_host, max_body=1024)
                assert appender.put("T", i % 2 if i % 3 else 0, payload, then=then) is None  # type: ignore[arg-type]
            assert len(seen) == 12 * rnd  # never before put returned
            while len(seen) + len(errors) < 12 * (rnd + 1):
                await asyncio.sleep(0.001)

    try:
        asyncio.run(main())
    finally:
        appender.close()
    assert errors == [] and len(seen) == 240
    assert all(end <= flushed for end, flushed in seen)


def test_then_gets_the_failed_rounds_error_and_a_refused_message_its_own(store: MessageStore,
                                                                         monkeypatch) -> None:
    r, w = os.pipe()  # the first round "syncs" a pipe: fdatasync fails with EINVAL
    real = BackgroundFlush._fds
    calls: list[int] = []

    def fds(self: BackgroundFlush, start: int, end: int) -> tuple[int, ...]:
        calls.append(end)
        return (r,) if len(calls) == 1 else real(self, start, end)

    monkeypatch.setattr(BackgroundFlush, "_fds", fds)
    appender = Appender(store)
    got: list[tuple[object, BaseException | None]] = []

    async def wait_for(n: int) -> None:
        while len(got) < n:
            await asyncio.sleep(0.001)

    async def main() -> None:
        then = lambda s, e: got.append((s, e))  # noqa: E731
        appender.put("T", 0, [StoreMessage("T", b"a", 0, {})], then=then)
        await wait_for(1)
        appender.put("T", 0, [StoreMessage("T", b"b", 0, {})], then=then)
        appender.put("T", 0, [StoreMessage("T", b"x" * 2048, 0, {})], then=then)  # over max_message_size
        await wait_for(3)

    try:
        asyncio.run(main())
    finally:
        appender.close()
        os.close(r)
        os.close(w)
    (s0, e0), *rest = got
    assert s0 is None and isinstance(e0, FlushDiskTimeoutError)
    refused = [e for s, e in rest if e is not None]
    ok = [s for s, e in rest if e is None]
    assert len(refused) == 1 and isinstance(refused[0], MessageIllegalError)
    assert len(ok) == 1 and ok[0][1][0].queue_offset == 1  # type: ignore[index]


def test_then_with_a_duplicate_window_is_refused(store: MessageStore) -> None:
    appender = Appender(store)
    try:
        with pytest.raises(TypeError, match="callback"):
            appender.put("T", 0, [StoreMessage("T", b"a", 0, {})], dedup=DedupWindow(max_keys=10, window_ms=1000, prefixes=("p-",)),
                         then=lambda s, e: None)
    finally:
        appender.close()


def test_a_rounds_replies_leave_in_one_write_per_connection(store: MessageStore, monkeypatch) -> None:
    conns: list[tuple[RemotingConnection, RecordingTransport]] = []
    answered = [0]
    after_wake: list[tuple[int, int]] = []  # (replies answered, frames written) as each round's wake-up ends
    real_ready = DurableWaiter._ready

    def ready(self: DurableWaiter) -> None:
        real_ready(self)
        after_wake.append((answered[0], len(frames([w for _, t in conns for w in t.writes]))))

    monkeypatch.setattr(DurableWaiter, "_ready", ready)
    appender = Appender(store)

    async def main() -> None:
        for _ in range(2):
            conn = RemotingConnection()
            transport = RecordingTransport()
            conn.connection_made(transport)
            conns.append((conn, transport))
        done = asyncio.get_running_loop().create_future()

        def answer(conn: RemotingConnection, req: RemotingCommand, s: object, e: BaseException | None) -> None:
            conn.answer(req, e if e is not None else req.make_response(remark=str(s[1][0].queue_offset)))  # type: ignore[index]
            answered[0] += 1
            if answered[0] == 20:
                done.set_result(None)

        for i in range(20):
            conn = conns[i % 2][0]
            req = dataclasses.replace(RemotingCommand.request(310), opaque=i)
            enc = encode_batch([StoreMessage("T", b"m%d" % i, 0, {})] * 2, store_host=store.config.store_host,
                               max_body=1024)
            appender.put("T", 0, enc, then=partial(answer, conn, req))
            if i % 5 == 4:
                await asyncio.sleep(0.002)  # several rounds
        await done

    try:
        asyncio.run(main())
    finally:
        appender.close()
    # Written by the round's wake-up itself, not at a later loop iteration...
    assert after_wake and all(n == written for n, written in after_wake)
    # ...in one write per connection per round, not one per reply.
    (_, a), (_, b) = conns
    assert len(a.writes) <= store.flusher.fsyncs and len(b.writes) <= store.flusher.fsyncs
    answers = frames(a.writes) + frames(b.writes)
    assert sorted(f.opaque for f in answers) == list(range(20))
    assert all(f.is_response and f.code == ResponseCode.SUCCESS for f in answers)
    assert sorted(int(f.remark) for f in answers) == list(range(0, 40, 2))


def test_answer_turns_an_exception_into_its_error_reply() -> None:
    async def main() -> list[RemotingCommand]:
        conn = RemotingConnection()
        transport = RecordingTransport()
        conn.connection_made(transport)
        conn.answer(RemotingCommand.request(310), FlushDiskTimeoutError("fsync failed"))
        conn.answer(RemotingCommand.request(310, oneway=True), FlushDiskTimeoutError("not written"))
        await asyncio.sleep(0)
        return frames(transport.writes)

    (frame,) = asyncio.run(main())
    assert frame.is_response and frame.code == ResponseCode.FLUSH_DISK_TIMEOUT and frame.remark == "fsync failed"


def test_sync_sends_through_the_broker_are_answered_and_leave_nothing_waiting(make_broker) -> None:
    b = make_broker(flush="sync", handle=Broker)
    assert b.send("T", b"one", {}).code == 0
    reply = b.send_batch("T", [(b"b%d" % i, {}) for i in range(5)], group="PG")
    assert reply.code == 0 and len(reply.ext_fields["msgId"].split(",")) == 5
    assert [bytes(r.body) for r in b.pull_all("T", 0)][-5:] == [b"b%d" % i for i in range(5)]
    assert b.broker.gate.in_flight == 0


def test_a_graceful_stop_waits_for_the_replies_of_a_round_still_running(make_broker, monkeypatch) -> None:
    b = make_broker(flush="sync", handle=Broker)
    assert b.send("T", b"warm", {}).code == 0
    held: list[BackgroundFlush] = []
    real = BackgroundFlush.request

    def request(self: BackgroundFlush) -> bool:  # the round is asked for only when the test says so
        held.append(self)
        return True

    monkeypatch.setattr(BackgroundFlush, "request", request)
    replies: list[object] = []

    def send() -> None:
        try:
            replies.append(b.send_batch("T", [(b"x", {}), (b"y", {})], group="PG"))
        except Exception as exc:  # the connection closed before the reply
            replies.append(exc)

    sender = threading.Thread(target=send)
    sender.start()
    while not held:
        time.sleep(0.005)
    assert b.broker.gate.in_flight == 1  # the durable reply's Deferred, counted by the gate
    stopper = threading.Thread(target=lambda: b.loop.run(b.broker.stop(), 30))
    stopper.start()
    while not b.broker.gate.stopping:
        time.sleep(0.005)
    time.sleep(0.2)  # the stop has reached its drain (without waiting for the reply it would be past it)

    async def release() -> None:
        real(held[0])

    b.loop.run(release(), 10)
    sender.join(30)
    stopper.join(30)
    (reply,) = replies
    assert isinstance(reply, RemotingCommand) and reply.code == ResponseCode.SUCCESS
    assert len(reply.ext_fields["msgId"].split(",")) == 2
