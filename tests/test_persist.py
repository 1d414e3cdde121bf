"""sluice.persist.write_atomic: the target is replaced whole, durably, and a failure leaves it as it was."""
from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from sluice import persist
from sluice.persist import read_json, write_atomic, write_json_atomic


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
