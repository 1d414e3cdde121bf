"""MessageStore: writes, reads by queue / offset / id / key / time, the filter hook, dispatchers, bad input."""
from __future__ import annotations

import os
import threading

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from store_testlib import TagFilter, msg, small_config
from sluice.errors import InvalidParameterError, MessageIllegalError, StoreError
from sluice.filter.tagcode import tag_code
from sluice.protocol.msgid import create_offset_msg_id
from sluice.protocol.record import iter_records
from sluice.store import GetMessageStatus as S
from sluice.store import MessageStore, StoreMessage
from sluice.store.types import RequestDispatcher, TagCodeFilter


def test_put_and_pull_round_trip(store: MessageStore) -> None:
    res = store.put_messages([msg(body=b"m%d" % i, TAGS="a", KEYS=f"k{i}") for i in range(10)])
    assert [r.queue_offset for r in res] == list(range(10))
    assert res[0].commitlog_offset == 0 and res[1].commitlog_offset == res[0].size
    assert res[3].msg_id == create_offset_msg_id("127.0.0.1", 10911, res[3].commitlog_offset)
    assert store.wait_dispatched()
    got = store.get_messages("T", 0, 0, 32)
    assert got.status is S.FOUND and got.message_count == 10 and got.next_begin_offset == 10
    recs = list(iter_records(got.data))
    assert [r.body for r in recs] == [b"m%d" % i for i in range(10)]
    assert [r.queue_offset for r in recs] == list(range(10))
    assert [r.physical_offset for r in recs] == [r.commitlog_offset for r in res]
    assert all(r.store_timestamp == res[0].store_timestamp for r in recs)
    assert recs[0].store_host == ("127.0.0.1", 10911)
    assert got.queue_offsets == list(range(10)) and got.commitlog_offsets == [r.commitlog_offset for r in res]


def test_pull_statuses(store: MessageStore) -> None:
    assert store.get_messages("none", 0, 0).status is S.NO_MATCHED_LOGIC_QUEUE
    store.put_messages([msg() for _ in range(5)])
    store.wait_dispatched()
    r = store.get_messages("T", 0, 5)
    assert (r.status, r.next_begin_offset, r.min_offset, r.max_offset) == (S.OFFSET_OVERFLOW_ONE, 5, 0, 5)
    r = store.get_messages("T", 0, 9)
    assert (r.status, r.next_begin_offset) == (S.OFFSET_OVERFLOW_BADLY, 0)
    r = store.get_messages("T", 0, 2, max_msgs=2)
    assert (r.status, r.message_count, r.next_begin_offset) == (S.FOUND, 2, 4)


def test_max_bytes_returns_at_least_one(store: MessageStore) -> None:
    res = store.put_messages([msg(body=bytes(1000)) for _ in range(5)])
    store.wait_dispatched()
    r = store.get_messages("T", 0, 0, 32, max_bytes=10)
    assert r.message_count == 1 and r.next_begin_offset == 1
    r = store.get_messages("T", 0, 0, 32, max_bytes=2 * res[0].size)
    assert r.message_count == 2


class PropFilter(TagCodeFilter):
    needs_record = True

    def match_units(self, tag_codes: np.ndarray) -> None:
        return None

    def match_record(self, properties: dict[str, str]) -> bool:
        return int(properties.get("n", "0")) % 3 == 0


def test_tag_filter_on_units(store: MessageStore) -> None:
    store.put_messages([msg(body=b"%d" % i, TAGS="a" if i % 4 == 0 else "b") for i in range(40)])
    store.wait_dispatched()
    r = store.get_messages("T", 0, 0, 5, message_filter=TagFilter("a"))
    assert r.status is S.FOUND and r.queue_offsets == [0, 4, 8, 12, 16]
    assert r.next_begin_offset == 17
    assert all(rec.properties.startswith("TAGS\x01a") for rec in iter_records(r.data))


def test_record_filter(store: MessageStore) -> None:
    store.put_messages([msg(n=str(i)) for i in range(12)])
    store.wait_dispatched()
    r = store.get_messages("T", 0, 0, 32, message_filter=PropFilter())
    assert r.queue_offsets == [0, 3, 6, 9] and r.next_begin_offset == 12


def test_selective_filter_scans_a_bounded_window(store_dir) -> None:
    with MessageStore(store_dir, small_config(max_filter_scan_bytes=20 * 50, max_filter_scan_units=50)) as s:
        s.put_messages([msg(TAGS="b") for _ in range(120)])
        s.wait_dispatched()
        r = s.get_messages("T", 0, 0, 32, message_filter=TagFilter("a"))
        assert (r.status, r.next_begin_offset, r.message_count) == (S.NO_MATCHED_MESSAGE, 50, 0)


