"""Filtering through an in-process broker: filter data from heartbeats, bitmap pulls for inline
subscriptions, conflicts in a group, hostile expressions, metrics, filter-aware lag."""
from __future__ import annotations

import time
from functools import partial

import orjson
import pytest
from filtering_support import InProcessBroker, props_of, sub_data

from sluice.broker.filter_data import LIVE_MARGIN_MS
from sluice.protocol.codes import RequestCode, ResponseCode

R = ResponseCode


@pytest.fixture
def make_broker(make_broker):  # the suite's factory (tests/conftest.py), building this folder's filtering handle
    return partial(make_broker, handle=InProcessBroker)


def age_filter_data(b: InProcessBroker, topic: str, group: str) -> None:
    """Messages sent from now on count as stored after the group's filter data was born."""
    b.broker.filter_data.get(topic, group).born_time -= 2 * LIVE_MARGIN_MS


def send_all(rpc, topic: str, n: int, start: int = 0) -> list[dict[str, str]]:
    out = []
    for i in range(start, start + n):
        p = props_of(i)
        assert rpc.send(topic, f"{i}".encode(), p).code == R.SUCCESS
        out.append(p)
    return out


def test_inline_pull_uses_the_groups_bitmaps(make_broker):
    b = make_broker()
    rpc = b.rpc()
    assert rpc.heartbeat("c1", "G", [sub_data("T", "a < 50")]).code == R.SUCCESS
    age_filter_data(b, "T", "G")
    props = send_all(rpc, "T", 600)
    want = [str(i).encode() for i, p in enumerate(props) if int(p["a"]) < 50]
    before = b.broker.store.pull_records_read
    assert rpc.pull_all("T", sub="a < 50") == want
    m = b.broker.filter_data.metrics_of("G", "T")
    assert b.broker.store.pull_records_read - before == m.evaluated < 600
    assert m.bitmap_skipped > 0 and m.matched == len(want)
    # another expression in the same pull path (newer version, heartbeat not yet seen) is evaluated directly
    newer = int(time.time() * 1000) + 10_000
    assert rpc.pull("T", sub="a < 60", sub_version=newer).code == R.SUCCESS
    info = orjson.loads(rpc.call(RequestCode.GET_BROKER_RUNTIME_INFO).body)["table"]
    assert int(info["filterBitmapSkipped"]) == m.bitmap_skipped and int(info["filterEvaluated"]) >= m.evaluated


def test_conflicting_subscriptions_name_both_expressions(make_broker):
    b = make_broker()
    rpc = b.rpc()
    rpc.send("T", b"x", {"a": "1"})
    v = int(time.time() * 1000)
    assert rpc.heartbeat("c1", "G", [sub_data("T", "a > 5", version=v)]).code == R.SUCCESS
    bad = rpc.heartbeat("c2", "G", [sub_data("T", "TagA", "TAG", version=v - 1)])
    assert bad.code == R.SUBSCRIPTION_NOT_LATEST
    assert "a > 5" in bad.remark and "TagA" in bad.remark and "c1" in bad.remark and "c2" in bad.remark
    # c2's pull comes on c2's own connection (one on which c1 heartbeats is c1's: never a conflict with itself)
    pulled = b.rpc().pull("T", sub="TagA", expr_type="TAG", sub_version=v - 1)
    assert pulled.code == R.SUBSCRIPTION_NOT_LATEST and "a > 5" in pulled.remark and "TagA" in pulled.remark
    assert rpc.pull("T", sub="TagA", expr_type="TAG", sub_version=v - 1).code == R.PULL_RETRY_IMMEDIATELY
    stats = rpc.consume_stats("G", "T")
    assert {c["refusedExpression"] for c in stats["subscriptionConflicts"]} == {"TagA"}
    assert stats["subscriptionConflicts"][0]["keptExpression"] == "a > 5"
    # a newer version wins for the group; then the old member is the one refused
    assert rpc.heartbeat("c3", "G", [sub_data("T", "a > 7", version=v + 1)]).code == R.SUCCESS
    again = rpc.heartbeat("c1", "G", [sub_data("T", "a > 5", version=v)])
    assert again.code == R.SUBSCRIPTION_NOT_LATEST and "a > 7" in again.remark
    assert b.broker.filter_data.get("T", "G").expression == "a > 7"


HOSTILE = ["(" * 5000 + "a > 1" + ")" * 5000, "a IN (" + ", ".join(f"'{i}'" for i in range(20_000)) + ")",
           "a > 1 AND " * 30_000 + "b < 2", "a > AND b"]


@pytest.mark.parametrize("expr", HOSTILE, ids=["deep", "huge-in", "long", "syntax"])
def test_hostile_expression_refused_at_heartbeat(make_broker, expr):
    b = make_broker()
    rpc = b.rpc()
    rpc.send("T", b"x", {"a": "1"})
    t0 = time.monotonic()
    r = rpc.heartbeat("c1", "G", [sub_data("T", expr)])
    assert r.code == R.SUBSCRIPTION_PARSE_FAILED and r.remark
    assert time.monotonic() - t0 < 3
    assert b.broker.filter_data.get("T", "G") is None and b.broker.consumers.get("G") is None
    assert rpc.pull("T", sub=expr).code == R.SUBSCRIPTION_PARSE_FAILED  # never "match everything"


def test_sql_off_names_the_setting(make_broker):
    b = make_broker(enable_property_filter=False)
    r = b.rpc().heartbeat("c1", "G", [sub_data("T", "a > 1")])
    assert r.code == R.SYSTEM_ERROR and "enable_property_filter" in r.remark


def test_filter_aware_lag_and_metrics_in_consume_stats(make_broker):
    b = make_broker()
    rpc = b.rpc()
    assert rpc.heartbeat("c1", "G", [sub_data("T", "region = 'eu' AND odd > 1")]).code == R.SUCCESS
    assert rpc.heartbeat("c2", "H", [sub_data("T", "TagA", "TAG")]).code == R.SUCCESS
    props = send_all(rpc, "T", 400)  # within the filter data's first second: evaluated on pull, not bitmaps
    b.broker.store.wait_dispatched()
    rpc.pull_all("T", group="G", sub="region = 'eu' AND odd > 1")
    st = rpc.consume_stats("G", "T")
    e = st["offsetTable"][0]
    assert e["lag"] == 400 and e["filteredLag"] == 0 and e["filteredLagExact"]  # odd > 1 never holds
    fs = st["filterStats"]["T"]
    assert fs["expression"] == "region = 'eu' AND odd > 1" and fs["errors"] > 0 and fs["matched"] == 0
    tags = rpc.consume_stats("H", "T")["offsetTable"][0]
    assert tags["filteredLag"] == sum(1 for p in props if p.get("TAGS") == "TagA")


def test_filter_data_request(make_broker):
    b = make_broker()
    rpc = b.rpc()
    assert rpc.heartbeat("c1", "G", [sub_data("T", "a > 1")]).code == R.SUCCESS
    r = rpc.call(RequestCode.GET_CONSUMER_FILTER_DATA, {"consumerGroup": "G"})
    body = orjson.loads(r.body)
    assert [(s["topic"], s["expression"], s["source"]) for s in body["subscriptions"]] == [("T", "a > 1", "heartbeat")]
    assert rpc.call(RequestCode.GET_CONSUMER_FILTER_DATA, {"consumerGroup": "Nobody"}).code == R.QUERY_NOT_FOUND
