"""The pull read path (store/pull_read.py): the C run copier and the record-by-record loop agree.

Pulls that no filter needs to see records for go through speedups.gather_units; the
Python loop is the reference. Every pull below runs both ways on the same store and
must give the same GetMessageResult: records, offsets, next offset, status, counters.
The store rolls commit-log segments every few records, so runs cross files.
"""
from __future__ import annotations

from dataclasses import asdict

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from store_testlib import TagFilter, msg, small_config

from sluice.errors import CorruptRecordError
from sluice.speedups import C
from sluice.store import MessageStore, pull_read
from sluice.store.types import GetMessageStatus as S

pytestmark = pytest.mark.skipif(C is None, reason="the C extension is not built")

SEGMENT = 128 * 1024  # small segments: a pull's records span several
MAX_MESSAGE = 32 * 1024


def both_ways(store: MessageStore, monkeypatch: pytest.MonkeyPatch, *args, **kw) -> tuple[dict, dict]:
    """The same pull through C and through the Python loop, as plain dicts (counters included)."""
    def one() -> dict:
        before = store.pull_records_read, store.pull_bytes_read
        try:
            out = asdict(store.get_messages(*args, **kw))
        except CorruptRecordError as e:
            out = {"error": str(e)}
        out["counted"] = (store.pull_records_read - before[0], store.pull_bytes_read - before[1])
        return out
    fast = one()
    with monkeypatch.context() as m:
        m.setattr(pull_read, "C", None)
        slow = one()
    return fast, slow


@pytest.fixture(scope="module")
def rolled(tmp_path_factory: pytest.TempPathFactory):
    """A store whose segments hold a few records each, with bodies of varied sizes and two tags."""
    s = MessageStore(tmp_path_factory.mktemp("rolled") / "store", small_config(commitlog_file_size=SEGMENT, max_message_size=MAX_MESSAGE))
    s.start()
    # 120 records per queue: more than one consume-queue file (64 units each in small_config)
    sizes = [100, 7000, 15000, 30, 9000, 20000, 500, 12000, 4000, 18000] * 24
    for i, n in enumerate(sizes):
        s.put_messages([msg(body=bytes([i % 251]) * n, qid=i % 2, TAGS="a" if i % 3 else "b", n=str(i))])
    s.wait_dispatched()
    yield s
    s.close()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(qid=st.integers(0, 1), offset=st.integers(0, 119), max_msgs=st.integers(1, 80),
       max_bytes=st.one_of(st.none(), st.integers(1, 1_200_000)), tags=st.sampled_from([None, ("a",), ("b",), ("z",)]))
def test_c_runs_equal_the_loop(rolled, monkeypatch, qid, offset, max_msgs, max_bytes, tags) -> None:
    mf = TagFilter(*tags) if tags else None
    fast, slow = both_ways(rolled, monkeypatch, "T", qid, offset, max_msgs, mf, max_bytes)
    assert fast == slow


def test_a_pull_spanning_segments_returns_whole_records(rolled, monkeypatch) -> None:
    fast, slow = both_ways(rolled, monkeypatch, "T", 0, 0, 30)
    assert fast == slow
    assert fast["status"] is S.FOUND and len(fast["sizes"]) == 30
    assert len(fast["data"]) == sum(fast["sizes"])
    files = {c // SEGMENT for c in fast["commitlog_offsets"]}
    assert len(files) > 2  # the records came from several segment files


def test_removed_records_are_skipped_the_same_way(tmp_path, monkeypatch) -> None:
    s = MessageStore(tmp_path / "s", small_config(commitlog_file_size=SEGMENT, max_message_size=MAX_MESSAGE))
    s.start()
    try:
        for i in range(24):
            s.put_messages([msg(body=b"x" * 15000, n=str(i))])
        s.wait_dispatched()
        # Retention took the oldest segment while the queue still points into it.
        s.commitlog.queue.delete_first(1)
        for offset in (0, 1, 7, 8, 9):
            fast, slow = both_ways(s, monkeypatch, "T", 0, offset, 8)
            assert fast == slow
        assert both_ways(s, monkeypatch, "T", 0, 0, 2)[0]["status"] in (S.FOUND, S.MESSAGE_WAS_REMOVING)
    finally:
        s.close()


def test_a_damaged_record_stops_both_ways_alike(tmp_path, monkeypatch) -> None:
    s = MessageStore(tmp_path / "s", small_config())
    s.start()
    try:
        res = s.put_messages([msg(body=b"%03d" % i * 100) for i in range(10)])
        s.wait_dispatched()
        bad = res[4]
        f = s.commitlog.queue.find(bad.commitlog_offset)
        at = bad.commitlog_offset - f.start + 88 + 5  # a byte inside the body
        f.mm[at] ^= 0xFF
        fast, slow = both_ways(s, monkeypatch, "T", 0, 0, 32)
        assert fast == slow
        assert fast["queue_offsets"] == [0, 1, 2, 3] and fast["next_begin_offset"] == 4
        fast, slow = both_ways(s, monkeypatch, "T", 0, 4, 32)
        assert fast == slow and "CRC" in fast["error"]
    finally:
        s.close()
