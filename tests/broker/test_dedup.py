"""Broker-side duplicate check (sluice.broker.dedup): replays of opted-in sends are stored once."""
from __future__ import annotations

import asyncio
import time
from functools import partial
from pathlib import Path

import pytest

from sluice.broker.config import BrokerConfig
from sluice.broker.dedup import DEDUP_PROPERTY, DedupWindow
from sluice.errors import InvalidParameterError
from sluice.protocol import properties as P
from sluice.store import PutResult, StoreMessage

from spark_side_support import Broker, SPARK_GROUP


@pytest.fixture
def make_broker(make_broker):  # the suite's factory (tests/conftest.py), building the Spark-side handle
    return partial(make_broker, handle=Broker)


def _rows(n: int, tag: str = "spark") -> list[tuple[bytes, dict[str, str]]]:
    return [(f"row-{i}".encode(), {P.UNIQ_KEY: f"{tag}-{i:04d}".upper().ljust(32, "0"), P.TAGS: "T"})
            for i in range(n)]


def _ids(resp) -> list[str]:
    return resp.ext_fields["msgId"].split(",")


def test_replayed_batch_stored_once_and_answered_with_originals(make_broker) -> None:
    b = make_broker()
    rows = _rows(20)
    first = b.send_batch("Orders", rows, queue_id=1)
    assert first.code == 0
    again = b.send_batch("Orders", rows, queue_id=3)  # a replay may pick another queue
    assert again.code == 0
    assert _ids(again) == _ids(first)
    assert again.ext_fields["queueId"] == "1" and again.ext_fields["queueOffset"] == first.ext_fields["queueOffset"]
    got = b.pull_all("Orders", 1) + b.pull_all("Orders", 3)
    assert sorted(bytes(r.body) for r in got) == sorted(body for body, _ in rows)
    assert all(P.decode_properties(r.properties).get(DEDUP_PROPERTY) == "1" for r in got)
    assert b.broker.dedup.duplicates == 20


def test_partial_replay_stores_only_new_rows(make_broker) -> None:
    b = make_broker()
    rows = _rows(10)
    first = b.send_batch("T1", rows[:6])
    mixed = b.send_batch("T1", rows)  # 6 replayed, 4 new
    assert mixed.code == 0
    ids = _ids(mixed)
    assert ids[:6] == _ids(first) and len(set(ids)) == 10
    assert [bytes(r.body) for r in b.pull_all("T1", 0)] == [body for body, _ in rows]


def test_single_sends_and_keys_repeated_inside_one_batch(make_broker) -> None:
    b = make_broker()
    body, props = _rows(1)[0]
    r1 = b.send("S", body, props, group=SPARK_GROUP, queue_id=2)
    r2 = b.send("S", body, props, group=SPARK_GROUP, queue_id=0)
    assert (r2.ext_fields["msgId"], r2.ext_fields["queueId"], r2.ext_fields["queueOffset"]) == \
        (r1.ext_fields["msgId"], "2", r1.ext_fields["queueOffset"])
    rows = _rows(3, "dup")
    resp = b.send_batch("S", [rows[0], rows[1], rows[0], rows[2]])
    ids = _ids(resp)
    assert ids[0] == ids[2] and len(set(ids)) == 3
    assert len(b.pull_all("S", 2)) == 1 and len(b.pull_all("S", 0)) == 3


def test_ordinary_producer_is_not_deduplicated(make_broker) -> None:
    b = make_broker()
    body, props = _rows(1)[0]
    r1 = b.send("Plain", body, props, group="OrdinaryPG")
    r2 = b.send("Plain", body, props, group="OrdinaryPG")
    assert r1.ext_fields["msgId"] != r2.ext_fields["msgId"]
    got = b.pull_all("Plain", 0)
    assert len(got) == 2
    assert DEDUP_PROPERTY not in P.decode_properties(got[0].properties)
    assert len(b.broker.dedup) == 0


def test_opt_in_by_configured_prefix_and_off(make_broker, tmp_path: Path) -> None:
    b = make_broker(tmp_path / "a", dedup_producer_group_prefixes=["etl-"])
    body, props = _rows(1)[0]
    assert b.send("X", body, props, group="etl-job").ext_fields["msgId"] == \
        b.send("X", body, props, group="etl-job").ext_fields["msgId"]
    assert b.send("Y", body, props, group=SPARK_GROUP).ext_fields["msgId"] != \
        b.send("Y", body, props, group=SPARK_GROUP).ext_fields["msgId"]  # the default prefix was replaced
    with pytest.raises(InvalidParameterError):
        BrokerConfig.load(None, dedup_window_keys=0)


def test_replay_after_restart_is_caught(make_broker, tmp_path: Path) -> None:
    store = tmp_path / "restart"
    b = make_broker(store)
    rows = _rows(50)
    first = b.send_batch("R", rows)
    for i in range(30):  # unmarked traffic around the marked records
        b.send("R", b"plain", {P.UNIQ_KEY: f"plain{i}"}, group="PG")
    port = b.broker.port
    b.stop()
    b2 = make_broker(store, listen=f"127.0.0.1:{port}")  # offset msg ids name the broker's address
    again = b2.send_batch("R", rows)
    assert _ids(again) == _ids(first)
    assert b2.broker.dedup.rebuilt == 50
    assert len(b2.pull_all("R", 0)) == 80


