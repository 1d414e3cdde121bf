"""Batch writes against real `sluice namesrv` + `sluice broker` subprocesses: ids derive from writeId and content,
so a replay (even repartitioned) is stored once and different rows under a reused writeId are all stored;
overwrite is refused; Kafka's value/key/headers columns are accepted."""
from __future__ import annotations

import pytest
from servers import running_cluster, wait_for_route

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.integration]

SCHEMA = "body binary, tags string, properties map<string,string>"


@pytest.fixture(scope="module")
def ns(tmp_path_factory):
    with running_cluster(tmp_path_factory.mktemp("writer")) as c:
        yield c.ns


def _write(df, ns, topic=None, **opts):
    w = df.write.format("sluice").option("namesrv", ns).mode("append")
    if topic:
        w = w.option("topic", topic)
    for k, v in opts.items():
        w = w.option(k, v)
    w.save()


def _bodies(spark, ns, topic):
    wait_for_route(ns, topic, timeout=20.0)
    return sorted(r.body for r in spark.read.format("sluice").option("namesrv", ns).option("topic", topic).load()
                  .select("body").collect())


def _df(spark, rows, parts=2):
    return spark.createDataFrame(rows, SCHEMA).repartition(parts)


def test_reused_write_id_keeps_new_rows_and_drops_replays(spark, ns):
    first = [(f"a{i}".encode(), "T", {"i": str(i)}) for i in range(60)]
    second = [(f"b{i}".encode(), "T", {"i": str(i)}) for i in range(50)]
    _write(_df(spark, first), ns, "Export", writeId="nightly-export")
    _write(_df(spark, second), ns, "Export", writeId="nightly-export")  # other rows, same writeId: all stored
    assert len(_bodies(spark, ns, "Export")) == 110
    _write(_df(spark, first, 3), ns, "Export", writeId="nightly-export")  # a replay, partitioned otherwise
    _write(_df(spark, second, 1), ns, "Export", writeId="nightly-export")
    assert _bodies(spark, ns, "Export") == sorted([r[0] for r in first + second])


def test_identical_rows_stay_apart_within_a_partition(spark, ns):
    rows = [(b"same", "T", {}), (b"same", "T", {}), (b"other", "T", {})]
    for _ in range(2):  # the second run is a replay: stored once
        _write(spark.createDataFrame(rows, SCHEMA).coalesce(1), ns, "Dupes", writeId="dupes")
    assert _bodies(spark, ns, "Dupes") == [b"other", b"same", b"same"]


def test_identical_rows_in_different_partitions_are_all_written(spark, ns):
    rows = [(b"twin", "T", {"n": "1"})] * 2 + [(b"solo", "T", {})]
    split = spark.createDataFrame([rows[0]], SCHEMA).union(spark.createDataFrame([rows[0], rows[2]], SCHEMA))
    assert split.rdd.getNumPartitions() >= 2
    _write(split, ns, "Twins", writeId="twins")  # both tasks send twin's occurrence 0; the driver adds the 2nd
    assert _bodies(spark, ns, "Twins") == [b"solo", b"twin", b"twin"]
    back = spark.read.format("sluice").option("namesrv", ns).option("topic", "Twins").load().collect()
    assert all(r.tags == "T" for r in back) and sorted(r.properties.get("n", "") for r in back) == ["", "1", "1"]
    for replay in (split, split.repartition(1), spark.createDataFrame(rows, SCHEMA).repartition(3)):
        _write(replay, ns, "Twins", writeId="twins")
    assert _bodies(spark, ns, "Twins") == [b"solo", b"twin", b"twin"]


def test_overwrite_is_refused_and_plain_save_names_append(spark, ns):
    df = spark.createDataFrame([(b"x", "T", {})], SCHEMA)
    with pytest.raises(Exception, match="cannot overwrite a topic"):
        df.write.format("sluice").option("namesrv", ns).option("topic", "Never").mode("overwrite").save()
    with pytest.raises(Exception, match="Append"):  # Spark refuses ErrorIfExists for Python sources itself
        df.write.format("sluice").option("namesrv", ns).option("topic", "Never").save()


def test_kafka_value_key_headers_and_topic_column(spark, ns):
    df = spark.createDataFrame(
        [("KafkaOut", b"v1", "k1", [("h1", b"x"), ("h2", b"y")]), ("KafkaOut", b"v2", None, [])],
        "topic string, value binary, key string, headers array<struct<key:string,value:binary>>")
    _write(df, ns)  # no topic option: the topic column names it
    wait_for_route(ns, "KafkaOut", timeout=20.0)
    back = sorted(spark.read.format("sluice").option("namesrv", ns).option("topic", "KafkaOut").load()
                  .select("body", "keys", "properties").collect())
    assert [r.body for r in back] == [b"v1", b"v2"]
    assert back[0].keys == ["k1"] and back[0].properties["h1"] == "x" and back[0].properties["h2"] == "y"
    assert not back[1].keys and "h1" not in back[1].properties
    with pytest.raises(Exception, match="not both"):
        _write(spark.createDataFrame([(b"a", b"b")], "body binary, value binary"), ns, "KafkaOut")
