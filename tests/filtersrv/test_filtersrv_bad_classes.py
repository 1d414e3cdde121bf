"""Filter classes that fail — to load, by raising, by hanging, spinning, hoarding memory — each answered
with a precise error naming the class and the cause, the worker killed and replaced, the group's offset
not moved past unfiltered messages, and another group on the same filter server unaffected."""
from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from filtersrv_support import FLAG_CLASS_FILTER, FLAG_COMMIT_OFFSET, FsRpc, numbers, start_filtersrv

from sluice.errors import SluiceError
from sluice.protocol.codes import ResponseCode


def _workers(pid: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmd = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if int(stat.rpartition(")")[2].split()[1]) == pid and b"sluice.filtersrv.worker" in cmd:
            out.append(int(entry.name))
    return out


def _good_group_still_served(s, topic: str) -> None:
    group = f"G-good-{topic}"
    assert s.rpc.register(s.fs.addr, group, topic, "evens:Even").code == ResponseCode.SUCCESS
    assert numbers(s.rpc.drain(s.fs.addr, group, topic)) == [0, 2, 4]


def _topic(s, name: str) -> str:
    for n in range(5):
        s.rpc.send(name, n)
    return name


@pytest.mark.parametrize("class_name, cause", [
    ("broken_import:Anything", "ModuleNotFoundError: No module named 'a_module_that_does_not_exist'"),
    ("not_a_filter:Plain", "not a subclass of sluice.filter.MessageFilter"),
    ("evens:NoSuchClass", "defines no NoSuchClass"),
])
def test_a_class_that_does_not_load_is_refused_with_its_cause(fs_setup, class_name: str, cause: str) -> None:
    s = fs_setup
    topic = _topic(s, "FsBadImport" + class_name.split(":")[0])
    resp = s.rpc.register(s.fs.addr, "G-bad-import", topic, class_name)
    assert resp.code == ResponseCode.SUBSCRIPTION_PARSE_FAILED
    assert class_name in resp.remark and cause in resp.remark
    pull = s.rpc.pull(s.fs.addr, "G-bad-import", topic, 0)  # the same error, not a silent delivery
    assert pull.code == ResponseCode.SUBSCRIPTION_PARSE_FAILED and cause in pull.remark
    _good_group_still_served(s, topic)


def test_a_class_missing_from_the_repository_is_not_found(fs_setup) -> None:
    s = fs_setup
    resp = s.rpc.register(s.fs.addr, "G-missing", "FsMissing", "missing_module:Cls")
    assert resp.code == ResponseCode.FILTER_DATA_NOT_EXIST
    assert "missing_module:Cls" in resp.remark and "missing_module.py does not exist" in resp.remark
    bad = s.rpc.register(s.fs.addr, "G-missing", "FsMissing", "not a class name")
    assert bad.code == ResponseCode.SUBSCRIPTION_PARSE_FAILED and "module:ClassName" in bad.remark


def _fails_and_recovers(s, topic: str, class_name: str, cause: str, *, first_failure: bool = True) -> None:
    group = f"G-{class_name.replace(':', '-')}"
    assert s.rpc.register(s.fs.addr, group, topic, class_name).code == ResponseCode.SUCCESS

    def pull():
        resp = s.rpc.pull(s.fs.addr, group, topic, 0, flags=FLAG_CLASS_FILTER | FLAG_COMMIT_OFFSET, commit_offset=0)
        assert resp.code == ResponseCode.SYSTEM_ERROR, (resp.code, resp.remark)
        assert class_name in resp.remark and cause in resp.remark, resp.remark
        assert "nextBeginOffset" not in resp.ext_fields  # the consumer pulls the same offset again
        return resp.remark
    # the worker is killed; within the pause that follows a failure the last error is answered at once,
    # after it a fresh worker runs the batch (and fails the same way: the pause doubles)
    remarks = [pull() for _ in range(2)]
    time.sleep(1.2)
    remarks.append(pull())
    if first_failure:  # fails, paused for 1 s, then a fresh worker fails again
        assert [("time(s) in a row" in r) for r in remarks] == [False, True, False], remarks
        assert "failed 1 time(s) in a row" in remarks[1]
    assert s.rpc.committed(group, topic) == 0
    assert len(_workers(s.fs.pid)) <= len(s.live_classes) + 2  # no failed worker left behind


@pytest.mark.parametrize("class_name, cause", [
    ("raises:Boom", "RuntimeError: boom at n=0"),
    ("hog:Hog", "MemoryError: exceeded the worker's address-space limit"),
])
def test_a_class_that_fails_on_a_batch_is_reported_and_replaced(fs_setup, class_name: str, cause: str) -> None:
    s = fs_setup
    topic = _topic(s, f"FsFail{class_name.split(':')[1]}")
    _fails_and_recovers(s, topic, class_name, cause)
    _good_group_still_served(s, topic)


@pytest.mark.slow
def test_a_hanging_class_misses_its_deadline_while_other_groups_are_served(fs_setup) -> None:
    s = fs_setup
    topic = _topic(s, "FsHang")
    assert s.rpc.register(s.fs.addr, "G-hang", topic, "hangs:Sleeper").code == ResponseCode.SUCCESS
    answers = []
    other = FsRpc(s.broker)
    t = threading.Thread(target=lambda: answers.append(other.pull(s.fs.addr, "G-hang", topic, 0)))
    t.start()
    try:
        _good_group_still_served(s, topic)  # while the hanging batch waits for its deadline
    finally:
        t.join(30)
        other.close()
    assert answers and answers[0].code == ResponseCode.SYSTEM_ERROR
    assert "hangs:Sleeper" in answers[0].remark and "exceeded the 3 s deadline" in answers[0].remark
    _fails_and_recovers(s, topic, "hangs:Sleeper", "deadline", first_failure=False)


@pytest.mark.slow
def test_a_spinning_class_hits_its_cpu_limit(fs_setup, tmp_path: Path) -> None:
    s = fs_setup
    fs = start_filtersrv(tmp_path, s.broker, "--repository", str(s.repo), "--worker-cpu-seconds", "1",
                         "--batch-deadline-ms", "60000", name="fs-cpu")
    try:
        topic = _topic(s, "FsSpin")
        assert s.rpc.register(fs.addr, "G-spin", topic, "spins:Spinner").code == ResponseCode.SUCCESS
        resp = s.rpc.pull(fs.addr, "G-spin", topic, 0, timeout=60)
        assert resp.code == ResponseCode.SYSTEM_ERROR
        assert "spins:Spinner" in resp.remark and "exceeded its CPU limit (1 s per batch)" in resp.remark
    finally:
        fs.stop()


@pytest.mark.slow
def test_a_killed_filter_server_leaves_no_worker_behind(fs_setup, tmp_path: Path) -> None:
    s = fs_setup
    fs = start_filtersrv(tmp_path, s.broker, "--repository", str(s.repo), "--batch-deadline-ms", "60000",
                         name="fs-killed")
    topic = _topic(s, "FsOrphan")
    other = FsRpc(s.broker)
    try:
        assert other.register(fs.addr, "G-orphan", topic, "hangs:Sleeper").code == ResponseCode.SUCCESS
        failed: list[Exception] = []

        def pull() -> None:
            try:
                other.pull(fs.addr, "G-orphan", topic, 0, timeout=5)
            except SluiceError as exc:  # the filter server is killed under it
                failed.append(exc)
        t = threading.Thread(target=pull, daemon=True)
        t.start()  # the worker now sleeps inside the class
        workers = _wait_workers(fs.pid)
        fs.kill()
        deadline = time.monotonic() + 15
        while any(Path(f"/proc/{w}").exists() and _is_worker(w) for w in workers) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(Path(f"/proc/{w}").exists() and _is_worker(w) for w in workers)
        t.join(10)
        assert failed and "closed" in str(failed[0])
    finally:
        other.close()
        fs.stop()


def _wait_workers(pid: int) -> list[int]:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        found = _workers(pid)
        if found:
            return found
        time.sleep(0.1)
    raise AssertionError("no worker started")


def _is_worker(pid: int) -> bool:
    try:
        return b"sluice.filtersrv.worker" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
