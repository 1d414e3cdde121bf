"""CommitLog and MappedFileQueue: append, roll-over, reads, scans, truncation, the record parser."""
from __future__ import annotations

import mmap
import os
import struct
import threading
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.errors import CorruptRecordError, StoreError
from sluice.protocol.record import BLANK_MAGIC, decode_record, encode_record
from sluice.store.commitlog import CommitLog, parse_record, verify_record_bytes
from sluice.speedups import C
from sluice.store import mapped
from sluice.store.mapped import FdWrittenFile, MappedFileQueue, offset_to_name

SEG = 64 * 1024


def rec(body: bytes = b"x" * 100, topic: str = "T", props: str = "") -> bytearray:
    return encode_record(topic=topic, body=body, properties=props)


def append(cl: CommitLog, records: list[bytearray], topic: str = "T", qid: int = 0):
    """([(commit-log offset, queue offset, size)], store timestamp, end offset)."""
    sizes = [len(r) for r in records]
    phys, qoffs, ts, end = cl.append(bytearray().join(records), sizes, topic, qid, [56] * len(records))
    return list(zip(phys, qoffs, sizes)), ts, end


@pytest.fixture(params=[False, True], ids=["mapped-writes", "pwrite"])
def cl(tmp_path: Path, request):
    """Both write paths: through the mapping (async flush) and with pwrite (sync flush, mapped.FdWrittenFile)."""
    c = CommitLog(tmp_path / "commitlog", SEG, write_by_fd=request.param)
    c.load()
    yield c
    c.close()


def test_append_assigns_offsets_and_patches_fields(cl: CommitLog) -> None:
    placed, ts, end = append(cl, [rec(), rec(b"yy")])
    (p0, q0, n0), (p1, q1, n1) = placed
    assert (p0, q0, p1, q1, end) == (0, 0, n0, 1, n0 + n1)
    r = decode_record(cl.read(p1, n1))
    assert (r.physical_offset, r.queue_offset, r.store_timestamp, r.body) == (p1, 1, ts, b"yy")
    assert append(cl, [rec()], "T", 1)[0][0][1] == 0  # another queue counts from 0
    assert append(cl, [rec()])[0][0][1] == 2


def test_roll_over_blank_marker_and_scan(cl: CommitLog) -> None:
    placed = []
    for _ in range(40):
        placed += append(cl, [rec(b"z" * 3000)])[0]
    assert len(cl.segments()) >= 2
    last_first = max(p for p, _, n in placed if p + n <= SEG)
    size = placed[0][2]
    blank_at = last_first + size
    assert struct.unpack_from(">iI", cl.segments()[0].mm, blank_at) == (SEG - blank_at, BLANK_MAGIC)
    seen = []
    end, err = cl.scan(0, on_record=lambda r: seen.append(r.physical_offset))
    assert err is None and end == cl.write_pos and seen == [p for p, _, _ in placed]
    assert [p.name for p in sorted(cl.queue.directory.iterdir())][:2] == [offset_to_name(0), offset_to_name(SEG)]


