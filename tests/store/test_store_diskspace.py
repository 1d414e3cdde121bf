"""Disk space: files allocated before any write through a mapping, ENOSPC survived, the disk guard,
bounded scans, and the LRU of open consume-queue files."""
from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from smallfs import fill, small_tmpfs
from store_testlib import msg, simulate_crash, small_config

from sluice.errors import DiskFullError
from sluice.store import MessageStore
from sluice.store.diskspace import DiskGuard, disk_usage
from sluice.store.mapped import MappedFile, data_end


def bodies(s: MessageStore, topic: str, max_msgs: int = 32, max_bytes: int | None = None) -> list[bytes]:
    got = s.get_messages(topic, 0, 0, max_msgs, max_bytes=max_bytes)
    return [s.get_message_by_offset(o).body for o in got.commitlog_offsets]


def allocated_bytes(path: Path) -> int:
    return os.stat(path).st_blocks * 512


def test_new_file_allocates_its_first_chunk_and_writes_allocate_ahead(tmp_path: Path) -> None:
    f = MappedFile(tmp_path / "f", 0, 1 << 20, alloc_chunk=64 * 1024)
    try:
        assert f.alloc_end == 64 * 1024
        assert allocated_bytes(f.path) >= 64 * 1024
        f.write(100 * 1024, b"x" * 10)  # past the first chunk: allocated up to there first
        assert f.alloc_end >= 100 * 1024 + 10
        assert allocated_bytes(f.path) >= f.alloc_end
    finally:
        f.close()
    g = MappedFile(tmp_path / "f", 0, 1 << 20)  # reopened: its data counts as allocated
    try:
        assert g.alloc_end >= 100 * 1024 + 10
        assert g.read(100 * 1024, 10) == b"x" * 10
    finally:
        g.close()


def test_data_end_skips_holes(tmp_path: Path) -> None:
    p = tmp_path / "sparse"
    with open(p, "wb") as out:
        out.truncate(8 << 20)
        out.seek(1 << 20)
        out.write(b"y" * 4096)
    fd = os.open(p, os.O_RDONLY)
    try:
        hole, end = data_end(fd, 8 << 20)
    finally:
        os.close(fd)
    assert hole == 0 and (1 << 20) + 4096 <= end < 8 << 20


def test_guard_refuses_above_ratio_and_below_floor(tmp_path: Path) -> None:
    u = disk_usage(tmp_path)
    g = DiskGuard(tmp_path, max_used_ratio=100, min_free_bytes=0)
    assert g.check() is None
    g = DiskGuard(tmp_path, max_used_ratio=100, min_free_bytes=u.available * 4 + (1 << 40))
    reason = g.check()
    assert reason is not None and "maybe disk full" in reason and "disk_min_free_bytes" in reason
    if u.used_ratio * 100 > 1:
        g = DiskGuard(tmp_path, max_used_ratio=1, min_free_bytes=0)
        reason = g.check()
        assert reason is not None and "diskMaxUsedSpaceRatio 1%" in reason


def test_store_refuses_puts_on_a_full_disk_and_reads_go_on(tmp_path: Path) -> None:
    s = MessageStore(tmp_path / "store", small_config())
    s.start()
    try:
        stored = s.put_messages([msg(body=b"before %d" % i) for i in range(5)])
        # The guard as its timer would leave it on a disk above the limit.
        s.disk.max_used_ratio, s.disk.min_free_bytes = 100, 1 << 62
        assert s.disk.check() is not None
        with pytest.raises(DiskFullError) as e:
            s.put_messages([msg(body=b"refused")])
        assert e.value.code == 14 and "maybe disk full" in str(e.value)
        assert s.wait_dispatched()
        got = s.get_messages("T", 0, 0, 32)
        assert got.message_count == 5 and got.commitlog_offsets[0] == stored[0].commitlog_offset
        s.disk.min_free_bytes = 0
        assert s.disk.check() is None
        assert s.put_message(msg(body=b"after")).queue_offset == 5
    finally:
        s.close()


def test_enospc_fails_the_put_not_the_store(tmp_path: Path) -> None:
    with small_tmpfs(tmp_path / "fs", "16m") as fs:
        cfg = small_config(commitlog_file_size=4 << 20, max_message_size=64 * 1024, disk_min_free_bytes=0,
                           disk_max_used_space_ratio=100, index_max_hash_slots=1024, index_max_index_num=8192)
        s = MessageStore(fs / "store", cfg)
        s.start()
        try:
            body = os.urandom(60 * 1024)
            n = 0
            with pytest.raises(DiskFullError) as e:
                for _ in range(1000):  # 60 MB: more than the filesystem holds
                    s.put_message(msg(body=body))
                    n += 1
            assert "maybe disk full" in str(e.value) and n > 10
            with pytest.raises(DiskFullError):  # refused at once now, with back-off
                s.put_message(msg(body=b"x"))
            assert s.wait_dispatched()
            got = s.get_messages("T", 0, 0, 1000, max_bytes=15 << 20)
            assert got.message_count == n  # every acknowledged message is readable
            assert s.check().ok
            end = s.commitlog.write_pos
            simulate_crash(s)
            s = MessageStore(fs / "store", cfg)
            s.start()  # restarts on the full filesystem
            assert s.commitlog.write_pos == end
            assert s.get_max_offset("T", 0) == n
        finally:
            s.close()


