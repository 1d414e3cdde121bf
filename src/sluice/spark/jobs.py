"""Bulk jobs over a store's files: ``scan`` (filter and export) and ``stats`` (counts, subscription hit rates).

Both read through ``format("sluice_store")`` (sluice.spark.store_source), so they work on a store whose
broker is down and spread the commit log across every core (or executor) Spark has.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import orjson

from sluice.errors import InvalidParameterError, TopicNotExistError
from sluice.filter import compile_selector
from sluice.spark.storefiles import check_store_path, store_topics

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


@dataclass(frozen=True, slots=True)
class Subscription:
    group: str
    topic: str
    expression_type: str
    expression: str


def read_store(spark: SparkSession, store: str, topic: str | None = None, *, split_bytes: int | None = None,
               check_crc: bool = True) -> DataFrame:
    """The store's consumer-visible messages as a DataFrame (the columns of ``format("sluice")``).

    ``store`` is made absolute here (executors do not share the driver's working directory); a missing
    store is an InvalidParameterError, a ``topic`` (comma list allowed) the store does not know a
    TopicNotExistError naming it."""
    store = os.path.abspath(store)
    check_store_path(store)
    check_topics(store, topic)
    r = spark.read.format("sluice_store").option("checkCrc", str(check_crc).lower())
    if topic:
        r = r.option("topic", topic)
    if split_bytes:
        r = r.option("splitBytes", str(split_bytes))
    return r.load(str(store))


def check_topics(store: str, topic: str | None) -> None:
    """Refuse topics (one or a comma list) the store has never held, naming them: a typo would
    otherwise read as an empty result."""
    if not topic:
        return
    wanted = [t.strip() for t in topic.split(",") if t.strip()]
    known = store_topics(store)
    missing = [t for t in wanted if t not in known]
    if missing:
        listed = ", ".join(sorted(known)[:20]) + (" ..." if len(known) > 20 else "") if known else "none"
        raise TopicNotExistError(f"unknown topic {', '.join(missing)} in store {store} (its topics: {listed})")


def scan(spark: SparkSession, store: str, out: str | None = None, *, topic: str | None = None,
         selector: str | None = None, selector_type: str = "SQL92", fmt: str = "parquet",
         split_bytes: int | None = None, mode: str = "errorifexists") -> DataFrame | int:
    """Messages of ``topic`` matching ``selector`` (the broker's outcome); written to ``out`` in ``fmt``
    and counted when ``out`` is given, else returned as a DataFrame. ``mode`` is Spark's save mode: by
    default an existing ``out`` is an error, never replaced."""
    from sluice.spark.selector import selector_column

    df = read_store(spark, store, topic, split_bytes=split_bytes)
    if selector:
        df = df.filter(selector_column(selector, selector_type))
    if out is None:
        return df
    out = os.path.abspath(out)
    df.write.format(fmt).mode(mode).save(out)
    return spark.read.format(fmt).load(out).count()


def live_subscriptions(store: str) -> list[Subscription]:
    """Subscriptions the broker persisted in {store}/config/consumerFilter.json (RocketMQ's
    ConsumerFilterManager format, as broker/filter_data.py writes it: filterDataByTopic → topic →
    groupFilterData → group → {expression, expressionType, bornTime, deadTime, ...}); [] when the file is
    absent. Dead ones (deadTime set and >= bornTime, RocketMQ's isDead) are left out; a missing type is TAG."""
    path = Path(store) / "config" / "consumerFilter.json"
    if not path.exists():
        return []
    data = orjson.loads(path.read_bytes())
    out = []
    for topic, per_topic in (data.get("filterDataByTopic") or {}).items():
        for group, fd in ((per_topic or {}).get("groupFilterData") or {}).items():
            dead = int((fd or {}).get("deadTime") or 0)
            if not fd or not fd.get("expression") or (dead and dead >= int(fd.get("bornTime") or 0)):
                continue
            out.append(Subscription(group, topic, str(fd.get("expressionType") or "TAG").upper(), fd["expression"]))
    return out


def parse_selector_arg(text: str) -> Subscription:
    """``TOPIC:EXPRESSION`` or ``TOPIC:TAG:EXPRESSION`` / ``TOPIC:SQL92:EXPRESSION`` from the command line."""
    topic, sep, rest = text.partition(":")
    if not sep or not topic or not rest:
        raise InvalidParameterError(f"--selector takes TOPIC:[TAG:|SQL92:]EXPRESSION, not {text!r}")
    kind = "SQL92"
    head, sep2, tail = rest.partition(":")
    if sep2 and head.upper() in ("TAG", "SQL92"):
        kind, rest = head.upper(), tail
    compile_selector(kind, rest)
    return Subscription("(command line)", topic, kind, rest)


#: Buckets of the stats timeline over the store's whole time span (whole seconds each).
TIMELINE_BUCKETS = 60


def _timelines(df: DataFrame, result: dict[str, dict]) -> None:
    from pyspark.sql import functions as F

    span = df.agg(F.min("ts").alias("lo"), F.max("ts").alias("hi")).collect()[0]
    if span["lo"] is None:
        return
    lo, hi = int(span["lo"]), int(span["hi"])
    width = max(1, -(-(hi - lo) // (1000 * TIMELINE_BUCKETS)))  # seconds, rounded up
    n = (hi - lo) // (width * 1000) + 1
    for name in result:
        result[name]["timeline"] = {"start_ms": lo, "bucket_seconds": width, "counts": [0] * n}
    bucket = F.floor((F.col("ts") - F.lit(lo)) / F.lit(width * 1000)).cast("int").alias("b")
    for r in df.groupBy("topic", bucket).count().collect():
        result[r["topic"]]["timeline"]["counts"][r["b"]] = r["count"]


def stats(spark: SparkSession, store: str, *, topic: str | None = None,
          subscriptions: list[Subscription] | None = None, top: int = 10, split_bytes: int | None = None) -> dict:
    """Per topic: message count, counts by tag, the ``top`` most frequent values of each property,
    each subscription's hit rate over the whole stored history, and ``timeline``: messages stored per
    time bucket (``start_ms``, ``bucket_seconds``, ``counts``; about TIMELINE_BUCKETS buckets over the
    store's time span, the same buckets for every topic)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    from sluice.spark.selector import selector_column

    df = (read_store(spark, store, topic, split_bytes=split_bytes)
          .select("topic", "tags", "properties", F.unix_millis("store_timestamp").alias("ts")).cache())
    try:
        result: dict[str, dict] = {}
        for r in df.groupBy("topic").count().collect():
            result[r["topic"]] = {"messages": r["count"], "tags": {}, "properties": {}, "subscriptions": []}
        _timelines(df, result)
        for r in df.groupBy("topic", "tags").count().collect():
            result[r["topic"]]["tags"][r["tags"] if r["tags"] is not None else "(none)"] = r["count"]
        props = (df.select("topic", F.explode("properties").alias("name", "value"))
                 .where(~F.col("name").isin("UNIQ_KEY", "KEYS", "TAGS"))
                 .groupBy("topic", "name", "value").count())
        ranked = props.withColumn("rank", F.row_number().over(
            Window.partitionBy("topic", "name").orderBy(F.desc("count"), F.asc("value"))))
        for r in ranked.where(F.col("rank") <= top).collect():
            result[r["topic"]]["properties"].setdefault(r["name"], {})[r["value"]] = r["count"]
        subs = [s for s in (subscriptions if subscriptions is not None else live_subscriptions(store))
                if s.topic in result]
        if subs:
            aggs = [F.sum(F.when((F.col("topic") == s.topic) & selector_column(s.expression, s.expression_type),
                                 1).otherwise(0)).alias(f"s{i}") for i, s in enumerate(subs)]
            row = df.agg(*aggs).collect()[0]
            for i, s in enumerate(subs):
                total = result[s.topic]["messages"]
                hits = int(row[f"s{i}"] or 0)
                result[s.topic]["subscriptions"].append({
                    "group": s.group, "type": s.expression_type, "expression": s.expression, "matched": hits,
                    "hit_rate": hits / total if total else 0.0})
        return result
    finally:
        df.unpersist()
