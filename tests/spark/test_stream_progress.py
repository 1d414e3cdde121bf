"""Streaming reads seen from the query's progress, against real `sluice namesrv` + `sluice broker` subprocesses:
latestOffset is reported with the source's name (Sluice, topics, selector) and Kafka's offsets-behind-latest
figures; offsets are keyed by topic, then queue; subscribe streams several topics."""
from __future__ import annotations

import json

import pytest
from servers import running_cluster

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.integration]

N, M = 120, 30


@pytest.fixture(scope="module")
def ns(tmp_path_factory):
    from sluice.client import Producer
    from sluice.message import Message

    with running_cluster(tmp_path_factory.mktemp("stream-progress")) as c:
        with Producer("progress-producer", c.ns) as p:
            for i in range(N):
                p.send(Message("Flow", f"f{i}".encode(), tags="A" if i % 3 else "B"))
            for i in range(M):
                p.send(Message("Flow2", f"g{i}".encode(), tags="A"))
        yield c.ns


def _json(v):
    """Progress offsets arrive as JSON text from PySpark's progress objects (parsed dicts from JSON progress)."""
    return json.loads(v) if isinstance(v, str) else v


def _run(spark, ns, tmp_path, name, **opts):
    r = spark.readStream.format("sluice").option("namesrv", ns).option("startingOffsets", "earliest")
    for k, v in opts.items():
        r = r.option(k, v)
    q = (r.load().writeStream.format("memory").queryName(name).trigger(availableNow=True)
         .option("checkpointLocation", str(tmp_path / name)).start())
    q.awaitTermination(180)
    assert q.exception() is None
    return q


def test_progress_reports_latest_offsets_name_and_lag(spark, ns, tmp_path):
    q = _run(spark, ns, tmp_path, "flow_progress", topic="Flow", selector="A", maxOffsetsPerTrigger="50")
    batches = [p for p in q.recentProgress if p["numInputRows"] > 0]
    assert len(batches) >= 3  # 120 offsets, 50 per trigger
    for p in batches:
        [src] = p["sources"]
        latest = _json(src["latestOffset"])
        assert latest["source"] == "Sluice[Flow TAG:A]"
        assert sum(latest["offsets"]["Flow"].values()) == N
        assert set(_json(src["endOffset"])) == {"Flow"}
    first, last = (_json(b["sources"][0]["latestOffset"]) for b in (batches[0], batches[-1]))
    assert first["maxOffsetsBehindLatest"] > 0 and first["avgOffsetsBehindLatest"] > 0
    assert last["maxOffsetsBehindLatest"] == 0 and last["avgOffsetsBehindLatest"] == 0
    assert sum(p["numInputRows"] for p in batches) == sum(1 for i in range(N) if i % 3)
    assert spark.table("flow_progress").count() == sum(1 for i in range(N) if i % 3)


def test_subscribe_streams_several_topics(spark, ns, tmp_path):
    q = _run(spark, ns, tmp_path, "flow_both", subscribe="Flow,Flow2")
    end = _json([p for p in q.recentProgress if p["numInputRows"] > 0][-1]["sources"][0]["endOffset"])
    assert set(end) == {"Flow", "Flow2"} and sum(end["Flow2"].values()) == M
    counts = {r.topic: r["count"] for r in spark.table("flow_both").groupBy("topic").count().collect()}
    assert counts == {"Flow": N, "Flow2": M}


def test_pattern_stream_picks_up_a_new_topic_from_its_start(spark, ns, tmp_path):
    from servers import wait_for_route

    from sluice.client import Producer
    from sluice.message import Message

    out = tmp_path / "out"

    def run():  # a parquet sink: the memory sink cannot resume from a checkpoint
        q = (spark.readStream.format("sluice").option("namesrv", ns).option("subscribePattern", "Dyn.*")
             .option("startingOffsets", "earliest").load().select("topic", "body")
             .writeStream.format("parquet").option("path", str(out))
             .option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True).start())
        q.awaitTermination(180)
        assert q.exception() is None

    with Producer("progress-dyn", ns) as p:
        for i in range(7):
            p.send(Message("DynA", f"a{i}".encode()))
    wait_for_route(ns, "DynA", timeout=20.0)
    run()
    assert spark.read.parquet(str(out)).count() == 7
    with Producer("progress-dyn", ns) as p:
        for i in range(5):
            p.send(Message("DynB", f"b{i}".encode()))
        p.send(Message("DynA", b"a-late"))
    wait_for_route(ns, "DynB", timeout=20.0)
    run()  # same checkpoint: the new topic from its start, the old one from where it was
    counts = {r.topic: r["count"] for r in spark.read.parquet(str(out)).groupBy("topic").count().collect()}
    assert counts == {"DynA": 8, "DynB": 5}