@pytest.mark.slow
def test_filled_tmpfs_store_survives_enospc_in_dispatch_and_resumes(tmp_path: Path) -> None:
    with small_tmpfs(tmp_path / "fs", "16m") as fs:
        cfg = small_config(commitlog_file_size=8 << 20, max_message_size=64 * 1024, disk_min_free_bytes=0,
                           disk_max_used_space_ratio=100, index_max_hash_slots=1024, index_max_index_num=8192)
        s = MessageStore(fs / "store", cfg)
        s.start()
        try:
            s.put_message(msg(body=b"kept"))
            assert s.wait_dispatched()
            filler = fill(fs, leave=0)
            accepted = 0
            with pytest.raises(DiskFullError):
                for _ in range(200):
                    s.put_message(msg(body=os.urandom(60 * 1024)))
                    accepted += 1
            assert bodies(s, "T", 1) == [b"kept"]  # reads go on
            # Dispatch of the accepted ones needs consume-queue files: it backs off, the store stays up.
            filler.unlink()
            deadline = time.monotonic() + 40.0  # the dispatch thread's back-off is at most 30 s
            while not s.wait_dispatched(timeout=0.5) and time.monotonic() < deadline:
                time.sleep(0.2)  # wait_dispatched gives up at once while dispatch reports its error
            assert s.wait_dispatched(timeout=1.0)
            assert s.get_max_offset("T", 0) == 1 + accepted
            deadline = time.monotonic() + 40.0
            while s.disk.check() is not None and time.monotonic() < deadline:
                time.sleep(0.2)  # the refusal lasts its back-off, then the sample finds room
            assert s.put_message(msg(body=b"after")).queue_offset == 1 + accepted
        finally:
            s.close()


def test_scan_copies_windows_of_written_bytes_not_the_segment(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    s = MessageStore(tmp_path / "store", small_config(commitlog_file_size=256 << 20, commitlog_warm_ahead=0))
    s.start()
    try:
        s.put_messages([msg(body=os.urandom(1000)) for _ in range(50)])
        assert s.wait_dispatched()
        reads: list[int] = []
        real = MappedFile.read_released

        def spy(self: MappedFile, pos: int, n: int) -> bytes:
            reads.append(n)
            return real(self, pos, n)

        monkeypatch.setattr(MappedFile, "read_released", spy)
        end, err = s.commitlog.scan(0)
        assert err is None and end == s.commitlog.write_pos
        # Only the allocated chunk (4 MiB) is looked at, never the rest of the 256 MiB segment.
        assert reads and sum(reads) <= 4 << 20
    finally:
        s.close()


def test_cold_queues_are_closed_and_reopen_on_use(tmp_path: Path) -> None:
    s = MessageStore(tmp_path / "store", small_config(max_open_queues=4))
    s.start()
    try:
        for q in range(20):
            s.put_messages([msg(topic=f"T{q}", body=b"q%d-%d" % (q, i)) for i in range(3)])
        assert s.wait_dispatched()
        assert len(s.queues.lru) <= 4
        open_cq = sum(1 for cq in s.queues.all() if not cq._evicted)
        assert open_cq <= 4
        for q in range(20):  # every cold queue still reads right
            assert bodies(s, f"T{q}") == [b"q%d-%d" % (q, i) for i in range(3)]
        s.put_message(msg(topic="T0", body=b"q0-3"))
        assert s.wait_dispatched()
        assert s.get_max_offset("T0", 0) == 4
        assert s.check().ok
    finally:
        s.close()
    s = MessageStore(tmp_path / "store", small_config(max_open_queues=4))
    s.start()  # loads every queue through the LRU too
    try:
        assert len(s.queues.lru) <= 4
        assert bodies(s, "T7") == [b"q7-%d" % i for i in range(3)]
    finally:
        s.close()


def test_ext_queues_share_the_lru_and_reopen(tmp_path: Path) -> None:
    from sluice.store.consumequeue_ext import ConsumeQueueExt
    from sluice.store.per_queue import OpenFilesLru

    lru = OpenFilesLru(2)
    exts = [ConsumeQueueExt(tmp_path / f"e{i}", file_size=64 * 1024, bitmap_bytes_max=8, lru=lru) for i in range(6)]
    addrs = []
    for i, e in enumerate(exts):
        e.load()
        addrs.append(e.put_many([i, i + 100], [1000 + i, 2000 + i], [bytes([i] * 4), bytes([i + 1] * 4)]))
    assert len(lru) <= 2
    assert sum(not e._evicted for e in exts) <= 2
    for i, e in enumerate(exts):  # cold ones reopen and read their units back
        u = e.get(addrs[i][1])
        assert u is not None and u.tags_code == i + 100 and u.bitmap == bytes([i + 1] * 4)
        more = e.put(7, 7, b"\x07" * 4)  # and append after them
        assert e.get(more).tags_code == 7
    assert len(lru) <= 2
    for e in exts:
        e.close()
    reloaded = ConsumeQueueExt(tmp_path / "e3", file_size=64 * 1024, bitmap_bytes_max=8)
    reloaded.load()
    assert reloaded.get(addrs[3][0]).tags_code == 3
    reloaded.close()
