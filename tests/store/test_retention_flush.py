"""Retention (expired segments, moving minimum offsets) and flushing (sync group commit, async thread)."""
from __future__ import annotations

import threading
import time
from pathlib import Path

from store_testlib import msg, small_config
from sluice.store import GetMessageStatus as S
from sluice.store import MessageStore

HOUR = 3600.0


def test_retention_deletes_old_segments_and_moves_min_offsets(store_dir: Path) -> None:
    cfg = small_config(retention_hours=1.0, consumequeue_units_per_file=16)
    with MessageStore(store_dir, cfg) as s:
        res = [s.put_message(msg(body=bytes(40_000), KEYS=f"k{i}")) for i in range(100)]
        s.wait_dispatched()
        s.flusher.flush()
        segs = len(s.commitlog.segments())
        assert segs >= 4
        now = res[-1].store_timestamp / 1000
        assert s.delete_expired_files(now=now).commitlog_files == []  # nothing is an hour old yet
        out = s.delete_expired_files(now=now + 2 * HOUR)
        assert len(out.commitlog_files) == segs - 1  # never the segment being written
        assert len(s.commitlog.segments()) == 1
        new_min = s.commitlog.min_offset
        first_kept = next(r for r in res if r.commitlog_offset >= new_min)
        assert s.get_min_offset("T", 0) == first_kept.queue_offset
        assert out.consumequeue_files >= 1
        r = s.get_messages("T", 0, 0)
        assert (r.status, r.next_begin_offset) == (S.OFFSET_TOO_SMALL, first_kept.queue_offset)
        r = s.get_messages("T", 0, first_kept.queue_offset, 4)
        assert r.status is S.FOUND and r.commitlog_offsets[0] == first_kept.commitlog_offset
        assert s.get_message_by_offset(res[0].commitlog_offset) is None
        assert s.query_messages_by_key("T", "k0") == []
        assert s.get_earliest_message_time() == first_kept.store_timestamp
        assert s.check().ok
    with MessageStore(store_dir, cfg) as s:  # the moved minimum survives a restart
        assert s.get_min_offset("T", 0) == first_kept.queue_offset and s.get_max_offset("T", 0) == 100
        assert s.put_message(msg()).queue_offset == 100


def test_retention_never_runs_ahead_of_dispatch_or_flush(store_dir: Path) -> None:
    with MessageStore(store_dir, small_config(retention_hours=0.0)) as s:
        for _ in range(60):
            s.put_message(msg(body=bytes(40_000)))
        s.flusher.flushed_offset = 0  # pretend nothing is durable yet
        assert s.delete_expired_files(now=time.time() + HOUR).commitlog_files == []


def test_sync_flush_group_commit(store_dir: Path) -> None:
    with MessageStore(store_dir, small_config(flush_mode="sync")) as s:
        fsyncs0 = s.flusher.fsyncs
        n_threads, per = 16, 20
        acked: list[int] = []

        def work() -> None:
            for _ in range(per):
                r = s.put_message(msg(body=bytes(200)))
                assert s.flusher.flushed_offset >= r.commitlog_offset + r.size  # durable before the ack
                acked.append(r.commitlog_offset)

        ts = [threading.Thread(target=work) for _ in range(n_threads)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        assert len(acked) == n_threads * per
        # Writers that wait together share fsyncs (not a timing assertion: a bound that holds by design).
        assert s.flusher.fsyncs - fsyncs0 <= len(acked)
        assert s.stats()["fsyncs"] >= 1


def test_async_flush_thread_catches_up(store_dir: Path) -> None:
    with MessageStore(store_dir, small_config(flush_mode="async", flush_interval_ms=20)) as s:
        r = s.put_message(msg())
        deadline = time.monotonic() + 5
        while s.flusher.flushed_offset < r.commitlog_offset + r.size and time.monotonic() < deadline:
            time.sleep(0.01)
        assert s.flusher.flushed_offset >= r.commitlog_offset + r.size


def test_checkpoint_written_periodically(store_dir: Path) -> None:
    from sluice.store.checkpoint import load_checkpoint

    with MessageStore(store_dir, small_config(checkpoint_interval_ms=20, flush_interval_ms=20)) as s:
        r = s.put_message(msg())
        end = r.commitlog_offset + r.size
        deadline = time.monotonic() + 5
        cp = None
        while time.monotonic() < deadline:
            cp = load_checkpoint(store_dir / "checkpoint")
            if cp and cp.commitlog_offset >= end and cp.dispatch_offset >= end:
                break
            time.sleep(0.02)
        assert cp and cp.commitlog_offset >= end and cp.dispatch_offset >= end
        assert (store_dir / "abort").exists()
    assert not (store_dir / "abort").exists()


def test_sync_flush_timeout_reports_the_stored_messages(store_dir: Path, monkeypatch) -> None:
    import os

    import pytest

    from sluice.errors import FlushDiskTimeoutError

    with MessageStore(store_dir, small_config(flush_mode="sync", sync_flush_timeout_s=0.2)) as s:
        real = os.fdatasync
        gate = threading.Event()

        def slow(fd: int) -> None:  # a disk that stalls: fsync takes longer than the timeout
            gate.wait(5)
            real(fd)

        monkeypatch.setattr(os, "fdatasync", slow)
        first: list[BaseException] = []

        def put_first() -> None:  # becomes the group-commit leader; its fsync stalls
            try:
                s.put_message(msg())
            except FlushDiskTimeoutError as e:
                first.append(e)

        leader = threading.Thread(target=put_first)
        leader.start()
        time.sleep(0.05)
        with pytest.raises(FlushDiskTimeoutError) as ei:
            s.put_message(msg(body=b"late"))
        assert ei.value.code == 10 and ei.value.results[0].queue_offset == 1
        gate.set()
        leader.join()
        assert first == []  # the leader waits for its own fsync, however long it takes
        monkeypatch.setattr(os, "fdatasync", real)
        assert s.get_message_by_offset(ei.value.results[0].commitlog_offset).body == b"late"
