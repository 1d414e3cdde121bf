"""format("sluice") against real `sluice namesrv` + `sluice broker` subprocesses."""
from __future__ import annotations

import time

import pytest
from servers import running_cluster, wait_for_route

from sluice.filter import compile_selector

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.integration]

N = 240


def _props(i: int) -> dict[str, str]:
    return {"a": str(i), "region": ("eu", "us", "ap")[i % 3]}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    from sluice.client import Producer
    from sluice.message import Message

    with running_cluster(tmp_path_factory.mktemp("spark-broker"), config="enable_property_filter = true\n") as c:
        with Producer("spark-test-producer", c.ns) as p:
            for i in range(N):
                p.send(Message("SparkIn", f"body-{i}".encode(), tags=f"Tag{i % 4}", keys=[f"k{i}"],
                               properties=_props(i)))
        yield c.ns


def _read(spark, ns, **opts):
    r = spark.read.format("sluice").option("namesrv", ns).option("topic", "SparkIn")
    for k, v in opts.items():
        r = r.option(k, v)
    return r.load()


def test_batch_read_all_columns(spark, cluster):
    df = _read(spark, cluster)
    rows = df.collect()
    assert len(rows) == N
    r = sorted(rows, key=lambda r: int(r.properties["a"]))[5]
    assert r.body == b"body-5" and r.tags == "Tag1" and r.keys == ["k5"] and r.properties["region"] == "ap"
    assert r.properties["TAGS"] == "Tag1" and r.msg_id == r.properties["UNIQ_KEY"] and r.broker
    assert len({(x.queue_id, x.queue_offset) for x in rows}) == N


def test_pushdown_results_equal_spark_filtering(spark, cluster):
    where = "tags IN ('Tag1', 'Tag2') AND queue_offset >= 3 AND queue_id IN (0, 1, 2, 3)"
    spark.conf.set("spark.sql.python.filterPushdown.enabled", "true")
    pushed = sorted(r.msg_id for r in _read(spark, cluster).where(where).collect())
    plain = sorted(r.msg_id for r in _read(spark, cluster).collect()
                   if r.tags in ("Tag1", "Tag2") and r.queue_offset >= 3)
    assert pushed == plain and len(pushed) > 0


