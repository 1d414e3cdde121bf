"""sluice.format: the layout constants agree with each other and with the encoder, and the one record walker
stops where it should (end of data, zeros, blank marker, a bad record with its file and offset)."""
from __future__ import annotations

import subprocess
import sys
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import sluice.format as fmt
from sluice.protocol.record import decode_record, encode_record


def _rec(body: bytes = b"body", *, topic: str = "T", props: str = "TAGS\x01a\x02", phys: int = 0,
         born_host: tuple[str, int] = ("10.0.0.1", 1), store_host: tuple[str, int] = ("10.0.0.2", 2),
         sysflag: int = 0) -> bytes:
    return bytes(encode_record(topic=topic, body=body, properties=props, physical_offset=phys, born_host=born_host,
                               store_host=store_host, sysflag=sysflag, store_timestamp=77))


def _log(*bodies: bytes) -> bytes:
    """Records back to back, each saying where it is."""
    out = b""
    for b in bodies:
        out += _rec(b, phys=len(out))
    return out


R1 = len(_rec(b"a"))  # a record with a one-byte body; the second record of _log(b"a", ...) starts here


def test_positions_match_the_encoder():
    r = encode_record(topic="Tp", body=b"xyz", properties="", queue_id=5, flag=6, sysflag=fmt.FLAG_COMPRESSED,
                      born_timestamp=7, store_timestamp=8, reconsume_times=9, prepared_tx_offset=10,
                      queue_offset=11, physical_offset=12)
    assert len(r) == fmt.MIN_RECORD_SIZE + 3 + 2
    assert fmt.I32.unpack_from(r, fmt.POS_QUEUEID)[0] == 5 and fmt.I32.unpack_from(r, fmt.POS_FLAG)[0] == 6
    assert fmt.QUEUE_PHYS.unpack_from(r, fmt.POS_QUEUEOFFSET) == (11, 12)
    assert fmt.I64.unpack_from(r, fmt.POS_BORNTIMESTAMP)[0] == 7
    assert fmt.I64.unpack_from(r, fmt.store_timestamp_pos(0))[0] == 8 == fmt.I64.unpack_from(r, fmt.POS_STORETIMESTAMP_V4)[0]
    assert fmt.I32.unpack_from(r, fmt.POS_RECONSUMETIMES_V4)[0] == 9
    assert fmt.I32.unpack_from(r, fmt.body_length_pos(0))[0] == 3 and r[fmt.POS_BODY_V4:fmt.POS_BODY_V4 + 3] == b"xyz"
    assert fmt.I32.unpack_from(r, fmt.POS_BODYCRC)[0] == fmt.body_crc(b"xyz") == zlib.crc32(b"xyz") & 0x7FFFFFFF
    assert fmt.HEAD_V4.unpack_from(r)[0] == len(r)


@pytest.mark.parametrize("born, store", [(False, False), (True, False), (False, True), (True, True)])
def test_host_size_rules(born: bool, store: bool):
    r = _rec(born_host=("::1", 3) if born else ("1.2.3.4", 3), store_host=("::2", 4) if store else ("1.2.3.4", 4))
    sysflag = fmt.I32.unpack_from(r, fmt.POS_SYSFLAG)[0]
    assert bool(sysflag & fmt.FLAG_BORNHOST_V6) == born and bool(sysflag & fmt.FLAG_STOREHOST_V6) == store
    assert fmt.born_host_size(sysflag) == (20 if born else 8) and fmt.store_host_size(sysflag) == (20 if store else 8)
    assert fmt.I64.unpack_from(r, fmt.store_timestamp_pos(sysflag))[0] == 77
    assert fmt.I32.unpack_from(r, fmt.body_length_pos(sysflag))[0] == 4
    assert fmt.parse_record(r, 0, check_crc=True).store_timestamp == 77


def test_transaction_types():
    queued = {t: fmt.is_queued(t | fmt.FLAG_BORNHOST_V6) for t in (0, 0x4, 0x8, 0xC)}
    assert queued == {0: True, fmt.FLAG_TRANSACTION_PREPARED: False, fmt.FLAG_TRANSACTION_COMMIT: True,
                      fmt.FLAG_TRANSACTION_ROLLBACK: False}
    assert [fmt.is_rolled_back(t) for t in (0, 0x4, 0x8, 0xC)] == [False, False, False, True]
    assert fmt.TRANSACTION_MASK == 0xC and set(fmt.NOT_QUEUED) == {0x4, 0xC}


def test_tag_code_is_stable():
    # Stored in every consume-queue unit: a change would make old units match no tag.
    assert fmt.tag_code(None) == fmt.tag_code("") == 0
    assert fmt.java_string_hash("TagA") == 2598919 and fmt.java_hash_of_code(fmt.tag_code("TagA")) == 2598919
    assert fmt.tag_code("TagA") == ((zlib.crc32(b"TagA") & 0x7FFFFFFF) << 32) | 2598919
    assert fmt.java_string_hash("\u00e9\U0001F600") == 1996812  # UTF-16 code units: a surrogate pair counts two
    from sluice.filter.tagcode import tag_code

    assert tag_code is fmt.tag_code


