"""The broker's side of class-filter mode: a class-filter pull sent to the broker itself is refused with the
filter servers named; a classFilterMode heartbeat keeps the class name (never a tag expression); members with
different classes get the loud conflict SQL92 subscriptions get; members' class errors reach consume stats."""
from __future__ import annotations

import time
from functools import partial
from typing import Any

import orjson
import pytest
from filtering_support import InProcessBroker, sub_data

from sluice.protocol.codes import RequestCode, ResponseCode

R = ResponseCode


@pytest.fixture
def make_broker(make_broker):
    return partial(make_broker, handle=InProcessBroker)


def class_sub(topic: str, name: str, version: int | None = None, error: str | None = None) -> dict[str, Any]:
    d = {"topic": topic, "subString": name, "classFilterMode": True, "expressionType": "TAG", "tagsSet": [],
         "codeSet": [], "subVersion": int(time.time() * 1000) if version is None else version}
    if error:
        d["filterClassError"] = error
    return d


def class_pull(rpc, topic: str, name: str) -> Any:
    fields = dict(consumerGroup="G", topic=topic, queueId=0, queueOffset=0, maxMsgNums=32, sysFlag=0x4 | 0x8,
                  commitOffset=0, suspendTimeoutMillis=0, subVersion=0, subscription=name, expressionType="TAG")
    return rpc.call(RequestCode.PULL_MESSAGE, fields)


def test_a_class_filter_pull_to_the_broker_is_refused_naming_its_filter_servers(make_broker):
    b = make_broker()
    rpc = b.rpc()
    assert rpc.send("T", b"x", {"n": "1"}).code == R.SUCCESS
    r = class_pull(rpc, "T", "filters.even:Even")
    assert r.code != R.SUCCESS and r.code not in (R.PULL_NOT_FOUND, R.PULL_RETRY_IMMEDIATELY)
    assert "filters.even:Even" in r.remark and "no filter server runs beside this broker" in r.remark
    assert "filter_server_nums" in r.remark
    # the broker knows filter servers: they are named
    b.broker.pull_processor.filter_servers = lambda: ["127.0.0.1:3002", "127.0.0.1:3001"]
    r = class_pull(rpc, "T", "filters.even:Even")
    assert "127.0.0.1:3001, 127.0.0.1:3002" in r.remark and r.body == b""


def test_class_heartbeat_keeps_the_class_name_not_a_tag(make_broker):
    b = make_broker()
    rpc = b.rpc()
    # "a || b" would parse as two tags; a class name with a colon as one tag: neither may happen
    assert rpc.heartbeat("c1", "G", [class_sub("T", "filters.even:Even")]).code == R.SUCCESS
    sub = b.broker.consumers.find_subscription("G", "T")
    assert (sub.expression_type, sub.expression, sub.tags) == ("CLASS", "filters.even:Even", ())
    assert sub.filter.passes_all  # the broker never filters for the class: its filter servers do
    wire = sub.to_wire()
    assert wire["classFilterMode"] is True and wire["expressionType"] == "TAG" and wire["tagsSet"] == []
    conn = rpc.call(RequestCode.GET_CONSUMER_CONNECTION_LIST, {"consumerGroup": "G"})
    assert orjson.loads(conn.body)["subscriptionTable"]["T"]["classFilterMode"] is True
    # filter servers pull the group's messages from the broker: everything, as pulled without a subscription
    for i in range(5):
        rpc.send("T", f"{i}".encode(), {"n": str(i)})
    assert rpc.pull_all("T", inline=False) == [f"{i}".encode() for i in range(5)]
    assert b.broker.filter_data.get("T", "G") is None  # no SQL92 filter data for a class


def test_a_class_subscription_needs_a_name(make_broker):
    rpc = make_broker().rpc()
    r = rpc.heartbeat("c1", "G", [class_sub("T", "")])
    assert r.code == R.SUBSCRIPTION_PARSE_FAILED and "needs a class name" in r.remark


def test_members_with_different_classes_conflict_loudly(make_broker):
    b = make_broker()
    rpc = b.rpc()
    v = int(time.time() * 1000)
    assert rpc.heartbeat("c1", "G", [class_sub("T", "filters.even:Even", v)]).code == R.SUCCESS
    bad = rpc.heartbeat("c2", "G", [class_sub("T", "filters.odd:Odd", v - 1)])
    assert bad.code == R.SUBSCRIPTION_NOT_LATEST
    assert "filters.even:Even" in bad.remark and "filters.odd:Odd" in bad.remark and "c1" in bad.remark
    # a tag subscription beside a class one conflicts the same way
    tag = rpc.heartbeat("c3", "G", [sub_data("T", "TagA", "TAG", version=v - 1)])
    assert tag.code == R.SUBSCRIPTION_NOT_LATEST and "filters.even:Even" in tag.remark
    stats = rpc.consume_stats("G")
    assert {c["refusedExpression"] for c in stats["subscriptionConflicts"]} == {"filters.odd:Odd", "TagA"}
    # the same class again is fine; a newer version replaces the group's class
    assert rpc.heartbeat("c4", "G", [class_sub("T", "filters.even:Even", v)]).code == R.SUCCESS
    assert rpc.heartbeat("c5", "G", [class_sub("T", "filters.odd:Odd", v + 1)]).code == R.SUCCESS
    assert b.broker.consumers.find_subscription("G", "T").expression == "filters.odd:Odd"


def test_members_class_errors_reach_consume_stats(make_broker):
    b = make_broker()
    rpc = b.rpc()
    rpc.send("T", b"x", {"n": "1"})
    v = int(time.time() * 1000)
    err = "filter class 'filters.even:Even': ZeroDivisionError: division by zero (filter server 127.0.0.1:3001)"
    assert rpc.heartbeat("c1", "G", [class_sub("T", "filters.even:Even", v, error=err)]).code == R.SUCCESS
    rpc.call(RequestCode.UPDATE_CONSUMER_OFFSET, {"consumerGroup": "G", "topic": "T", "queueId": 0,
                                                  "commitOffset": 0})
    stats = rpc.consume_stats("G")
    assert [(e["topic"], e["clientId"], e["className"], e["error"]) for e in stats["classFilterErrors"]] == [
        ("T", "c1", "filters.even:Even", err)]
    # the broker cannot count a class's matches: no filteredLag for its entries
    assert all("filteredLag" not in e for e in stats["offsetTable"] if e["topic"] == "T")
    # the member's next heartbeat without the error clears it
    assert rpc.heartbeat("c1", "G", [class_sub("T", "filters.even:Even", v)]).code == R.SUCCESS
    assert rpc.consume_stats("G")["classFilterErrors"] == []


def test_only_filter_servers_pull_a_class_groups_messages_unfiltered(make_broker):
    b = make_broker()
    rpc = b.rpc()
    v = int(time.time() * 1000)
    assert rpc.heartbeat("c1", "G", [class_sub("T", "filters.even:Even", v)]).code == R.SUCCESS
    for i in range(4):
        rpc.send("T", f"{i}".encode(), {"n": str(i)})
    # a member pulling the class group's topic with "*" is refused: it would get unfiltered messages
    r = rpc.pull("T", sub="*", expr_type="TAG", sub_version=v)
    assert r.code == R.SUBSCRIPTION_NOT_LATEST and "filters.even:Even" in r.remark
    # a filter server (registered on its connection) pulls the group's messages as "*" to run the class on
    b.broker.pull_processor.is_filter_server = lambda conn: True
    assert rpc.pull_all("T", sub="*", expr_type="TAG", sub_version=v) == [f"{i}".encode() for i in range(4)]
