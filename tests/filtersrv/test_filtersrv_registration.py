"""302 in detail: uploads refused by default and accepted when on, a new CRC replacing the class, one load
for concurrent registrations, conflicting classes in one group, the ACL on uploads, and repository classes
reloaded when their file changes."""
from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from filtersrv_support import CLASSES, FsRpc, crc, numbers, start_filtersrv
from servers import SluiceProcess, wait_for

from sluice.acl.signature import Credentials, sign_fields
from sluice.protocol.codes import RequestCode, ResponseCode
from sluice.protocol.command import RemotingCommand

EVENS = CLASSES["evens"].encode()
ODDS = EVENS.replace(b"== 0", b"== 1")


@pytest.fixture(scope="module")
def uploads_fs(fs_setup) -> Iterator[SluiceProcess]:
    fs = start_filtersrv(fs_setup.tmp, fs_setup.broker, "--uploads", name="fs-uploads")
    try:
        yield fs
    finally:
        fs.stop()


def _topic(s, name: str, count: int = 6) -> str:
    for n in range(count):
        s.rpc.send(name, n)
    return name


def test_uploads_are_refused_by_default(fs_setup) -> None:
    s = fs_setup
    resp = s.rpc.register(s.fs.addr, "G-up", "FsUp", "evens:Even", EVENS)
    assert resp.code == ResponseCode.NO_PERMISSION
    assert "uploads are refused" in resp.remark and "filter_class_repository" in resp.remark


def test_an_uploaded_class_filters_and_a_new_crc_replaces_it(fs_setup, uploads_fs: SluiceProcess) -> None:
    s, fs = fs_setup, uploads_fs.addr
    topic = _topic(s, "FsUpload")
    assert s.rpc.register(fs, "G-up", topic, "evens:Even", EVENS).code == ResponseCode.SUCCESS
    assert numbers(s.rpc.drain(fs, "G-up", topic)) == [0, 2, 4]
    assert s.rpc.register(fs, "G-up", topic, "evens:Even", ODDS).code == ResponseCode.SUCCESS
    assert numbers(s.rpc.drain(fs, "G-up", topic)) == [1, 3, 5]
    bad = s.rpc.register(fs, "G-up", topic, "evens:Even", EVENS, class_crc=12345)
    assert bad.code == ResponseCode.SUBSCRIPTION_PARSE_FAILED and "classCRC 12345" in bad.remark
    none = s.rpc.register(fs, "G-none", topic, "evens:Even")  # no source, and this server has no repository
    assert none.code == ResponseCode.FILTER_DATA_NOT_EXIST and "no class repository" in none.remark


def test_concurrent_registrations_of_one_class_load_it_once(fs_setup, uploads_fs: SluiceProcess,
                                                            tmp_path: Path) -> None:
    s, fs = fs_setup, uploads_fs.addr
    marker = tmp_path / "loads.txt"
    source = (f"open({str(marker)!r}, 'a').write('loaded\\n')\n" + CLASSES["evens"]).encode()
    answers: list[int] = []
    clients = [FsRpc(s.broker) for _ in range(5)]  # five members of the group, one connection each
    try:
        threads = [threading.Thread(target=lambda c=c: answers.append(
            c.register(fs, "G-once", "FsOnce", "counted:Even", source).code)) for c in clients]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    finally:
        for c in clients:
            c.close()
    assert answers == [ResponseCode.SUCCESS] * 5
    assert marker.read_text() == "loaded\n"


def test_members_registering_different_classes_conflict(fs_setup) -> None:
    s = fs_setup
    topic = _topic(s, "FsConflict")
    first, second = FsRpc(s.broker), FsRpc(s.broker)
    try:
        assert first.register(s.fs.addr, "G-conf", topic, "evens:Even").code == ResponseCode.SUCCESS
        resp = second.register(s.fs.addr, "G-conf", topic, "tagged:RedOnly")
        assert resp.code == ResponseCode.SUBSCRIPTION_NOT_LATEST
        assert "conflict" in resp.remark and "'evens:Even'" in resp.remark and "'tagged:RedOnly'" in resp.remark
        assert numbers(second.drain(s.fs.addr, "G-conf", topic)) == [0, 2, 4]  # the group's class still serves
        # the same member changing its class is no conflict
        assert first.register(s.fs.addr, "G-conf", topic, "nothing:Nothing").code == ResponseCode.SUCCESS
        assert first.register(s.fs.addr, "G-conf", topic, "evens:Even").code == ResponseCode.SUCCESS
    finally:
        first.close()
    # the holder left: the other member's class takes over
    wait_for(lambda: second.register(s.fs.addr, "G-conf", topic, "tagged:RedOnly").code == ResponseCode.SUCCESS,
             10, "the class replaced once its holder disconnected")
    second.close()


def test_a_changed_repository_file_reloads_the_class(fs_setup) -> None:
    s = fs_setup
    topic = _topic(s, "FsReload")
    (s.repo / "flip.py").write_bytes(EVENS)
    assert s.rpc.register(s.fs.addr, "G-flip", topic, "flip:Even").code == ResponseCode.SUCCESS
    assert numbers(s.rpc.drain(s.fs.addr, "G-flip", topic)) == [0, 2, 4]
    (s.repo / "flip.py").write_bytes(ODDS)  # the fixture's server re-reads every second
    wait_for(lambda: numbers(s.rpc.drain(s.fs.addr, "G-flip", topic)) == [1, 3, 5], 20,
             "the class reloaded from the changed file")


ACL = """\
accounts:
  - accessKey: fsuser
    secretKey: user-secret-1
    admin: false
    defaultTopicPerm: SUB
    defaultGroupPerm: SUB
  - accessKey: fsadmin
    secretKey: admin-secret-1
    admin: true
"""


def _signed_register(rpc: FsRpc, fs: str, who: Credentials | None, source: bytes) -> RemotingCommand:
    fields = {"consumerGroup": "G-acl", "topic": "FsAcl", "className": "evens:Even", "classCRC": str(crc(source))}
    if who is not None:
        sign_fields(who, fields, source)
    return rpc.client.invoke(fs, RemotingCommand.request(RequestCode.REGISTER_MESSAGE_FILTER_CLASS, fields,
                                                         source), 20)


def test_with_acl_only_an_admin_account_uploads(fs_setup, tmp_path: Path) -> None:
    s = fs_setup
    (tmp_path / "plain_acl.yml").write_text(ACL)
    fs = start_filtersrv(tmp_path, s.broker, "--uploads", "--acl", str(tmp_path / "plain_acl.yml"),
                         "--repository", str(s.repo), name="fs-acl")
    try:
        unsigned = _signed_register(s.rpc, fs.addr, None, EVENS)
        assert unsigned.code == ResponseCode.NO_PERMISSION and "no AccessKey" in unsigned.remark
        user = _signed_register(s.rpc, fs.addr, Credentials("fsuser", "user-secret-1"), EVENS)
        assert user.code == ResponseCode.NO_PERMISSION and "Need admin permission" in user.remark
        from_repo = _signed_register(s.rpc, fs.addr, Credentials("fsuser", "user-secret-1"), b"")
        assert from_repo.code == ResponseCode.SUCCESS, from_repo.remark  # no upload: SUB is enough
        admin = _signed_register(s.rpc, fs.addr, Credentials("fsadmin", "admin-secret-1"), EVENS)
        assert admin.code == ResponseCode.SUCCESS, admin.remark
    finally:
        fs.stop()
