"""sluice._speedups against the store's pure-Python paths: encode_batch, IndexFile.put_many, CommitLog.append,
pwrite_all.

The reference runs in the same process with the module's ``C`` patched to None. For every input both
must succeed with identical results (byte for byte) or raise the same exception with the same message.
"""
from __future__ import annotations

import ipaddress
import os
import random
import struct
import tempfile
from collections import deque
from itertools import accumulate, repeat
from operator import add, sub
from pathlib import Path

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import sluice.speedups
import sluice.store.encode as E
import sluice.store.index as I
from sluice.protocol import properties as P
from sluice.protocol.record import decode_record
from sluice.format import crc32
from sluice.store.types import StoreMessage

C = sluice.speedups.C
REQUIRED = os.environ.get("SLUICE_REQUIRE_EXTENSIONS", "") not in ("", "0")
pytestmark = pytest.mark.skipif(C is None and not REQUIRED, reason="sluice._speedups is not built")

I32 = (-2**31, 2**31 - 1)
I64 = (-2**63, 2**63 - 1)


def ints(lo, hi):
    return st.sampled_from([lo, -1, 0, 1, hi]) | st.integers(lo, hi)


# ------------------------------------------------------------------------------------------ encode_batch

HOSTS_V4 = [("127.0.0.1", 0), ("10.1.2.3", 65535), ("255.255.255.255", 2**31 - 1), ("0.0.0.0", -1)]
HOSTS_V6 = [("::1", 9876), ("2001:db8::7", 1), ("::ffff:1.2.3.4", 5)]
SYSFLAGS = [0, 0x1, 0x2, 0x3, 0x4, 0x8, 0xC, 0x10, 0x20, 0x30, 0x3F, 0x13, -1, -16, -64, *I32]
utf8 = st.sampled_from(["a", "é", "ÿ", "€", "😀", "\U0010ffff", " ", "\x00"]) | st.characters(codec="utf-8")
valid_text = st.text(utf8.filter(lambda c: c not in "\x01\x02"), max_size=8)
# Valid properties: system and arbitrary names, transient ones (left out when stored), empty values.
good_name = st.sampled_from(["TAGS", "KEYS", "UNIQ_KEY", "a", "é", "😀x", "x__RMQ.TRANSIENT."]) | valid_text.filter(bool)
good_props = st.dictionaries(good_name, valid_text | st.just("__RMQ.TRANSIENT.v"), max_size=5)
transient_props = st.dictionaries(good_name | st.just("__RMQ.TRANSIENT.x"), valid_text, max_size=5)
# Invalid ones: an empty name, separators, lone surrogates, names or values that are not str, no dict.
bad_props = st.one_of(st.none(), st.dictionaries(good_name | st.sampled_from(["", "a\x01", "b\x02", "\ud800", 7]),
                                                 valid_text | st.sampled_from(["x\x01", "\x02", "\udfff", None, 3]),
                                                 min_size=1, max_size=3))
good_body = st.binary(max_size=64) | st.integers(1000, 4000).map(lambda n: random.Random(n).randbytes(n))  # cheap KiBs
bad_body = st.binary(max_size=8).map(bytearray) | st.binary(max_size=8).map(memoryview) | st.just("text")


@st.composite
def batches(draw):
    """Messages of one topic, queue and host, the shape C encodes; a quarter of the batches each also
    mix in transactional sysflags, other hosts (IPv6 too), transient property names, or strays: a field
    here and there invalid or unusual (another topic or queue, an out-of-range int, a bad body, ...)."""
    topic = draw(st.sampled_from(["T", "TopicA", "%RETRY%g-1", "a" * 127]))
    qid = draw(st.sampled_from([0, 3, I32[1]]))
    host = draw(st.sampled_from(HOSTS_V4 + HOSTS_V6[:1]))
    stray, tran, hosts, transient = (draw(st.integers(0, 3)) == 0 for _ in range(4))

    def field(usual, *alts):
        alts = [a if isinstance(a, st.SearchStrategy) else st.just(a) for a in alts]
        return draw(st.one_of(usual, *alts) if stray and draw(st.integers(0, 9)) == 0 else usual)

    sysflags = st.sampled_from(SYSFLAGS) | ints(*I32)
    msgs = [StoreMessage(
        topic=field(st.just(topic), "T2", "bad topic", ""),
        queue_id=field(st.just(qid), qid + 1 if qid < I32[1] else 0, -1),
        body=field(good_body, bad_body),
        properties=field(transient_props if transient else good_props, bad_props),
        flag=field(ints(*I32), 2**31, True),
        sysflag=field(sysflags if tran else sysflags.map(lambda f: f & ~0xC), 2**31),
        born_timestamp=field(ints(*I64), 2**63),
        born_host=field(st.sampled_from(HOSTS_V4 + HOSTS_V6) if hosts else st.just(host),
                        ("1.2.3.4", 2**31), ("nohost", 1)),
        reconsume_times=field(ints(*I32), -2**31 - 1),
        prepared_tx_offset=field(ints(*I64), 2**63),
    ) for _ in range(draw(st.integers(1, 5)))]
    store_host = draw(st.sampled_from([("192.168.0.1", 10911), ("192.168.0.1", 10911), ("::1", 10911)]))
    max_body = draw(st.sampled_from([4 * 1024 * 1024, 4 * 1024 * 1024, 0, 63, 2000]))
    return msgs, store_host, max_body


