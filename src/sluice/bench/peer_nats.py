"""NATS JetStream as a peer: a file-storage stream over subjects ``bench.<tag>.<region>.<a>``.

Drains are durable pull consumers with a subject filter (``bench.TagA.>``, ``bench.*.eu.*``); a subject cannot say
``a >= 50``, so the SQL92 drain takes ``region = 'eu'`` from the server and tests ``a`` in the client. The
'before' consumers exist before the writes; the 'catch-up' ones are made afterwards. JetStream fsyncs its files on
a timer, not before each publish ack."""
from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sluice.bench.procs import PeerProcess, free_port, require
from sluice.bench.workload import (
    FILTERS, LATENCY_FILTER, Counter, Filter, LatencyProbe, Props, Workload, body_with_stamp, chunks,
    expected_counts, generate, paced, settle_heap,
)

__all__ = ["SUBJECTS", "check", "run"]

STREAM = "BENCH"
#: The server-side subject filter of each drain (the SQL92 drain tests ``a`` in the client).
SUBJECTS = {"tag": "bench.TagA.>", "region": "bench.*.eu.*", "sql92": "bench.*.eu.*"}
LAT_SUBJECT = "lat.*.eu.*"


def check() -> str:
    return require("nats-server", "nats", "nats-py")


def _subject(p: Props, prefix: str = "bench") -> str:
    return f"{prefix}.{p.tag}.{p.region}.{p.a}"


def _props(subject: str) -> Props:
    _, tag, region, a = subject.split(".")
    return Props(tag, region, int(a))


async def _produce(js: Any, props: list[Props], wl: Workload) -> float:
    body = body_with_stamp(wl.body_size)

    async def work(part: list[Props]) -> None:
        for i in range(0, len(part), wl.batch):
            futures = [await js.publish_async(_subject(p), body) for p in part[i:i + wl.batch]]
            await asyncio.gather(*futures)

    t0 = time.perf_counter()
    await asyncio.gather(*(work(part) for part in chunks(props, wl.threads)))
    return len(props) / (time.perf_counter() - t0)


async def _add_consumer(js: Any, name: str, f: Filter) -> None:
    from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
    await js.add_consumer(STREAM, ConsumerConfig(durable_name=name, filter_subject=SUBJECTS[f.name],
                                                 ack_policy=AckPolicy.ALL, deliver_policy=DeliverPolicy.ALL,
                                                 max_ack_pending=-1))


async def _drain(js: Any, name: str, f: Filter, expected: int, timeout: float, create: bool) -> dict[str, Any]:
    import nats.errors
    counter = Counter(expected)
    started = time.perf_counter()
    if create:
        await _add_consumer(js, name, f)
    sub = await js.pull_subscribe(SUBJECTS[f.name], durable=name, stream=STREAM)
    deadline = time.monotonic() + timeout
    while counter.count < expected and time.monotonic() < deadline:
        try:
            msgs = await sub.fetch(512, timeout=1.0)
        except nats.errors.TimeoutError:
            continue
        matched = sum(1 for m in msgs if f.matches(_props(m.subject)))
        await msgs[-1].ack()  # AckPolicy.ALL: acknowledges the batch
        if matched:
            counter.add(matched)
    await sub.unsubscribe()
    return counter.drained(started, timeout)


async def _latency(js: Any, wl: Workload, step: Callable[[str], None]) -> dict[str, Any]:
    from nats.js.api import DeliverPolicy
    results: dict[str, Any] = {}
    for rate in wl.latency_rates:
        step(f"nats: latency at {rate:,} msgs/s")
        probe = LatencyProbe()

        async def on_msg(msg: Any) -> None:
            probe.seen(msg.data)

        sub = await js.subscribe(LAT_SUBJECT, cb=on_msg, ordered_consumer=True, deliver_policy=DeliverPolicy.NEW)
        sent = expected = 0
        pending = []
        t0 = time.perf_counter()
        for due, p in paced(rate, wl.latency_seconds, wl.seed + rate):
            left = due - time.perf_counter()
            if left > 0:
                await asyncio.sleep(left)
            pending.append(await js.publish_async(_subject(p, "lat"),
                                                  body_with_stamp(wl.body_size, time.perf_counter_ns())))
            sent += 1
            expected += LATENCY_FILTER.matches(p)
        seconds = time.perf_counter() - t0
        await asyncio.gather(*pending)
        deadline = time.monotonic() + 30
        while len(probe.latencies_ms) < expected and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        await sub.unsubscribe()
        results[str(rate)] = probe.summary(sent, expected, seconds)
    return results


async def _run(port: int, wl: Workload, step: Callable[[str], None], server: PeerProcess) -> dict[str, Any]:
    import nats
    from nats.js.api import StorageType
    props = generate(wl.messages, wl.seed)
    expected = expected_counts(props)
    settle_heap()
    out: dict[str, Any] = {"produce": {}, "drains": {}}
    nc = await nats.connect(f"nats://127.0.0.1:{port}")
    try:
        out["version"] = str(nc.connected_server_version).strip("<>")
        js = nc.jetstream()
        await js.add_stream(name=STREAM, subjects=["bench.>"], storage=StorageType.FILE)
        await js.add_stream(name="LAT", subjects=["lat.>"], storage=StorageType.FILE)
        for f in FILTERS:
            await _add_consumer(js, f"before-{f.name}", f)
        step(f"nats: produce {wl.messages:,} messages")
        out["produce"]["msgs_per_s"] = round(await _produce(js, props, wl))
        for f in FILTERS:
            for case in ("before", "catchup"):
                step(f"nats: {f.name} drain ({case})")
                out["drains"].setdefault(f.name, {})[case] = await _drain(
                    js, f"{case}-{f.name}", f, expected[f.name], wl.drain_timeout, create=case == "catchup")
        out["server_rss_bytes"] = server.rss()
        out["handler_on_io_thread"] = True  # nats-py runs the subscription callback on its asyncio loop
        out["latency"] = await _latency(js, wl, step)
    finally:
        await nc.close()
    return out


def run(wl: Workload, workdir: Path, step: Callable[[str], None]) -> dict[str, Any]:
    binary = check()
    port = free_port()
    step("nats: starting nats-server -js (file storage)")
    argv = [binary, "-a", "127.0.0.1", "-p", str(port), "-js", "-sd", str(workdir / "jetstream")]
    with PeerProcess.start("nats", argv, port, workdir) as server:
        return asyncio.run(_run(port, wl, step, server))
