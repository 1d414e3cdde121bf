"""Backfill hand-over (sluice.broker.backfill): pulls over a backlog read only the messages a bitmap allows."""
from __future__ import annotations

import io
from functools import partial
from pathlib import Path

import numpy as np
import orjson
import pytest

from sluice.admin import main as admin_main
from sluice.protocol import properties as P
from sluice.protocol.codes import RequestCode, ResponseCode

from spark_side_support import Broker, write_backfill


@pytest.fixture
def make_broker(make_broker):  # the suite's factory (tests/conftest.py), building the Spark-side handle
    return partial(make_broker, handle=Broker)

EXPR = "k = 'hit'"
N = 300


def _fill(b: Broker, topic: str = "B", n: int = N) -> list[int]:
    """n messages in queue 0; every 7th carries k=hit. Returns the matching offsets."""
    entries = [(f"m{i}".encode(), {"k": "hit" if i % 7 == 0 else "miss", "i": str(i)}) for i in range(n)]
    for s in range(0, n, 50):
        assert b.send_batch(topic, entries[s:s + 50], group="PG").code == 0
    return [i for i in range(n) if i % 7 == 0]


def _pull(b: Broker, group: str, expr: str = EXPR, topic: str = "B") -> tuple[list[int], int]:
    """(queue offsets delivered, commit-log records read by the store)."""
    before = b.broker.store.pull_records_read
    got = b.pull_all(topic, 0, group=group, sub=expr, expr_type="SQL92")
    return [int(P.decode_properties(r.properties)["i"]) for r in got], b.broker.store.pull_records_read - before


def _hand_over(b: Broker, out: Path, *extra: str) -> tuple[int, dict]:
    stdout, stderr = io.StringIO(), io.StringIO()
    status = admin_main(["-n", "127.0.0.1:9", "--json", "loadBackfill", "-d", str(out), "-b", b.addr, *extra],
                        env={}, stdout=stdout, stderr=stderr)
    return int(status), orjson.loads(stdout.getvalue() or "{}")


def test_pull_reads_only_bit_one_messages(make_broker, tmp_path: Path) -> None:
    b = make_broker()
    hits = _fill(b)
    write_backfill(tmp_path / "bf", "B", "G1", EXPR, {0: (0, [i in set(hits) for i in range(N)])})
    status, out = _hand_over(b, tmp_path / "bf")
    assert status == 0 and out["queues"]["0"]["matched"] == len(hits)
    got, reads = _pull(b, "G1")
    assert got == hits and reads == len(hits)
    assert b.broker.backfills.table[("G1", "B", 0)].skipped == N - len(hits)
    # Another group without a backfill reads every record for the same answer.
    got2, reads2 = _pull(b, "G2")
    assert got2 == hits and reads2 == N


def test_a_one_bit_is_only_maybe_and_coverage_is_partial(make_broker, tmp_path: Path) -> None:
    b = make_broker()
    hits = _fill(b)
    # Covers [100, 250) only, with false positives on every even offset: still exactly the matches.
    bits = [i % 7 == 0 or i % 2 == 0 for i in range(100, 250)]
    write_backfill(tmp_path / "bf", "B", "G1", EXPR, {0: (100, bits)})
    assert _hand_over(b, tmp_path / "bf")[0] == 0
    got, reads = _pull(b, "G1")
    assert got == hits
    assert reads == 100 + sum(bits) + (N - 250)


def test_changed_selector_drops_the_backfill(make_broker, tmp_path: Path) -> None:
    b = make_broker()
    hits = set(_fill(b))
    write_backfill(tmp_path / "bf", "B", "G1", EXPR, {0: (0, [i in hits for i in range(N)])})
    assert _hand_over(b, tmp_path / "bf")[0] == 0
    other = "k = 'miss' AND i < 5"
    got, reads = _pull(b, "G1", other)
    assert got == [1, 2, 3, 4] and reads == N
    assert not b.broker.backfills.table
    assert not list((Path(b.broker.config.store) / "filterbackfill").rglob("*.bitmap"))