def test_reads_by_offset_id_key_time(store: MessageStore) -> None:
    r1 = store.put_message(msg(body=b"one", KEYS="alpha beta", UNIQ_KEY="U1"))
    r2 = store.put_message(msg(topic="Other", body=b"two", KEYS="alpha"))
    store.wait_dispatched()
    m = store.get_message_by_offset(r1.commitlog_offset)
    assert m.body == b"one" and m.keys == ["alpha", "beta"] and m.msg_id == "U1" and m.offset_msg_id == r1.msg_id
    assert store.get_message_by_id(r2.msg_id).body == b"two"
    assert [m.body for m in store.query_messages_by_key("T", "alpha")] == [b"one"]
    assert [m.body for m in store.query_messages_by_key("T", "U1")] == [b"one"]
    assert [m.body for m in store.query_messages_by_key("Other", "alpha")] == [b"two"]
    assert store.query_messages_by_key("T", "gamma") == []
    assert store.read_record(r1.commitlog_offset)[4:8] == bytes.fromhex("DAA320A7")
    assert store.get_message_by_offset(10**9) is None


def test_offset_by_timestamp(store: MessageStore) -> None:
    times = []
    for i in range(6):
        times.append(store.put_message(msg(body=b"%d" % i)).store_timestamp)
        # distinct store times without sleeping: the store keeps times monotonic, so bump the clock
        store.commitlog.last_store_timestamp = times[-1] + 10
    store.wait_dispatched()
    assert store.get_offset_by_timestamp("T", 0, 0) == 0
    assert store.get_offset_by_timestamp("T", 0, times[3]) == 3
    assert store.get_offset_by_timestamp("T", 0, times[3] + 1) == 4
    assert store.get_offset_by_timestamp("T", 0, times[-1] + 1) == 6
    assert store.get_earliest_message_time("T", 0) == times[0]
    assert store.get_earliest_message_time() == times[0]
    assert store.get_earliest_message_time("T", 5) == -1


def test_topics_offsets_stats(store: MessageStore) -> None:
    store.put_messages([msg(qid=2) for _ in range(3)])
    store.put_message(msg(topic="A", qid=0))
    store.wait_dispatched()
    assert store.topic_queues() == {"A": [0], "T": [2]}
    assert (store.get_min_offset("T", 2), store.get_max_offset("T", 2)) == (0, 3)
    st_ = store.stats()
    assert st_["put_messages"] == 4 and st_["dispatch_behind_bytes"] == 0


def test_roll_over_writes_blank_marker(store_dir) -> None:
    with MessageStore(store_dir, small_config()) as s:
        body = bytes(100_000)
        res = [s.put_message(msg(body=body)) for _ in range(25)]
        s.wait_dispatched()
        assert len(s.commitlog.segments()) >= 3
        first_in_second = next(r for r in res if r.commitlog_offset >= 1 << 20)
        assert first_in_second.commitlog_offset == 1 << 20
        last_in_first = [r for r in res if r.commitlog_offset < 1 << 20][-1]
        blank_at = last_in_first.commitlog_offset + last_in_first.size
        seg = s.commitlog.segments()[0]
        total, magic = int.from_bytes(seg.mm[blank_at:blank_at + 4], "big"), seg.mm[blank_at + 4:blank_at + 8]
        assert magic == bytes.fromhex("CBD43194") and total == (1 << 20) - blank_at
        got = s.get_messages("T", 0, 0, 32, max_bytes=1 << 30)
        assert got.message_count == 25 and all(r.body == body for r in iter_records(got.data))
    names = sorted(os.listdir(store_dir / "commitlog"))
    assert names[:2] == ["00000000000000000000", "00000000000001048576"]


def test_batch_that_rolls_over_mid_batch(store_dir) -> None:
    with MessageStore(store_dir, small_config()) as s:
        res = s.put_messages([msg(body=bytes(30_000)) for _ in range(80)])
        offs = [r.commitlog_offset for r in res]
        assert any(o == 1 << 20 for o in offs) and all(o + r.size <= ((o >> 20) + 1) << 20 for o, r in zip(offs, res))
        s.wait_dispatched()
        assert s.get_messages("T", 0, 0, 100, max_bytes=1 << 30).message_count == 80


