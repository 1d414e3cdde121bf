"""A `sluice filtersrv` beside a real broker, driven with raw frames: 302 from the repository, class-filter
pulls answered as a broker answers them."""
from __future__ import annotations

import pytest
from filtersrv_support import (
    FLAG_CLASS_FILTER, FLAG_COMMIT_OFFSET, FLAG_SUSPEND, numbers,
)

from sluice.client.broker_api import decode_messages
from sluice.protocol.codes import ResponseCode


def test_a_class_from_the_repository_filters_pulls_exactly(fs_setup) -> None:
    s, topic = fs_setup, "FsExact"
    for n in range(20):
        s.rpc.send(topic, n)
    resp = s.rpc.register(s.fs.addr, "G-even", topic, "evens:Even")
    assert resp.code == ResponseCode.SUCCESS, resp.remark
    assert numbers(s.rpc.drain(s.fs.addr, "G-even", topic)) == list(range(0, 20, 2))
    first = s.rpc.pull(s.fs.addr, "G-even", topic, 0, max_msgs=4)
    assert first.code == ResponseCode.SUCCESS
    msgs = decode_messages(first.body)
    # the broker is asked for 8 times 4 messages; the answer is cut at the 4th kept one, and the next pull
    # starts at the first kept record left out
    assert numbers(msgs) == [0, 2, 4, 6]
    assert first.ext_fields["nextBeginOffset"] == "8"
    assert first.ext_fields["minOffset"] == "0" and first.ext_fields["maxOffset"] == "20"
    assert first.ext_fields["suggestWhichBrokerId"] == "0"
    assert [m.queue_offset for m in msgs] == [0, 2, 4, 6]
    last = s.rpc.pull(s.fs.addr, "G-even", topic, 17, max_msgs=4)
    assert numbers(decode_messages(last.body)) == [18] and last.ext_fields["nextBeginOffset"] == "20"
    end = s.rpc.pull(s.fs.addr, "G-even", topic, 20)
    assert end.code == ResponseCode.PULL_NOT_FOUND
    assert end.ext_fields["nextBeginOffset"] == "20"


def test_an_unregistered_group_is_told_to_register_first(fs_setup) -> None:
    resp = fs_setup.rpc.pull(fs_setup.fs.addr, "G-unknown", "FsExact", 0)
    assert resp.code == ResponseCode.SUBSCRIPTION_NOT_EXIST
    assert "302" in resp.remark and "register" in resp.remark


def test_a_batch_with_nothing_kept_advances_past_the_filtered_records(fs_setup) -> None:
    s, topic = fs_setup, "FsNothing"
    for n in range(10):
        s.rpc.send(topic, n)
    assert s.rpc.register(s.fs.addr, "G-none", topic, "nothing:Nothing").code == ResponseCode.SUCCESS
    resp = s.rpc.pull(s.fs.addr, "G-none", topic, 0, max_msgs=4)
    # never FOUND with an empty body: the queue's end, with nextBeginOffset past every filtered record
    assert resp.code == ResponseCode.PULL_NOT_FOUND
    assert resp.ext_fields["nextBeginOffset"] == "10"
    assert not resp.body


def test_rounds_are_bounded_then_pull_again_from_the_advanced_offset(fs_setup) -> None:
    s, topic = fs_setup, "FsManyRounds"
    s.rpc.send_many(topic, range(7300), tags="blue")
    s.rpc.send(topic, 7300, tags="red")
    assert s.rpc.register(s.fs.addr, "G-red", topic, "tagged:RedOnly").code == ResponseCode.SUCCESS
    # 8 broker pulls, none kept: the first of 8 records (8 x the 1 asked for), then 1024 each
    resp = s.rpc.pull(s.fs.addr, "G-red", topic, 0, max_msgs=1)
    assert resp.code == ResponseCode.PULL_RETRY_IMMEDIATELY
    assert resp.ext_fields["nextBeginOffset"] == str(8 + 7 * 1024)
    assert f"{8 + 7 * 1024} messages pulled, none kept by filter class tagged:RedOnly" in resp.remark
    assert numbers(s.rpc.drain(s.fs.addr, "G-red", topic)) == [7300]


def test_the_commit_offset_reaches_the_broker(fs_setup) -> None:
    s, topic = fs_setup, "FsCommit"
    for n in range(6):
        s.rpc.send(topic, n)
    assert s.rpc.register(s.fs.addr, "G-commit", topic, "evens:Even").code == ResponseCode.SUCCESS
    resp = s.rpc.pull(s.fs.addr, "G-commit", topic, 4, flags=FLAG_CLASS_FILTER | FLAG_COMMIT_OFFSET,
                      commit_offset=4)
    assert resp.code == ResponseCode.SUCCESS
    assert numbers(decode_messages(resp.body)) == [4]
    assert s.rpc.committed("G-commit", topic) == 4


@pytest.mark.slow
def test_a_suspended_pull_waits_for_a_matching_message(fs_setup) -> None:
    """As the broker's own filters do (a range with no match is answered at once, PULL_RETRY_IMMEDIATELY):
    a held pull that read only filtered-out records is answered with nextBeginOffset past them, and the
    consumer's next pull from there waits for the matching message."""
    import threading
    import time
    s, topic = fs_setup, "FsLongPoll"
    s.rpc.send(topic, 1)
    assert s.rpc.register(s.fs.addr, "G-lp", topic, "evens:Even").code == ResponseCode.SUCCESS
    first = s.rpc.pull(s.fs.addr, "G-lp", topic, 0, flags=FLAG_CLASS_FILTER | FLAG_SUSPEND, suspend_ms=10000)
    assert first.code in (ResponseCode.PULL_NOT_FOUND, ResponseCode.PULL_RETRY_IMMEDIATELY), first.remark
    assert first.ext_fields["nextBeginOffset"] == "1"  # past the filtered-out 1, not held for it

    def later() -> None:
        time.sleep(1.0)
        s.rpc.send(topic, 3)  # filtered out: answered at once, the next pull waits on
        time.sleep(0.5)
        s.rpc.send(topic, 4)
    t = threading.Thread(target=later)
    t.start()
    offset, resp = 1, first
    for _ in range(5):  # 3 then 4 arrive: a few held pulls at most until the match
        resp = s.rpc.pull(s.fs.addr, "G-lp", topic, offset, flags=FLAG_CLASS_FILTER | FLAG_SUSPEND,
                          suspend_ms=10000)
        if resp.code == ResponseCode.SUCCESS:
            break
        assert resp.code in (ResponseCode.PULL_NOT_FOUND, ResponseCode.PULL_RETRY_IMMEDIATELY), resp.remark
        offset = int(resp.ext_fields["nextBeginOffset"])
    t.join()
    assert resp.code == ResponseCode.SUCCESS
    assert numbers(decode_messages(resp.body)) == [4]