def test_unit_layouts():
    assert fmt.CQ_UNIT.size == fmt.CQ_UNIT_SIZE == 20 and [n for n, _ in fmt.CQ_UNIT_FIELDS] == ["offset", "size", "tag"]
    assert fmt.EXT_UNIT_HEAD.size == fmt.EXT_MIN_UNIT_SIZE == 20
    assert fmt.is_ext_address(fmt.ext_decorate(0)) and fmt.ext_undecorate(fmt.ext_decorate(123)) == 123
    assert not fmt.is_ext_address(fmt.tag_code("x")) and fmt.ext_decorate(fmt.EXT_MAX_ADDR - fmt.LONG_MIN) == fmt.EXT_MAX_ADDR


def test_format_imports_no_numpy():
    code = "import sys, sluice.format; print('numpy' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True).stdout.strip() == "False"


# ---- the walker --------------------------------------------------------------------------------------

def test_walk_to_the_end_of_the_data():
    log = _log(b"a", b"bb", b"ccc")
    walk = fmt.RecordWalk(log, log_offset=0)
    assert [r.physical_offset for r in walk] == [0, R1, 2 * R1 + 1]
    assert walk.stop == fmt.END and walk.error is None and walk.pos == len(log)
    walk = fmt.RecordWalk(log)
    assert list(walk.positions()) == [0, R1, 2 * R1 + 1] and walk.stop == fmt.END


def test_walk_stops_at_zeros_and_at_the_blank_marker():
    log = _log(b"a", b"b")
    walk = fmt.RecordWalk(log + bytes(100))
    assert len(list(walk)) == 2 and walk.stop == fmt.END_OF_DATA and walk.pos == len(log)
    seg = log + fmt.TOTAL_MAGIC.pack(50, fmt.BLANK_MAGIC) + bytes(42)
    walk = fmt.RecordWalk(seg)
    assert len(list(walk)) == 2 and walk.stop == fmt.BLANK and walk.pos == len(log)
    walk = fmt.RecordWalk(seg[:-1], where="seg")  # the blank marker must cover the rest of a whole segment
    assert len(list(walk)) == 2 and walk.stop == fmt.CORRUPT and "blank marker says 50" in str(walk.error)
    walk = fmt.RecordWalk(seg[:-1], window=True)  # a window of the log: it cannot know
    assert len(list(walk)) == 2 and walk.stop == fmt.BLANK


def test_walk_reports_a_bad_record_with_file_and_offset():
    log = bytearray(_log(b"a", b"b", b"c"))
    log[R1 + fmt.POS_BODY_V4] ^= 1  # the second record's body
    walk = fmt.RecordWalk(log, where="00000000000000001000", file_offset=1000)
    assert len(list(walk)) == 1 and walk.stop == fmt.CORRUPT and walk.pos == R1
    assert "body CRC mismatch" in str(walk.error) and walk.error.path == "00000000000000001000"
    assert walk.error.offset == 1000 + R1
    assert len(list(fmt.RecordWalk(log, check_crc=False))) == 3
    walk = fmt.RecordWalk(_log(b"a", b"b"), log_offset=5)  # records that do not say they are where they are
    assert list(walk) == [] and walk.stop == fmt.CORRUPT and "says it is at 0" in str(walk.error)


def test_walk_over_a_window_stops_before_a_record_it_does_not_hold():
    log = _log(b"a", b"x" * 500)
    walk = fmt.RecordWalk(log[:200], window=True)
    assert len(list(walk)) == 1 and walk.stop == fmt.PARTIAL and walk.want == R1 + 499 and walk.pos == R1
    walk = fmt.RecordWalk(log[:R1 + 3], window=True)
    assert len(list(walk)) == 1 and walk.stop == fmt.PARTIAL and walk.want == 0
    walk = fmt.RecordWalk(log[:200], where="f")  # a whole segment: the same cut is damage
    assert len(list(walk)) == 1 and walk.stop == fmt.CORRUPT and "does not fit" in str(walk.error)
    walk = fmt.RecordWalk(log[:R1 + 3], where="f")
    assert len(list(walk)) == 1 and "truncated record header" in str(walk.error)


def test_positions_check_magic_and_size_only():
    log = bytearray(_log(b"a", b"b"))
    log[R1 + fmt.POS_BODY_V4] ^= 1
    assert list(fmt.RecordWalk(log).positions()) == [0, R1]  # the body is the reader's to check
    log[R1 + fmt.POS_MAGIC] ^= 1
    walk = fmt.RecordWalk(log, where="f")
    assert list(walk.positions()) == [0] and "bad magic code" in str(walk.error) and walk.error.offset == R1


def test_breaking_out_leaves_pos_after_the_last_record_handed_out():
    log = _log(b"a", b"b", b"c")
    walk = fmt.RecordWalk(log)
    for r in walk:
        if r.physical_offset == R1:
            break
    assert walk.pos == 2 * R1


@settings(max_examples=60, deadline=None)
@given(bodies=st.lists(st.binary(max_size=40), min_size=1, max_size=6), cut=st.integers(0, 400))
def test_walk_agrees_with_decode_record(bodies, cut):
    log = _log(*bodies)
    parsed = list(fmt.RecordWalk(log, log_offset=0))
    full, pos = [], 0
    while pos < len(log):
        full.append(decode_record(log, pos))
        pos += full[-1].total_size
    assert [(p.total_size, p.physical_offset, p.topic, p.properties, p.store_timestamp) for p in parsed] == [
        (r.total_size, r.physical_offset, r.topic, r.properties, r.store_timestamp) for r in full]
    cut = min(cut, len(log))
    walk = fmt.RecordWalk(log[:cut], window=True)
    got = list(walk)
    assert walk.stop in (fmt.END, fmt.PARTIAL) and walk.pos == sum(r.total_size for r in got) <= cut
