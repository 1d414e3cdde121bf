"""sluice.persist.write_atomic: the target is replaced whole, durably, and a failure leaves it as it was."""
from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from sluice import persist
from sluice.persist import JsonSaver, read_json, write_atomic, write_json_atomic


def test_the_target_is_replaced_whole_and_no_temp_file_is_left(tmp_path: Path) -> None:
    target = tmp_path / "doc"
    target.write_bytes(b"old content that is longer than the new one")
    write_atomic(target, b"new")
    assert target.read_bytes() == b"new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["doc"]
    write_atomic(tmp_path / "fresh", memoryview(b"made"))  # a new file, from any bytes-like object
    assert (tmp_path / "fresh").read_bytes() == b"made"


def test_the_file_then_the_directory_are_fsynced_around_the_rename(tmp_path: Path, monkeypatch) -> None:
    events: list[str] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        events.append("fsync dir" if os.path.isdir(f"/proc/self/fd/{fd}") else "fsync file")
        real_fsync(fd)

    def replace(a, b) -> None:  # type: ignore[no-untyped-def]
        events.append("replace")
        real_replace(a, b)

    monkeypatch.setattr(persist.os, "fsync", fsync)
    monkeypatch.setattr(persist.os, "replace", replace)
    write_atomic(tmp_path / "doc", b"x")
    assert events == ["fsync file", "replace", "fsync dir"]


class Boom(Exception):
    pass


def test_a_failure_mid_write_leaves_the_old_file_intact(tmp_path: Path, monkeypatch) -> None:
    target = tmp_path / "doc"
    target.write_bytes(b"old")

    def failing_fsync(fd: int) -> None:
        raise Boom("disk full")

    monkeypatch.setattr(persist.os, "fsync", failing_fsync)
    with pytest.raises(Boom):
        write_atomic(target, b"new" * 1000)
    assert target.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["doc"]  # the temp file is gone too


def test_a_failed_rename_leaves_the_old_file_and_no_temp_file(tmp_path: Path) -> None:
    target = tmp_path / "dir-in-the-way"
    (target / "child").mkdir(parents=True)  # os.replace cannot put a file over a non-empty directory
    with pytest.raises(OSError):
        write_atomic(target, b"new")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dir-in-the-way"]


def test_concurrent_writers_of_one_file_do_not_share_a_temp_file(tmp_path: Path) -> None:
    target = tmp_path / "doc"
    errors: list[BaseException] = []

    def work(i: int) -> None:
        try:
            for _ in range(50):
                write_atomic(target, bytes([i]) * 4096)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    data = target.read_bytes()
    assert len(data) == 4096 and len(set(data)) == 1  # one writer's whole content
    assert sorted(p.name for p in tmp_path.iterdir()) == ["doc"]


def test_json_documents_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "offsets.json"
    write_json_atomic(path, {"offsetTable": {"T@G": {0: 5}}})
    assert read_json(path) == {"offsetTable": {"T@G": {"0": 5}}}
    path.write_bytes(b"{not json")
    assert read_json(path, default={}) == {}
    assert (tmp_path / "sub" / "offsets.json.bad").exists()


# ------------------------------------------------------------------------------------------ JsonSaver

class _Table:
    """A dict behind an RLock, as the broker's topic and group tables keep theirs."""

    def __init__(self, path: Path, delay_s: float = 0.0) -> None:
        self.lock = threading.RLock()
        self.data: dict[str, int] = {}
        self.gate = threading.Event()
        self.gate.set()
        self.saver = JsonSaver(path, self.snapshot, self.lock, "test-saver", delay_s=delay_s)

    def snapshot(self) -> dict[str, int]:
        self.gate.wait(10)
        with self.lock:
            return dict(self.data)

    def put(self, key: str, value: int, *, soon: bool) -> None:
        with self.lock:
            self.data[key] = value
            self.saver.soon() if soon else self.saver.now()


def test_saver_now_writes_before_returning(tmp_path: Path) -> None:
    t = _Table(tmp_path / "t.json")
    t.put("a", 1, soon=False)
    assert read_json(tmp_path / "t.json") == {"a": 1}


def test_saver_soon_returns_before_writing_and_flush_writes(tmp_path: Path) -> None:
    t = _Table(tmp_path / "t.json")
    t.gate.clear()  # the background write cannot take its snapshot yet
    t.put("a", 1, soon=True)  # returns although nothing can be written
    assert not (tmp_path / "t.json").exists()
    t.gate.set()
    t.saver.flush()
    assert read_json(tmp_path / "t.json") == {"a": 1}


def test_saver_soon_waits_its_delay_and_writes_a_burst_once(tmp_path: Path) -> None:
    # The heartbeat's case: a group and its retry topic auto-created, then more requests; the write comes
    # after them, one for the burst, so its Python steps do not take the GIL from the loop mid-request.
    target = tmp_path / "t.json"
    t = _Table(target, delay_s=1.0)
    t.put("group", 1, soon=True)
    t.put("retry", 2, soon=True)
    t.put("group", 3, soon=True)
    time.sleep(0.2)
    assert not target.exists() and t.saver._taken == 0  # resting
    deadline = time.monotonic() + 10
    while not target.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert read_json(target) == {"group": 3, "retry": 2}
    assert t.saver._taken == 1  # one snapshot, one write for the three changes


def test_saver_flush_writes_a_change_still_resting(tmp_path: Path) -> None:
    target = tmp_path / "t.json"
    t = _Table(target, delay_s=30.0)
    t.put("a", 1, soon=True)
    t.saver.flush()  # the broker's stop does not wait out the delay
    assert read_json(target) == {"a": 1}


def test_saver_thread_does_not_write_again_what_flush_wrote(tmp_path: Path) -> None:
    target = tmp_path / "t.json"
    t = _Table(target, delay_s=0.6)
    t.put("a", 1, soon=True)
    time.sleep(0.2)  # the thread took the change and rests
    t.saver.flush()
    taken = t.saver._taken
    time.sleep(1.0)  # its rest is over: it finds nothing pending
    assert t.saver._taken == taken and read_json(target) == {"a": 1}


def test_saver_ends_with_the_latest_state_under_mixed_writers(tmp_path: Path) -> None:
    t = _Table(tmp_path / "t.json")

    def writer(prefix: str, soon: bool) -> None:
        for i in range(200):
            t.put(f"{prefix}{i % 7}", i, soon=soon)

    threads = [threading.Thread(target=writer, args=(p, s)) for p, s in (("x", True), ("y", False), ("z", True))]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    t.saver.flush()
    assert read_json(tmp_path / "t.json") == t.data


def test_saver_background_failure_is_counted_and_the_next_change_writes(tmp_path: Path) -> None:
    target = tmp_path / "sub" / "t.json"
    t = _Table(target)
    (tmp_path / "sub").write_text("a file where the directory should be")
    t.put("a", 1, soon=True)
    deadline = time.monotonic() + 10
    while t.saver.failures == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert t.saver.failures == 1
    (tmp_path / "sub").unlink()
    t.put("b", 2, soon=False)
    assert read_json(target) == {"a": 1, "b": 2}
