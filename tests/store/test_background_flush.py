"""store/background_flush.py: the fsync thread (C's Syncer and its reference PySyncer, held equal) and
BackgroundFlush over a real synchronous-flush store."""
from __future__ import annotations

import errno
import os
import select
import tempfile
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.errors import FlushDiskTimeoutError
from sluice.speedups import C
from sluice.store import MessageStore, StoreConfig, StoreMessage
from sluice.store.background_flush import MAX_FDS, BackgroundFlush, PySyncer

KINDS = ["python", pytest.param("c", marks=pytest.mark.skipif(C is None, reason="sluice._speedups is not built"))]


def _make(kind: str, efd: int):
    return C.Syncer(efd) if kind == "c" else PySyncer(efd)


def _eventfd() -> int:
    return os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)


def _await_round(efd: int, timeout: float = 10.0) -> int:
    """Wait for the eventfd to be readable and read it: the rounds reported since the last read."""
    r, _, _ = select.select([efd], [], [], timeout)
    assert r, "no round reported"
    return os.eventfd_read(efd)


@pytest.fixture
def data_fd(tmp_path: Path):
    fd = os.open(tmp_path / "data", os.O_RDWR | os.O_CREAT, 0o644)
    os.write(fd, b"x" * 4096)
    yield fd
    os.close(fd)


@pytest.mark.parametrize("kind", KINDS)
def test_a_round_syncs_and_reports(kind: str, data_fd: int) -> None:
    efd = _eventfd()
    s = _make(kind, efd)
    try:
        assert (s.done, s.rounds, s.take_error()) == (0, 0, None)
        s.request(100, (data_fd,))
        assert _await_round(efd) == 1
        assert (s.done, s.rounds, s.take_error()) == (100, 1, None)
        assert s.sync_ns > 0  # the time the round spent in fdatasync
        s.request(100, (data_fd,))  # not above the highest request: ignored, no round
        s.request(50, (data_fd,))
        assert not select.select([efd], [], [], 0.2)[0]
        assert s.rounds == 1
    finally:
        s.close()
        os.close(efd)


@pytest.mark.parametrize("kind", KINDS)
def test_a_failed_round_is_reported_once_and_does_not_advance(kind: str, data_fd: int) -> None:
    efd = _eventfd()
    r, w = os.pipe()  # fdatasync on a pipe fails with EINVAL
    s = _make(kind, efd)
    try:
        s.request(10, (data_fd,))
        _await_round(efd)
        s.request(20, (data_fd, r))
        _await_round(efd)
        assert s.done == 10
        assert s.take_error() == (20, errno.EINVAL)
        assert s.take_error() is None
        s.request(30, (data_fd,))  # the next round goes on
        _await_round(efd)
        assert (s.done, s.rounds, s.take_error()) == (30, 3, None)
    finally:
        s.close()
        for fd in (efd, r, w):
            os.close(fd)


@pytest.mark.parametrize("kind", KINDS)
def test_files_are_held_by_duplicates_and_close_finishes_what_was_asked(kind: str, tmp_path: Path) -> None:
    efd = _eventfd()
    s = _make(kind, efd)
    fd = os.open(tmp_path / "f", os.O_RDWR | os.O_CREAT, 0o644)
    before = len(os.listdir("/proc/self/fd"))
    s.request(5, (fd,))
    os.close(fd)  # the syncer's duplicate stays valid
    s.close()  # joins only after the round asked for
    assert (s.done, s.take_error()) == (5, None)
    assert os.eventfd_read(efd) == 1
    assert len(os.listdir("/proc/self/fd")) == before - 1  # its duplicate closed too
    with pytest.raises(ValueError, match="closed"):
        s.request(6, ())
    s.close()  # twice is fine
    os.close(efd)


@pytest.mark.parametrize("kind", KINDS)
def test_bad_requests_are_refused_precisely(kind: str, data_fd: int) -> None:
    efd = _eventfd()
    s = _make(kind, efd)
    try:
        with pytest.raises(ValueError, match=f"at most {MAX_FDS} files"):
            s.request(1, (data_fd,) * (MAX_FDS + 1))
        with pytest.raises(OSError) as e:
            s.request(1, (-1,))
        assert e.value.errno == errno.EBADF
        not_open = 1 << 20  # above any descriptor limit
        with pytest.raises(OSError) as e:
            s.request(1, (data_fd, not_open))
        assert e.value.errno == errno.EBADF
        with pytest.raises(TypeError):
            s.request(1, [data_fd])
        assert s.rounds == 0  # nothing refused was asked for
        s.request(1, ())  # no files: a round that syncs nothing
        _await_round(efd)
        assert s.done == 1
    finally:
        s.close()
        os.close(efd)


