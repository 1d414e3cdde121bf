"""Redis streams as a peer: ``XADD`` in pipelines of 32 from 4 threads; drains read the whole stream through a
consumer group (``XREADGROUP`` + ``XACK``) and filter in the client, since streams have no server-side filter.
Persistence: ``appendonly yes``, ``appendfsync everysec``."""
from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sluice.bench.procs import PeerProcess, free_port, require
from sluice.bench.workload import (
    FILTERS, LATENCY_FILTER, Counter, Filter, LatencyProbe, Props, Workload, body_with_stamp,
    expected_counts, generate, paced, settle_heap, produce_rate, wait_until,
)

__all__ = ["check", "run"]

STREAM = "bench"
LAT_STREAM = "bench-latency"


def check() -> str:
    return require("redis-server", "redis", "redis (redis-py)")


def _fields(p: Props, body: bytes) -> dict[str, Any]:
    return {"tag": p.tag, "region": p.region, "a": str(p.a), "body": body}


def _props(fields: dict[bytes, bytes]) -> Props:
    return Props(fields[b"tag"].decode(), fields[b"region"].decode(), int(fields[b"a"]))


def _produce(port: int, props: list[Props], wl: Workload) -> float:
    import redis
    body = body_with_stamp(wl.body_size)

    def work(n: int, part: list[Props]) -> None:
        r = redis.Redis(host="127.0.0.1", port=port)
        for i in range(0, len(part), wl.batch):
            pipe = r.pipeline(transaction=False)
            for p in part[i:i + wl.batch]:
                pipe.xadd(STREAM, _fields(p, body))
            pipe.execute()
        r.close()

    return produce_rate(work, props, wl.threads, "redis produce")


def _drain(port: int, group: str, f: Filter, expected: int, timeout: float) -> dict[str, Any]:
    import redis
    r = redis.Redis(host="127.0.0.1", port=port)
    counter = Counter(expected)
    deadline = time.monotonic() + timeout
    started = time.perf_counter()
    while counter.count < expected and time.monotonic() < deadline:
        got = r.xreadgroup(group, "c1", {STREAM: ">"}, count=1000, block=200)
        if not got:
            continue
        entries = got[0][1]
        matched = sum(1 for _, fields in entries if f.matches(_props(fields)))
        r.xack(STREAM, group, *[eid for eid, _ in entries])
        if matched:
            counter.add(matched)
    r.close()
    return counter.drained(started, timeout)


def _latency(port: int, wl: Workload, step: Callable[[str], None]) -> dict[str, Any]:
    import redis
    results: dict[str, Any] = {}
    for rate in wl.latency_rates:
        step(f"redis: latency at {rate:,} msgs/s")
        probe = LatencyProbe()
        stop = threading.Event()
        reader = redis.Redis(host="127.0.0.1", port=port)
        last = [reader.xinfo_stream(LAT_STREAM)["last-generated-id"] if reader.exists(LAT_STREAM) else b"0-0"]

        def read() -> None:
            while not stop.is_set():
                got = reader.xread({LAT_STREAM: last[0]}, count=1000, block=100)
                for _, entries in got or []:
                    for eid, fields in entries:
                        last[0] = eid
                        if LATENCY_FILTER.matches(_props(fields)):
                            probe.seen(fields[b"body"])

        t = threading.Thread(target=read, daemon=True)
        t.start()
        writer = redis.Redis(host="127.0.0.1", port=port)
        sent = expected = 0
        t0 = time.perf_counter()
        for due, p in paced(rate, wl.latency_seconds, wl.seed + rate):
            wait_until(due)
            writer.xadd(LAT_STREAM, _fields(p, body_with_stamp(wl.body_size, time.perf_counter_ns())))
            sent += 1
            expected += LATENCY_FILTER.matches(p)
        seconds = time.perf_counter() - t0
        probe.wait_for(expected, 30)
        stop.set()
        t.join(5)
        writer.close()
        reader.close()
        results[str(rate)] = probe.summary(sent, expected, seconds)
    return results


def run(wl: Workload, workdir: Path, step: Callable[[str], None]) -> dict[str, Any]:
    binary = check()
    import redis
    port = free_port()
    step("redis: starting redis-server (appendonly)")
    argv = [binary, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(workdir), "--appendonly", "yes",
            "--appendfsync", "everysec", "--save", "", "--daemonize", "no", "--protected-mode", "no"]
    props = generate(wl.messages, wl.seed)
    expected = expected_counts(props)
    settle_heap()
    out: dict[str, Any] = {"produce": {}, "drains": {}, "version": ""}
    with PeerProcess.start("redis", argv, port, workdir) as server:
        admin = redis.Redis(host="127.0.0.1", port=port)
        out["version"] = admin.info("server").get("redis_version", "")
        for f in FILTERS:  # the 'before' groups exist before the writes
            admin.xgroup_create(STREAM, f"before-{f.name}", id="0", mkstream=True)
        step(f"redis: produce {wl.messages:,} messages")
        out["produce"]["msgs_per_s"] = round(_produce(port, props, wl))
        for f in FILTERS:
            admin.xgroup_create(STREAM, f"catchup-{f.name}", id="0")
            for case in ("before", "catchup"):
                step(f"redis: {f.name} drain ({case})")
                out["drains"].setdefault(f.name, {})[case] = _drain(port, f"{case}-{f.name}", f, expected[f.name],
                                                                    wl.drain_timeout)
        out["server_rss_bytes"] = server.rss()
        out["handler_on_io_thread"] = True  # the reader thread handles what XREADGROUP returns
        out["latency"] = _latency(port, wl, step)
        admin.close()
    return out