def test_store_timestamp_bounds_are_pushed_exactly(spark, cluster):
    rows = sorted(_read(spark, cluster).select("store_timestamp", "msg_id").collect())
    mid = rows[len(rows) // 2].store_timestamp
    import operator

    ops = {">=": operator.ge, ">": operator.gt, "<": operator.lt, "<=": operator.le, "=": operator.eq}
    for op, fn in ops.items():
        where = f"store_timestamp {op} timestamp'{mid.isoformat()}'"
        pushed = sorted(r.msg_id for r in _read(spark, cluster).where(where).collect())
        want = sorted(r.msg_id for r in rows if fn(r.store_timestamp, mid))
        assert pushed == want, op


def test_broker_side_sql92_selector_matches_selector_column(spark, cluster):
    from sluice.spark import selector_column

    expr = "a > 100 AND region IN ('eu', 'us')"
    broker = {r.msg_id for r in _read(spark, cluster, selectorType="SQL92", selector=expr).collect()}
    in_spark = {r.msg_id for r in _read(spark, cluster).where(selector_column(expr)).collect()}
    sel = compile_selector("SQL92", expr)
    assert broker == in_spark and len(broker) == sum(1 for i in range(N) if sel.matches(_props(i)))


def test_stream_available_now_honours_max_offsets_and_resumes(spark, cluster, tmp_path):
    from sluice.client import Producer
    from sluice.message import Message

    out, ckpt = tmp_path / "out", tmp_path / "ckpt"

    def run():
        q = (spark.readStream.format("sluice").option("namesrv", cluster).option("topic", "SparkIn")
             .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", "100").load()
             .select("msg_id", "queue_id", "queue_offset")
             .writeStream.format("parquet").option("path", str(out)).option("checkpointLocation", str(ckpt))
             .trigger(availableNow=True).start())
        q.awaitTermination(120)
        return q

    q = run()
    assert len([p for p in q.recentProgress if p["numInputRows"] > 0]) >= 3  # 240 rows, 100 per trigger
    assert spark.read.parquet(str(out)).count() == N
    with Producer("spark-test-producer2", cluster) as p:
        for i in range(10):
            p.send(Message("SparkIn", b"late", tags="Late", properties={"a": "-1"}))
    run()
    df = spark.read.parquet(str(out))
    assert df.count() == N + 10 and df.select("msg_id").distinct().count() == N + 10


def test_batch_write_then_read_back(spark, cluster):
    rows = [(f"w{i}".encode(), "W" if i % 2 else "V", {"n": str(i)}) for i in range(20)]
    df = spark.createDataFrame(rows, "body binary, tags string, properties map<string,string>")
    df.write.format("sluice").option("namesrv", cluster).option("topic", "SparkOut").mode("append").save()
    wait_for_route(cluster, "SparkOut", timeout=20.0)
    back = (spark.read.format("sluice").option("namesrv", cluster).option("topic", "SparkOut")
            .option("selector", "W").load().collect())
    assert sorted(int(r.properties["n"]) for r in back) == list(range(1, 20, 2))
    assert all(len(r.msg_id) == 32 for r in back)


def test_demo_job(spark, cluster, tmp_path):
    from sluice.spark import demo_job

    res = demo_job(cluster, "SparkIn", str(tmp_path), spark=spark, tags=("Tag1", "Tag2"), selector="a > 100")
    want = sum(1 for i in range(N) if i % 4 in (1, 2) and i > 100)
    assert res["ok"] and res["exported"] == want and sum(g["messages"] for g in res["per_group"]) == want
    assert any("pushed to the broker" in line for line in res["lines"])


def test_offsets_json_timestamps_and_min_partitions(spark, cluster):
    rows = _read(spark, cluster).select("broker", "queue_id", "queue_offset").collect()
    broker = rows[0].broker
    per_queue = {}
    for r in rows:
        per_queue[r.queue_id] = per_queue.get(r.queue_id, 0) + 1
    ending = '{"SparkIn": {"%s:0": 5}}' % broker
    got = _read(spark, cluster, endingOffsets=ending).select("queue_id").collect()
    want = 5 + sum(v for q, v in per_queue.items() if q != 0)
    assert len(got) == want and sum(1 for r in got if r.queue_id == 0) == 5
    starting = '{"SparkIn": {"0": 3, "%s:1": -1}}' % broker  # a bare queue id: the topic has one broker
    got = _read(spark, cluster, startingOffsets=starting).select("queue_id").collect()
    assert len(got) == len(rows) - 3 - per_queue.get(1, 0)
    future = str(int(time.time() * 1000) + 3_600_000)
    assert _read(spark, cluster, startingTimestamp=future).count() == 0
    assert _read(spark, cluster, startingTimestamp="0").count() == len(rows)
    df = _read(spark, cluster, minPartitions="9")
    assert df.rdd.getNumPartitions() >= 9 and df.count() == len(rows)


def test_stream_write_gives_query_and_batch_derived_ids(spark, cluster, tmp_path):
    from sluice.spark.source import _unique_key

    total = _read(spark, cluster).count()
    q = (spark.readStream.format("sluice").option("namesrv", cluster).option("topic", "SparkIn")
         .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", "150").load()
         .select("body", "tags", "properties")
         .writeStream.format("sluice").option("namesrv", cluster).option("topic", "SparkCopy")
         .option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True).start())
    q.awaitTermination(180)
    assert q.exception() is None
    batches = [p["batchId"] for p in q.recentProgress if p["numInputRows"] > 0]
    wait_for_route(cluster, "SparkCopy", timeout=20.0)
    back = _read(spark, cluster, topic="SparkCopy").select("msg_id", "properties").collect()
    assert len(back) == total
    possible = {_unique_key(q.id, b, p, i) for b in batches for p in range(8) for i in range(total)}
    assert {r.msg_id for r in back} <= possible
    assert len({r.msg_id for r in back}) == total
