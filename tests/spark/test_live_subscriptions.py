"""`sluice spark stats` reads live subscriptions from the consumerFilter.json the broker writes."""
from __future__ import annotations

from pathlib import Path

import orjson

from sluice.protocol.codes import RequestCode
from sluice.spark.jobs import Subscription, live_subscriptions


def _heartbeat(b, client: str, group: str, subs: list[tuple[str, str, str]]) -> None:
    body = {"clientID": client, "producerDataSet": [], "consumerDataSet": [{
        "groupName": group, "consumeType": "CONSUME_PASSIVELY", "messageModel": "CLUSTERING",
        "consumeFromWhere": "CONSUME_FROM_FIRST_OFFSET", "subscriptionDataSet": [
            {"topic": t, "subString": e, "expressionType": k, "subVersion": 1} for t, k, e in subs]}]}
    assert b.call(RequestCode.HEART_BEAT, {}, orjson.dumps(body)).code == 0


def test_stats_reads_what_the_broker_persists(make_broker, tmp_path: Path) -> None:
    b = make_broker()
    _heartbeat(b, "c1", "g-sql", [("Orders", "SQL92", "amount > 5")])
    _heartbeat(b, "c2", "g-gone", [("Orders", "SQL92", "region = 'eu'")])
    b.call(RequestCode.UNREGISTER_CLIENT, {"clientID": "c2", "consumerGroup": "g-gone"})
    b.broker.filter_data.persist(force=True)
    store = b.broker.config.store
    subs = live_subscriptions(store)
    assert Subscription("g-sql", "Orders", "SQL92", "amount > 5") in subs
    assert all(s.group != "g-gone" for s in subs)
    raw = orjson.loads((Path(store) / "config" / "consumerFilter.json").read_bytes())
    assert raw["filterDataByTopic"]["Orders"]["groupFilterData"]["g-gone"]["deadTime"] > 0
    assert live_subscriptions(str(tmp_path / "nothing")) == []