def outcome(msgs, store_host, max_body, use_c):
    with pytest.MonkeyPatch.context() as mp:
        if not use_c:
            mp.setattr(E, "C", None)
        try:
            return E.encode_batch(list(msgs), store_host=store_host, max_body=max_body)
        except Exception as e:  # noqa: BLE001 - the exception itself is what is compared
            return type(e), str(e)


def check_records(enc, msgs, store_host):
    """The records decode back to the messages (the layout, independently of both encoders)."""
    store_v6 = ipaddress.ip_address(store_host[0]).version == 6
    assert len(enc.buf) == sum(enc.sizes)
    tran = [f & 0xC for f in enc.sysflags]  # prepared (0x4) and rolled-back (0xC) records get no queue offset
    assert enc.queued == ([t not in (4, 0xC) for t in tran] if {4, 0xC} & set(tran) else None)
    pos = 0
    for i, m in enumerate(msgs):
        r = decode_record(enc.buf, pos)
        stored = {k: v for k, v in m.properties.items() if not k.startswith(P.TRANSIENT_PREFIX)} \
            if m.properties else {}
        born_v6 = ipaddress.ip_address(m.born_host[0]).version == 6
        sysflag = m.sysflag & ~0x30 | (0x10 if born_v6 else 0) | (0x20 if store_v6 else 0)
        assert (r.total_size, r.body, r.topic, r.queue_id, r.properties) == (
            enc.sizes[i], bytes(m.body), msgs[0].topic, msgs[0].queue_id, P.encode_properties(stored))
        assert (r.flag, r.sysflag, r.born_timestamp, r.reconsume_times, r.prepared_tx_offset) == (
            m.flag, sysflag, m.born_timestamp, m.reconsume_times, m.prepared_tx_offset)
        assert (ipaddress.ip_address(r.born_host[0]), r.born_host[1]) == (
            ipaddress.ip_address(m.born_host[0]), m.born_host[1])
        assert (ipaddress.ip_address(r.store_host[0]), r.store_host[1]) == (
            ipaddress.ip_address(store_host[0]), store_host[1])
        assert (r.body_crc, r.queue_offset, r.physical_offset, r.store_timestamp) == (crc32(m.body) & 0x7FFFFFFF, 0, 0, 0)
        assert enc.ts_positions[i] == 48 + (20 if born_v6 else 8) and enc.sysflags[i] == sysflag
        assert (enc.props[i], enc.tags[i], enc.keys[i], enc.uniq[i]) == (
            r.properties, stored.get("TAGS"), stored.get("KEYS"), stored.get("UNIQ_KEY"))
        pos += r.total_size


M = StoreMessage


@settings(max_examples=300)
@given(batches())
@example(([M("T", b"a", 0, {"TAGS": "t", "KEYS": "k1 k2", "UNIQ_KEY": "u", "é": "😀"}), M("T", b"", 0, {})],
          ("10.0.0.1", 1), 100))