def test_window_bounds_by_count_and_age() -> None:
    async def run() -> None:
        w = DedupWindow(max_keys=3, window_ms=1000, prefixes=("p-",))
        w.open()
        stored: list[StoreMessage] = []
        now = int(time.time() * 1000)

        async def store(msgs: list[StoreMessage]) -> list[PutResult]:
            stored.extend(msgs)
            return [PutResult(len(stored) * 100, len(stored), f"ID{len(stored)}", now, 100) for _ in msgs]

        def msg(k: str) -> StoreMessage:
            return StoreMessage("t", b"x", 0, {P.UNIQ_KEY: k})

        for k in "abcd":
            await w.put("t", [msg(k)], store)
        assert len(w) == 3 and w.lookup("t", "a") is None and w.lookup("t", "d") is not None
        await w.put("t", [msg("a")], store)  # evicted: stored again
        assert len(stored) == 5
        w.window_ms = 0  # everything is now older than the window
        await w.put("t", [msg("b")], store)
        assert len(stored) == 6
        assert not w.applies("other") and not w.applies(None) and w.applies("p-1")

    asyncio.run(run())


def test_concurrent_duplicates_store_once() -> None:
    async def run() -> None:
        w = DedupWindow(max_keys=100, window_ms=60_000, prefixes=("p-",))
        w.open()
        stored: list[StoreMessage] = []
        gate = asyncio.Event()

        async def store(msgs: list[StoreMessage]) -> list[PutResult]:
            await gate.wait()  # both sends are in flight before either is stored
            stored.extend(msgs)
            return [PutResult(i, i, f"ID{i}", int(time.time() * 1000), 1) for i in range(len(msgs))]

        batch = [StoreMessage("t", b"x", 0, {P.UNIQ_KEY: k}) for k in ("k1", "k2")]
        t1 = asyncio.create_task(w.put("t", list(batch), store))
        t2 = asyncio.create_task(w.put("t", [StoreMessage("t", b"x", 0, {P.UNIQ_KEY: k}) for k in ("k1", "k2")],
                                       store))
        await asyncio.sleep(0.01)
        gate.set()
        r1, r2 = await asyncio.gather(t1, t2)
        assert len(stored) == 2 and r1 == r2

    asyncio.run(run())


def test_failed_first_send_lets_the_duplicate_store() -> None:
    async def run() -> None:
        w = DedupWindow(max_keys=100, window_ms=60_000, prefixes=("p-",))
        w.open()
        calls = 0

        async def store(msgs: list[StoreMessage]) -> list[PutResult]:
            nonlocal calls
            calls += 1
            if calls == 1:
                await asyncio.sleep(0.01)
                raise OSError("disk full")
            return [PutResult(0, 0, "ID", int(time.time() * 1000), 1) for _ in msgs]

        t1 = asyncio.create_task(w.put("t", [StoreMessage("t", b"x", 0, {P.UNIQ_KEY: "k"})], store))
        await asyncio.sleep(0)
        t2 = asyncio.create_task(w.put("t", [StoreMessage("t", b"x", 0, {P.UNIQ_KEY: "k"})], store))
        with pytest.raises(OSError):
            await t1
        assert (await t2)[0].result.msg_id == "ID" and calls == 2

    asyncio.run(run())


def test_rebuild_walks_several_segments(make_broker, tmp_path: Path) -> None:
    store = tmp_path / "segments"
    small = {"commitlog_file_size": 80 * 1024, "max_message_size": 8 * 1024}
    b = make_broker(store, **small)
    early, late = _rows(40, "early"), _rows(40, "late")
    ids_early = _ids(b.send_batch("R", early))
    for i in range(300):  # ~300 KiB of unmarked records: the log spans several 80 KiB segments
        b.send("R", b"p" * 1000, {P.UNIQ_KEY: f"plain{i}"}, group="PG")
    ids_late = _ids(b.send_batch("R", late))
    assert len(b.broker.store.commitlog.segments()) > 3
    port = b.broker.port
    b.stop()
    b2 = make_broker(store, listen=f"127.0.0.1:{port}", **small)
    assert _ids(b2.send_batch("R", late)) == ids_late
    assert _ids(b2.send_batch("R", early)) == ids_early
    assert b2.broker.dedup.rebuilt == 80


def test_replays_log_one_info_line_a_minute_not_one_per_request(make_broker, monkeypatch, caplog) -> None:
    import logging

    from sluice.broker import dedup
    from sluice.ratelog import RateLimitedLog

    monkeypatch.setattr(dedup, "_replay_log", RateLimitedLog(dedup.log, 60.0))  # a fresh minute
    b = make_broker()
    rows = _rows(5)
    b.send_batch("Quiet", rows)
    with caplog.at_level(logging.DEBUG, logger="sluice.broker.dedup"):
        for _ in range(4):
            assert b.send_batch("Quiet", rows).code == 0
    replays = [r for r in caplog.records if r.name == "sluice.broker.dedup" and "already stored" in r.getMessage()]
    assert [r.levelno for r in replays].count(logging.INFO) == 1  # the rest are DEBUG
    assert [r.levelno for r in replays].count(logging.DEBUG) == 4
