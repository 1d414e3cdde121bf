"""What the ACL remembers to stay cheap, and what it never skips: the signing order per request shape, needs
per (code, topic, group), a signed account's decision per need until the file is reloaded. Every request's
signature is still verified."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from sluice.acl import signature as S
from sluice.acl.guard import AclGuard
from sluice.acl.policy import PUB, Need
from sluice.acl.signature import Credentials, sign_fields
from sluice.broker import acl as broker_acl
from sluice.broker.acl import need_of
from sluice.broker.requests import ROUTE_BY_CODE
from sluice.errors import NoPermissionError
from sluice.protocol.codes import RequestCode as R
from sluice.protocol.command import RemotingCommand

USER = Credentials("memuser", "mem-secret-1")


def _acl(perm: str) -> str:
    return f"""accounts:
  - accessKey: {USER.access_key}
    secretKey: {USER.secret_key}
    defaultTopicPerm: DENY
    defaultGroupPerm: SUB
    topicPerms:
      - T={perm}
"""


def _send(topic: str = "T", body: bytes = b"x", creds: Credentials = USER) -> RemotingCommand:
    req = RemotingCommand.request(R.SEND_MESSAGE_V2, {"a": "PG", "b": topic, "e": "0"}, body)
    sign_fields(creds, req.ext_fields, req.body)
    return req


def _check(guard: AclGuard, req: RemotingCommand) -> None:
    guard.check("10.1.2.3:4000", req.ext_fields, req.body, need_of(ROUTE_BY_CODE[req.code], req))


def test_a_remembered_decision_still_verifies_every_signature(tmp_path: Path) -> None:
    path = tmp_path / "plain_acl.yml"
    path.write_text(_acl("PUB"))
    guard = AclGuard(path, reload_interval=0.0)
    _check(guard, _send())
    _check(guard, _send(body=b"other"))  # remembered: allowed
    # The same need, the same signature, a body changed after signing.
    forged = RemotingCommand.request(R.SEND_MESSAGE_V2, dict(_send().ext_fields), b"tampered")
    with pytest.raises(NoPermissionError, match="Check signature failed"):
        _check(guard, forged)
    with pytest.raises(NoPermissionError, match="Check signature failed"):
        _check(guard, _send(creds=Credentials(USER.access_key, "wrong-secret")))
    with pytest.raises(NoPermissionError, match="no PUB permission for topic U"):
        _check(guard, _send("U"))
    with pytest.raises(NoPermissionError, match="no PUB permission for topic U"):  # remembered refusal
        _check(guard, _send("U"))


def test_a_reload_forgets_the_decisions(tmp_path: Path) -> None:
    path = tmp_path / "plain_acl.yml"
    path.write_text(_acl("PUB"))
    guard = AclGuard(path, reload_interval=0.0)
    _check(guard, _send())
    path.write_text(_acl("DENY"))
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # a changed mtime, whatever the clock's grain
    with pytest.raises(NoPermissionError, match="no PUB permission for topic T"):
        _check(guard, _send())


def test_needs_are_built_once_per_code_topic_and_group() -> None:
    a = need_of(ROUTE_BY_CODE[int(R.SEND_MESSAGE_V2)], _send("T"))
    b = need_of(ROUTE_BY_CODE[int(R.SEND_MESSAGE_V2)], _send("T"))
    c = need_of(ROUTE_BY_CODE[int(R.SEND_MESSAGE_V2)], _send("U"))
    assert a is b and a.key == (int(R.SEND_MESSAGE_V2), "T", None) and a.resources == {"T": PUB}
    # A send needs PUB on its topic whatever group it names: one need (and one remembered decision) per topic.
    named = RemotingCommand.request(R.SEND_MESSAGE_V2, {"a": "OtherPG", "b": "T", "e": "0"}, b"x")
    assert need_of(ROUTE_BY_CODE[int(R.SEND_MESSAGE_V2)], named) is a
    assert c is not a and c.resources == {"U": PUB}
    pull = RemotingCommand.request(R.PULL_MESSAGE, {"consumerGroup": "G", "topic": "T"})
    assert need_of(ROUTE_BY_CODE[int(R.PULL_MESSAGE)], pull).key == (int(R.PULL_MESSAGE), "T", "G")
    hb = RemotingCommand.request(R.HEART_BEAT, {}, b"{}")
    assert need_of(ROUTE_BY_CODE[int(R.HEART_BEAT)], hb).key is None  # resources from the body: not remembered


def test_the_memories_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(broker_acl, "_MAX_NEEDS", 16)
    monkeypatch.setattr(S, "_MAX_SHAPES", 16)
    for i in range(100):
        need_of(ROUTE_BY_CODE[int(R.SEND_MESSAGE_V2)], _send(f"T{i}"))
        S._signed_head({f"k{i}": "v", "x": "y"})  # the Python twin's memory (C remembers nothing)
    assert len(broker_acl._NEEDS[int(R.SEND_MESSAGE_V2)]) <= 16 and len(S._ORDER) <= 16


def test_one_shape_many_values_and_key_orders() -> None:
    """The remembered order belongs to the shape (the keys in their order): values change, orders differ."""
    import base64
    import hashlib
    import hmac
    for ext in ({"b": "1", "a": "2", "Signature": "s"}, {"b": "3", "a": "4", "Signature": "s"},
                {"a": "5", "b": "6"}, {"a": None, "b": True, "c": 7}):
        want = "".join(S._java_string(ext[k]) for k in sorted(ext) if k != "Signature" and ext[k] is not None)
        assert S._signed_head(ext) == want.encode()
        sig = base64.b64encode(hmac.new(b"key", want.encode() + b"body", hashlib.sha1).digest()).decode()
        assert S.compute_signature("key", ext, b"body") == sig


def test_keys_longer_than_a_block() -> None:
    import base64
    import hashlib
    import hmac
    for key in ("k" * 64, "k" * 65, "é" * 40, "x"):
        sig = base64.b64encode(hmac.new(key.encode(), b"vbody", hashlib.sha1).digest()).decode()
        assert S.compute_signature(key, {"a": "v"}, b"body") == sig
    assert Need(1).key is None


def test_the_broker_check_is_need_of_then_the_guard(tmp_path: Path) -> None:
    """acl_check (what the broker calls before a handler) asks the guard exactly what need_of says."""
    path = tmp_path / "plain_acl.yml"
    path.write_text(_acl("PUB"))
    guard = AclGuard(path, reload_interval=0.0)

    class Conn:
        peer = "10.1.2.3:4000"
    check = broker_acl.acl_check(guard, ROUTE_BY_CODE[int(R.SEND_MESSAGE_V2)])
    check(Conn(), _send())
    with pytest.raises(NoPermissionError, match="no PUB permission for topic U"):
        check(Conn(), _send("U"))
    with pytest.raises(NoPermissionError, match="Check signature failed"):
        check(Conn(), RemotingCommand.request(R.SEND_MESSAGE_V2, dict(_send().ext_fields), b"tampered"))
    pull = RemotingCommand.request(R.PULL_MESSAGE, {"consumerGroup": "G", "topic": "T"})
    sign_fields(USER, pull.ext_fields, None)
    with pytest.raises(NoPermissionError, match="no SUB permission for topic T"):  # T is PUB only
        broker_acl.acl_check(guard, ROUTE_BY_CODE[int(R.PULL_MESSAGE)])(Conn(), pull)
    for code in (R.UPDATE_AND_CREATE_TOPIC, R.CHECK_CLIENT_CONFIG, R.HEART_BEAT):
        route = ROUTE_BY_CODE[int(code)]
        req = RemotingCommand.request(code, {"topic": "T"}, b"")
        assert broker_acl.need_function(route)(req) == need_of(route, req)