@example(([M("T", b"a", 0, {"__RMQ.TRANSIENT.x": "1", "TAGS": "t"}), M("T", b"b")], ("10.0.0.1", 1), 100))
@example(([M("T", b"a", 0, {"k": "v"}, born_host=("::1", 1)), M("T", b"b", 0, {"k": "v"})], ("10.0.0.1", 1), 100))
@example(([M("T", b"a", 0, {"k": "v"})], ("::1", 1), 100))
@example(([M("T", b"a", 0, {"k": "v"}, sysflag=s) for s in (0x4, 0x8, 0xC, 0x30)], ("10.0.0.1", 1), 100))
@example(([M("T", b"a", 0, {"": "v"})], ("10.0.0.1", 1), 100))
@example(([M("T", b"a", 0, {"k": "v\x01"})], ("10.0.0.1", 1), 100))
@example(([M("T", b"a", 0, {"k": "é" * 16382})], ("10.0.0.1", 1), 100))  # 32767 bytes encoded: the limit
@example(([M("T", b"a", 0, {"k": "é" * 16382 + "x"})], ("10.0.0.1", 1), 100))  # one byte over
@example(([M("T", b"ab", 0, {})], ("10.0.0.1", 1), 1))
@example(([M("T", b"a", 0, {}, flag=2**31)], ("10.0.0.1", 1), 100))
def test_encode_batch_equals_python(case):
    msgs, store_host, max_body = case
    c = outcome(msgs, store_host, max_body, True)
    py = outcome(msgs, store_host, max_body, False)
    assert c == py  # EncodedBatch: buf, sizes, ts_positions, sysflags, queued, props, tags, keys, uniq
    if isinstance(py, E.EncodedBatch):
        check_records(py, msgs, store_host)


def test_encode_batch_c_path_is_taken():
    # The comparisons mean something only if the store calls C and C answers the usual batch itself.
    assert E.C is C and I.C is C
    msgs = [M("T", b"x", 1, {"TAGS": "t", "a": "é"}, born_host=("10.0.0.2", 7)), M("T", b"", 1, {})]
    out = C.encode_batch(msgs, "T", 1, E._topic_part("T"), bytes(8), 100, E._born_host_bytes, crc32,
                         P.TRANSIENT_PREFIX)
    assert out is not None and out[1] == [92 + 1 + 12, 92]  # 88 + topic 2 + length 2, body, properties


@pytest.mark.parametrize("msgs, max_body", [
    ([M("T", b"x", 2**31)], 10), ([M("T", b"x", 2**32 + 1)], 10), ([M("T", b"x", 2**63)], 10),
    ([M("T", b"x", 1.0)], 10), ([M("T", b"x", 0)], 2**63),
])
def test_encode_batch_ints_outside_c_range(msgs, max_body):
    # Queue ids outside the record's int32 (and a max_body past C's long long) once diverged: both paths
    # now refuse the queue id alike, and C's limit is clamped.
    store = ("10.0.0.1", 1)
    assert outcome(msgs, store, max_body, True) == outcome(msgs, store, max_body, False)


# -------------------------------------------------------------------------------------------- index_put

def new_files(d, slot_num, index_num):
    return (I.IndexFile(Path(d) / "c", slot_num, index_num, create=True),
            I.IndexFile(Path(d) / "py", slot_num, index_num, create=True))


def state(f):
    return bytes(f.mm), f.count, f.slot_count, f.begin_ts, f.end_ts, f.begin_phy, f.end_phy


garbage = st.lists(st.tuples(st.integers(0, 6), st.sampled_from([-1, 1, 2, 5, 2**31 - 1, -2**31]) | ints(*I32)),
                   max_size=4)
entries = st.lists(st.tuples(st.sampled_from([0, 1, 7, 2**31 - 1]) | st.integers(0, 2**31 - 1),
                             ints(0, I64[1]), st.integers(-2**62, 2**62) | st.integers(0, 10**7)),
                   min_size=1, max_size=12)


@settings(max_examples=120)
@given(st.integers(1, 7), st.lists(st.tuples(garbage, entries), min_size=1, max_size=4))
@example(1, [([(0, 5)], [(3, 10, 1000), (4, 11, 2000)])])  # garbage head pointing past count
@example(3, [([], [(0, 1, 0), (3, 1, 0), (6, 1, 0)]), ([(0, 1)], [(9, 2, 5000)])])  # chains across batches
def test_index_put_equals_put_many(slot_num, batches):
    with tempfile.TemporaryDirectory() as d:
        fc, fp = new_files(d, slot_num, 1 + sum(len(e) for _, e in batches))
        try:
            for junk, es in batches:
                for slot, v in junk:  # torn or stale slot heads, in both files alike
                    for f in (fc, fp):
                        I.SLOT.pack_into(f.mm, I.HEADER.size + (slot % slot_num) * 4, v)
                h, p, t = (np.array(col, dtype=np.int64) for col in zip(*es))
                fc.put_many(h, p, t)
                with pytest.MonkeyPatch.context() as mp:
                    mp.setattr(I, "C", None)
                    fp.put_many(h, p, t)
                assert state(fc) == state(fp)
        finally:
            fc.close()
            fp.close()


