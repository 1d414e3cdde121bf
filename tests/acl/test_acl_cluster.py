"""ACL end to end: real ``sluice namesrv`` / ``sluice broker`` subprocesses with ``--acl``, the SDK signing with
``credentials=``, ``sluice admin --access-key/--secret-key``."""
from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path

import pytest
from servers import SluiceProcess, broker_argv, running_cluster, wait_for, wait_for_route

import threading
import time

from sluice import ConsumeResult, Credentials, Message, Producer, PullConsumer, PushConsumer
from sluice.admin import ExitStatus, main
from sluice.errors import SluiceError
from sluice.namesrv.client import SyncNamesrvClient
from sluice.protocol.codes import RequestCode, ResponseCode
from sluice.protocol.command import RemotingCommand
from sluice.transport.blocking import SyncRemotingClient

pytestmark = pytest.mark.slow

ACL = """\
accounts:
  - accessKey: sluiceuser
    secretKey: user-secret-1
    admin: false
    defaultTopicPerm: DENY
    defaultGroupPerm: SUB
    topicPerms:
      - TopicOk=PUB|SUB
      - TopicDeny=DENY
  - accessKey: sluiceadmin
    secretKey: admin-secret-1
    admin: true
"""
USER = Credentials("sluiceuser", "user-secret-1")
ADMIN = Credentials("sluiceadmin", "admin-secret-1")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    tmp = tmp_path_factory.mktemp("acl")
    (tmp / "plain_acl.yml").write_text(ACL)
    with running_cluster(tmp, ("broker-a",), "--acl", str(tmp / "plain_acl.yml")) as c:
        yield c


def admin(*argv: str, env: dict[str, str] | None = None) -> tuple[ExitStatus, str, str]:
    out, err = io.StringIO(), io.StringIO()
    status = main(list(argv), env or {}, stdout=out, stderr=err, stdin=io.BytesIO(b""))
    return status, out.getvalue(), err.getvalue()


def test_the_right_key_sends_and_pulls(cluster: object) -> None:
    with Producer("PG_acl", cluster.ns, credentials=USER) as p:  # type: ignore[attr-defined]
        result = p.send(Message("TopicOk", b"signed"))
    wait_for_route(cluster.ns, "TopicOk")  # type: ignore[attr-defined]
    with PullConsumer("CG_acl", cluster.ns, credentials=USER) as c:  # type: ignore[attr-defined]
        mq = next(q for q in c.fetch_message_queues("TopicOk") if q.queue_id == result.queue.queue_id)
        pulled = c.pull(mq, "*", 0)
    assert [m.body for m in pulled.msg_found_list] == [b"signed"]


def test_a_push_consumer_with_credentials_consumes(cluster: object) -> None:
    ns = cluster.ns  # type: ignore[attr-defined]
    got: list[bytes] = []
    lock = threading.Lock()

    def listener(msgs: list) -> ConsumeResult:  # type: ignore[type-arg]
        with lock:
            got.extend(m.body for m in msgs)
        return ConsumeResult.SUCCESS

    with Producer("PG_acl_push", ns, credentials=USER) as p:
        p.send(Message("TopicOk", b"before-push"))
    wait_for_route(ns, "TopicOk")
    cons = PushConsumer("CG_acl_push", namesrv=ns, credentials=USER, consume_from_where="CONSUME_FROM_FIRST_OFFSET")
    cons.subscribe("TopicOk", "*")
    cons.register_listener(listener)
    cons.start()
    try:
        wait_for(lambda: b"before-push" in got, 20, "a pushed message")
    finally:
        cons.shutdown()


def test_the_file_is_reloaded_when_it_changes(cluster: object) -> None:
    acl = cluster.tmp / "plain_acl.yml"  # type: ignore[attr-defined]
    with Producer("PG_acl_reload", cluster.ns, credentials=USER, retry_times=0) as p:  # type: ignore
        with pytest.raises(SluiceError, match="no PUB permission for topic TopicLater"):
            p.send(Message("TopicLater", b"x"))
        acl.write_text(ACL.replace("      - TopicDeny=DENY\n", "      - TopicDeny=DENY\n      - TopicLater=PUB\n"))
        try:
            deadline = time.monotonic() + 20
            while True:  # reloaded within a few seconds (mtime checked every 3 s, on a request)
                try:
                    p.send(Message("TopicLater", b"now allowed"))
                    break
                except SluiceError:
                    assert time.monotonic() < deadline, "the changed ACL file was not reloaded"
                    time.sleep(0.5)
        finally:
            acl.write_text(ACL)


@pytest.mark.parametrize("creds, remark", [
    (None, "no AccessKey"),
    (Credentials("sluiceuser", "wrong-secret"), "Check signature failed for accessKey=sluiceuser"),
    (Credentials("nobody-here", "user-secret-1"), "No acl config for nobody-here"),
])
def test_unsigned_or_wrongly_signed_sends_are_refused_with_the_account(cluster: object, creds: Credentials | None,
                                                                       remark: str) -> None:
    opts = {"credentials": creds} if creds else {}
    with Producer("PG_acl_bad", cluster.ns, retry_times=0, **opts) as p:  # type: ignore
        with pytest.raises(SluiceError) as info:
            p.send(Message("TopicOk", b"x"))
    assert remark in str(info.value)
    assert getattr(info.value, "code", None) == ResponseCode.NO_PERMISSION


