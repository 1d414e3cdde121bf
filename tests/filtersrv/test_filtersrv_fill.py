"""A filter server fills a pull's answer over several broker pulls and reads ahead: the kept records beyond
an answer serve the queue's next pull. Delivered sets stay exact, offsets never pass an unfiltered record,
commits still reach the broker, and a class failing mid-fill answers what earlier batches kept first."""
from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from filtersrv_support import (
    CLASSES, FLAG_CLASS_FILTER, FLAG_COMMIT_OFFSET, FLAG_SUSPEND, FsRpc, numbers, start_filtersrv, write_repository,
)
from servers import running_cluster

from sluice.client.broker_api import decode_messages
from sluice.filtersrv.forward import AHEAD_TTL_S, ReadAhead, fetch_size
from sluice.filtersrv.registry import ClassEntry
from sluice.filtersrv.sandbox import WorkerLimits
from sluice.protocol import headers as H
from sluice.protocol.codes import RequestCode, ResponseCode
from sluice.protocol.record import encode_record

FILL_CLASSES = {
    **CLASSES,
    "tenth": '''
from sluice.filter import MessageFilter

class Tenth(MessageFilter):
    def match(self, message):
        return int(message.properties["n"]) % 10 == 0

class TenthBoomAt45(MessageFilter):
    def match(self, message):
        if int(message.properties["n"]) == 45:
            raise RuntimeError("boom at 45")
        return int(message.properties["n"]) % 10 == 0
''',
}


@pytest.fixture(scope="module")
def fill(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[FsRpc, str]]:
    tmp: Path = tmp_path_factory.mktemp("fill")
    repo = write_repository(tmp / "repo", FILL_CLASSES)
    with running_cluster(tmp) as c:
        fs = start_filtersrv(tmp, c.broker.addr, "--repository", str(repo), "--batch-deadline-ms", "3000")
        rpc = FsRpc(c.broker.addr)
        try:
            yield rpc, fs.addr
        finally:
            rpc.close()
            fs.stop()


def test_a_sparse_class_fills_the_answer_over_several_broker_pulls(fill) -> None:
    rpc, fs = fill
    topic = "FillSparse"
    rpc.send_many(topic, range(3000))
    assert rpc.register(fs, "G-sparse", topic, "tenth:Tenth").code == ResponseCode.SUCCESS
    # 8 x 8 = 64 records first (6 or 7 kept), then more: one answer holds what was asked for
    resp = rpc.pull(fs, "G-sparse", topic, 0, max_msgs=20)
    assert resp.code == ResponseCode.SUCCESS, resp.remark
    assert numbers(decode_messages(resp.body)) == list(range(0, 200, 10))
    assert resp.ext_fields["nextBeginOffset"] == "200"  # the 21st kept record, read ahead
    assert numbers(rpc.drain(fs, "G-sparse", topic, limit=200)) == list(range(0, 3000, 10))


def test_consecutive_pulls_are_answered_from_the_read_ahead_exactly(fill) -> None:
    rpc, fs = fill
    topic = "FillAhead"
    rpc.send_many(topic, range(400))
    assert rpc.register(fs, "G-ahead", topic, "evens:Even").code == ResponseCode.SUCCESS
    first = rpc.pull(fs, "G-ahead", topic, 0, max_msgs=4)  # 32 records asked, 16 kept: 12 read ahead
    assert numbers(decode_messages(first.body)) == [0, 2, 4, 6] and first.ext_fields["nextBeginOffset"] == "8"
    # the next pull at 8 is answered from them; its commit offset still reaches the broker
    second = rpc.pull(fs, "G-ahead", topic, 8, max_msgs=4, flags=FLAG_CLASS_FILTER | FLAG_COMMIT_OFFSET,
                      commit_offset=8)
    assert numbers(decode_messages(second.body)) == [8, 10, 12, 14]
    assert second.ext_fields["nextBeginOffset"] == "16"
    assert second.ext_fields["maxOffset"] == "400"
    assert rpc.committed("G-ahead", topic) == 8
    # a pull elsewhere is not answered from it
    other = rpc.pull(fs, "G-ahead", topic, 3, max_msgs=3)
    assert numbers(decode_messages(other.body)) == [4, 6, 8]
    offset, got = 0, []
    while offset < 400:  # more than the read-ahead holds: answered from it, then filled on from its end
        resp = rpc.pull(fs, "G-ahead", topic, offset, max_msgs=10)
        assert resp.code == ResponseCode.SUCCESS, resp.remark
        got += numbers(decode_messages(resp.body))
        offset = int(resp.ext_fields["nextBeginOffset"])
    assert got == list(range(0, 400, 2))


def test_a_held_pull_whose_records_were_all_filtered_out_is_answered_at_once(fill) -> None:
    """Records read and filtered out move the consumer's offset now: the pull is not held at the broker
    for its whole suspend time first (which left a push consumer's offset, and its lag, where it was)."""
    rpc, fs = fill
    topic = "FillNoneKept"
    rpc.send_many(topic, range(1, 100, 2))  # odd numbers only: evens:Even keeps none of them
    assert rpc.register(fs, "G-none", topic, "evens:Even").code == ResponseCode.SUCCESS
    # suspended for 60 s, asked with a 20 s timeout: holding the pull would time the call out
    resp = rpc.pull(fs, "G-none", topic, 0, flags=FLAG_CLASS_FILTER | FLAG_SUSPEND, suspend_ms=60_000,
                    timeout=20.0)
    assert resp.code in (ResponseCode.PULL_RETRY_IMMEDIATELY, ResponseCode.PULL_NOT_FOUND), resp.remark
    assert resp.ext_fields["nextBeginOffset"] == "50"
    assert not resp.body


