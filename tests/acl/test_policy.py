"""plain_acl.yml parsing, RocketMQ's address patterns and PlainPermissionManager's decisions."""
from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from sluice.acl.guard import AclGuard
from sluice.acl.policy import ANY, DENY, PUB, SUB, AddressPattern, Need, parse_policy, retry_topic
from sluice.acl.signature import Credentials, sign_fields
from sluice.errors import AclConfigError, NoPermissionError

# RocketMQ 4.9's distribution/conf/plain_acl.yml, as shipped.
ROCKETMQ_SAMPLE = """\
globalWhiteRemoteAddresses:
  - 10.10.103.*
  - 192.168.0.*

accounts:
  - accessKey: RocketMQ
    secretKey: 12345678
    whiteRemoteAddress:
    admin: false
    defaultTopicPerm: DENY
    defaultGroupPerm: SUB
    topicPerms:
      - topicA=DENY
      - topicB=PUB|SUB
      - topicC=SUB
    groupPerms:
      # the group should convert to retry topic
      - groupA=DENY
      - groupB=PUB|SUB
      - groupC=SUB

  - accessKey: rocketmq2
    secretKey: 12345678
    whiteRemoteAddress: 192.168.1.*
    # if it is admin, it could access all resources
    admin: true
"""


def signed(ak: str, sk: str, fields: dict[str, str], body: bytes = b"") -> dict[str, str]:
    fields = dict(fields)
    sign_fields(Credentials(ak, sk), fields, body)
    return fields


def test_rocketmqs_own_sample_parses() -> None:
    p = parse_policy(ROCKETMQ_SAMPLE, "plain_acl.yml")
    a = p.accounts["RocketMQ"]
    assert a.secret_key == "12345678" and not a.admin and a.white is None
    assert (a.default_topic_perm, a.default_group_perm) == (DENY, SUB)
    assert a.perms == {"topicA": DENY, "topicB": ANY, "topicC": SUB, retry_topic("groupA"): DENY,
                       retry_topic("groupB"): ANY, retry_topic("groupC"): SUB}
    assert p.accounts["rocketmq2"].admin
    assert p.whitelisted("10.10.103.7") and not p.whitelisted("10.10.104.7")


@pytest.mark.parametrize("pattern, yes, no", [
    ("*", ["1.2.3.4", "127.0.0.1"], []),
    ("192.168.0.*", ["192.168.0.1", "192.168.0.255"], ["192.168.1.1", "192.168.00.1x"]),
    ("192.168.1.1-100", ["192.168.1.1", "192.168.1.100"], ["192.168.1.101", "192.168.1.0", "192.168.2.50"]),
    ("192.168.*.*", ["192.168.7.9"], ["192.169.7.9"]),
    ("192.168.1.{1,2,3}", ["192.168.1.2"], ["192.168.1.4"]),
    ("127.0.0.1", ["127.0.0.1"], ["127.0.0.2"]),
])
def test_address_patterns(pattern: str, yes: list[str], no: list[str]) -> None:
    p = AddressPattern(pattern, "f")
    assert all(p.match(a) for a in yes) and not any(p.match(a) for a in no)


@pytest.mark.parametrize("bad", ["192.168.1.300", "192.168.*.1", "192.168.1.100-1", "host.example", "1.2.3.{x}"])
def test_bad_address_patterns_are_refused(bad: str) -> None:
    with pytest.raises(AclConfigError, match="address pattern"):
        AddressPattern(bad, "f")


@pytest.mark.parametrize("text, where", [
    ("accounts: [ {accessKey: abcdef\n", "acl.yml: line"),
    ("- a\n- b\n", "the top level must be a mapping"),
    ("accounts:\n  - secretKey: 12345678\n", "accounts[0].accessKey is missing"),
    ("accounts:\n  - {accessKey: abcdefg, secretKey: 12345678, defaultTopicPerm: PUBLISH}\n",
     "accounts[0].defaultTopicPerm: permission 'PUBLISH'"),
    ("accounts:\n  - {accessKey: abcdefg, secretKey: 12345678, topicPerms: [topicA]}\n",
     "accounts[0].topicPerms[0]: 'topicA' is not 'NAME=PERM'"),
    ("accounts:\n  - {accessKey: abcdefg, secretKey: 12345678, admin: yes-please}\n", "accounts[0].admin"),
    ("accounts:\n  - {accessKey: abcdefg, secretKey: 12345678}\n  - {accessKey: abcdefg, secretKey: x}\n",
     "accounts[1].accessKey 'abcdefg' is given twice"),
    ("globalWhiteRemoteAddresses: [10.0.0.x]\n", "globalWhiteRemoteAddresses[0]"),
])
def test_a_bad_file_names_the_file_and_the_place(text: str, where: str) -> None:
    with pytest.raises(AclConfigError) as info:
        parse_policy(text, "acl.yml")
    assert str(info.value).startswith("acl.yml:") and where in str(info.value)


