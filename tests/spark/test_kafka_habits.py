"""What a Kafka-source user does, against real `sluice namesrv` + `sluice broker` subprocesses: offsets JSON
keyed by topic then queue, subscribe / subscribePattern, selectors that fail loudly, and reads that leave no
consumer group or %RETRY% topic behind."""
from __future__ import annotations

import io

import pytest
from servers import running_cluster

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.integration]

ORDERS, REFUNDS = 160, 40


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    from sluice.client import Producer
    from sluice.message import Message

    with running_cluster(tmp_path_factory.mktemp("kafka-habits"), config="enable_property_filter = true\n") as c:
        with Producer("habits-producer", c.ns) as p:
            for i in range(ORDERS):
                p.send(Message("Orders", f"o{i}".encode(), tags=("Paid", "Shipped")[i % 2],
                               properties={"amount": str(i)}))
            for i in range(REFUNDS):
                p.send(Message("Refunds", f"r{i}".encode(), tags="Refund"))
        yield c


def _read(spark, ns, **opts):
    r = spark.read.format("sluice").option("namesrv", ns)
    for k, v in opts.items():
        r = r.option(k, v)
    return r.load()


def _per_queue(spark, ns, topic="Orders"):
    rows = _read(spark, ns, topic=topic).select("broker", "queue_id").collect()
    out: dict[int, int] = {}
    for r in rows:
        out[r.queue_id] = out.get(r.queue_id, 0) + 1
    return rows[0].broker, out


def test_kafka_offsets_json_keyed_by_topic_then_queue(spark, cluster):
    broker, per_queue = _per_queue(spark, cluster.ns)
    total = sum(per_queue.values())
    got = _read(spark, cluster.ns, topic="Orders", startingOffsets='{"Orders": {"0": 10}}').select("queue_id").collect()
    assert len(got) == total - 10 and sum(1 for r in got if r.queue_id == 0) == per_queue[0] - 10
    got = _read(spark, cluster.ns, topic="Orders", startingOffsets='{"Orders": {"%s:1": -1}}' % broker,
                endingOffsets='{"Orders": {"0": 4, "2": -1}}').select("queue_id").collect()
    want = 4 + sum(v for q, v in per_queue.items() if q not in (0, 1))
    assert len(got) == want


@pytest.mark.parametrize("spec, match", [
    ('{"Ordrs": {"0": 10}}', "names topic 'Ordrs'"),
    ('{"Orders": {"broker-zz:0": 10}}', "no broker 'broker-zz'"),
    ('{"Orders": {"99": 10}}', "no queue 99"),
])
def test_unknown_topic_broker_or_queue_key_is_an_error(spark, cluster, spec, match):
    with pytest.raises(Exception, match=match):
        _read(spark, cluster.ns, topic="Orders", startingOffsets=spec).count()


def test_unknown_topic_is_an_error_naming_it(spark, cluster):
    with pytest.raises(Exception, match="topic 'Ordrs' does not exist"):
        _read(spark, cluster.ns, topic="Ordrs").count()
    with pytest.raises(Exception, match="matches no topic"):
        _read(spark, cluster.ns, subscribePattern="Nothing.*").count()


def test_subscribe_and_pattern_read_several_topics(spark, cluster):
    for opts in ({"subscribe": "Orders, Refunds"}, {"subscribePattern": "(Orders|Refunds)"},
                 {"subscribePattern": "Or.*|Re.*"}):
        counts = {r.topic: r["count"] for r in _read(spark, cluster.ns, **opts).groupBy("topic").count().collect()}
        assert counts == {"Orders": ORDERS, "Refunds": REFUNDS}, opts
    got = _read(spark, cluster.ns, subscribe="Orders,Refunds",
                startingOffsets='{"Refunds": {"0": -1, "1": -1, "2": -1, "3": -1}}').where("topic = 'Refunds'")
    assert got.count() == 0


def test_selector_naming_tags_fails_at_load_in_a_short_error(spark, cluster):
    with pytest.raises(Exception) as e:
        _read(spark, cluster.ns, topic="Orders", selectorType="SQL92", selector="tags = 'Paid'")
    assert "TAGS" in str(e.value) and len(str(e.value)) < 600
    with pytest.raises(Exception) as e:
        _read(spark, cluster.ns, topic="Orders", selectorType="SQL92", selector="amount >> 3")
    text = str(e.value)
    assert "option selector: Invalid SQL92 selector" in text and "  amount >> 3\n" in text and len(text) < 600
    got = _read(spark, cluster.ns, topic="Orders", selectorType="SQL92", selector="TAGS = 'Paid'").count()
    assert got == ORDERS // 2


def test_reads_leave_no_group_or_retry_topic(spark, cluster, tmp_path):
    from sluice.admin import main as admin_main

    for sel in ("*", "Paid"):
        _read(spark, cluster.ns, topic="Orders", selector=sel).count()
    _read(spark, cluster.ns, subscribe="Orders,Refunds", selectorType="SQL92", selector="amount > 3").count()
    q = (spark.readStream.format("sluice").option("namesrv", cluster.ns).option("topic", "Refunds")
         .option("startingOffsets", "earliest").load().writeStream.format("noop")
         .option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True).start())
    q.awaitTermination(120)
    outputs = []
    for cmd in (["topicList"], ["consumerProgress"]):
        out = io.StringIO()
        status = admin_main(["-n", cluster.ns, *cmd], env={}, stdout=out, stderr=io.StringIO())
        outputs.append(out.getvalue())
        assert int(status) == 0, out.getvalue()
    assert "Orders" in outputs[0]
    assert not any("spark-sluice" in o or "%RETRY%" in o for o in outputs), outputs