def test_an_answer_keeps_within_the_pulls_max_bytes(fill) -> None:
    rpc, fs = fill
    topic = "FillBytes"
    rpc.send_many(topic, range(50))
    assert rpc.register(fs, "G-bytes", topic, "evens:Even").code == ResponseCode.SUCCESS
    h = H.PullMessageRequestHeader(consumer_group="G-bytes", topic=topic, queue_id=0, queue_offset=0,
                                   max_msg_nums=32, sys_flag=FLAG_CLASS_FILTER, commit_offset=0,
                                   suspend_timeout_millis=0, subscription="*", sub_version=0,
                                   expression_type="TAG", max_msg_bytes=1)
    resp = rpc.call(fs, RequestCode.PULL_MESSAGE, h.to_ext())
    assert resp.code == ResponseCode.SUCCESS, resp.remark
    assert numbers(decode_messages(resp.body)) == [0]  # at least one record, whatever the limit
    assert resp.ext_fields["nextBeginOffset"] == "1"


def test_a_class_failing_mid_fill_answers_what_earlier_batches_kept_first(fill) -> None:
    rpc, fs = fill
    topic = "FillBoom"
    rpc.send_many(topic, range(200))
    assert rpc.register(fs, "G-boom", topic, "tenth:TenthBoomAt45").code == ResponseCode.SUCCESS
    # 40 records first (0..39: 4 kept), then 40 more from 40: the class raises on 45
    resp = rpc.pull(fs, "G-boom", topic, 0, max_msgs=5)
    assert resp.code == ResponseCode.SUCCESS, resp.remark
    assert numbers(decode_messages(resp.body)) == [0, 10, 20, 30]
    assert resp.ext_fields["nextBeginOffset"] == "40"  # the failed batch is pulled again, never skipped
    failed = rpc.pull(fs, "G-boom", topic, 40, max_msgs=5)
    assert failed.code == ResponseCode.SYSTEM_ERROR
    assert "tenth:TenthBoomAt45" in failed.remark and "boom at 45" in failed.remark
    assert "nextBeginOffset" not in failed.ext_fields


def _entry() -> ClassEntry:
    return ClassEntry("T", "G", "m:C", 0, b"", False, WorkerLimits())


def _records(offsets: range) -> list[memoryview]:
    return [memoryview(bytes(encode_record(topic="T", body=b"x", queue_offset=o))) for o in offsets]


def test_read_ahead_is_taken_only_at_its_offset_for_its_class_and_bounded() -> None:
    ahead, entry = ReadAhead(max_bytes=1_000), _entry()
    ahead.put(("T", "G", 0), entry, _records(range(5, 8)), 12, {"maxOffset": "20"})
    assert ahead.take(("T", "G", 0), entry, 6) is None  # another offset: a miss, and dropped
    assert ahead.take(("T", "G", 0), entry, 5) is None
    ahead.put(("T", "G", 0), entry, _records(range(5, 8)), 12, {})
    assert ahead.take(("T", "G", 0), _entry(), 5) is None  # another class (a reload): a miss
    ahead.put(("T", "G", 0), entry, _records(range(5, 8)), 12, {})
    got = ahead.take(("T", "G", 0), entry, 5)
    assert got is not None and got.end == 12 and len(got.records) == 3 and ahead.bytes == 0
    size = len(b"".join(_records(range(1))))
    for q in range(40):  # bounded in bytes: the oldest queues go first
        ahead.put(("T", "G", q), entry, _records(range(q, q + 1)), q + 1, {})
    assert ahead.bytes <= 1_000 and len(ahead) == 1_000 // size
    assert ahead.take(("T", "G", 0), entry, 0) is None and ahead.take(("T", "G", 39), entry, 39) is not None
    ahead.put(("T", "G", 1), entry, _records(range(1, 2)), 2, {})
    ahead._by_queue[("T", "G", 1)].at = time.monotonic() - AHEAD_TTL_S - 1
    assert ahead.take(("T", "G", 1), entry, 1) is None  # unused too long
    ahead = ReadAhead(max_bytes=1_000)
    for q in range(3):
        ahead.put(("T", "G", q), entry, _records(range(q, q + 1)), q + 1, {})
    ahead._by_queue[("T", "G", 0)].at = time.monotonic() - AHEAD_TTL_S - 1
    ahead.put(("T", "G", 7), entry, _records(range(7, 8)), 8, {})  # a put drops what outlived its time
    assert sorted(ahead._by_queue) == [("T", "G", 1), ("T", "G", 2), ("T", "G", 7)] and ahead.bytes == 3 * size


def test_fetch_sizes_follow_the_selectivity() -> None:
    assert fetch_size(4, None) == 32  # not known yet: 8 x what is wanted
    assert fetch_size(4, 0.0) == 1024  # nothing kept so far: the largest batch
    assert fetch_size(5, 0.1) == 200 and fetch_size(32, 0.01) == 1024
    assert fetch_size(32, 1.0) == 128