POLICY = parse_policy(ROCKETMQ_SAMPLE, "plain_acl.yml")
HOST = "127.0.0.1"


def decide(fields: dict[str, str], need: Need, host: str = HOST, body: bytes = b"") -> None:
    POLICY.decide(host, fields, body, need)


def test_unsigned_requests_are_refused_unless_whitelisted() -> None:
    with pytest.raises(NoPermissionError, match="no AccessKey"):
        decide({"topic": "topicB"}, Need(11, resources={"topicB": SUB}))
    decide({"topic": "topicA"}, Need(11, resources={"topicA": SUB}), host="192.168.0.3")  # global white


def test_wrong_key_or_secret_is_refused_naming_the_account() -> None:
    with pytest.raises(NoPermissionError, match="No acl config for nobody1"):
        decide(signed("nobody1", "12345678", {"topic": "topicB"}), Need(11, resources={"topicB": SUB}))
    with pytest.raises(NoPermissionError, match="Check signature failed for accessKey=RocketMQ"):
        decide(signed("RocketMQ", "wrongsecret", {"topic": "topicB"}), Need(11, resources={"topicB": SUB}))


def test_topic_and_group_permissions() -> None:
    ok = signed("RocketMQ", "12345678", {})
    decide(ok, Need(11, resources={"topicB": SUB, retry_topic("groupB"): SUB}))
    decide(ok, Need(10, resources={"topicB": PUB}))
    with pytest.raises(NoPermissionError, match="accessKey=RocketMQ has no PUB permission for topic topicA"):
        decide(ok, Need(10, resources={"topicA": PUB}))
    with pytest.raises(NoPermissionError, match="no PUB permission for topic topicC"):
        decide(ok, Need(10, resources={"topicC": PUB}))
    with pytest.raises(NoPermissionError, match="no SUB permission for topic other"):  # default DENY
        decide(ok, Need(11, resources={"other": SUB}))
    with pytest.raises(NoPermissionError, match="no SUB permission for group groupA"):
        decide(ok, Need(11, resources={"topicB": SUB, retry_topic("groupA"): SUB}))
    decide(ok, Need(11, resources={"topicB": SUB, retry_topic("anyGroup"): SUB}))  # default group SUB
    # A pull of a retry topic is a group's permission.
    decide(ok, Need(11, resources={retry_topic("groupC"): SUB}))


def test_admin_codes_need_an_admin_account() -> None:
    with pytest.raises(NoPermissionError, match="Need admin permission for request code=17, but "
                                                "accessKey=RocketMQ is not"):
        decide(signed("RocketMQ", "12345678", {}), Need(17, admin=True))
    decide(signed("rocketmq2", "12345678", {}), Need(17, admin=True))
    decide({"AccessKey": "rocketmq2"}, Need(17, admin=True), host="192.168.1.9")  # the account's white address


def test_the_guard_reloads_a_changed_file_and_keeps_the_last_good_one(tmp_path: Path) -> None:
    path = tmp_path / "plain_acl.yml"
    path.write_text(ROCKETMQ_SAMPLE)
    guard = AclGuard(path, reload_interval=0.0)
    need = Need(10, resources={"topicC": PUB})
    ok = signed("RocketMQ", "12345678", {})
    with pytest.raises(NoPermissionError):
        guard.check("127.0.0.1:5555", ok, b"", need)
    path.write_text(ROCKETMQ_SAMPLE.replace("topicC=SUB", "topicC=PUB"))
    os.utime(path, ns=(time.time_ns(), time.time_ns() + 10**9))
    guard.check("127.0.0.1:5555", ok, b"", need)
    path.write_text("accounts: [ broken")
    os.utime(path, ns=(time.time_ns(), time.time_ns() + 2 * 10**9))
    guard.check("127.0.0.1:5555", ok, b"", need)  # still the previous policy
    assert guard.policy.accounts["RocketMQ"].perms["topicC"] == PUB


def test_refusals_are_logged_once_per_client_and_reason(caplog: pytest.LogCaptureFixture) -> None:
    import tempfile
    with tempfile.NamedTemporaryFile("w", suffix=".yml") as f:
        f.write(ROCKETMQ_SAMPLE)
        f.flush()
        guard = AclGuard(f.name)
        for _ in range(5):
            with pytest.raises(NoPermissionError):
                guard.check("127.0.0.1:1", {}, b"", Need(10))
    assert sum("ACL refused" in r.message for r in caplog.records) == 1


def test_a_missing_file_is_an_error_naming_it(tmp_path: Path) -> None:
    with pytest.raises(AclConfigError, match="nope.yml: cannot read"):
        AclGuard(tmp_path / "nope.yml")
