"""Recovery after clean and unclean stops, the whole-store check, and damaged records."""
from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest

from store_testlib import msg, simulate_crash, small_config
from sluice.errors import CorruptRecordError
from sluice.protocol.record import iter_records
from sluice.store import GetMessageStatus as S
from sluice.store import MessageStore
from sluice.store.checkpoint import Checkpoint, load_checkpoint, save_checkpoint

CFG = small_config(checkpoint_interval_ms=3_600_000)  # checkpoints only when a test asks


def fill(s: MessageStore, n: int, qid: int = 0, start: int = 0) -> list:
    return [s.put_message(msg(body=b"body-%d" % i, qid=qid, KEYS=f"k{i}")) for i in range(start, start + n)]


def test_clean_restart_trusts_the_checkpoint(store_dir: Path) -> None:
    with MessageStore(store_dir, CFG) as s:
        res = fill(s, 30)
    assert not (store_dir / "abort").exists()
    with MessageStore(store_dir, CFG) as s:
        rep = s.recovery_report
        assert not rep.abnormal and rep.scanned_from == rep.end_offset == res[-1].commitlog_offset + res[-1].size
        assert s.put_message(msg()).queue_offset == 30
        assert s.check().ok


def test_torn_tail_is_cut_and_saved(store_dir: Path) -> None:
    s = MessageStore(store_dir, CFG).start()
    res = fill(s, 20)
    s.wait_dispatched()
    end = s.commitlog.write_pos
    simulate_crash(s)
    seg = store_dir / "commitlog" / ("0" * 20)
    with open(seg, "r+b") as f:  # half a record after the end: a put that was cut short
        f.seek(end)
        f.write(struct.pack(">iI", 500, 0xDAA320A7) + b"\x07" * 100)
    with MessageStore(store_dir, CFG) as s2:
        rep = s2.recovery_report
        assert rep.abnormal and rep.end_offset == end and rep.cut_bytes == 108
        assert Path(rep.tail_file).read_bytes()[:8] == struct.pack(">iI", 500, 0xDAA320A7)
        got = s2.get_messages("T", 0, 0, 32)
        assert got.message_count == 20
        assert s2.put_message(msg()).commitlog_offset == end
        assert s2.check().ok
    assert res[-1].queue_offset == 19


def test_queue_past_the_log_is_truncated(store_dir: Path) -> None:
    s = MessageStore(store_dir, CFG).start()
    res = fill(s, 20)
    s.wait_dispatched()
    simulate_crash(s)
    cut = res[15].commitlog_offset
    with open(store_dir / "commitlog" / ("0" * 20), "r+b") as f:  # the log lost its last 5 records
        f.seek(cut)
        f.write(bytes(res[-1].commitlog_offset + res[-1].size - cut))
    with MessageStore(store_dir, CFG) as s2:
        assert s2.recovery_report.queues_truncated == {"T/0": 5}
        assert s2.get_max_offset("T", 0) == 15
        assert s2.put_message(msg()).queue_offset == 15
        s2.wait_dispatched()
        assert s2.query_messages_by_key("T", "k17") == []
        assert [m.body for m in s2.query_messages_by_key("T", "k14")] == [b"body-14"]
        assert s2.check().ok


def test_queue_behind_the_log_is_redispatched(store_dir: Path) -> None:
    s = MessageStore(store_dir, CFG).start()
    fill(s, 10)
    s.wait_dispatched()
    s._checkpoint()
    fill(s, 10, start=10)
    s.wait_dispatched()
    simulate_crash(s)
    # The units of the last 10 never reached the disk.
    cq_file = store_dir / "consumequeue" / "T" / "0" / ("0" * 20)
    with open(cq_file, "r+b") as f:
        f.seek(10 * 20)
        f.write(bytes(10 * 20))
    with MessageStore(store_dir, CFG) as s2:
        assert s2.get_max_offset("T", 0) == 20
        got = s2.get_messages("T", 0, 10, 32)
        assert [r.body for r in iter_records(got.data)] == [b"body-%d" % i for i in range(10, 20)]
        assert s2.put_message(msg()).queue_offset == 20
        assert s2.check().ok


def test_flipped_byte_is_detected_and_never_served(store_dir: Path) -> None:
    with MessageStore(store_dir, CFG) as s:
        res = fill(s, 10)
    victim = res[6]
    seg = store_dir / "commitlog" / ("0" * 20)
    with open(seg, "r+b") as f:
        f.seek(victim.commitlog_offset + 88 + 2)  # inside the body (IPv4 hosts: the body starts at 88)
        b = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([b[0] ^ 0x40]))
    with MessageStore(store_dir, CFG) as s:
        rep = s.check()
        assert not rep.ok
        p = rep.problems[0]
        assert p.path == str(seg) and p.offset == victim.commitlog_offset and "CRC" in p.message
        with pytest.raises(CorruptRecordError) as ei:
            s.get_messages("T", 0, 6, 32)
        assert ei.value.offset == victim.commitlog_offset and ei.value.path == str(seg)
        got = s.get_messages("T", 0, 4, 32)
        assert got.status is S.FOUND and got.queue_offsets == [4, 5] and got.next_begin_offset == 6
        with pytest.raises(CorruptRecordError):
            s.get_message_by_offset(victim.commitlog_offset)
        assert s.get_messages("T", 0, 7, 32).message_count == 3


def test_check_finds_and_fixes_a_damaged_queue(store_dir: Path) -> None:
    with MessageStore(store_dir, CFG) as s:
        fill(s, 12)
        s.wait_dispatched()
        f = s.queues.get("T", 0).queue.files[0]
        f.write(5 * 20, struct.pack(">q", 999_999))  # unit 5 now points nowhere
        rep = s.check()
        assert not rep.ok and "consumequeue/T/0" in rep.problems[0].path
        rep = s.check(fix=True)
        assert rep.fixed == ["rebuilt consume queue T/0"]
        assert s.check().ok
        assert s.get_messages("T", 0, 0, 32).message_count == 12


def test_checkpoint_round_trip_and_damage(tmp_path: Path) -> None:
    p = tmp_path / "checkpoint"
    assert load_checkpoint(p) is None
    save_checkpoint(p, Checkpoint(commitlog_offset=5, dispatch_offset=4, index_offset=3))
    cp = load_checkpoint(p)
    assert (cp.commitlog_offset, cp.dispatch_offset, cp.index_offset) == (5, 4, 3)
    data = bytearray(p.read_bytes())
    data[10] ^= 1
    p.write_bytes(bytes(data))
    assert load_checkpoint(p) is None
    assert not (tmp_path / "checkpoint.tmp").exists()


def test_unclean_stop_without_checkpoint(store_dir: Path) -> None:
    s = MessageStore(store_dir, CFG).start()
    res = fill(s, 40)
    s.wait_dispatched()
    simulate_crash(s)
    (store_dir / "checkpoint").unlink()
    with MessageStore(store_dir, CFG) as s2:
        assert s2.recovery_report.end_offset == res[-1].commitlog_offset + res[-1].size
        assert s2.get_max_offset("T", 0) == 40 and s2.check().ok
        np.testing.assert_array_equal(s2.queues.get("T", 0).get_units(0, 40)["offset"],
                                      [r.commitlog_offset for r in res])
