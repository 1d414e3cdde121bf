"""``sluice spark …``: bulk jobs over a store's files (scan, stats, backfill), the demo job, and
``submit`` (spark-submit from this venv, whatever PATH holds).

The bulk jobs take ``--master`` (default: what spark-submit or the environment chose, else local[*]),
make store and output paths absolute (executors do not share the driver's working directory), show
progress on a terminal (sluice.spark.progress; ``--quiet`` or piped output shows none), end with a
one-line summary on stderr and their JSON on stdout. Failures are one line; ``SLUICE_SPARK_TRACEBACK=1``
shows Spark's whole error.
"""
from __future__ import annotations

import contextlib
import os
import re
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
import orjson

from sluice.errors import SluiceError

# A Sluice error raised inside a Spark task or planner arrives wrapped in Spark's text: the class and
# message are found again there.
_SLUICE_IN_SPARK = re.compile(r"sluice\.errors\.(\w+Error): (.+)")


def _one_line(e: BaseException) -> str:
    """A Spark or py4j error as one line: the innermost Sluice error it carries, else its first line."""
    text = str(e)
    found = _SLUICE_IN_SPARK.findall(text)
    if found:
        name, message = found[-1]
        return f"{name}: {message.strip()}"
    first = next((line.strip() for line in text.splitlines() if line.strip()), type(e).__name__)
    return first if len(first) <= 400 else first[:400] + "…"


# The masters spark-submit accepts (SparkSubmit.prepareSubmitEnvironment): anything else makes the JVM
# print a stack trace and exit before Python gets an error, so it is refused here first.
_MASTER = re.compile(r"local(\[(\*|\d+)(,\s*\d+)?\])?|local-cluster\[\d+,\s*\d+,\s*\d+\]|yarn|"
                     r"(spark|k8s)://\S+")


