"""The common workload against Sluice: an embedded namesrv and broker (subprocesses) driven through the SDK.

* produce: ``send_batch`` of 32 from 4 threads sharing one ``Producer``, under ``--flush async`` and, on a second
  broker, ``--flush sync``;
* drains: push consumers, one group per filter; the "before" groups subscribed (heartbeat, so the broker builds
  their bitmaps at dispatch) before the writes and were stopped, the "catch-up" groups subscribe afterwards;
* latency: a push consumer on ``region = 'eu'`` while single messages are sent at a paced rate (also with the
  listener on the consumer's I/O thread, and then with the producer's ``auto_batch`` on as well).
"""
from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import CancelledError, Future
from pathlib import Path
from typing import Any

from sluice.bench.procs import rss_bytes
from sluice.broker.filter_data import LIVE_MARGIN_MS
from sluice.bench.workload import (
    FILTERS, LATENCY_FILTER, Counter, Filter, LatencyProbe, Props, Workload, body_with_stamp,
    expected_counts, generate, paced, settle_heap, produce_rate, wait_until,
)
from sluice.client import ConsumeResult, MessageSelector, Producer, PullConsumer, PushConsumer
from sluice.embedded import SluiceProcess
from sluice.message import Message
from sluice.namesrv.client import SyncNamesrvClient

__all__ = ["TOPIC", "cluster", "create_topic", "filter_stats", "latency", "produce", "push", "run_sluice",
           "wait_owned", "wait_visible"]

TOPIC = "BenchCommon"
Step = Callable[[str], None]


def _message(p: Props, body: bytes) -> Message:
    return Message(TOPIC, body, tags=p.tag, properties={"region": p.region, "a": str(p.a)})


def _selector(f: Filter) -> MessageSelector:
    return MessageSelector.by_tag(f.expression) if f.kind == "TAG" else MessageSelector.by_sql(f.expression)


def _wait_route(ns: str, timeout: float = 30.0) -> None:
    with SyncNamesrvClient(ns) as nc:
        deadline = time.monotonic() + timeout
        while True:
            try:
                nc.get_route("TBW102")
                return
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)


def cluster(workdir: Path, flush: str) -> tuple[SluiceProcess, SluiceProcess]:
    logs = workdir / f"logs-{flush}"
    logs.mkdir(parents=True, exist_ok=True)
    ns = SluiceProcess.start(["namesrv"], logs, name="namesrv")
    try:
        broker = SluiceProcess.start(["broker", "--namesrv", ns.addr, "--store", str(workdir / f"store-{flush}"),
                                      "--flush", flush], logs, name="broker")
    except BaseException:
        ns.stop()
        raise
    try:
        _wait_route(ns.addr)
    except BaseException:
        broker.stop()
        ns.stop()
        raise
    return ns, broker


def produce(ns: str, props: list[Props], wl: Workload) -> float:
    """msgs/s of ``send_batch`` batches from ``wl.threads`` threads sharing one producer."""
    body = body_with_stamp(wl.body_size)
    with Producer("bench-producer", ns) as producer:
        def work(n: int, part: list[Props]) -> None:
            for i in range(0, len(part), wl.batch):
                producer.send_batch([_message(p, body) for p in part[i:i + wl.batch]])

        return produce_rate(work, props, wl.threads, "produce")


def push(group: str, ns: str, f: Filter, listener: Callable[[list[Any]], ConsumeResult],
          first: bool = True, **options: Any) -> PushConsumer:
    c = PushConsumer(group, namesrv=ns,
                     consume_from_where="CONSUME_FROM_FIRST_OFFSET" if first else "CONSUME_FROM_LAST_OFFSET",
                     **options)
    c.subscribe(TOPIC, _selector(f))
    c.register_listener(listener)
    c.start()
    return c


