"""``sluice spark …``: bulk jobs over a store's files (scan, stats, backfill) and the demo job."""
from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import Any

import click
import orjson

from sluice.errors import SluiceError


def _session(master: str):
    try:
        from sluice.spark.builder import session
    except ImportError:  # pragma: no cover - depends on the install
        raise click.ClickException("PySpark is not installed: pip install 'sluice[spark]'") from None
    return session(master)


@contextlib.contextmanager
def _job_session(master: str) -> Iterator[Any]:
    """A Spark session for one command: a SluiceError becomes the command's error message, and the
    session stops however the job ends."""
    spark = _session(master)
    try:
        yield spark
    except SluiceError as e:
        raise click.ClickException(str(e)) from None
    finally:
        spark.stop()


@click.group("spark")
def spark_group() -> None:
    """Spark jobs (PySpark, embedded local[*] unless --master says otherwise)."""


@spark_group.command("scan")
@click.argument("store", type=click.Path(exists=True, file_okay=False))
@click.option("--out", required=True, help="Output directory (or table path) for the matching messages.")
@click.option("--topic", default=None, help="Only this topic (comma list allowed); default every topic.")
@click.option("--selector", default=None, help="Selector the messages must match (broker semantics).")
@click.option("--selector-type", type=click.Choice(["SQL92", "TAG"], case_sensitive=False), default="SQL92",
              show_default=True)
@click.option("--format", "fmt", default="parquet", show_default=True, help="Any Spark sink format.")
@click.option("--split-mb", type=click.IntRange(1), default=64, show_default=True, help="Commit log per task.")
@click.option("--master", default="local[*]", show_default=True)
def scan_command(store: str, out: str, topic: str | None, selector: str | None, selector_type: str, fmt: str,
                 split_mb: int, master: str) -> None:
    """Filter a store's messages with Spark and write them out (works while the broker is down)."""
    from sluice.spark.jobs import scan

    with _job_session(master) as spark:
        n = scan(spark, store, out, topic=topic, selector=selector, selector_type=selector_type.upper(), fmt=fmt,
                 split_bytes=split_mb * 1024 * 1024)
        click.echo(orjson.dumps({"store": store, "out": out, "messages": n}).decode())


@spark_group.command("stats")
@click.argument("store", type=click.Path(exists=True, file_okay=False))
@click.option("--topic", default=None)
@click.option("--selector", "selectors", multiple=True,
              help="TOPIC:[TAG:|SQL92:]EXPRESSION; repeatable. Default: the broker's persisted subscriptions.")
@click.option("--top", type=click.IntRange(1), default=10, show_default=True, help="Values shown per property.")
@click.option("--master", default="local[*]", show_default=True)
def stats_command(store: str, topic: str | None, selectors: tuple[str, ...], top: int, master: str) -> None:
    """Per topic: counts by tag and property value, and each subscription's hit rate over history (JSON)."""
    from sluice.spark.jobs import parse_selector_arg, stats

    try:
        subs = [parse_selector_arg(s) for s in selectors] or None
    except SluiceError as e:
        raise click.ClickException(str(e)) from None
    with _job_session(master) as spark:
        result = stats(spark, store, topic=topic, subscriptions=subs, top=top)
        sys.stdout.write(orjson.dumps(result, option=orjson.OPT_INDENT_2).decode() + "\n")


@spark_group.command("backfill")
@click.argument("store", type=click.Path(exists=True, file_okay=False))
@click.option("--topic", required=True)
@click.option("--group", required=True, help="The consumer group whose new subscription this is.")
@click.option("--selector", required=True, help="The subscription's expression.")
@click.option("--selector-type", type=click.Choice(["SQL92", "TAG"], case_sensitive=False), default="SQL92",
              show_default=True)
@click.option("--out", required=True, help="Directory for the per-queue bitmaps and manifest.json.")
@click.option("--master", default="local[*]", show_default=True)
def backfill_command(store: str, topic: str, group: str, selector: str, selector_type: str, out: str,
                     master: str) -> None:
    """Which stored messages of TOPIC match a subscription: one bitmap per queue (for the broker to skip
    non-matching messages of the backlog; see docs/spark.md)."""
    from sluice.spark.backfill import backfill

    with _job_session(master) as spark:
        manifest = backfill(spark, store, topic, group, selector, out, expression_type=selector_type.upper())
        click.echo(orjson.dumps(manifest, option=orjson.OPT_INDENT_2).decode())


@spark_group.command("demo")
@click.option("--namesrv", required=True)
@click.option("--topic", required=True)
@click.option("--out", required=True)
def demo_command(namesrv: str, topic: str, out: str) -> None:
    """Run the demo job (pushed-down read, aggregate, Parquet export) and print its results."""
    from sluice.spark.demo import demo_job

    click.echo(orjson.dumps(demo_job(namesrv, topic, out), option=orjson.OPT_INDENT_2).decode())
