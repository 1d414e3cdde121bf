"""The one-record dispatch road (DispatchService.write_one, ConsumeQueue.put_unit, ConsumeQueueExt.put) writes
byte for byte what the batch road (write_queue, ConsumeQueue.put, ConsumeQueueExt.put_many) writes."""
from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.format import FLAG_TRANSACTION_PREPARED, FLAG_TRANSACTION_ROLLBACK
from sluice.store.consumequeue import CQ_DTYPE, PAD_SIZE, ConsumeQueue, ConsumeQueueTable
from sluice.store.dispatch import DispatchService
from sluice.store.dispatch_request import DispatchRequest
from sluice.store.ext_files import ExtTable

UNITS_PER_FILE = 8
EXT_FILE = 256
BITMAP_MAX = 12


def _service(root: Path) -> DispatchService:
    queues = ConsumeQueueTable(root / "cq", UNITS_PER_FILE)
    svc = DispatchService(None, queues, None, batch_bytes=1 << 20)  # type: ignore[arg-type]  # no log read here
    svc.ext = ExtTable(root / "ext", file_size=EXT_FILE, bitmap_bytes_max=BITMAP_MAX, lru=queues.lru)
    return svc


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _close(svc: DispatchService) -> None:
    for t in (svc.queues, svc.ext):
        t.flush()  # type: ignore[union-attr]
        for obj in t.all():  # type: ignore[union-attr]
            obj.close()


def _requests(rng: random.Random, n: int, first: dict[tuple[str, int], int], blen: int) -> list[DispatchRequest]:
    out = []
    for _ in range(n):
        key = rng.choice([("T", 0), ("T", 1), ("U", 0)])
        qoff = first[key]
        flag = rng.choice([0, 0, 0, FLAG_TRANSACTION_PREPARED, FLAG_TRANSACTION_ROLLBACK])
        if flag == 0:
            first[key] = qoff + 1  # only queued records take a queue offset
        bitmap = bytes(rng.randrange(256) for _ in range(blen)) if rng.random() < 0.7 else None
        out.append(DispatchRequest(key[0], key[1], qoff, rng.randrange(1 << 40), rng.randrange(1, 1 << 20),
                                   rng.randrange(-(1 << 40), 1 << 40), {}, rng.randrange(1 << 41), [], None,
                                   flag, bitmap))
    return out


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), batches=st.lists(st.integers(2, 40), min_size=1, max_size=5),
       blen=st.sampled_from([0, 4, BITMAP_MAX]), start=st.sampled_from([0, 5, 19]))
def test_one_record_road_writes_what_the_batch_road_writes(tmp_path_factory, seed, batches, blen, start):
    """Queues start at ``start`` (mid-file: padded), files roll over (small files), records that get no unit
    (prepared, rolled back) are skipped, and ext units go where bitmaps are."""
    root = tmp_path_factory.mktemp("twin")
    one, many = _service(root / "one"), _service(root / "many")
    rng = random.Random(seed)
    first = {k: start for k in [("T", 0), ("T", 1), ("U", 0)]}
    try:
        for n in batches:
            batch = _requests(rng, n, first, blen)
            many._write_requests(batch)  # len >= 2: grouped by queue, one write_queue each
            for r in batch:
                one._write_requests([r])  # the one-record road
        for key in first:
            a, b = one.queues.get(*key), many.queues.get(*key)
            assert (a is None) == (b is None)
            if a is not None:
                assert (a.max_offset, a.min_offset) == (b.max_offset, b.min_offset)
                assert np.array_equal(a.get_units(0, 1000), b.get_units(0, 1000))
        _close(one)
        _close(many)
        assert _files(root / "one") == _files(root / "many")
    finally:
        _close(one)
        _close(many)


def test_one_record_road_keeps_the_plain_tag_code_when_the_ext_write_fails(tmp_path, caplog):
    svc = _service(tmp_path)
    ok = DispatchRequest("T", 0, 0, 100, 50, 7, {}, 1, [], None, 0, b"\x01\x02")
    bad = DispatchRequest("T", 0, 1, 150, 60, 9, {}, 2, [], None, 0, bytes(BITMAP_MAX + 1))  # too long for ext
    svc._write_requests([ok])
    svc._write_requests([bad])
    units = svc.queues.get("T", 0).get_units(0, 10)
    assert units["tag"][0] < 0  # an ext address
    assert svc.ext.get("T", 0).get(int(units["tag"][0])).tags_code == 7  # type: ignore[union-attr]
    assert units[1].tolist() == (150, 60, 9)  # the plain tag code: pulls evaluate it directly
    assert "no ext units for T/0 offsets 1" in caplog.text
    _close(svc)


def test_a_record_without_a_unit_writes_nothing(tmp_path):
    svc = _service(tmp_path)
    svc._write_requests([DispatchRequest("T", 0, 0, 100, 50, 7, {}, 1, [], None, FLAG_TRANSACTION_PREPARED, b"x")])
    assert svc.queues.get("T", 0) is None and svc.ext.get("T", 0) is None  # type: ignore[union-attr]


@settings(max_examples=40, deadline=None)
@given(ops=st.lists(st.tuples(st.integers(-3, 12), st.integers(0, 1 << 40), st.integers(1, 1 << 30),
                              st.integers(-(1 << 62), 1 << 62)), min_size=1, max_size=30),
       start=st.sampled_from([0, 3, 17]))
