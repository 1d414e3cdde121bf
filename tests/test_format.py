"""sluice.format: the layout constants agree with each other and with the encoder, and the one record walker
stops where it should (end of data, zeros, blank marker, a bad record with its file and offset)."""
from __future__ import annotations

import subprocess
import sys
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import sluice.format as F
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
    r = encode_record(topic="Tp", body=b"xyz", properties="", queue_id=5, flag=6, sysflag=F.FLAG_COMPRESSED,
                      born_timestamp=7, store_timestamp=8, reconsume_times=9, prepared_tx_offset=10,
                      queue_offset=11, physical_offset=12)
    assert len(r) == F.MIN_RECORD_SIZE + 3 + 2
    assert F.I32.unpack_from(r, F.POS_QUEUEID)[0] == 5 and F.I32.unpack_from(r, F.POS_FLAG)[0] == 6
    assert F.QUEUE_PHYS.unpack_from(r, F.POS_QUEUEOFFSET) == (11, 12)
    assert F.I64.unpack_from(r, F.POS_BORNTIMESTAMP)[0] == 7
    assert F.I64.unpack_from(r, F.store_timestamp_pos(0))[0] == 8 == F.I64.unpack_from(r, F.POS_STORETIMESTAMP_V4)[0]
    assert F.I32.unpack_from(r, F.POS_RECONSUMETIMES_V4)[0] == 9
    assert F.I32.unpack_from(r, F.body_length_pos(0))[0] == 3 and r[F.POS_BODY_V4:F.POS_BODY_V4 + 3] == b"xyz"
    assert F.I32.unpack_from(r, F.POS_BODYCRC)[0] == F.body_crc(b"xyz") == zlib.crc32(b"xyz") & 0x7FFFFFFF
    assert F.HEAD_V4.unpack_from(r)[0] == len(r)


@pytest.mark.parametrize("born, store", [(False, False), (True, False), (False, True), (True, True)])
def test_host_size_rules(born: bool, store: bool):
    r = _rec(born_host=("::1", 3) if born else ("1.2.3.4", 3), store_host=("::2", 4) if store else ("1.2.3.4", 4))
    sysflag = F.I32.unpack_from(r, F.POS_SYSFLAG)[0]
    assert bool(sysflag & F.FLAG_BORNHOST_V6) == born and bool(sysflag & F.FLAG_STOREHOST_V6) == store
    assert F.born_host_size(sysflag) == (20 if born else 8) and F.store_host_size(sysflag) == (20 if store else 8)
    assert F.I64.unpack_from(r, F.store_timestamp_pos(sysflag))[0] == 77
    assert F.I32.unpack_from(r, F.body_length_pos(sysflag))[0] == 4
    assert F.parse_record(r, 0, check_crc=True).store_timestamp == 77


def test_transaction_types():
    queued = {t: F.is_queued(t | F.FLAG_BORNHOST_V6) for t in (0, 0x4, 0x8, 0xC)}
    assert queued == {0: True, F.FLAG_TRANSACTION_PREPARED: False, F.FLAG_TRANSACTION_COMMIT: True,
                      F.FLAG_TRANSACTION_ROLLBACK: False}
    assert [F.is_rolled_back(t) for t in (0, 0x4, 0x8, 0xC)] == [False, False, False, True]
    assert F.TRANSACTION_MASK == 0xC and set(F.NOT_QUEUED) == {0x4, 0xC}


def test_tag_code_is_stable():
    # Stored in every consume-queue unit: a change would make old units match no tag.
    assert F.tag_code(None) == F.tag_code("") == 0
    assert F.java_string_hash("TagA") == 2598919 and F.java_hash_of_code(F.tag_code("TagA")) == 2598919
    assert F.tag_code("TagA") == ((zlib.crc32(b"TagA") & 0x7FFFFFFF) << 32) | 2598919
    assert F.java_string_hash("\u00e9\U0001F600") == 1996812  # UTF-16 code units: a surrogate pair counts two
    from sluice.filter.tagcode import tag_code

    assert tag_code is F.tag_code


def test_unit_layouts():
    assert F.CQ_UNIT.size == F.CQ_UNIT_SIZE == 20 and [n for n, _ in F.CQ_UNIT_FIELDS] == ["offset", "size", "tag"]
    assert F.EXT_UNIT_HEAD.size == F.EXT_MIN_UNIT_SIZE == 20
    assert F.is_ext_address(F.ext_decorate(0)) and F.ext_undecorate(F.ext_decorate(123)) == 123
    assert not F.is_ext_address(F.tag_code("x")) and F.ext_decorate(F.EXT_MAX_ADDR - F.LONG_MIN) == F.EXT_MAX_ADDR


def test_format_imports_no_numpy():
    code = "import sys, sluice.format; print('numpy' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True).stdout.strip() == "False"