def test_index_put_refuses_before_writing():
    buf = bytearray(40 + 4 + 3 * 20)
    one = np.array([1], dtype=np.int64)
    with pytest.raises(ValueError):  # a hash outside 0..2**31-1
        C.index_put(buf, 44, 1, 1, 0, np.array([-1], dtype=np.int64), one, one)
    with pytest.raises(ValueError):  # more entries than the file holds
        C.index_put(buf, 44, 1, 2, 0, np.array([1, 2], dtype=np.int64), np.ones(2, np.int64), np.ones(2, np.int64))
    assert buf == bytearray(len(buf))


# ---------------------------------------------------------------------------------------- patch_records

_QP, _I64 = struct.Struct(">qq"), struct.Struct(">q")


def patch_py(buf, sizes, ts_positions, qoff, wpos, now):
    """CommitLog.append's map path, as written there."""
    phys = list(accumulate(sizes, initial=wpos))
    phys.pop()
    rels = list(map(sub, phys, repeat(wpos)))
    deque(map(_QP.pack_into, repeat(buf), map(add, rels, repeat(20)), range(qoff, qoff + len(sizes)), phys), 0)
    deque(map(_I64.pack_into, repeat(buf), map(add, rels, ts_positions), repeat(now)), 0)
    return phys


@st.composite
def records(draw, min_size=1):
    sizes = draw(st.lists(st.integers(52, 160), min_size=min_size, max_size=6))
    ts = [draw(st.sampled_from([t for t in (56, 68, 44, s - 8) if t <= s - 8]) | st.integers(44, s - 8)) for s in sizes]
    rnd = random.Random(draw(st.integers(0, 2**32)))
    return bytearray(rnd.randbytes(sum(sizes))), sizes, ts


@settings(max_examples=300)
@given(records(min_size=0), ints(-2**62, 2**62), ints(0, 2**62), ints(*I64))
def test_patch_records_equals_python(rec, qoff, wpos, now):
    buf, sizes, ts = rec
    ref = bytearray(buf)
    assert C.patch_records(buf, sizes, ts, qoff, wpos, now) == patch_py(ref, sizes, ts, qoff, wpos, now)
    assert buf == ref


@pytest.mark.parametrize("qoff, wpos", [(2**63 - 1, 0), (0, 2**63 - 80)])
def test_patch_records_int64_overflow(qoff, wpos):
    sizes, ts = [80, 80], [56, 56]
    errors = []
    for fn in (C.patch_records, patch_py):
        try:
            fn(bytearray(160), sizes, ts, qoff, wpos, 0)
        except (struct.error, OverflowError, ValueError) as e:
            errors.append(type(e))
    assert len(errors) == 2  # both refuse (Python's error type is struct.error)


@settings(max_examples=150)
@given(records(), st.sampled_from(["size+", "size-", "drop", "extra", "ts<44", "ts>size-8", "short", "buf+"]),
       st.integers(0, 5), st.integers(1, 100))
def test_patch_records_refuses_inconsistent_sizes(rec, how, i, d):
    buf, sizes, ts = rec
    i %= len(sizes)
    if how == "size+":
        sizes[i] += d
    elif how == "size-":
        sizes[i] -= d
    elif how == "drop":
        del sizes[i], ts[i]
    elif how == "extra":
        sizes.append(d + 52)
        ts.append(56)
    elif how == "ts<44":
        ts[i] = 44 - d
    elif how == "ts>size-8":
        ts[i] = sizes[i] - 8 + d
    elif how == "short":
        del ts[i]
    else:
        buf += bytes(d)
    before = bytes(buf)
    with pytest.raises(ValueError):
        C.patch_records(buf, sizes, ts, 0, 0, 1)
    assert bytes(buf) == before  # nothing patched


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 20_000), st.binary(max_size=9000)), max_size=6))
def test_pwrite_all_equals_python(writes):
    from sluice.store.mapped import _pwrite_py
    files = []
    try:
        for f in (C.pwrite_all, _pwrite_py):
            fd, path = tempfile.mkstemp()
            files.append((fd, path))
            for pos, data in writes:
                f(fd, bytearray(data), pos)
        (fa, pa), (fb, pb) = files
        assert Path(pa).read_bytes() == Path(pb).read_bytes()
    finally:
        for fd, path in files:
            os.close(fd)
            os.unlink(path)


def test_pwrite_all_refuses_a_negative_offset_and_a_bad_descriptor():
    with pytest.raises(ValueError):
        C.pwrite_all(0, b"x", -1)
    with pytest.raises(OSError):
        C.pwrite_all(-1, b"x", 0)