@pytest.mark.skipif(C is None, reason="sluice._speedups is not built")
@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(-5, 60), st.booleans()), min_size=1, max_size=12))
def test_c_syncer_equals_python(ops: list[tuple[int, bool]]) -> None:
    """The same requests (offsets up and down, some naming a file fdatasync refuses) leave both in the same
    state after each round."""
    with tempfile.TemporaryDirectory() as tmp:
        fd = os.open(Path(tmp) / "d", os.O_RDWR | os.O_CREAT, 0o644)
        r, w = os.pipe()
        efds = [_eventfd(), _eventfd()]
        pair = [C.Syncer(efds[0]), PySyncer(efds[1])]
        try:
            highest = 0
            for want, bad in ops:
                for s in pair:
                    s.request(want, (fd, r) if bad else (fd,))
                if want > highest:
                    highest = want
                    for e in efds:
                        _await_round(e)
                states = [(s.done, s.rounds, s.take_error()) for s in pair]
                assert states[0] == states[1]
        finally:
            for s in pair:
                s.close()
            for x in (fd, r, w, *efds):
                os.close(x)


# ---------------------------------------------------------------------------------------- BackgroundFlush

def _store(root: Path, file_size: int = 1 << 20) -> MessageStore:
    store = MessageStore(root, StoreConfig(flush_mode="sync", commitlog_file_size=file_size, max_message_size=1024))
    store.start()
    return store


def _append(store: MessageStore, n: int, size: int = 100) -> int:
    res = store.put_messages([StoreMessage("T", b"m" * size, 0, {}) for _ in range(n)], wait_durable=False)
    return res[-1].commitlog_offset + res[-1].size


@pytest.mark.parametrize("use_c", [False, pytest.param(True, marks=pytest.mark.skipif(C is None, reason="no C"))])
def test_background_flush_reports_rounds_to_the_flush_service(tmp_path: Path, use_c: bool) -> None:
    store = _store(tmp_path)
    bf = BackgroundFlush(store.flusher, use_c=use_c)
    try:
        end = _append(store, 3)
        fsyncs = store.flusher.fsyncs
        assert store.flusher.flushed_offset < end
        assert bf.request() is True
        _await_round_fd(bf)
        durable, errors = bf.collect()
        assert errors == [] and durable == end == store.flusher.flushed_offset
        assert store.flusher.flush_time == store.commitlog.last_store_timestamp
        assert store.flusher.fsyncs == fsyncs + 1 and bf.rounds == 1
        assert bf.request() is False  # nothing new: durable already, no round
        assert bf.collect() == (end, [])
    finally:
        bf.close()
        bf.release()
        store.close()


def _await_round_fd(bf: BackgroundFlush, rounds: int | None = None) -> None:
    """Wait until the eventfd is readable and the thread ran ``rounds`` rounds (default: any)."""
    deadline = time.monotonic() + 10.0
    while not select.select([bf.fileno()], [], [], 0.05)[0] or (rounds is not None and bf.rounds < rounds):
        assert time.monotonic() < deadline, "no round reported"


@pytest.mark.parametrize("use_c", [False, pytest.param(True, marks=pytest.mark.skipif(C is None, reason="no C"))])
def test_a_round_across_a_segment_end_syncs_both_files(tmp_path: Path, use_c: bool, monkeypatch) -> None:
    store = _store(tmp_path, file_size=128 * 1024)
    bf = BackgroundFlush(store.flusher, use_c=use_c)
    seen: list[tuple[int, tuple[int, ...]]] = []
    real = BackgroundFlush._fds

    def spy(self: BackgroundFlush, start: int, end: int) -> tuple[int, ...]:
        fds = real(self, start, end)
        seen.append((end, fds))
        return fds

    monkeypatch.setattr(BackgroundFlush, "_fds", spy)
    try:
        _append(store, 120, 1000)  # 120 KiB of the 128 KiB segment
        end = _append(store, 30, 1000)  # rolls into the second segment
        assert len(store.commitlog.segments()) == 2
        assert bf.request()
        _await_round_fd(bf)
        assert bf.collect() == (end, [])
        assert seen == [(end, tuple(f._fd for f in store.commitlog.segments()))]
    finally:
        bf.close()
        bf.release()
        store.close()