@pytest.mark.parametrize("bad, why", [
    (StoreMessage("T", bytes(256 * 1024 + 1)), "limit"),
    (StoreMessage("bad topic", b"x"), "contains"),
    (StoreMessage("x" * 128, b"x"), "127"),
    (StoreMessage("T", b"x", 0, {"a\x01": "v"}), "property name .* separators"),
    (StoreMessage("T", b"x", 0, {"a": "v\x02"}), "property value .* separators"),
    (StoreMessage("T", "text"), "bytes"),  # type: ignore[arg-type]
    (StoreMessage("T", b"x", -1), "negative"),
])
def test_bad_input_refused_and_nothing_written(store: MessageStore, bad: StoreMessage, why: str) -> None:
    store.put_message(msg())
    before = store.commitlog.write_pos
    with pytest.raises(MessageIllegalError, match=why):
        store.put_messages([msg(), bad])  # a good message first: it must not be written either
    assert store.commitlog.write_pos == before
    assert store.put_message(msg()).queue_offset == 1


def test_batch_must_be_one_queue(store: MessageStore) -> None:
    with pytest.raises(InvalidParameterError):
        store.put_messages([msg(qid=0), msg(qid=1)])


def test_closed_store_refuses(store_dir) -> None:
    s = MessageStore(store_dir, small_config())
    with pytest.raises(StoreError):
        s.put_message(msg())
    with s:
        with pytest.raises(StoreError, match="another process"):
            MessageStore(store_dir, small_config()).start()


def test_extra_dispatcher_sees_batches_and_sets_tag_code(store: MessageStore) -> None:
    seen = []

    class D(RequestDispatcher):
        def dispatch(self, reqs) -> None:
            for r in reqs:
                seen.append((r.topic, r.queue_offset, r.properties.get("TAGS"), r.keys, r.uniq_key))
                r.tag_code = 777

    store.add_dispatcher(D())
    store.put_messages([msg(TAGS="x", KEYS="a b", UNIQ_KEY="u%d" % i) for i in range(3)])
    store.wait_dispatched()
    assert seen == [("T", i, "x", ["a", "b"], "u%d" % i) for i in range(3)]
    assert store.queues.get("T", 0).unit(1)[2] == 777


def test_prepared_transaction_messages_are_not_queued(store: MessageStore) -> None:
    store.put_message(msg(body=b"a"))
    r = store.put_message(StoreMessage("T", b"prep", 0, sysflag=0x4))
    store.put_message(msg(body=b"b"))
    store.wait_dispatched()
    assert r.queue_offset == 0 and store.get_max_offset("T", 0) == 2
    assert store.get_message_by_offset(r.commitlog_offset).body == b"prep"


def test_concurrent_writers_get_distinct_offsets(store: MessageStore) -> None:
    out: list = []

    def work() -> None:
        for _ in range(50):
            out.extend(store.put_messages([msg(), msg()]))

    ts = [threading.Thread(target=work) for _ in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert sorted(r.queue_offset for r in out) == list(range(400))
    assert len({r.commitlog_offset for r in out}) == 400
    store.wait_dispatched()
    assert store.check().ok


props_st = st.dictionaries(st.text(st.characters(blacklist_characters="\x01\x02", blacklist_categories=("Cs",)),
                                   min_size=1, max_size=8),
                           st.text(st.characters(blacklist_characters="\x01\x02", blacklist_categories=("Cs",)),
                                   min_size=1, max_size=16), max_size=4)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batch=st.lists(st.tuples(st.binary(min_size=1, max_size=3000), st.integers(0, 2), props_st),
                      min_size=1, max_size=12))
def test_round_trip_property(store: MessageStore, batch) -> None:
    start = {q: store.get_max_offset("P", q) for q in range(3)}
    sent = []
    for body, q, props in batch:
        r = store.put_message(StoreMessage("P", body, q, props))
        assert r.queue_offset == start[q]
        start[q] += 1
        sent.append((r, body, q, props))
    assert store.wait_dispatched()
    for r, body, q, props in sent:
        m = store.get_message_by_offset(r.commitlog_offset)
        assert (m.body, m.queue_id, m.queue_offset) == (body, q, r.queue_offset)
        assert m.properties == props
        got = store.get_messages("P", q, r.queue_offset, 1)
        assert got.status is S.FOUND and got.data == store.read_record(r.commitlog_offset)


