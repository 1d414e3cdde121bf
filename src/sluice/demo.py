"""`sluice demo`: the README's main job.

Starts a namesrv and a broker (real subprocesses on free loopback ports, a
fresh store), sends a stream of orders with tags, keys and properties, then
drains the topic with filtered consumers — a tag subscription and SQL92
subscriptions evaluated by the broker — and checks every consumer received
exactly what its selector admits. Ends with a Spark job over the demo topic
when PySpark is installed. Exits non-zero if anything disagrees.
"""
from __future__ import annotations

import json
import random
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import click

from sluice.client import MessageSelector, Producer, PullConsumer, PullStatus
from sluice.embedded import SluiceProcess
from sluice.filter import compile_selector
from sluice.message import Message

TOPIC = "DemoOrders"
REGIONS = ("eu", "us", "apac")
TAGS = ("Created", "Paid", "Shipped", "Cancelled")

#: (name, selector type, expression) of the consumers the demo runs.
SUBSCRIPTIONS = (
    ("everything", "TAG", "*"),
    ("payments", "TAG", "Paid || Cancelled"),
    ("big-eu-us", "SQL92", "amount > 800 AND region IN ('eu', 'us')"),
    ("rare", "SQL92", "amount BETWEEN 990 AND 1000 AND vip = 'true'"),
)


@dataclass
class ConsumerReport:
    name: str
    selector: str
    expected: int
    received: int
    seconds: float

    @property
    def ok(self) -> bool:
        return self.expected == self.received


def _orders(n: int, seed: int) -> list[Message]:
    rnd = random.Random(seed)
    out = []
    for i in range(n):
        props = {"region": rnd.choice(REGIONS), "amount": str(rnd.randint(1, 1000))}
        if rnd.random() < 0.1:
            props["vip"] = "true"
        body = json.dumps({"order": i, **props}).encode()
        out.append(Message(TOPIC, body, tags=rnd.choice(TAGS), keys=[f"order-{i}"], properties=props))
    return out


def _drain(consumer: PullConsumer, selector: MessageSelector, deadline: float) -> int:
    """Pull every queue of the topic from offset 0 to its end; returns the number of messages received."""
    received = 0
    for mq in consumer.fetch_message_queues(TOPIC):
        end = consumer.max_offset(mq)
        offset = 0
        while offset < end and time.monotonic() < deadline:
            result = consumer.pull(mq, selector, offset, max_nums=32)
            if result.status is PullStatus.FOUND:
                received += len(result.msg_found_list)
            offset = max(offset, result.next_begin_offset)
            if result.status is PullStatus.NO_NEW_MSG:
                break
    return received


def _echo_table(rows: list[ConsumerReport]) -> None:
    click.echo(f"  {'consumer':<12} {'selector':<52} {'expected':>8} {'received':>8}  {'msgs/s':>8}")
    for r in rows:
        rate = r.received / r.seconds if r.seconds > 0 else 0.0
        mark = "ok" if r.ok else "MISMATCH"
        click.echo(f"  {r.name:<12} {r.selector:<52} {r.expected:>8} {r.received:>8}  {rate:>8.0f}  {mark}")


def run_demo(messages: int, workdir: Path, *, spark: bool, echo: Callable[[str], None] = click.echo) -> bool:
    """The whole demo; returns True when every check held."""
    logs = workdir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    store = workdir / "store"
    echo(f"Starting namesrv and broker (store: {store}, logs: {logs})")
    with SluiceProcess.start(["namesrv"], logs, name="namesrv") as ns, \
         SluiceProcess.start(["broker", "--namesrv", ns.addr, "--store", str(store), "--flush", "async"],
                             logs, name="broker") as broker:
        echo(f"  namesrv {ns.addr} (pid {ns.pid}), broker {broker.addr} (pid {broker.pid})")
        orders = _orders(messages, seed=7)
        t0 = time.perf_counter()
        with Producer("DemoProducers", namesrv=ns.addr) as producer:
            producer.send(orders[0])  # the first send creates the topic and its route
            for i in range(1, len(orders), 32):
                producer.send_batch(orders[i:i + 32])
        sent_s = time.perf_counter() - t0
        echo(f"Sent {len(orders)} orders in {sent_s:.2f} s ({len(orders) / sent_s:,.0f} msgs/s, batches of 32)")
        props = [m.all_properties() for m in orders]
        reports = []
        with PullConsumer("DemoReaders", namesrv=ns.addr) as consumer:
            _wait_dispatched(consumer, len(orders))
            for name, kind, expr in SUBSCRIPTIONS:
                expected = int(compile_selector(kind, expr).matches_batch(props).sum())
                selector = MessageSelector.by_tag(expr) if kind == "TAG" else MessageSelector.by_sql(expr)
                t1 = time.perf_counter()
                got = _drain(consumer, selector, time.monotonic() + 60)
                reports.append(ConsumerReport(name, f"{kind}: {expr}", expected, got, time.perf_counter() - t1))
            echo("Filtered on the broker:")
            _echo_table(reports)
            key_hits = consumer.query_message(TOPIC, "order-42", 8, 0, int(time.time() * 1000) + 60_000)
            echo(f"Query by key order-42: {len(key_hits)} message(s): "
                 + ", ".join(m.body.decode() for m in key_hits))
        ok = all(r.ok for r in reports) and len(key_hits) == 1
        if spark:
            ok = _spark_part(ns.addr, workdir, echo) and ok
    echo("Demo " + ("passed: every consumer got exactly what its selector admits." if ok else "FAILED."))
    return ok


def _wait_dispatched(consumer: PullConsumer, total: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if sum(consumer.max_offset(mq) for mq in consumer.fetch_message_queues(TOPIC)) >= total:
            return
        time.sleep(0.05)
    raise click.ClickException(f"the broker did not make {total} messages visible within {timeout:g} s")


def _spark_part(namesrv: str, workdir: Path, echo: Callable[[str], None]) -> bool:
    try:
        from sluice.spark import demo_job
    except ImportError as e:  # the spark extra is not installed
        echo(f"Spark part skipped: {e}")
        return True
    echo("Spark job over the demo topic (local[*]):")
    result = demo_job(namesrv, TOPIC, str(workdir / "parquet"))
    for line in result.get("lines", []):
        echo(f"  {line}")
    return bool(result.get("ok", True))


@click.command("demo")
@click.option("--messages", default=5000, show_default=True, help="How many orders to send.")
@click.option("--workdir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Where the store, logs and exports go (default: a temporary directory, removed afterwards).")
@click.option("--spark/--no-spark", default=True, show_default=True, help="End with the Spark job.")
def demo_command(messages: int, workdir: Path | None, spark: bool) -> None:
    """Run the main job: an embedded namesrv + broker, a producer, filtered consumers, a Spark job."""
    if messages < 1:
        raise click.BadParameter("must be at least 1", param_hint="--messages")
    keep = workdir is not None
    root = workdir or Path(tempfile.mkdtemp(prefix="sluice-demo-"))
    try:
        ok = run_demo(messages, root, spark=spark)
    finally:
        if not keep:
            shutil.rmtree(root, ignore_errors=True)
            # The output above names files under root: say they are gone, and how to keep them.
            click.echo(f"Removed {root} (store, logs, exports); --workdir DIR keeps them.")
    if not ok:
        raise SystemExit(1)