def test_refusals(make_broker, tmp_path: Path) -> None:
    b = make_broker()
    hits = _fill(b)
    bits = [i in set(hits) for i in range(N)]

    def put(fields: dict, body: bytes):
        return b.call(RequestCode.PUT_FILTER_BACKFILL, {"consumerGroup": "G1", "topic": "B", "queueId": 0,
                                                        "expressionType": "SQL92", "expression": EXPR, **fields}, body)

    def body_of(manifest_dir: Path) -> bytes:
        return (manifest_dir / "B" / "0" / "G1.bitmap").read_bytes()

    write_backfill(tmp_path / "other", "B", "G1", EXPR, {0: (0, bits)}, digest_of="k = 'x'")
    r = put({}, body_of(tmp_path / "other"))
    assert r.code == ResponseCode.INVALID_PARAMETER and "another selector" in r.remark
    write_backfill(tmp_path / "long", "B", "G1", EXPR, {0: (0, bits + [True])})  # past the queue's end
    r = put({}, body_of(tmp_path / "long"))
    assert r.code == ResponseCode.INVALID_PARAMETER and "queue ends at" in r.remark
    good = tmp_path / "good"
    write_backfill(good, "B", "G1", EXPR, {0: (0, bits)})
    assert put({}, body_of(good)[:-1]).code == ResponseCode.INVALID_PARAMETER  # truncated bits
    assert put({"queueId": 5}, body_of(good)).code == ResponseCode.INVALID_PARAMETER  # no such queue
    assert put({"expressionType": "TAG", "expression": "a"}, body_of(good)).code == ResponseCode.INVALID_PARAMETER
    wrong_count = bytearray(body_of(good))
    wrong_count[56:64] = (5).to_bytes(8, "big")
    assert put({}, bytes(wrong_count)).code == ResponseCode.INVALID_PARAMETER
    # The group's live subscription (heartbeat) is another expression: refused.
    hb = {"clientID": "c1", "producerDataSet": [], "consumerDataSet": [{
        "groupName": "G1", "consumeType": "CONSUME_PASSIVELY", "messageModel": "CLUSTERING",
        "consumeFromWhere": "CONSUME_FROM_FIRST_OFFSET", "subscriptionDataSet": [
            {"topic": "B", "subString": "k = 'other'", "expressionType": "SQL92", "subVersion": 1}]}]}
    assert b.call(RequestCode.HEART_BEAT, {}, orjson.dumps(hb)).code == 0
    status, out = _hand_over(b, good)
    assert status == 5 and "now subscribes" in out["queues"]["0"]["error"]
    assert not b.broker.backfills.table


def test_restored_after_restart_and_bounded(make_broker, tmp_path: Path) -> None:
    store = tmp_path / "store"
    b = make_broker(store)
    hits = _fill(b)
    write_backfill(tmp_path / "bf", "B", "G1", EXPR, {0: (0, [i in set(hits) for i in range(N)])})
    assert _hand_over(b, tmp_path / "bf")[0] == 0
    b.stop()
    b2 = make_broker(store)
    got, reads = _pull(b2, "G1")
    assert got == hits and reads == len(hits)
    b2.stop()
    b3 = make_broker(store, backfill_max_bytes=64)  # a restored file is kept; a new one must fit
    r = b3.call(RequestCode.PUT_FILTER_BACKFILL, {"consumerGroup": "G9", "topic": "B", "queueId": 0,
                                                  "expressionType": "SQL92", "expression": EXPR},
                (tmp_path / "bf" / "B" / "0" / "G1.bitmap").read_bytes())
    assert r.code == ResponseCode.INVALID_PARAMETER and "backfill_max_bytes" in r.remark


def test_may_match_windows() -> None:
    from sluice.broker.backfill import QueueBackfill

    bits = np.array([i % 3 == 0 for i in range(37)], dtype=bool)
    bf = QueueBackfill("g", "t", 0, b"", 10, 47, int(bits.sum()), np.packbits(bits), Path("x"))
    for offset in range(0, 60, 3):
        for n in (1, 5, 8, 17, 40):
            m = bf.may_match(offset, n)
            want = np.array([not (10 <= o < 47) or bits[o - 10] for o in range(offset, offset + n)])
            if m is None:
                assert want.all() and (offset + n <= 10 or offset >= 47)
            else:
                assert (m == want).all(), (offset, n)


@pytest.mark.parametrize("args", [["-d", "/nonexistent"]])
def test_admin_command_errors(make_broker, args) -> None:
    b = make_broker()
    stdout, stderr = io.StringIO(), io.StringIO()
    status = admin_main(["-n", "127.0.0.1:9", "loadBackfill", *args, "-b", b.addr], env={}, stdout=stdout,
                        stderr=stderr)
    assert int(status) == 5 and "manifest" in stderr.getvalue()


