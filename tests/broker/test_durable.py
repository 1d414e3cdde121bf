"""The durable waits (broker/durable.py) behind synchronous-flush replies, over a real store, with the C
fsync thread and with its Python reference (store/background_flush.py)."""
from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path

import pytest

from sluice.broker.appender import Appender, stored
from sluice.broker.durable import DurableWaiter
from sluice.errors import FlushDiskTimeoutError
from sluice.speedups import C
from sluice.store import MessageStore, StoreConfig, StoreMessage
from sluice.store.background_flush import BackgroundFlush
from sluice.store.encode import encode_batch


@pytest.fixture(params=["python", pytest.param("c", marks=pytest.mark.skipif(C is None, reason="no C extension"))])
def use_c(request: pytest.FixtureRequest) -> bool:
    return request.param == "c"


@pytest.fixture
def _store(use_c: bool):
    def make(tmp_path: Path) -> MessageStore:
        store = MessageStore(tmp_path, StoreConfig(flush_mode="sync", commitlog_file_size=1 << 20,
                                                   max_message_size=1024))
        store.background_flush = lambda: BackgroundFlush(store.flusher, use_c=use_c)  # type: ignore[method-assign]
        store.start()
        store.dispatch.drive_externally()
        return store
    return make


def test_no_reply_before_its_bytes_are_flushed(tmp_path: Path, _store) -> None:
    store = _store(tmp_path)
    appender = Appender(store)
    flushed_at_reply: list[tuple[int, int]] = []

    async def one(i: int) -> None:
        if i % 3:
            p = appender.put("T", i % 2, [StoreMessage("T", b"m%d" % i, i % 2, {})])
        else:
            enc = encode_batch([StoreMessage("T", b"b%d-%d" % (i, k), 0, {}) for k in range(4)],
                               store_host=store.config.store_host, max_body=1024)
            p = appender.put("T", 0, enc)
        assert type(p) is not tuple  # synchronous flush: every reply waits
        _, results = await stored(p)
        last = results[-1]
        flushed_at_reply.append((last.commitlog_offset + last.size, store.flusher.flushed_offset))

    async def main() -> None:
        for _ in range(20):  # rounds of concurrent requests, each round over several loop iterations
            await asyncio.gather(*(one(i) for i in range(12)))

    try:
        asyncio.run(main())
    finally:
        appender.close()
        store.close()
    assert len(flushed_at_reply) == 240
    assert all(end <= flushed for end, flushed in flushed_at_reply)
    assert store.flusher.fsyncs < 240  # requests shared fsyncs


def test_a_failed_flush_answers_its_replies_with_the_error_and_later_ones_go_on(tmp_path: Path, _store,
                                                                              monkeypatch) -> None:
    store = _store(tmp_path)
    r, w = os.pipe()  # the first round "syncs" a pipe: fdatasync fails with EINVAL
    real = BackgroundFlush._fds
    calls = []

    def fds(self: BackgroundFlush, start: int, end: int) -> tuple[int, ...]:
        calls.append(end)
        return (r,) if len(calls) == 1 else real(self, start, end)

    monkeypatch.setattr(BackgroundFlush, "_fds", fds)
    appender = Appender(store)

    async def main() -> tuple[object, object]:
        first = await asyncio.gather(stored(appender.put("T", 0, [StoreMessage("T", b"a", 0, {})])),
                                     return_exceptions=True)
        second = await stored(appender.put("T", 0, [StoreMessage("T", b"b", 0, {})]))
        return first[0], second

    try:
        first, second = asyncio.run(main())
    finally:
        appender.close()
        store.close()
        os.close(r)
        os.close(w)
    assert isinstance(first, FlushDiskTimeoutError) and "fsync failed" in str(first)
    assert second[1][0].queue_offset == 1  # type: ignore[index]
    assert len(calls) == 2


def test_the_round_is_asked_for_before_the_iteration_dispatches(tmp_path: Path, _store, monkeypatch) -> None:
    """The fsync thread starts while the loop dispatches, not after."""
    store = _store(tmp_path)
    order: list[str] = []
    real_request, real_reput = BackgroundFlush.request, store.dispatch.reput

    def request(self: BackgroundFlush) -> bool:
        order.append("request")
        return real_request(self)

    def reput() -> None:
        order.append("reput")
        real_reput()

    monkeypatch.setattr(BackgroundFlush, "request", request)
    monkeypatch.setattr(store.dispatch, "reput", reput)
    appender = Appender(store)
    enc = encode_batch([StoreMessage("T", b"b%d" % k, 0, {}) for k in range(4)],
                       store_host=store.config.store_host, max_body=1024)

    async def main() -> None:
        await asyncio.gather(stored(appender.put("T", 0, enc)), stored(appender.put("T", 1, [StoreMessage("T", b"s", 1, {})])))

    try:
        asyncio.run(main())
    finally:
        appender.close()
        store.close()
    assert order[:2] == ["request", "reput"]