# ---- the walker --------------------------------------------------------------------------------------

def test_walk_to_the_end_of_the_data():
    log = _log(b"a", b"bb", b"ccc")
    walk = F.RecordWalk(log, log_offset=0)
    assert [r.physical_offset for r in walk] == [0, R1, 2 * R1 + 1]
    assert walk.stop == F.END and walk.error is None and walk.pos == len(log)
    walk = F.RecordWalk(log)
    assert list(walk.positions()) == [0, R1, 2 * R1 + 1] and walk.stop == F.END


def test_walk_stops_at_zeros_and_at_the_blank_marker():
    log = _log(b"a", b"b")
    walk = F.RecordWalk(log + bytes(100))
    assert len(list(walk)) == 2 and walk.stop == F.END_OF_DATA and walk.pos == len(log)
    seg = log + F.TOTAL_MAGIC.pack(50, F.BLANK_MAGIC) + bytes(42)
    walk = F.RecordWalk(seg)
    assert len(list(walk)) == 2 and walk.stop == F.BLANK and walk.pos == len(log)
    walk = F.RecordWalk(seg[:-1], where="seg")  # the blank marker must cover the rest of a whole segment
    assert len(list(walk)) == 2 and walk.stop == F.CORRUPT and "blank marker says 50" in str(walk.error)
    walk = F.RecordWalk(seg[:-1], window=True)  # a window of the log: it cannot know
    assert len(list(walk)) == 2 and walk.stop == F.BLANK


def test_walk_reports_a_bad_record_with_file_and_offset():
    log = bytearray(_log(b"a", b"b", b"c"))
    log[R1 + F.POS_BODY_V4] ^= 1  # the second record's body
    walk = F.RecordWalk(log, where="00000000000000001000", file_offset=1000)
    assert len(list(walk)) == 1 and walk.stop == F.CORRUPT and walk.pos == R1
    assert "body CRC mismatch" in str(walk.error) and walk.error.path == "00000000000000001000"
    assert walk.error.offset == 1000 + R1
    assert len(list(F.RecordWalk(log, check_crc=False))) == 3
    walk = F.RecordWalk(_log(b"a", b"b"), log_offset=5)  # records that do not say they are where they are
    assert list(walk) == [] and walk.stop == F.CORRUPT and "says it is at 0" in str(walk.error)


def test_walk_over_a_window_stops_before_a_record_it_does_not_hold():
    log = _log(b"a", b"x" * 500)
    walk = F.RecordWalk(log[:200], window=True)
    assert len(list(walk)) == 1 and walk.stop == F.PARTIAL and walk.want == R1 + 499 and walk.pos == R1
    walk = F.RecordWalk(log[:R1 + 3], window=True)
    assert len(list(walk)) == 1 and walk.stop == F.PARTIAL and walk.want == 0
    walk = F.RecordWalk(log[:200], where="f")  # a whole segment: the same cut is damage
    assert len(list(walk)) == 1 and walk.stop == F.CORRUPT and "does not fit" in str(walk.error)
    walk = F.RecordWalk(log[:R1 + 3], where="f")
    assert len(list(walk)) == 1 and "truncated record header" in str(walk.error)


def test_positions_check_magic_and_size_only():
    log = bytearray(_log(b"a", b"b"))
    log[R1 + F.POS_BODY_V4] ^= 1
    assert list(F.RecordWalk(log).positions()) == [0, R1]  # the body is the reader's to check
    log[R1 + F.POS_MAGIC] ^= 1
    walk = F.RecordWalk(log, where="f")
    assert list(walk.positions()) == [0] and "bad magic code" in str(walk.error) and walk.error.offset == R1


def test_breaking_out_leaves_pos_after_the_last_record_handed_out():
    log = _log(b"a", b"b", b"c")
    walk = F.RecordWalk(log)
    for r in walk:
        if r.physical_offset == R1:
            break
    assert walk.pos == 2 * R1


@settings(max_examples=60, deadline=None)
@given(bodies=st.lists(st.binary(max_size=40), min_size=1, max_size=6), cut=st.integers(0, 400))
def test_walk_agrees_with_decode_record(bodies, cut):
    log = _log(*bodies)
    parsed = list(F.RecordWalk(log, log_offset=0))
    full, pos = [], 0
    while pos < len(log):
        full.append(decode_record(log, pos))
        pos += full[-1].total_size
    assert [(p.total_size, p.physical_offset, p.topic, p.properties, p.store_timestamp) for p in parsed] == [
        (r.total_size, r.physical_offset, r.topic, r.properties, r.store_timestamp) for r in full]
    cut = min(cut, len(log))
    walk = F.RecordWalk(log[:cut], window=True)
    got = list(walk)
    assert walk.stop in (F.END, F.PARTIAL) and walk.pos == sum(r.total_size for r in got) <= cut
