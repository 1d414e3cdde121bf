"""What message trace costs the client: CPU per message of asyncio sends and push consumption with
``enable_trace`` off and on (real namesrv + broker subprocesses on 127.0.0.1).

Each round sends ``n`` 256-byte messages with 64 in flight from one AsyncProducer, then ``n`` more as batches
of 32 (8 in flight; traced as one Pub per message), then consumes the single sends with one AsyncPushConsumer
(batch size 1, the default); the client process's CPU (getrusage, user + system, all threads, the trace
producer included) is divided by ``n``. Modes alternate round by round so a busy machine
skews both alike; the median per mode is reported. ``--modes off`` runs without tracing only (so the same
script measures a checkout that has no tracing, as a baseline).

Run: .venv/bin/python benchmarks/trace_cost.py [--quick] [--rounds R] [--modes off,on]
Prints one JSON object on its last line.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import resource
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from servers import running_cluster, wait_for_route  # noqa: E402

from sluice import AsyncProducer, AsyncPushConsumer, ConsumeResult, Message  # noqa: E402


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


BATCH = 32


async def _round(ns: str, topic: str, n: int, trace: bool, tag: str) -> tuple[float, float, float, int, int]:
    opts = {"enable_trace": True} if trace else {}
    body = b"x" * 256
    async with AsyncProducer(f"PG_{tag}", ns, **opts) as p:
        sem = asyncio.Semaphore(64)

        async def one(i: int) -> None:
            async with sem:
                await p.send(Message(topic, body, tags="TagA", keys=[f"k{i}"]))
        begin = _cpu()
        await asyncio.gather(*(one(i) for i in range(n)))
        send_us = (_cpu() - begin) / n * 1e6
        batches = [[Message(topic + "Batch", body, tags="TagA", keys=[f"b{i + j}"]) for j in range(BATCH)]
                   for i in range(0, n, BATCH)]
        bsem = asyncio.Semaphore(8)

        async def batch(msgs: list[Message]) -> None:
            async with bsem:
                await p.send_batch(msgs)
        begin = _cpu()
        await asyncio.gather(*(batch(b) for b in batches))
        batch_us = (_cpu() - begin) / (len(batches) * BATCH) * 1e6
        send_dropped = t.dropped if (t := getattr(p, "trace", None)) is not None else 0
    done = asyncio.Event()
    count = 0
    loop = asyncio.get_running_loop()

    def listener(msgs: list) -> ConsumeResult:
        nonlocal count
        count += len(msgs)
        if count >= n:
            loop.call_soon_threadsafe(done.set)
        return ConsumeResult.SUCCESS

    c = AsyncPushConsumer(f"CG_{tag}", ns, consume_from_where="CONSUME_FROM_FIRST_OFFSET", **opts)
    c.subscribe(topic, "*")
    c.register_listener(listener)
    begin = _cpu()
    await c.start()
    await asyncio.wait_for(done.wait(), 300)
    consume_dropped = t.dropped if (t := getattr(c, "trace", None)) is not None else 0
    await c.shutdown()
    return send_us, batch_us, (_cpu() - begin) / n * 1e6, send_dropped, consume_dropped


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--rounds", type=int, default=None)
    ap.add_argument("--modes", default="off,on")
    a = ap.parse_args()
    n = 2000 if a.quick else 10000
    rounds = a.rounds or (2 if a.quick else 4)
    modes = a.modes.split(",")
    results: dict[str, dict[str, list[float]]] = {m: {"send": [], "batch": [], "consume": [], "dropped": []}
                                                    for m in modes}
    with tempfile.TemporaryDirectory(prefix="trace-bench-") as tmp, running_cluster(Path(tmp)) as c:
        for r in range(rounds):
            for m in modes:
                topic = f"TraceBench_{m}_{r}"
                with __import__("sluice").Producer("warm", c.ns) as p:  # create the topics and their routes
                    p.send(Message(topic, b"warm"))
                    p.send(Message(topic + "Batch", b"warm"))
                wait_for_route(c.ns, topic)
                wait_for_route(c.ns, topic + "Batch")
                s, b, k, ds, dk = asyncio.run(_round(c.ns, topic, n, m == "on", f"{m}{r}"))
                results[m]["send"].append(s)
                results[m]["batch"].append(b)
                results[m]["consume"].append(k)
                results[m]["dropped"].append(ds + dk)
    out = {"messages_per_round": n, "rounds": rounds}
    for m in modes:
        out[f"trace_{m}_send_cpu_us_per_msg"] = round(statistics.median(results[m]["send"]), 2)
        out[f"trace_{m}_batch_send_cpu_us_per_msg"] = round(statistics.median(results[m]["batch"]), 2)
        out[f"trace_{m}_consume_cpu_us_per_msg"] = round(statistics.median(results[m]["consume"]), 2)
        if m == "on":  # records the full queue dropped, all rounds (sends + consumption)
            out["trace_on_records_dropped"] = int(sum(results[m]["dropped"]))
    print(json.dumps(out))


if __name__ == "__main__":
    main()