def test_put_unit_is_put_of_one_unit(tmp_path_factory, ops, start):
    """Appends, re-writes below the end, gaps (padded) and a queue that starts mid-file."""
    root = tmp_path_factory.mktemp("cq")
    a = ConsumeQueue("T", 0, root / "a", UNITS_PER_FILE)
    b = ConsumeQueue("T", 0, root / "b", UNITS_PER_FILE)
    try:
        for step, phys, size, tag in ops:
            off = max(0, (a.max_offset or start) + step)
            a.put_unit(off, phys, size, tag)
            u = np.zeros(1, dtype=CQ_DTYPE)
            u[0] = (phys, size, tag)
            b.put(off, u)
            assert (a.max_offset, a.min_offset) == (b.max_offset, b.min_offset)
        assert np.array_equal(a.get_units(0, 1000), b.get_units(0, 1000))
        a.flush()
        b.flush()
        assert _files(root / "a") == {k.replace("b", "a", 1): v for k, v in _files(root / "b").items()}
    finally:
        a.close()
        b.close()


def test_put_unit_pads_a_gap(tmp_path):
    q = ConsumeQueue("T", 0, tmp_path, UNITS_PER_FILE)
    q.put_unit(0, 10, 5, 1)
    q.put_unit(3, 20, 5, 2)
    assert q.max_offset == 4
    assert q.get_units(0, 10)["size"].tolist() == [5, PAD_SIZE, PAD_SIZE, 5]
    q.close()


def test_put_unit_rejects_a_field_out_of_range(tmp_path):
    import struct
    q = ConsumeQueue("T", 0, tmp_path, UNITS_PER_FILE)
    with pytest.raises(struct.error):  # as the batch road's unit_array raises for a few units
        q.put_unit(0, 10, 1 << 31, 1)
    assert q.max_offset == 0
    q.close()


def test_one_record_batches_give_the_requests_replay_parses(tmp_path):
    """DispatchBatch.requests() of a one-record put (its own road) equals what parsing the log back gives."""
    from store_testlib import small_config

    from sluice.store import MessageStore, StoreMessage
    from sluice.store.types import RequestDispatcher

    seen: list = []

    class D(RequestDispatcher):
        def dispatch(self, reqs) -> None:
            assert len(reqs) == 1
            seen.extend(reqs)

    store = MessageStore(tmp_path, small_config())
    store.add_dispatcher(D())
    store.start()
    try:
        msgs = [StoreMessage("T", b"a", 1, {"TAGS": "x", "KEYS": "k1 k2", "empty": ""}),
                StoreMessage("T", b"b", 1, {"UNIQ_KEY": "U"}, sysflag=0x4, born_host=("::1", 9)),
                StoreMessage("U", b"c", 0, {}),
                StoreMessage("T", b"d", 1, {"TAGS": "y"})]
        for m in msgs:
            store.put_message(m)
            assert store.wait_dispatched()
        replay, end = [], 0
        while end < store.commitlog.write_pos:
            got, end = store.dispatch._parse_batch(end)
            replay.extend(got)
        assert len(seen) == 4 and seen == replay
        assert [r.queue_offset for r in seen] == [0, 0, 0, 1]  # the prepared record takes no offset, no unit
        assert store.queues.get("T", 1).max_offset == 2
        assert store.get_messages("T", 1, 0, 10).message_count == 2  # the prepared one is not served
    finally:
        store.close()


_KEYS = st.sampled_from([None, "", "k1", "k1 k2", " a  b ", "x"])


@settings(max_examples=40, deadline=None)
@given(runs=st.lists(st.lists(st.tuples(st.sampled_from([None, "", "U1", "U2"]), _KEYS,
                                        st.sampled_from([0, 0, FLAG_TRANSACTION_PREPARED, FLAG_TRANSACTION_ROLLBACK])),
                              min_size=1, max_size=5), min_size=1, max_size=6),
       together=st.booleans())
def test_index_runs_one_run_road_equals_python(tmp_path_factory, runs, together):
    """index_runs: a one-run batch (its own road in C) or several runs at once index what the per-message
    Python loop indexes, byte for byte."""
    from sluice.speedups import C
    from sluice.store import dispatch_columns as dc
    from sluice.store.dispatch_columns import PutRun, index_runs
    from sluice.store.index import IndexService

    if C is None:
        pytest.skip("the C road needs the extension")
    root = tmp_path_factory.mktemp("idx")
    put_runs, phy = [], 0
    for k, recs in enumerate(runs):
        n = len(recs)
        put_runs.append(PutRun(f"T{k % 2}", 0, [100] * n, [f for _, _, f in recs], [""] * n, [None] * n,
                               [kk for _, kk, _ in recs], [u for u, _, _ in recs], all_queued=False,
                               phys=list(range(phy, phy + 100 * n, 100)), qoffs=list(range(n)),
                               store_timestamp=1_700_000_000_000 + 1000 * k))
        phy += 100 * n
    c_svc = IndexService(root / "c", max_hash_slots=7, max_index_num=20)
    py_svc = IndexService(root / "py", max_hash_slots=7, max_index_num=20)
    try:
        if together:
            index_runs(c_svc, put_runs)
        else:
            for r in put_runs:
                index_runs(c_svc, [r])
        orig = dc.C
        dc.C = None
        try:
            for r in put_runs:
                index_runs(py_svc, [r])
        finally:
            dc.C = orig
        c_svc.flush()
        py_svc.flush()
        # files are named by their creation time: compare them in order
        assert list(_files(root / "c").values()) == list(_files(root / "py").values())
    finally:
        c_svc.close()
        py_svc.close()
