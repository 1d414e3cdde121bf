"""Every road of a send through Appender.put, under both flush modes: single, batch (encoded or as messages),
duplicate-checked, delayed, and single sends that arrive together (merged into one append)."""
from __future__ import annotations

import asyncio
from functools import partial
from pathlib import Path

import pytest

from sluice.broker.appender import Appender, stored
from sluice.broker.dedup import DedupWindow
from sluice.broker.topics import SCHEDULE_TOPIC
from sluice.errors import MessageIllegalError
from sluice.protocol import properties as P
from sluice.store import MessageStore, StoreConfig, StoreMessage
from sluice.store.encode import encode_batch

from spark_side_support import SPARK_GROUP, Broker

FLUSH = ["async", "sync"]


@pytest.fixture
def make_broker(make_broker):
    return partial(make_broker, handle=Broker)


def _key(i: int) -> str:
    return f"K{i:031d}"


@pytest.mark.parametrize("flush", FLUSH)
def test_single_batch_replay_and_delay(make_broker, flush: str) -> None:
    b = make_broker(flush=flush)
    assert b.send("T", b"one", {P.UNIQ_KEY: _key(0)}).code == 0
    batch = [(f"b{i}".encode(), {P.UNIQ_KEY: _key(i + 1)}) for i in range(5)]
    plain = b.send_batch("T", batch, group="PG")  # not opted in: encoded straight to records under async
    assert plain.code == 0 and len(plain.ext_fields["msgId"].split(",")) == 5
    first = b.send_batch("T", batch)  # opted in: stored again (the window has not seen these keys)...
    again = b.send_batch("T", batch, queue_id=1)  # ...and this replay is answered with those originals
    assert again.ext_fields["msgId"] == first.ext_fields["msgId"] and again.ext_fields["queueId"] == "0"
    assert b.send("T", b"later", {P.DELAY: "3"}).code == 0  # 10 s: not moved during the test
    got = [bytes(r.body) for r in b.pull_all("T", 0)]
    assert got == [b"one"] + [body for body, _ in batch] * 2
    assert b.broker.store.get_max_offset(SCHEDULE_TOPIC, 2) == 1
    info = b.broker.runtime_info()
    assert info["msgPutTotalTodayNow"] == 12 and info["dedupDuplicates"] == 5


@pytest.mark.parametrize("flush", FLUSH)
def test_appender_merges_single_sends_and_isolates_a_bad_one(tmp_path: Path, flush: str) -> None:
    store = MessageStore(tmp_path, StoreConfig(flush_mode=flush, commitlog_file_size=1 << 20,  # type: ignore[arg-type]
                                               max_message_size=16))
    store.start()
    appender = Appender(store)
    store.dispatch.drive_externally()

    async def main() -> None:
        msgs = [[StoreMessage("T", f"m{i}".encode(), 0, {})] for i in range(4)]
        bad = [StoreMessage("T", b"x" * 17, 0, {})]  # over max_message_size
        pending = [appender.put("T", 0, m) for m in msgs[:2]] + [appender.put("T", 0, bad)] + \
                  [appender.put("T", 0, m) for m in msgs[2:]]
        assert not any(type(p) is tuple for p in pending)  # single messages wait for the merge
        out = await asyncio.gather(*(stored(p) for p in pending), return_exceptions=True)
        assert isinstance(out[2], MessageIllegalError)
        offsets = [r[1][0].queue_offset for i, r in enumerate(out) if i != 2]
        assert offsets == [0, 1, 2, 3]
        enc = encode_batch([StoreMessage("T", b"e1", 0, {}), StoreMessage("T", b"e2", 0, {})],
                           store_host=store.config.store_host, max_body=16)
        now = appender.put("T", 0, enc)
        assert (type(now) is tuple) == (flush == "async")  # asynchronous flush: nothing to wait for
        qid, results = await stored(now)
        assert qid == 0 and [r.queue_offset for r in results] == [4, 5]
        window = DedupWindow(max_keys=10, window_ms=60_000, prefixes=(SPARK_GROUP,))
        window.open()
        keyed = [StoreMessage("T", b"k", 0, {P.UNIQ_KEY: _key(1)})]
        a = await stored(appender.put("T", 0, keyed, dedup=window))
        b = await stored(appender.put("T", 0, [StoreMessage("T", b"k", 0, {P.UNIQ_KEY: _key(1)})], dedup=window))
        assert a == b and window.duplicates == 1
        assert appender.messages == 7

    try:
        asyncio.run(main())
    finally:
        appender.close()
        store.close()


@pytest.mark.parametrize("flush", FLUSH)
def test_merged_sends_are_dispatched_before_their_replies(tmp_path: Path, flush: str) -> None:
    """Single sends merged at the end of an iteration are dispatched in that same step, before their
    replies are written (so the pulls they wake are answered with the replies' write); an encoded batch,
    answered at once, is dispatched in the next iteration, after its reply."""
    store = MessageStore(tmp_path, StoreConfig(flush_mode=flush, commitlog_file_size=1 << 20,  # type: ignore[arg-type]
                                               max_message_size=1024))
    store.start()
    appender = Appender(store)
    store.dispatch.drive_externally()
    store.dispatch.stop()  # only the loop dispatches: no thread may catch up meanwhile

    async def reply(pending) -> int:  # what the send handler's task does: await the append, then answer
        await stored(pending)
        return store.dispatch.reput_offset

    async def main() -> None:
        # As the broker's send handler: the put, then the task that writes the reply.
        tasks = [asyncio.ensure_future(reply(appender.put("T", 0, [StoreMessage("T", f"m{i}".encode(), 0, {})])))
                 for i in range(3)]
        seen = [await t for t in tasks]
        end = store.commitlog.write_pos
        assert seen == [end] * 3  # dispatched before any reply was written
        assert store.get_max_offset("T", 0) == 3
        enc = encode_batch([StoreMessage("T", b"e1", 0, {})], store_host=store.config.store_host, max_body=1024)
        qid, results = await stored(appender.put("T", 0, enc))
        if flush == "async":  # answered at once: dispatch waits for the next iteration
            assert store.dispatch.reput_offset == end
        await asyncio.sleep(0)
        assert store.dispatch.reput_offset == results[-1].commitlog_offset + results[-1].size
        assert store.get_max_offset("T", 0) == 4

    try:
        asyncio.run(main())
    finally:
        appender.close()
        store.close()