def _check_master(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    if value is not None and not _MASTER.fullmatch(value):
        raise click.BadParameter(f"{value!r} is not a Spark master: local[N], local[*], spark://HOST:PORT[,...], "
                                 f"yarn or k8s://URL")
    return value


_store_arg = click.argument("store", type=click.Path(exists=True, file_okay=False, resolve_path=True))
_master_opt = click.option("--master", default=None, callback=_check_master,
                           help="Spark master URL. Default: spark-submit's or $MASTER, else local[*].")
_quiet_opt = click.option("--quiet", "-q", is_flag=True, help="No progress display and no summary line.")


def _traceback_wanted() -> bool:
    return bool(os.environ.get("SLUICE_SPARK_TRACEBACK"))


def _session(master: str | None):
    try:
        from sluice.spark.builder import session
    except ImportError:  # pragma: no cover - depends on the install
        raise click.ClickException("PySpark is not installed: pip install 'sluice[spark]'") from None
    # Spark's own error log repeats a failed task's stack several times; the job's exception says it once.
    return session(master, log_level="error" if _traceback_wanted() else "off")


@contextlib.contextmanager
def _job(job: str, master: str | None, quiet: bool) -> Iterator[tuple[Any, Any]]:
    """(Spark session, JobProgress) for one command. A SluiceError or a Spark error becomes the command's
    one-line error message; the progress display and the session stop however the job ends."""
    from rich.console import Console

    from sluice.spark.progress import JobProgress

    with JobProgress(Console(stderr=True), job, quiet=quiet) as progress:
        spark = None
        try:
            spark = _session(master)
            progress.attach(spark)
            yield spark, progress
        except SluiceError as e:
            raise click.ClickException(str(e)) from None
        except Exception as e:  # noqa: BLE001 - Spark's own (py4j, AnalysisException, PythonException)
            if _traceback_wanted() or type(e).__module__.startswith(("click", "builtins")):
                raise
            raise click.ClickException(_one_line(e) + "  (SLUICE_SPARK_TRACEBACK=1 shows Spark's error)") from None
        finally:
            if spark is not None:
                spark.stop()


def _check_out(out: str, overwrite: bool) -> str:
    """The absolute output path; a non-empty existing directory (or a file) is refused unless ``overwrite``."""
    path = Path(out).absolute()
    if path.exists() and not overwrite:
        if not path.is_dir():
            raise click.UsageError(f"--out {path} exists and is not a directory; pass --overwrite to replace it")
        entries = sum(1 for _ in path.iterdir())
        if entries:
            raise click.UsageError(f"--out {path} is not empty ({entries} entries); pass --overwrite to replace "
                                   f"its contents")
    return str(path)


@click.group("spark")
def spark_group() -> None:
    """Spark jobs (PySpark; local[*] unless --master, spark-submit or $MASTER says otherwise)."""


@spark_group.command("scan")
@_store_arg
@click.option("--out", required=True, help="Output directory for the matching messages (must be empty or absent).")
@click.option("--overwrite", is_flag=True, help="Replace the contents of a non-empty --out.")
@click.option("--topic", default=None, help="Only this topic (comma list allowed); default every topic.")
@click.option("--selector", default=None, help="Selector the messages must match (broker semantics).")
@click.option("--selector-type", type=click.Choice(["SQL92", "TAG"], case_sensitive=False), default="SQL92",
              show_default=True)
@click.option("--format", "fmt", default="parquet", show_default=True, help="Any Spark sink format.")
@click.option("--split-mb", type=click.IntRange(1), default=64, show_default=True, help="Commit log per task.")
@_master_opt
@_quiet_opt
def scan_command(store: str, out: str, overwrite: bool, topic: str | None, selector: str | None,
                 selector_type: str, fmt: str, split_mb: int, master: str | None, quiet: bool) -> None:
    """Filter a store's messages with Spark and write them out (works while the broker is down)."""
    from sluice.spark.jobs import check_topics, scan
    from sluice.spark.storefiles import check_store_path

    from sluice.filter import compile_selector

    out = _check_out(out, overwrite)
    try:  # before a JVM starts: a typo costs no Spark start-up
        if selector:
            compile_selector(selector_type.upper(), selector)
        check_store_path(store)
        check_topics(store, topic)
    except SluiceError as e:
        raise click.ClickException(str(e)) from None
    with _job("scan", master, quiet) as (spark, progress):
        progress.phase(f"writing {fmt}")
        n = scan(spark, store, out, topic=topic, selector=selector, selector_type=selector_type.upper(), fmt=fmt,
                 split_bytes=split_mb * 1024 * 1024, mode="overwrite")
        progress.summary(f"{n:,} messages{f' of {topic}' if topic else ''}"
                         f"{f' matching {selector!r}' if selector else ''} written to {out} ({fmt})")
        click.echo(orjson.dumps({"store": store, "out": out, "messages": n}).decode())


@spark_group.command("stats")
@_store_arg
@click.option("--topic", default=None)
@click.option("--selector", "selectors", multiple=True,
              help="TOPIC:[TAG:|SQL92:]EXPRESSION; repeatable. Default: the broker's persisted subscriptions.")
@click.option("--top", type=click.IntRange(1), default=10, show_default=True, help="Values shown per property.")
@click.option("--plot", "plot", type=click.Path(dir_okay=False, resolve_path=True), default=None,
              help="Also draw message rate over time and the top property values into this PNG.")
@_master_opt
@_quiet_opt
def stats_command(store: str, topic: str | None, selectors: tuple[str, ...], top: int, plot: str | None,
                  master: str | None, quiet: bool) -> None:
    """Per topic: counts by tag and property value, each subscription's hit rate over history and the
    message timeline (JSON)."""
    from sluice.spark.jobs import check_topics, parse_selector_arg, stats
    from sluice.spark.storefiles import check_store_path

    if plot and not plot.lower().endswith(".png"):
        raise click.UsageError(f"--plot writes a PNG: {plot} should end in .png")
    try:
        subs = [parse_selector_arg(s) for s in selectors] or None
        check_store_path(store)
        check_topics(store, topic)
    except SluiceError as e:
        raise click.ClickException(str(e)) from None
    with _job("stats", master, quiet) as (spark, progress):
        progress.phase("counting")
        result = stats(spark, store, topic=topic, subscriptions=subs, top=top)
        written = ""
        if plot:
            from sluice.spark.plot import plot_stats

            progress.phase("plotting")
            written = f", plot in {plot_stats(result, plot)}"
        total = sum(t["messages"] for t in result.values())
        progress.summary(f"{total:,} messages in {len(result)} topic(s){written}")
        sys.stdout.write(orjson.dumps(result, option=orjson.OPT_INDENT_2).decode() + "\n")


@spark_group.command("backfill")
@_store_arg
@click.option("--topic", required=True)
@click.option("--group", required=True, help="The consumer group whose new subscription this is.")
@click.option("--selector", required=True, help="The subscription's expression.")
@click.option("--selector-type", type=click.Choice(["SQL92", "TAG"], case_sensitive=False), default="SQL92",
              show_default=True)
@click.option("--out", required=True, help="Directory for the per-queue bitmaps and manifest.json.")
@_master_opt
@_quiet_opt
def backfill_command(store: str, topic: str, group: str, selector: str, selector_type: str, out: str,
                     master: str | None, quiet: bool) -> None:
    """Which stored messages of TOPIC match a subscription: one bitmap per queue (for the broker to skip
    non-matching messages of the backlog; see docs/spark.md)."""
    from sluice.filter import compile_selector
    from sluice.spark.backfill import backfill
    from sluice.spark.jobs import check_topics
    from sluice.spark.storefiles import check_store_path

    out = str(Path(out).absolute())
    try:
        compile_selector(selector_type.upper(), selector)
        check_store_path(store)
        check_topics(store, topic)
    except SluiceError as e:
        raise click.ClickException(str(e)) from None
    with _job("backfill", master, quiet) as (spark, progress):
        progress.phase("computing bitmaps")
        manifest = backfill(spark, store, topic, group, selector, out, expression_type=selector_type.upper())
        matched = sum(q["matched"] for q in manifest["queues"].values())
        covered = sum(q["end"] - q["first"] for q in manifest["queues"].values())
        progress.summary(f"{matched:,} of {covered:,} messages of {topic} match, {len(manifest['queues'])} "
                         f"queue bitmap(s) in {out}")
        click.echo(orjson.dumps(manifest, option=orjson.OPT_INDENT_2).decode())


@spark_group.command("demo")
@click.option("--namesrv", required=True)
@click.option("--topic", required=True)
@click.option("--out", required=True)
def demo_command(namesrv: str, topic: str, out: str) -> None:
    """Run the demo job (pushed-down read, aggregate, Parquet export) and print its results."""
    from sluice.spark.demo import demo_job

    click.echo(orjson.dumps(demo_job(namesrv, topic, out), option=orjson.OPT_INDENT_2).decode())


@spark_group.command("submit", context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def submit_command(args: tuple[str, ...]) -> None:
    """spark-submit ARGS with this venv's PySpark and Python, whether or not the venv is on PATH
    (sets SPARK_HOME, PYSPARK_PYTHON and PYSPARK_DRIVER_PYTHON unless already set)."""
    from sluice.spark.builder import spark_home, submit_env

    tool = Path(spark_home()) / "bin" / "spark-submit"
    if not tool.exists():
        raise click.ClickException(f"no spark-submit in {tool.parent}: is pyspark installed?")
    java = shutil.which("java")
    if java is None and not os.environ.get("JAVA_HOME"):
        raise click.ClickException("no java on PATH and no JAVA_HOME (Spark 4 needs Java 17 or 21)")
    sys.stdout.flush()
    os.execve(str(tool), [str(tool), *args], submit_env())
