"""The ACL under fuzzing: a broker run with ``--acl`` gets requests of every code it routes, with fuzzed fields
and bodies, unsigned, signed by unknown accounts, signed with a wrong secret, or signed right and then changed;
every one is refused with NO_PERMISSION naming the account (or "no AccessKey") before its handler runs, and a
normal client signing with its credentials is served (and finds its messages) after every example.

Requests of a known account signed right reach their handlers only within the account's permissions."""
from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from servers import Cluster, running_cluster
from test_frames_fuzz import FUZZ_TOPICS, PLAUSIBLE, WAIT_S, _exchange, ext_fields, json_values

from sluice import Credentials, Message, Producer, PullConsumer
from sluice.acl.signature import sign_fields
from sluice.broker.requests import ROUTES, Permission
from sluice.protocol.codes import ResponseCode
from sluice.protocol.command import RemotingCommand
from sluice.protocol.frame import encode_frame

pytestmark = pytest.mark.slow

TOPIC = "AbuseAcl"
USER = Credentials("abuseuser", "abuse-secret-1")
ACL = f"""\
accounts:
  - accessKey: {USER.access_key}
    secretKey: {USER.secret_key}
    admin: false
    defaultTopicPerm: DENY
    defaultGroupPerm: DENY
    topicPerms:
      - {TOPIC}=PUB|SUB
      - FuzzT=SUB
    groupPerms:
      - PG_acl_normal=PUB|SUB
      - CG_acl_normal=SUB
"""
CHECKED = [r for r in ROUTES if r.permission is not Permission.NONE]
REFUSALS = ("no AccessKey", "No acl config for", "Check signature failed for accessKey=",
            f"accessKey={USER.access_key} has no", f"accessKey={USER.access_key} is not")


class Normal:
    def __init__(self, ns: str) -> None:
        self.producer = Producer("PG_acl_normal", ns, credentials=USER, retry_times=1)
        self.producer.start()
        self.consumer = PullConsumer("CG_acl_normal", ns, credentials=USER)
        self.consumer.start()
        self.n = 0

    def served(self) -> None:
        body = f"acl-normal-{self.n}".encode()
        self.n += 1
        r = self.producer.send(Message(TOPIC, body))
        assert r.status.name == "SEND_OK"
        got = self.consumer.pull(r.queue, "*", r.queue_offset)
        assert [m.body for m in got.msg_found_list][:1] == [body]

    def close(self) -> None:
        self.consumer.shutdown()
        self.producer.shutdown()


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Cluster, Normal]]:
    tmp = tmp_path_factory.mktemp("aclfuzz")
    (tmp / "plain_acl.yml").write_text(ACL)
    with running_cluster(tmp, ("broker-a",), "--acl", str(tmp / "plain_acl.yml")) as c:
        normal = Normal(c.ns)
        try:
            normal.served()
            yield c, normal
        finally:
            normal.close()


@st.composite
def forged(draw: st.DrawFn) -> tuple[RemotingCommand, str]:
    """(a request of a checked code, how it is signed): never signed right by an account allowed to run it."""
    route = draw(st.sampled_from(CHECKED))
    ext = dict(PLAUSIBLE) if draw(st.integers(0, 3)) else {}
    ext.update(draw(ext_fields))
    for key in ("topic", "b", "originTopic"):
        ext[key] = draw(FUZZ_TOPICS | st.just(TOPIC))
    for key in ("a", "producerGroup", "consumerGroup", "group"):
        ext[key] = draw(st.sampled_from(["PG_acl_normal", "CG_acl_normal", "FuzzG"]))
    body = draw(st.binary(max_size=48) | json_values.map(lambda v: json.dumps(v).encode()))
    cmd = RemotingCommand.request(int(route.code), ext, body)
    how = draw(st.sampled_from(["unsigned", "unknown account", "wrong secret", "changed after signing",
                                "forged signature"]))
    if how == "unknown account":
        sign_fields(Credentials(draw(st.text(min_size=1, max_size=8)).strip() or "x", "s"), cmd.ext_fields, body)
        if cmd.ext_fields["AccessKey"] == USER.access_key:
            cmd.ext_fields["AccessKey"] = "someone-else"
    elif how == "wrong secret":
        sign_fields(Credentials(USER.access_key, "not-" + USER.secret_key), cmd.ext_fields, body)
    elif how == "changed after signing":
        sign_fields(USER, cmd.ext_fields, body)
        if draw(st.booleans()) or not body:
            key = draw(st.sampled_from(sorted(k for k in cmd.ext_fields if k not in ("AccessKey", "Signature"))))
            cmd.ext_fields[key] = cmd.ext_fields[key] + "x"
        else:
            cmd = dataclasses.replace(cmd, body=body + b"x")
    elif how == "forged signature":
        cmd.ext_fields["AccessKey"] = USER.access_key
        cmd.ext_fields["Signature"] = draw(st.text(max_size=30))
    return dataclasses.replace(cmd, opaque=draw(st.integers(1, 2**31 - 1))), how


@settings(deadline=None, max_examples=60, derandomize=True, suppress_health_check=list(HealthCheck))
@given(case=forged())
def test_forged_requests_are_refused_before_their_handlers(live: tuple[Cluster, Normal],
                                                           case: tuple[RemotingCommand, str]) -> None:
    cluster, normal = live
    cmd, how = case
    got, closed = _exchange(cluster.broker.addr, encode_frame(cmd), 1, until_closed=False)
    assert not closed and len(got) == 1, (how, cmd.code, got)
    resp = got[0]
    assert resp.code == ResponseCode.NO_PERMISSION, (how, cmd.code, resp.code, resp.remark)
    assert any(r in (resp.remark or "") for r in REFUSALS), resp.remark
    normal.served()


def test_the_normal_account_reaches_handlers_only_within_its_permissions(live: tuple[Cluster, Normal]) -> None:
    cluster, normal = live
    for route in CHECKED:
        ext = dict(PLAUSIBLE, topic="NotMine", b="NotMine", originTopic="NotMine", consumerGroup="FuzzG",
                   group="FuzzG", a="PG_acl_normal", producerGroup="PG_acl_normal")
        cmd = RemotingCommand.request(int(route.code), ext, b"{}")
        sign_fields(USER, cmd.ext_fields, cmd.body)
        got, _ = _exchange(cluster.broker.addr, encode_frame(cmd), 1, until_closed=False)
        if route.permission is Permission.ADMIN:
            assert got[0].code == ResponseCode.NO_PERMISSION and "Need admin permission" in got[0].remark
        elif route.code.name != "HEART_BEAT":  # a heartbeat names its resources in its body ("{}": none)
            assert got[0].code == ResponseCode.NO_PERMISSION, (route.code, got[0].remark)
    normal.served()
    assert WAIT_S > 0 and "Traceback" not in cluster.broker.stderr()
