"""Server-side filtering: tags on consume-queue codes alone, SQL92 on properties, bad expressions refused."""
from __future__ import annotations

import orjson
import pytest

from broker_support import bodies, sub_data
from sluice.filter import java_string_hash
from sluice.protocol.codes import RequestCode, ResponseCode

R = ResponseCode


def test_tag_subscription_gets_only_its_tag(rpc):
    for tag in ("TagA", "TagB", None, "TagA", "TagC"):
        rpc.send("Tags", (tag or "none").encode(), tags=tag)
    assert bodies(rpc.pull("Tags", sub="TagA")) == [b"TagA", b"TagA"]
    assert bodies(rpc.pull("Tags", sub="TagA || TagC")) == [b"TagA", b"TagA", b"TagC"]
    assert len(bodies(rpc.pull("Tags", sub="*"))) == 5


def test_java_hash_colliding_tags_are_told_apart(rpc):
    assert java_string_hash("Aa") == java_string_hash("BB")
    rpc.send("Coll", b"Aa", tags="Aa")
    rpc.send("Coll", b"BB", tags="BB")
    assert bodies(rpc.pull("Coll", sub="Aa")) == [b"Aa"]
    assert bodies(rpc.pull("Coll", sub="BB")) == [b"BB"]


def test_tag_filter_reads_no_commit_log(rpc, broker):
    for i in range(10):
        rpc.send("NoRead", f"{i}".encode(), tags="TagA" if i == 7 else "TagB")
    store = broker.broker.store
    store.wait_dispatched()
    read_before = store.pull_records_read
    assert bodies(rpc.pull("NoRead", sub="TagA")) == [b"7"]
    assert store.pull_records_read - read_before == 1  # only the one match was read


def test_nothing_matches_retry_immediately(rpc):
    for i in range(5):
        rpc.send("Miss", b"x", tags="TagB")
    resp = rpc.pull("Miss", sub="TagZ")
    assert resp.code == R.PULL_RETRY_IMMEDIATELY
    assert resp.ext_fields["nextBeginOffset"] == "5"


def test_sql92_filter(rpc):
    for a, region in ((1, "eu"), (7, "us"), (9, "cn"), (12, "eu")):
        rpc.send("Sql", f"{a}-{region}".encode(), props={"a": str(a), "region": region})
    rpc.send("Sql", b"none")
    resp = rpc.pull("Sql", sub="a > 5 AND region IN ('eu', 'us')", expr_type="SQL92")
    assert bodies(resp) == [b"7-us", b"12-eu"]
    assert bodies(rpc.pull("Sql", sub="TAGS IS NULL AND a IS NULL", expr_type="SQL92")) == [b"none"]


BAD_SQL = "a > AND b"


def test_bad_sql_refused_at_pull(rpc):
    rpc.send("BadSql", b"x", props={"a": "1"})
    resp = rpc.pull("BadSql", sub=BAD_SQL, expr_type="SQL92")
    assert resp.code == R.SUBSCRIPTION_PARSE_FAILED
    assert "position" in resp.remark and "^" in resp.remark


def test_bad_sql_refused_at_heartbeat(rpc, broker):
    resp = rpc.heartbeat("cid-1", "sqlgroup", [sub_data("T", BAD_SQL, "SQL92")])
    assert resp.code == R.SUBSCRIPTION_PARSE_FAILED and "^" in resp.remark
    assert broker.broker.consumers.get("sqlgroup") is None  # nothing half-registered


def test_bad_sql_refused_at_check_client_config(rpc):
    body = {"clientId": "c1", "group": "g", "subscriptionData": sub_data("T", BAD_SQL, "SQL92")}
    resp = rpc.call(RequestCode.CHECK_CLIENT_CONFIG, {}, orjson.dumps(body))
    assert resp.code == R.SUBSCRIPTION_PARSE_FAILED and "position" in resp.remark
    body["subscriptionData"] = sub_data("T", "a > 1", "SQL92")
    assert rpc.call(RequestCode.CHECK_CLIENT_CONFIG, {}, orjson.dumps(body)).code == R.SUCCESS
    body["subscriptionData"] = sub_data("T", "TagA || TagB")
    assert rpc.call(RequestCode.CHECK_CLIENT_CONFIG, {}, orjson.dumps(body)).code == R.SUCCESS


def test_sql_disabled_names_the_setting(make_broker):
    r = make_broker(enable_property_filter=False).rpc()
    r.send("S", b"x")
    resp = r.pull("S", sub="a > 1", expr_type="SQL92")
    assert resp.code == R.SYSTEM_ERROR and "enable_property_filter" in resp.remark
    hb = r.heartbeat("c", "g", [sub_data("S", "a > 1", "SQL92")])
    assert hb.code == R.SYSTEM_ERROR and "enable_property_filter" in hb.remark
    assert r.pull("S", sub="*").code == R.SUCCESS


def test_subscription_from_heartbeat_when_pull_carries_none(rpc):
    for tag in ("TagA", "TagB"):
        rpc.send("Hb", tag.encode(), tags=tag)
    assert rpc.pull("Hb", group="nohb", sub=None).code == R.SUBSCRIPTION_NOT_EXIST
    # librocketmq form: ordinals, zero codeSet, no expressionType -> codes recomputed on the server.
    assert rpc.heartbeat("c1", "hbgroup", [sub_data("Hb", "TagB", zero_codes=True)], ordinals=True).code == 0
    assert bodies(rpc.pull("Hb", group="hbgroup", sub=None)) == [b"TagB"]
    other = rpc.pull("Other", group="hbgroup", sub=None)
    assert other.code in (R.TOPIC_NOT_EXIST, R.SUBSCRIPTION_NOT_EXIST)
    rpc.send("Other", b"o")
    assert rpc.pull("Other", group="hbgroup", sub=None).code == R.SUBSCRIPTION_NOT_EXIST


def test_heartbeat_sql_subscription_filters_later_pulls(rpc):
    rpc.send("HbSql", b"lo", props={"a": "1"})
    rpc.send("HbSql", b"hi", props={"a": "10"})
    assert rpc.heartbeat("c1", "sg", [sub_data("HbSql", "a > 5", "SQL92")]).code == 0
    assert bodies(rpc.pull("HbSql", group="sg", sub=None)) == [b"hi"]


@pytest.mark.parametrize("expr", ["", "   ", "||"])
def test_degenerate_tag_subscriptions(rpc, expr):
    rpc.send("Deg", b"t", tags="T")
    resp = rpc.pull("Deg", sub=expr)
    # "" means everything (RocketMQ); a string of blanks/separators names no tag and matches nothing.
    assert resp.code == (R.SUCCESS if expr == "" else R.PULL_RETRY_IMMEDIATELY)