def test_a_denied_topic_is_refused_and_nothing_is_stored(cluster: object) -> None:
    with Producer("PG_acl_deny", cluster.ns, credentials=USER) as p:  # type: ignore[attr-defined]
        with pytest.raises(SluiceError, match="accessKey=sluiceuser has no PUB permission for topic TopicDeny"):
            p.send(Message("TopicDeny", b"x"))
    ns = SyncNamesrvClient(cluster.ns)  # type: ignore[attr-defined]
    try:
        assert "TopicDeny" not in ns.get_all_topics()
    finally:
        ns.close()


@pytest.mark.parametrize("code,fields", [
    (RequestCode.SEND_MESSAGE_V2, {"producerGroup": "PG_raw", "topic": "TopicDeny", "defaultTopic": "TBW102",
                                   "defaultTopicQueueNums": "4", "queueId": "0", "sysFlag": "0",
                                   "bornTimestamp": "1", "flag": "0"}),
    (RequestCode.SEND_MESSAGE, {"a": "PG_raw", "b": "TopicDeny", "c": "TBW102", "d": "4", "e": "0", "f": "0",
                                "g": "1", "h": "0"}),
])
def test_a_send_naming_its_topic_the_other_way_is_still_checked(cluster: object, code: int,
                                                                  fields: dict[str, str]) -> None:
    """The send handler reads either header naming with any send code; the ACL checks the topic it will use."""
    from sluice.acl.signature import sign_fields
    ext = dict(fields)
    sign_fields(USER, ext, b"sneaked")
    client = SyncRemotingClient()
    try:
        resp = client.invoke(cluster.broker.addr, RemotingCommand(code, ext, b"sneaked"))  # type: ignore[attr-defined]
    finally:
        client.close()
    assert resp.code == ResponseCode.NO_PERMISSION, (resp.code, resp.remark)
    assert "no PUB permission for topic TopicDeny" in resp.remark


def test_a_raw_refusal_is_no_permission(cluster: object) -> None:
    client = SyncRemotingClient()
    try:
        req = RemotingCommand.request(RequestCode.UPDATE_AND_CREATE_TOPIC, {"topic": "T_raw", "readQueueNums": 1})
        resp = client.invoke(cluster.broker.addr, req)  # type: ignore[attr-defined]
    finally:
        client.close()
    assert resp.code == ResponseCode.NO_PERMISSION and resp.remark.startswith("no AccessKey")


def test_admin_commands_need_an_admin_account(cluster: object) -> None:
    ns = cluster.ns  # type: ignore[attr-defined]
    status, _, err = admin("updateTopic", "-t", "TopicByAdmin", "-c", "DefaultCluster", "-n", ns,
                           "--access-key", USER.access_key, "--secret-key", USER.secret_key)
    assert status == ExitStatus.REFUSED, err
    assert "Need admin permission" in err and "accessKey=sluiceuser is not" in err
    env = {"SLUICE_ACCESS_KEY": ADMIN.access_key, "SLUICE_SECRET_KEY": ADMIN.secret_key}
    status, out, err = admin("updateTopic", "-t", "TopicByAdmin", "-c", "DefaultCluster", "-n", ns, env=env)
    assert status == ExitStatus.SUCCESS, err
    status, _, err = admin("topicList", "-n", ns, "--access-key", "only-the-key")
    assert status == ExitStatus.USAGE and "--secret-key" in err


def test_without_acl_nothing_changes(tmp_path: Path) -> None:
    with running_cluster(tmp_path) as c:
        with Producer("PG_noacl", c.ns) as p:
            p.send(Message("TopicFree", b"plain"))
        with Producer("PG_noacl2", c.ns, credentials=USER) as p:  # a signed request is fine without ACL too
            p.send(Message("TopicFree", b"signed"))


NS_ACL = """\
globalWhiteRemoteAddresses:
  - 10.255.255.*
accounts:
  - accessKey: brokeracct
    secretKey: broker-secret
    admin: true
  - accessKey: sluiceuser
    secretKey: user-secret-1
    admin: false
"""


def test_namesrv_writes_need_admin_or_a_white_address(tmp_path: Path) -> None:
    acl = tmp_path / "ns_acl.yml"
    acl.write_text(NS_ACL)
    with SluiceProcess.start(["namesrv", "--acl", str(acl)], tmp_path, name="namesrv") as ns:
        # A broker without an account cannot register; one signing as an admin account can.
        with SluiceProcess.start(broker_argv(tmp_path, ns.addr, "broker-x"), tmp_path, name="broker-x"):
            conf = 'acl_access_key = "brokeracct"\nacl_secret_key = "broker-secret"\n'
            with SluiceProcess.start(broker_argv(tmp_path, ns.addr, "broker-y", config=conf), tmp_path,
                                     name="broker-y"):
                route = wait_for_route(ns.addr, "TBW102")
                assert [b.broker_name for b in route.broker_datas] == ["broker-y"]
                wait_for(lambda: "Need admin permission" in (tmp_path / "namesrv.stderr.log").read_text()
                         or "no AccessKey" in (tmp_path / "namesrv.stderr.log").read_text(), what="refusal log")
        client = SyncRemotingClient()
        try:
            put = RemotingCommand.request(RequestCode.PUT_KV_CONFIG, {"namespace": "N", "key": "k", "value": "v"})
            resp = client.invoke(ns.addr, put)
            assert resp.code == ResponseCode.NO_PERMISSION and "no AccessKey" in (resp.remark or "")
            get = RemotingCommand.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "TBW102"})
            assert client.invoke(ns.addr, get).code in (ResponseCode.SUCCESS, ResponseCode.TOPIC_NOT_EXIST)
        finally:
            client.close()