@pytest.mark.parametrize("use_c", [False, pytest.param(True, marks=pytest.mark.skipif(C is None, reason="no C"))])
def test_a_failed_round_is_an_error_for_its_offset_even_after_a_later_success(tmp_path: Path, use_c: bool,
                                                                              monkeypatch) -> None:
    store = _store(tmp_path)
    bf = BackgroundFlush(store.flusher, use_c=use_c)
    r, w = os.pipe()
    real = BackgroundFlush._fds
    monkeypatch.setattr(BackgroundFlush, "_fds", lambda self, start, end: (r,))
    try:
        first = _append(store, 2)
        assert bf.request()
        _await_round_fd(bf)
        monkeypatch.setattr(BackgroundFlush, "_fds", real)
        second = _append(store, 2)
        assert bf.request()
        _await_round_fd(bf, rounds=2)
        durable, errors = bf.collect()
        assert durable == second
        [(upto, err)] = errors
        assert upto == first and isinstance(err, FlushDiskTimeoutError)
        assert "fsync failed" in str(err) and os.strerror(errno.EINVAL) in str(err)
        assert bf.collect()[1] == []  # reported once
    finally:
        bf.close()
        bf.release()
        store.close()
        os.close(r)
        os.close(w)


@pytest.mark.parametrize("use_c", [False, pytest.param(True, marks=pytest.mark.skipif(C is None, reason="no C"))])
def test_a_backlog_over_more_segments_than_a_round_takes_is_flushed_first(tmp_path: Path, use_c: bool) -> None:
    store = _store(tmp_path, file_size=128 * 1024)
    bf = BackgroundFlush(store.flusher, use_c=use_c)
    try:
        for _ in range(MAX_FDS + 2):
            end = _append(store, 100, 1000)  # about 100 KiB: a segment each
        assert len(store.commitlog.segments()) > MAX_FDS
        fsyncs = store.flusher.fsyncs
        assert bf.request()
        assert store.flusher.flushed_offset == end  # flushed synchronously, all segments
        _await_round_fd(bf)
        assert bf.collect() == (end, [])
        assert store.flusher.fsyncs == fsyncs + 2  # the synchronous flush, and the (empty) round
    finally:
        bf.close()
        bf.release()
        store.close()


@pytest.mark.skipif(C is None, reason="sluice._speedups is not built")
def test_the_c_thread_is_named_and_blocks_every_signal() -> None:
    """Signals go to the interpreter's threads, never to the fsync thread."""
    efd = _eventfd()
    s = C.Syncer(efd)
    try:
        tasks = Path("/proc/self/task")
        if not tasks.is_dir():
            pytest.skip("no /proc")
        mine = [t for t in tasks.iterdir() if (t / "comm").read_text().strip() == "sluice-fsync"]
        assert len(mine) == 1
        blocked = next(line for line in (mine[0] / "status").read_text().splitlines() if line.startswith("SigBlk:"))
        mask = int(blocked.split()[1], 16)
        assert mask & 0x7FFFFFFF == 0x7FFFFFFF & ~((1 << 8) | (1 << 18))  # all but SIGKILL (9) and SIGSTOP (19)
    finally:
        s.close()
        os.close(efd)


@pytest.mark.parametrize("use_c", [False, pytest.param(True, marks=pytest.mark.skipif(C is None, reason="no C"))])
def test_a_segment_closed_while_a_round_is_asked_for_is_looked_up_again(tmp_path: Path, use_c: bool,
                                                                        monkeypatch) -> None:
    store = _store(tmp_path)
    bf = BackgroundFlush(store.flusher, use_c=use_c)
    real = BackgroundFlush._fds
    calls = []

    def fds(self: BackgroundFlush, start: int, end: int) -> tuple[int, ...]:
        calls.append(end)
        return (1 << 20,) if len(calls) == 1 else real(self, start, end)  # first: a descriptor closed meanwhile

    monkeypatch.setattr(BackgroundFlush, "_fds", fds)
    try:
        end = _append(store, 3)
        assert bf.request()
        _await_round_fd(bf)
        assert bf.collect() == (end, [])
        assert calls == [end, end]
    finally:
        bf.close()
        bf.release()
        store.close()