def wait_owned(c: PushConsumer, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not c.owned_queues():
        if time.monotonic() > deadline:
            raise RuntimeError(f"push consumer {c.group} owned no queue within {timeout:g} s")
        time.sleep(0.05)


def create_topic(ns: str) -> None:
    """One message no filter matches creates the topic (and its route) before any group subscribes."""
    with Producer("bench-producer", ns) as producer:
        producer.send(Message(TOPIC, b"warm-up", tags="Warm", properties={"region": "none", "a": "-1"}))


def _preregister(ns: str) -> None:
    """The 'before' groups subscribe and leave: the broker keeps their filter data and builds bitmaps."""
    for f in FILTERS:
        c = push(f"bench-before-{f.name}", ns, f, lambda msgs: ConsumeResult.SUCCESS)
        try:
            wait_owned(c)
        finally:
            c.shutdown()
    # The broker trusts a bitmap only for messages stored LIVE_MARGIN_MS after the group's filter data was born
    # (broker/pull.py); without this wait a quick run would write everything inside the margin and the "before"
    # groups would be evaluated record by record, like the catch-up ones.
    time.sleep(LIVE_MARGIN_MS / 1000 + 0.2)


def filter_stats(ns: str, group: str) -> dict[str, Any]:
    """The broker's filter counters of ``group`` on the bench topic (evaluated, matched, bitmapSkipped, ...),
    read with ``sluice admin consumerProgress --json``; an ``error`` entry when they cannot be read."""
    argv = [sys.executable, "-m", "sluice", "admin", "consumerProgress", "-n", ns, "-g", group, "-t", TOPIC,
            "--json"]
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        stats = json.loads(proc.stdout).get("filterStats") or {}
        for topics in stats.values():
            if TOPIC in topics:
                return {k: v for k, v in topics[TOPIC].items() if k not in ("expression", "subVersion")}
        return {"error": f"no filter figures for {group} (exit {proc.returncode}): {proc.stderr.strip()[-300:]}"}
    except (OSError, ValueError, subprocess.SubprocessError) as exc:
        return {"error": f"sluice admin consumerProgress failed: {exc}"}


def wait_visible(ns: str, total: int, timeout: float) -> None:
    with PullConsumer("bench-probe", ns) as pc:
        queues = pc.fetch_message_queues(TOPIC)
        deadline = time.monotonic() + timeout
        while sum(pc.max_offset(q) for q in queues) < total:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the broker did not make {total} messages visible within {timeout:g} s")
            time.sleep(0.05)


#: Messages per listener call in the drains.
DRAIN_BATCH = 32


def _drain(ns: str, group: str, f: Filter, expected: int, timeout: float) -> dict[str, Any]:
    counter = Counter(expected)
    wrong = [0]

    def listener(msgs: list[Any]) -> ConsumeResult:
        for m in msgs:
            p = m.properties
            if f.kind == "TAG":
                ok = m.tags == f.expression
            else:
                ok = f.matches(Props(m.tags or "", p.get("region", ""), int(p.get("a", "-1"))))
            if not ok:
                wrong[0] += 1
        counter.add(len(msgs))
        return ConsumeResult.SUCCESS

    started = time.perf_counter()
    # Batch consumption (consumeMessageBatchMaxSize), as RocketMQ advises for throughput (docs/consumer.md).
    c = push(group, ns, f, listener, consume_message_batch_max_size=DRAIN_BATCH)
    try:
        done = counter.wait(timeout)
    finally:
        c.shutdown()
    out = counter.rate(started)
    if wrong[0]:
        out["error"] = f"{wrong[0]} delivered messages do not match {f.expression!r}"
    elif not done:
        out["error"] = f"drained {counter.count} of {expected} within {timeout:g} s"
    out["broker_filter"] = filter_stats(ns, group)
    return out


def latency(ns: str, wl: Workload, step: Step = lambda s: None, *, warmup_seconds: float = 0.0,
            inline: bool = False, auto_batch: bool = False) -> list[dict[str, Any]]:
    """One summary per entry of ``wl.latency_rates`` (in order, with its ``rate``): a push consumer on
    ``region = 'eu'`` and a producer ``send_async``-ing single messages paced at the rate, both in this process.
    With ``warmup_seconds`` the first rate runs that long first, unreported (benchmarks/latency.py: sluice bench
    measures latency after the drains, on a warm broker and client). ``inline``: the consumer's listener runs
    on its I/O thread (``consume_inline``), as the peers' clients call their handlers. ``auto_batch``: the
    producer's sends made while one is in flight go together (ProducerOptions.auto_batch)."""
    results: list[dict[str, Any]] = []
    probe_box: list[LatencyProbe] = [LatencyProbe()]

    def listener(msgs: list[Any]) -> ConsumeResult:
        probe = probe_box[0]
        for m in msgs:
            probe.seen(m.body)
        return ConsumeResult.SUCCESS

    def run(producer: Producer, rate: int, seconds: float) -> dict[str, Any]:
        probe = probe_box[0] = LatencyProbe()
        sends = _Sends()
        expected = 0
        t0 = time.perf_counter()
        for due, p in paced(rate, seconds, wl.seed + rate):
            wait_until(due)
            expected += LATENCY_FILTER.matches(p)
            sends.track(producer.send_async(_message(p, body_with_stamp(wl.body_size, time.perf_counter_ns()))))
        seconds = time.perf_counter() - t0
        failed = sends.wait(30)  # the row says so instead of ending the whole run
        received = probe.wait_for(expected, 30 if not failed else 5)  # a failed send may not be stored
        out = {"rate": rate, **probe.summary(sends.sent, expected, seconds)}
        if failed:
            out["error"] = (f"{len(failed)} of {sends.sent} sends failed, the sender having fallen behind the "
                            f"rate (last: {type(failed[-1]).__name__}: {str(failed[-1]).splitlines()[0]})")
        elif not received:
            out["error"] = f"received {out['received']} of {expected} matches within 30 s"
        return out

    c = push("bench-latency-inline" if inline else "bench-latency", ns, LATENCY_FILTER, listener, first=False,
             consume_inline=inline)
    try:
        wait_owned(c)
        with Producer("bench-latency-producer", ns, auto_batch=auto_batch) as producer:
            if warmup_seconds > 0 and wl.latency_rates:
                run(producer, wl.latency_rates[0], warmup_seconds)
            for rate in wl.latency_rates:
                step(f"sluice: latency at {rate:,} msgs/s{' (consume_inline)' if inline else ''}"
                     f"{' (auto_batch)' if auto_batch else ''}")
                results.append(run(producer, rate, wl.latency_seconds))
    finally:
        c.shutdown()
    return results


class _Sends:
    """The outcomes of a latency run's sends, counted as their futures complete. The run keeps no Future:
    thousands alive (each with its Condition) pushed the bench process into full collections of tens of
    milliseconds during the run, which its p99 then measured."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self.sent = 0
        self.done = 0
        self.failed: list[BaseException] = []

    def track(self, fut: Future[Any]) -> None:
        with self._cond:
            self.sent += 1
        fut.add_done_callback(self._done)  # at once when it is done already

    def _done(self, fut: Future[Any]) -> None:
        exc = fut.exception() if not fut.cancelled() else CancelledError("send cancelled")
        with self._cond:
            self.done += 1
            if exc is not None:
                self.failed.append(exc)
            self._cond.notify_all()

    def wait(self, timeout: float) -> list[BaseException]:
        """Wait up to ``timeout`` for every send; the failures, a send still unanswered counted as one."""
        with self._cond:
            if not self._cond.wait_for(lambda: self.done >= self.sent, timeout):
                self.failed.extend(TimeoutError(f"send not answered within {timeout:g} s")
                                   for _ in range(self.sent - self.done))
            return list(self.failed)


def run_sluice(wl: Workload, workdir: Path, step: Step = lambda s: None, *, sync_flush: bool = True) -> dict[str, Any]:
    """Every row for Sluice; a row that failed carries an ``error`` instead of its figure."""
    props = generate(wl.messages, wl.seed)
    expected = expected_counts(props)
    settle_heap()
    out: dict[str, Any] = {"available": True, "drains": {}, "produce": {}}
    step("sluice: starting namesrv and broker (--flush async)")
    ns, broker = cluster(workdir, "async")
    try:
        create_topic(ns.addr)
        _preregister(ns.addr)
        step(f"sluice: produce {wl.messages:,} messages")
        out["produce"]["msgs_per_s"] = round(produce(ns.addr, props, wl))
        wait_visible(ns.addr, wl.messages + 1, wl.drain_timeout)
        for f in FILTERS:
            for case in ("before", "catchup"):
                step(f"sluice: {f.name} drain ({case})")
                out["drains"].setdefault(f.name, {})[case] = _drain(
                    ns.addr, f"bench-{case}-{f.name}", f, expected[f.name], wl.drain_timeout)
        out["broker_rss_bytes"] = rss_bytes(broker.pid)
        out["latency"] = {str(r.pop("rate")): r for r in latency(ns.addr, wl, step)}
        out["latency_inline"] = {str(r.pop("rate")): r for r in latency(ns.addr, wl, step, inline=True)}
        out["latency_auto_batch"] = {str(r.pop("rate")): r
                                     for r in latency(ns.addr, wl, step, inline=True, auto_batch=True)}
    finally:
        broker.stop()
        ns.stop()
    if sync_flush:
        step("sluice: produce with --flush sync")
        ns, broker = cluster(workdir, "sync")
        try:
            create_topic(ns.addr)
            out["produce"]["sync_msgs_per_s"] = round(produce(ns.addr, props, wl))
        finally:
            broker.stop()
            ns.stop()
    return out