def test_dispatch_from_appenders_equals_dispatch_from_the_log(store: MessageStore) -> None:
    """Live dispatch uses what put handed over; replay parses the log: dispatchers must not tell them apart."""
    seen: list = []

    class D(RequestDispatcher):
        def dispatch(self, reqs) -> None:
            seen.extend(reqs)

    store.add_dispatcher(D())
    batch = [StoreMessage("T", b"a", 1, {"TAGS": "x", "KEYS": "k1 k2", "empty": "", "__RMQ.TRANSIENT.t": "v"}),
             StoreMessage("T", b"b", 1, {"UNIQ_KEY": "U"}, sysflag=0x4, born_host=("::1", 9))]
    store.put_messages(batch)
    store.put_messages([StoreMessage("T", bytes(300_000 // 2), 1, {"n": str(i)}) for i in range(8)])  # rolls over
    store.wait_dispatched()
    replay, end = [], 0
    while end < store.commitlog.write_pos:
        got, end = store.dispatch._parse_batch(end)
        replay.extend(got)
    assert len(seen) == 10 and seen == replay
    assert seen[0].properties == {"TAGS": "x", "KEYS": "k1 k2"} and seen[0].keys == ["k1", "k2"]
    assert seen[1].uniq_key == "U" and seen[1].sysflag == 0x14


def test_dispatch_reports_a_hole_instead_of_spinning(store: MessageStore) -> None:
    r = store.put_message(msg())
    store.wait_dispatched()
    seg = store.commitlog.segments()[0]
    seg.write(r.commitlog_offset + r.size, bytes(8))  # a hole where the next record will be claimed to start
    store.commitlog.write_pos += 200  # as if 200 bytes had been appended there
    assert not store.wait_dispatched(timeout=2.0)
    assert "no record at commit-log offset" in store.stats()["dispatch_error"]
    store.commitlog.write_pos -= 200  # let the store close cleanly
    store.dispatch.error = None


def test_columnar_dispatch_without_and_with_requests(store: MessageStore) -> None:
    """A dispatcher with dispatch_batch sees columns and nothing per message is built; one that asks for
    requests (and changes tag codes) gets them, and the units are written from those."""
    from sluice.store.dispatch_columns import DispatchBatch

    batches: list[DispatchBatch] = []

    class Columns(RequestDispatcher):
        def dispatch(self, requests) -> None:  # type: ignore[no-untyped-def]
            pass  # replayed records (none in this test): nothing to record per request

        def dispatch_batch(self, batch: DispatchBatch) -> None:
            batches.append(batch)

    store.add_dispatcher(Columns())
    res = store.put_messages([msg(TAGS="a", KEYS=f"k{i}", UNIQ_KEY=f"U{i:031d}") for i in range(5)])
    assert store.wait_dispatched()
    assert sum(len(b) for b in batches) == 5 and not any(b.materialised for b in batches)
    assert [int(store.queues.get("T", 0).unit(i)[2]) for i in range(5)] == [tag_code("a")] * 5
    assert [m.queue_offset for m in store.query_messages_by_key("T", "k3")] == [3]
    assert [m.queue_offset for m in store.query_messages_by_key("T", f"U{4:031d}")] == [4]

    class Retag(RequestDispatcher):  # takes every batch as requests (RequestDispatcher.dispatch_batch)
        def dispatch(self, requests) -> None:  # type: ignore[no-untyped-def]
            for r in requests:
                r.tag_code = 1000 + r.queue_offset

    store.add_dispatcher(Retag())
    store.put_messages([msg(TAGS="b", KEYS="x y") for _ in range(3)])
    assert store.wait_dispatched()
    assert [int(store.queues.get("T", 0).unit(i)[2]) for i in range(5, 8)] == [1005, 1006, 1007]
    assert sorted(m.queue_offset for m in store.query_messages_by_key("T", "y")) == [5, 6, 7]


def test_warming_follows_the_flush_mode(tmp_path) -> None:
    from sluice.errors import InvalidParameterError as Bad

    for name, cfg, warms in (("a", small_config(flush_mode="async"), True),
                             ("s", small_config(flush_mode="sync"), True),  # durable zeros (warm.py)
                             ("o", small_config(flush_mode="async", commitlog_warm_ahead=0), False),
                             ("so", small_config(flush_mode="sync", commitlog_warm_ahead=0), False)):
        with MessageStore(tmp_path / name, cfg) as s:
            s.put_message(msg())
            assert (s.commitlog.warm.ahead > 0) is warms
            assert s.commitlog.warm.durable is (cfg.flush_mode == "sync")
    with pytest.raises(Bad):
        small_config(commitlog_warm_ahead=-1)