def _put(b: Broker, body: bytes, **fields):
    return b.call(RequestCode.PUT_FILTER_BACKFILL, {"consumerGroup": "G1", "topic": "B", "queueId": 0,
                                                    "expressionType": "SQL92", "expression": EXPR, **fields}, body)


def _body(d: Path) -> bytes:
    return (d / "B" / "0" / "G1.bitmap").read_bytes()


@pytest.mark.parametrize("hidden", ["all", "few", "first", "last"])
def test_forged_bitmap_hiding_matches_is_refused(make_broker, tmp_path: Path, hidden: str, monkeypatch) -> None:
    monkeypatch.setattr("sluice.broker.backfill._CHUNK_BITS", 64)  # the bitmap is checked in 5 chunks
    # Samples cover every 0 bit here, so the refusal is certain (the default, 256, is probabilistic); with no
    # samples at all the first and last offsets are still checked.
    b = make_broker(backfill_verify_samples=0 if hidden in ("first", "last") else N)
    n = 295  # the last offset, 294, matches
    hits = _fill(b, n=n)
    cleared = {"all": set(hits), "few": {hits[3], hits[17], hits[30]}, "first": {0}, "last": {n - 1}}[hidden]
    bits = [i in set(hits) and i not in cleared for i in range(n)]
    write_backfill(tmp_path / "bf", "B", "G1", EXPR, {0: (0, bits)})
    r = _put(b, _body(tmp_path / "bf"))
    assert r.code == ResponseCode.INVALID_PARAMETER, r.remark
    assert "matches the selector but the bitmap marks it 0" in r.remark and "queue 0 offset" in r.remark
    assert int(r.remark.split(" offset ")[1].split()[0]) in cleared
    # Nothing changed: no table entry, no file, and a pull still delivers every match.
    assert not b.broker.backfills.table
    assert not list((Path(b.broker.config.store) / "filterbackfill").rglob("*.bitmap"))
    got, reads = _pull(b, "G1")
    assert got == hits and reads == n


def test_forged_bitmap_refused_by_admin_command_with_the_default_samples(make_broker, tmp_path: Path) -> None:
    b = make_broker()
    hits = _fill(b)
    write_backfill(tmp_path / "bf", "B", "G1", EXPR, {0: (0, [False] * N)})  # would hide every message
    status, out = _hand_over(b, tmp_path / "bf")
    assert status == 5 and "marks it 0" in out["queues"]["0"]["error"]
    assert not b.broker.backfills.table
    assert _pull(b, "G1")[0] == hits


@pytest.mark.parametrize("chunk_bits", [64, 1 << 20])
def test_range_and_count_checked_against_the_store(make_broker, tmp_path: Path, chunk_bits: int,
                                                   monkeypatch) -> None:
    monkeypatch.setattr("sluice.broker.backfill._CHUNK_BITS", chunk_bits)
    b = make_broker()
    hits = set(_fill(b))
    bits = [i in hits for i in range(N)]
    # A range below the queue's first stored offset: the queue's min offset is raised by hand, as retention does.
    write_backfill(tmp_path / "ok", "B", "G1", EXPR, {0: (0, bits)})
    cq = b.broker.store.queues.get("B", 0)
    saved, cq.min_offset = cq.min_offset, 10
    try:
        r = _put(b, _body(tmp_path / "ok"))
    finally:
        cq.min_offset = saved
    assert r.code == ResponseCode.INVALID_PARAMETER and "first stored offset is 10" in r.remark
    # A wrong 'matched' count, one more than the set bits.
    wrong = bytearray(_body(tmp_path / "ok"))
    wrong[56:64] = (len(hits) + 1).to_bytes(8, "big")
    r = _put(b, bytes(wrong))
    assert r.code == ResponseCode.INVALID_PARAMETER and "the bits hold" in r.remark
    # A length that does not match the header's range.
    r = _put(b, _body(tmp_path / "ok") + b"\0")
    assert r.code == ResponseCode.INVALID_PARAMETER and "bitmap bytes" in r.remark
    assert not b.broker.backfills.table
    # The genuine one is accepted and used.
    r = _put(b, _body(tmp_path / "ok"))
    assert r.code == 0, r.remark
    got, reads = _pull(b, "G1")
    assert got == sorted(hits) and reads == len(hits)
