"""The job the README's main run ends with: a pushed-down read of the demo topic, an aggregate, a Parquet export."""
from __future__ import annotations

import time
from pathlib import Path

#: The where clause of the demo: its tag conjunct goes to the broker (pushdown); the selector on the
#: amount property runs in Spark with the broker's semantics (selector_column).
DEMO_TAGS = ("Paid", "Shipped")
DEMO_SELECTOR = "amount > 500"


def demo_job(namesrv: str, topic: str, out_dir: str, *, spark=None, tags: tuple[str, ...] = DEMO_TAGS,
             selector: str = DEMO_SELECTOR) -> dict:
    """Read ``topic`` through the broker with ``tags IN (...)`` pushed down, keep ``selector`` matches,
    aggregate per tag and region, export to ``out_dir``/messages.parquet.

    Returns ``{"ok", "lines" (printable), "per_group", "exported", "parquet", "seconds"}``."""
    from pyspark.sql import functions as F

    from sluice.spark.builder import session
    from sluice.spark.selector import selector_column

    started = time.monotonic()
    own = spark is None
    spark = spark or session()
    try:
        df = (spark.read.format("sluice").option("namesrv", namesrv).option("topic", topic).load()
              .where(F.col("tags").isin(list(tags))).where(selector_column(selector)).cache())
        groups = (df.groupBy("tags", F.col("properties")["region"].alias("region"))
                  .agg(F.count("*").alias("messages"),
                       F.sum(F.col("properties")["amount"].try_cast("bigint")).alias("amount"))
                  .orderBy("tags", "region").collect())
        out = Path(out_dir) / "messages.parquet"
        (df.select("msg_id", "queue_id", "queue_offset", "tags", "keys", "properties", "body", "store_timestamp")
         .write.mode("overwrite").parquet(str(out)))
        exported = spark.read.parquet(str(out)).count()
        df.unpersist()
        per_group = [{"tags": r["tags"], "region": r["region"], "messages": r["messages"],
                      "amount": int(r["amount"] or 0)} for r in groups]
        total = sum(g["messages"] for g in per_group)
        lines = [f"read {topic} where tags IN {tags} (pushed to the broker) AND {selector} (in Spark)"]
        lines += [f"{g['tags']:<10} {str(g['region']):<6} {g['messages']:>6} messages  amount {g['amount']}"
                  for g in per_group]
        lines.append(f"exported {exported} messages to {out} in {time.monotonic() - started:.1f} s")
        return {"ok": exported == total, "lines": lines, "per_group": per_group, "exported": exported,
                "parquet": str(out), "seconds": round(time.monotonic() - started, 2)}
    finally:
        if own:
            spark.stop()