def test_batch_larger_than_a_segment_splits_at_record_boundaries(cl: CommitLog) -> None:
    placed, _, end = append(cl, [rec(b"q" * 5000) for _ in range(30)])
    assert all(p // SEG == (p + n - 1) // SEG for p, _, n in placed)
    assert cl.scan(0) == (end, None)


def test_scan_stops_at_damage(cl: CommitLog) -> None:
    placed, _, end = append(cl, [rec() for _ in range(5)])
    p3 = placed[3][0]
    f = cl.segments()[0]
    f.write(p3 + 4, b"\xde\xad\xbe\xef")
    stop, err = cl.scan(0)
    assert stop == p3 and "bad magic" in str(err) and err.offset == p3 and err.path == str(f.path)


def test_truncate_zeros_and_drops_later_segments(cl: CommitLog) -> None:
    for _ in range(40):
        append(cl, [rec(b"z" * 3000)])
    cut = 1000 + 0  # anywhere: truncate does not care about record boundaries
    cl.truncate(cut)
    assert cl.write_pos == cut and len(cl.segments()) == 1
    assert bytes(cl.segments()[0].mm[cut:SEG]) == bytes(SEG - cut)


def test_read_record_and_reads_out_of_range(cl: CommitLog) -> None:
    placed, _, _ = append(cl, [rec(b"abc")])
    assert decode_record(cl.read_record(0)).body == b"abc"
    assert cl.read_record(10 * SEG) is None and cl.read(10 * SEG, 10) is None
    cl.segments()[0].write(4, b"\x00\x00\x00\x00")
    with pytest.raises(CorruptRecordError, match="magic"):
        cl.read_record(0)


@pytest.mark.parametrize("pwrite", [mapped._pwrite_py] + ([C.pwrite_all] if C is not None else []),
                         ids=lambda f: f.__module__ or "C")
def test_fd_written_file_reads_back_through_the_mapping_and_the_file(tmp_path: Path, pwrite) -> None:
    q = MappedFileQueue(tmp_path / "q", SEG, write_by_fd=True)
    f = q.create(0)
    assert isinstance(f, FdWrittenFile)
    data = bytes(range(256)) * 20  # crosses page boundaries, starts mid-page
    pwrite(f._fd, memoryview(bytearray(data))[3:], 4093)
    pwrite(f._fd, b"", 0)  # nothing to write: no call, no error
    assert f.read(4093, len(data) - 3) == data[3:]  # the mapping sees what pwrite wrote: one page cache
    assert os.pread(f._fd, len(data) - 3, 4093) == data[3:]
    assert f.read(0, 4093) == bytes(4093)  # nothing else touched
    with pytest.raises(OSError):
        pwrite(-1, b"x", 0)
    q.close()


def test_mapped_queue_refuses_a_gap(tmp_path: Path) -> None:
    q = MappedFileQueue(tmp_path, SEG)
    q.create(0)
    q.create(SEG)
    q.create(2 * SEG)
    q.close()
    (tmp_path / offset_to_name(SEG)).unlink()
    with pytest.raises(StoreError, match="missing"):
        MappedFileQueue(tmp_path, SEG).load()


def test_mapped_queue_extends_a_short_file(tmp_path: Path) -> None:
    (tmp_path / offset_to_name(0)).write_bytes(b"abc")
    q = MappedFileQueue(tmp_path, SEG)
    q.load()
    assert q.files[0].read(0, 4) == b"abc\x00" and (tmp_path / offset_to_name(0)).stat().st_size == SEG
    q.close()


@settings(max_examples=150, deadline=None)
@given(body=st.binary(max_size=600), topic=st.from_regex(r"[A-Za-z0-9_%|-]{1,40}", fullmatch=True),
       props=st.text(max_size=50), qid=st.integers(0, 1000), born_v6=st.booleans(), store_v6=st.booleans())
def test_parse_record_agrees_with_decode_record(body, topic, props, qid, born_v6, store_v6) -> None:
    r = encode_record(topic=topic, body=body, properties=props, queue_id=qid, queue_offset=7, physical_offset=99,
                      born_host=("::1", 5) if born_v6 else ("10.0.0.1", 5),
                      store_host=("::2", 6) if store_v6 else ("10.0.0.2", 6), store_timestamp=1234)
    p = parse_record(bytes(r), 0, check_crc=True)
    d = decode_record(r)
    assert (p.total_size, p.queue_id, p.queue_offset, p.physical_offset, p.sysflag, p.store_timestamp, p.topic,
            p.properties) == (d.total_size, d.queue_id, d.queue_offset, d.physical_offset, d.sysflag,
                              d.store_timestamp, d.topic, d.properties)
    verify_record_bytes(bytes(r), 99)


@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_parse_record_rejects_any_damage_or_cut(data) -> None:
    """A cut record, or one with a flipped bit in the body, never parses as valid."""
    body = data.draw(st.binary(min_size=1, max_size=200))
    r = bytes(encode_record(topic="T", body=body, properties="a\x01b\x02"))
    cut = data.draw(st.integers(0, len(r) - 1))
    with pytest.raises(CorruptRecordError):
        parse_record(r[:cut], 0, check_crc=True)
    i = data.draw(st.integers(88, 88 + len(body) - 1))  # inside the body
    bad = bytearray(r)
    bad[i] ^= 1 << data.draw(st.integers(0, 7))
    with pytest.raises(CorruptRecordError):
        parse_record(bytes(bad), 0, check_crc=True)
    with pytest.raises(CorruptRecordError):
        verify_record_bytes(bytes(bad), 0)


# -- warming (warm.py): pages ahead of the write position are zeroed by a thread, never written data ------

@pytest.mark.parametrize("durable", [False, True])
def test_warming_runs_ahead_and_never_touches_written_records(tmp_path: Path, durable: bool) -> None:
    seg = 4 * 1024 * 1024
    c = CommitLog(tmp_path / "commitlog", seg, warm_ahead=256 * 1024, write_by_fd=durable, durable_warm=durable)
    c.load()
    try:
        bodies = [bytes([i % 251]) * (100 + i % 900) for i in range(2000)]

        def work(k: int) -> None:
            for i in range(k, len(bodies), 4):
                append(c, [rec(bodies[i])])

        threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        deadline = time.monotonic() + 10  # the warmer catches up with the writers after the last append
        while (c.warm.warmed_bytes == 0 or c.warm.end <= c.write_pos) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert c.warm.warmed_bytes > 0
        seen = []
        end, err = c.scan(0, check_crc=True, on_record=lambda r: seen.append(r.physical_offset))
        assert err is None and end == c.write_pos and len(seen) == len(bodies)
        c.warm.stop()  # ``warm.end`` moves while the thread runs: compare against a still one
        f = c.queue.last()
        warm_end = c.warm.end
        assert c.write_pos < warm_end
        assert f.mm[c.write_pos - f.start:warm_end - f.start] == bytes(warm_end - c.write_pos)
    finally:
        c.close()
    assert c.warm._thread is None


_FS_IOC_FIEMAP = 0xC020660B  # _IOWR('f', 11, struct fiemap)
_FIEMAP_EXTENT_UNWRITTEN = 0x800
_FIEMAP_EXTENT_DELALLOC = 0x4


def _extent_flags(path: Path, start: int, length: int) -> list[tuple[int, int, int]]:
    """(logical offset, length, flags) of the file's extents over [start, start + length), by FIEMAP (no
    sync first: what the filesystem holds now)."""
    import fcntl
    n = 64
    req = bytearray(struct.pack("=QQIIII", start, length, 0, 0, n, 0) + bytes(56 * n))
    with open(path, "rb") as fh:
        try:
            fcntl.ioctl(fh.fileno(), _FS_IOC_FIEMAP, req)
        except OSError as e:
            pytest.skip(f"no FIEMAP on this filesystem: {e}")
    mapped = struct.unpack_from("=I", req, 20)[0]
    out = []
    for i in range(mapped):
        logical, _phys, ln = struct.unpack_from("=QQQ", req, 32 + 56 * i)
        flags = struct.unpack_from("=I", req, 32 + 56 * i + 40)[0]
        out.append((logical, ln, flags))
    return out


@pytest.mark.parametrize("durable", [False, True])
def test_durable_warming_leaves_written_blocks_ahead_of_the_writer(tmp_path: Path, durable: bool) -> None:
    """Under synchronous flush the zeros ahead are on disk as written blocks (not unwritten extents), so the
    fsyncs after later appends change no extent; the asynchronous warmer's zeros only reach the page cache."""
    c = CommitLog(tmp_path / "commitlog", 4 * 1024 * 1024, warm_ahead=1024 * 1024, write_by_fd=durable,
                  durable_warm=durable)
    c.load()
    try:
        append(c, [rec(b"x" * 3000)])
        deadline = time.monotonic() + 10
        while c.warm.end < c.write_pos + 512 * 1024 and time.monotonic() < deadline:
            time.sleep(0.01)
        c.warm.stop()
        f = c.queue.last()
        lo = -(-c.write_pos // mmap.PAGESIZE) * mmap.PAGESIZE + c.warm.margin  # (durable zeros keep a margin)
        extents = _extent_flags(f.path, lo - f.start, c.warm.end - lo)
        pending = [e for e in extents if e[2] & (_FIEMAP_EXTENT_UNWRITTEN | _FIEMAP_EXTENT_DELALLOC)]
        assert extents
        if durable:
            assert not pending, extents
        elif not pending:
            pytest.skip("the kernel wrote the zeros back already")  # (the comparison case proves nothing then)
    finally:
        c.close()


def test_an_append_waits_while_its_range_is_being_zeroed(cl: CommitLog) -> None:
    append(cl, [rec()])
    w = cl.warm
    w.stop()  # the real thread would clear ``busy`` when its own step ends
    with cl.put_lock:
        w.busy = (cl.write_pos, cl.write_pos + 4096)  # as if the warmer were zeroing right there
    done = threading.Event()
    t = threading.Thread(target=lambda: (append(cl, [rec(b"late")]), done.set()))
    t.start()
    assert not done.wait(0.2)  # blocked: it cannot write where zeros are going
    with w.cond:
        w.busy = None
        w.cond.notify_all()
    assert done.wait(5)
    t.join()
    assert cl.scan(0, check_crc=True)[1] is None
