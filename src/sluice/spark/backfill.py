"""``backfill``, Spark side: which stored messages of a topic match a (new) subscription, as bitmaps per queue.

The job reads the store's files (``sluice_store``), evaluates the selector with the broker's semantics
(``selector_column``), and builds one bit per queue offset in parallel with Spark's own bitmap
aggregates (``bitmap_construct_agg`` per queue and bucket of 32768 offsets, in the JVM); the driver
only joins the buckets. The result is written as one file per queue (layout in sluice.format) plus a
``manifest.json``; handing it to a running broker is the broker's part (docs/spark.md, "backfill").

The file ``{out}/{topic}/{queue_id}/{group}.bitmap`` is laid out in sluice.format (the backfill bitmap
file); the broker reads it with the same structs.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import orjson

from sluice.errors import InvalidParameterError
from sluice.filter import compile_selector
from sluice.format import BACKFILL_HEADER as HEADER
from sluice.format import BACKFILL_MAGIC as MAGIC
from sluice.format import BACKFILL_VERSION as VERSION
from sluice.format import backfill_selector_hash as selector_hash
from sluice.persist import write_atomic

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

CHUNK = 32768  # bits per Spark bitmap bucket


def backfill(spark: SparkSession, store: str, topic: str, group: str, expression: str, out: str, *,
             expression_type: str = "SQL92", split_bytes: int | None = None) -> dict:
    """Compute the bitmaps of ``expression`` over ``topic``'s stored history and write them under ``out``.
    Returns the manifest (per queue: first, end, matched)."""
    from pyspark.sql import functions as F

    from sluice.spark.jobs import read_store
    from sluice.spark.selector import selector_column

    if not group:
        raise InvalidParameterError("backfill needs the consumer group the subscription belongs to")
    compile_selector(expression_type, expression)
    df = (read_store(spark, store, topic, split_bytes=split_bytes)
          .where(F.col("topic") == topic)
          .select("queue_id", "queue_offset", selector_column(expression, expression_type).alias("hit")))
    bounds = {r["queue_id"]: (r["lo"], r["hi"]) for r in
              df.groupBy("queue_id").agg(F.min("queue_offset").alias("lo"), F.max("queue_offset").alias("hi"))
              .collect()}
    # Spark's bitmaps take positive positions: offset o is value o + 1, bucket o // CHUNK + 1, bit o % CHUNK.
    value = F.col("queue_offset") + 1
    chunks = (df.where("hit").groupBy("queue_id", F.bitmap_bucket_number(value).alias("bucket"))
              .agg(F.bitmap_construct_agg(F.bitmap_bit_position(value)).alias("bits"),
                   F.count("*").alias("hits"))
              .collect())
    by_queue: dict[int, dict[int, tuple[bytes, int]]] = {}
    for r in chunks:
        by_queue.setdefault(r["queue_id"], {})[r["bucket"] - 1] = (bytes(r["bits"]), r["hits"])
    digest = selector_hash(expression_type, expression)
    manifest = {"topic": topic, "group": group, "expression_type": expression_type.upper(),
                "expression": expression, "selector_sha256": digest.hex(), "queues": {}}
    for qid, (lo, hi) in sorted(bounds.items()):
        end = hi + 1
        first_chunk, last_chunk = lo // CHUNK, hi // CHUNK
        bits = np.zeros((last_chunk - first_chunk + 1) * CHUNK, dtype=bool)
        matched = 0
        for c, (packed, hits) in by_queue.get(qid, {}).items():
            bits[(c - first_chunk) * CHUNK:(c - first_chunk + 1) * CHUNK] = np.unpackbits(
                np.frombuffer(packed, dtype=np.uint8), bitorder="little")[:CHUNK].astype(bool)
            matched += hits
        start = lo - first_chunk * CHUNK
        body = np.packbits(bits[start:start + (end - lo)]).tobytes()
        path = Path(out) / topic / str(qid) / f"{group}.bitmap"
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, HEADER.pack(MAGIC, VERSION, 0, digest, lo, end, matched) + body)
        manifest["queues"][str(qid)] = {"first": lo, "end": end, "matched": matched, "file": str(path)}
    (Path(out) / "manifest.json").write_bytes(orjson.dumps(manifest, option=orjson.OPT_INDENT_2))
    return manifest


def read_bitmap(path: str | os.PathLike[str]) -> tuple[dict, np.ndarray]:
    """(header fields, bool array over [first, end)) of one backfill file."""
    raw = Path(path).read_bytes()
    magic, version, _r, digest, first, end, matched = HEADER.unpack_from(raw, 0)
    if magic != MAGIC or version != VERSION:
        raise InvalidParameterError(f"{path} is not a version-{VERSION} backfill bitmap")
    bits = np.unpackbits(np.frombuffer(raw, dtype=np.uint8, offset=HEADER.size))[: end - first].astype(bool)
    return {"selector_sha256": digest.hex(), "first": first, "end": end, "matched": matched}, bits
