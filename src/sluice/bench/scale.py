"""The scale table: the common workload at larger message counts and with more SQL92 groups, recording produce
and drain throughput and the broker's resident memory, so growth with the work is visible.

Per (messages, groups) cell: a fresh namesrv and broker, ``groups`` SQL92 groups (``region = 'eu' AND a >= k``, k
spread over 0..99) subscribed before the writes, the messages produced as in the common workload, then every
group drained at once (push consumers in this process); RSS is the broker's peak seen while draining.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sluice.bench.procs import rss_bytes
from sluice.bench.sluice_runner import cluster, create_topic, produce, push, wait_owned, wait_visible
from sluice.bench.workload import Counter, Filter, Workload, generate, settle_heap
from sluice.broker.filter_data import LIVE_MARGIN_MS
from sluice.client import ConsumeResult

__all__ = ["DEFAULT_GROUPS", "DEFAULT_MESSAGES", "run_scale"]

DEFAULT_MESSAGES = (1_000_000, 10_000_000)
DEFAULT_GROUPS = (1, 10, 100)


def _filters(groups: int) -> list[Filter]:
    out = []
    for i in range(groups):
        k = (i * 100) // max(1, groups)
        out.append(Filter(f"g{i}", "SQL92", f"region = 'eu' AND a >= {k}",
                          lambda p, k=k: p.region == "eu" and p.a >= k))
    return out


def _cell(wl: Workload, groups: int, workdir: Path) -> dict[str, Any]:
    row: dict[str, Any] = {"messages": wl.messages, "groups": groups}
    props = generate(wl.messages, wl.seed)
    settle_heap()
    filters = _filters(groups)
    ns, broker = cluster(workdir, "async")
    try:
        create_topic(ns.addr)
        for f in filters:
            c = push(f"scale-{f.name}", ns.addr, f, lambda msgs: ConsumeResult.SUCCESS)
            try:
                wait_owned(c)
            finally:
                c.shutdown()
        time.sleep(LIVE_MARGIN_MS / 1000 + 0.2)  # so the broker trusts the bitmaps (see sluice_runner)
        row["produce_msgs_per_s"] = round(produce(ns.addr, props, wl))
        wait_visible(ns.addr, wl.messages + 1, wl.drain_timeout)
        expected = sum(sum(1 for p in props if f.matches(p)) for f in filters)
        counter = Counter(expected)

        def listener(msgs: list[Any]) -> ConsumeResult:
            counter.add(len(msgs))
            return ConsumeResult.SUCCESS

        peak = [rss_bytes(broker.pid)]
        stop = threading.Event()

        def sample() -> None:
            while not stop.wait(0.2):
                peak[0] = max(peak[0], rss_bytes(broker.pid))

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        started = time.perf_counter()
        # A few listener threads per group: 100 groups with RocketMQ's 20 each would be 2,000 threads.
        consumers = [push(f"scale-{f.name}", ns.addr, f, listener, consume_thread_max=2) for f in filters]
        try:
            done = counter.wait(wl.drain_timeout)
        finally:
            for c in consumers:
                c.shutdown()
            stop.set()
            sampler.join()
        r = counter.rate(started)
        row["drain_matched_per_s"] = r["matched_per_s"]
        row["matched"] = r["matched"]
        row["broker_rss_bytes"] = peak[0]
        if not done:
            row["error"] = f"drained {counter.count} of {expected} within {wl.drain_timeout:g} s"
    finally:
        broker.stop()
        ns.stop()
    return row


def run_scale(base: Workload, workdir: Path, messages: tuple[int, ...] = DEFAULT_MESSAGES,
              groups: tuple[int, ...] = DEFAULT_GROUPS, step: Callable[[str], None] = lambda s: None,
              ) -> list[dict[str, Any]]:
    rows = []
    for n in messages:
        for g in groups:
            step(f"scale: {n:,} messages, {g} SQL92 group(s)")
            wl = Workload(messages=n, body_size=base.body_size, batch=base.batch, threads=base.threads,
                          seed=base.seed, drain_timeout=max(base.drain_timeout, n / 1000))
            cell_dir = workdir / f"scale-{n}-{g}"
            try:
                rows.append(_cell(wl, g, cell_dir))
            except Exception as exc:  # one failed cell is reported, the table goes on
                rows.append({"messages": n, "groups": g, "error": f"{type(exc).__name__}: {exc}"})
    return rows
