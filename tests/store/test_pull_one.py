"""The one-record read (store/pull_read.py PullReader._one): a woken held pull's unfiltered single read, without
numpy, gives what the general road gives, and hands anything unusual to it (removed, damaged, padding)."""
from __future__ import annotations

from dataclasses import asdict

import pytest
from store_testlib import msg, small_config

from sluice.errors import CorruptRecordError
from sluice.speedups import C
from sluice.store import MessageStore
from sluice.store.pull_read import PullReader
from sluice.store.types import GetMessageStatus as S

pytestmark = pytest.mark.skipif(C is None, reason="the C extension is not built")

SEGMENT = 128 * 1024


def one_and_general(store: MessageStore, monkeypatch: pytest.MonkeyPatch, qid: int, offset: int,
                    max_bytes: int | None = None) -> tuple[dict, dict, bool]:
    """One record at ``offset`` both ways, as plain dicts with the counters; and whether _one answered."""
    taken = []
    real = PullReader._one

    def spy(self, *a):  # type: ignore[no-untyped-def]
        out = real(self, *a)
        taken.append(out is not None)
        return out

    def read() -> dict:
        before = store.pull_records_read, store.pull_bytes_read
        try:
            out = asdict(store.get_messages("T", qid, offset, 1, None, max_bytes))
        except CorruptRecordError as e:
            out = {"error": str(e)}
        out["counted"] = (store.pull_records_read - before[0], store.pull_bytes_read - before[1])
        return out

    with monkeypatch.context() as m:
        m.setattr(PullReader, "_one", spy)
        fast = read()
    with monkeypatch.context() as m:
        m.setattr(PullReader, "_one", lambda self, *a: None)
        general = read()
    return fast, general, bool(taken and taken[0])


def test_every_record_reads_the_same_one_at_a_time(tmp_path, monkeypatch) -> None:
    s = MessageStore(tmp_path / "s", small_config(commitlog_file_size=SEGMENT, max_message_size=32 * 1024))
    s.start()
    try:
        sizes = [100, 7000, 15000, 30, 9000, 20000, 500, 12000, 4000, 18000] * 8  # runs cross segments
        for i, n in enumerate(sizes):
            s.put_messages([msg(body=bytes([i % 251]) * n, qid=i % 2, n=str(i))])
        s.wait_dispatched()
        for qid in (0, 1):
            for offset in range(-1, 42):
                fast, general, took = one_and_general(s, monkeypatch, qid, offset)
                assert fast == general, (qid, offset)
                assert took == (0 <= offset < 40), (qid, offset)
                if took:
                    assert fast["status"] is S.FOUND and fast["queue_offsets"] == [offset]
                    assert fast["next_begin_offset"] == offset + 1 and fast["counted"] == (1, len(fast["data"]))
        # A record over max_bytes is still served (the first record always is): the same either way.
        fast, general, _ = one_and_general(s, monkeypatch, 0, 5, max_bytes=10)
        assert fast == general and fast["status"] is S.FOUND
    finally:
        s.close()


def test_a_removed_or_damaged_record_goes_to_the_general_road(tmp_path, monkeypatch) -> None:
    s = MessageStore(tmp_path / "s", small_config(commitlog_file_size=SEGMENT, max_message_size=32 * 1024))
    s.start()
    try:
        res = s.put_messages([msg(body=b"%03d" % i * 100) for i in range(10)])
        for i in range(24):
            s.put_messages([msg(body=b"x" * 15000, n=str(i))])
        s.wait_dispatched()
        bad = res[4]
        f = s.commitlog.queue.find(bad.commitlog_offset)
        f.mm[bad.commitlog_offset - f.start + 88 + 5] ^= 0xFF  # a byte inside the body
        fast, general, took = one_and_general(s, monkeypatch, 0, 4)
        assert not took and fast == general and "CRC" in fast["error"]
        s.commitlog.queue.delete_first(1)  # retention took the oldest segment; the queue still points there
        for offset in (0, 4, 9, 10):
            fast, general, took = one_and_general(s, monkeypatch, 0, offset)
            assert fast == general
            assert not took or fast["status"] is S.FOUND
        assert one_and_general(s, monkeypatch, 0, 0)[0]["status"] is not S.FOUND
    finally:
        s.close()