def test_close_makes_durable_what_was_asked_and_confirms_it(tmp_path: Path, _store) -> None:
    store = _store(tmp_path)
    confirmed: list[list[str]] = []

    async def main() -> None:
        waiter: DurableWaiter[str] = DurableWaiter(store, asyncio.get_running_loop(),
                                                   lambda items, err: confirmed.append(items))
        res = store.put_messages([StoreMessage("T", b"x", 0, {})], wait_durable=False)
        waiter.wait(res[-1].commitlog_offset + res[-1].size, "x")
        await asyncio.get_running_loop().run_in_executor(None, waiter.close)
        await asyncio.sleep(0)  # the confirmation the thread scheduled before it stopped

    try:
        asyncio.run(main())
    finally:
        store.close()
    assert confirmed == [["x"]]
    assert not [t for t in threading.enumerate() if t.name == "sluice-group-commit"]


@pytest.mark.parametrize("raising", [False, True])
def test_a_confirm_that_raises_does_not_stop_the_thread(tmp_path: Path, raising: bool, _store) -> None:
    store = _store(tmp_path)
    seen: list[str] = []

    def confirm(items: list[str], err: BaseException | None) -> None:
        seen.extend(items)
        if raising and items == ["first"]:
            raise RuntimeError("a reply could not be delivered")

    async def main() -> None:
        waiter: DurableWaiter[str] = DurableWaiter(store, asyncio.get_running_loop(), confirm)
        for name in ("first", "second"):
            res = store.put_messages([StoreMessage("T", name.encode(), 0, {})], wait_durable=False)
            waiter.wait(res[-1].commitlog_offset + res[-1].size, name)
            for _ in range(500):
                if name in seen:
                    break
                await asyncio.sleep(0.01)
        await asyncio.get_running_loop().run_in_executor(None, waiter.close)

    try:
        asyncio.run(main())
    finally:
        store.close()
    assert seen == ["first", "second"]


def test_a_hung_fsync_round_answers_flush_disk_timeout_and_frees_its_replies(tmp_path: Path, monkeypatch) -> None:
    """An fdatasync that does not return (a disk that stopped answering) holds its replies only until the
    store's sync_flush_timeout_s; a round that ends later confirms only the replies still waiting. The
    Python fsync thread, whose fdatasync can be made to hang here."""
    store = MessageStore(tmp_path, StoreConfig(flush_mode="sync", commitlog_file_size=1 << 20,
                                               max_message_size=1024, sync_flush_timeout_s=0.3))
    store.background_flush = lambda: BackgroundFlush(store.flusher, use_c=False)  # type: ignore[method-assign]
    store.start()
    store.dispatch.drive_externally()
    disk = threading.Event()
    real = os.fdatasync

    def fdatasync(fd: int) -> None:
        if threading.current_thread().name == "sluice-group-commit":
            disk.wait(30)  # hangs until the test lets the disk answer
        real(fd)

    monkeypatch.setattr(os, "fdatasync", fdatasync)
    appender = Appender(store)

    async def main() -> tuple[object, float, object, int]:
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        first = (await asyncio.gather(stored(appender.put("T", 0, [StoreMessage("T", b"a", 0, {})])),
                                      return_exceptions=True))[0]
        waited = loop.time() - t0
        assert appender._waiter is not None
        timed_out = appender._waiter.timed_out
        disk.set()  # the hung round ends now, successfully: "a" was answered already and is not again
        second = await stored(appender.put("T", 0, [StoreMessage("T", b"b", 0, {})]))
        return first, waited, second, timed_out

    try:
        first, waited, second, timed_out = asyncio.run(main())
    finally:
        disk.set()
        appender.close()
        store.close()
    assert isinstance(first, FlushDiskTimeoutError) and "not confirmed durable within 0.3 s" in str(first)
    assert 0.3 <= waited < 5
    assert timed_out == 1
    assert second[1][0].queue_offset == 1  # type: ignore[index]  # stored after the stored-but-unconfirmed "a"


def test_the_wait_defaults_to_the_stores_sync_flush_timeout(tmp_path: Path, _store) -> None:
    store = _store(tmp_path)

    async def main() -> tuple[float, float]:
        loop = asyncio.get_running_loop()
        default = DurableWaiter(store, loop, lambda items, err: None)
        given = DurableWaiter(store, loop, lambda items, err: None, timeout_s=0.5)
        with pytest.raises(ValueError, match="must be positive"):
            DurableWaiter(store, loop, lambda items, err: None, timeout_s=0)
        for w in (default, given):
            await loop.run_in_executor(None, w.close)
        return default.timeout_s, given.timeout_s

    try:
        assert asyncio.run(main()) == (store.config.sync_flush_timeout_s, 0.5)
    finally:
        store.close()
