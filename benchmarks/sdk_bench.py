"""SDK throughput against a real namesrv + broker (subprocesses on 127.0.0.1).

Measures: blocking sends one at a time, asyncio sends with many in flight,
batch sends, pulls (messages decoded per second), and the client-side cost of
preparing a send (validation, unique id, properties) without the network.

The common workload's produce (``sluice bench``: ``send_batch`` of 32 from 4 threads
sharing one Producer, 1 KiB bodies with properties region and a and a tag) is
reported as msgs/s and as the client process's CPU microseconds per message
(getrusage, user + system, all threads): on a shared machine the CPU figure is
the steadier one. ``batch_prepare_cpu_us_per_msg`` is the same batches' client
encoding alone (validation, unique ids, body), without the network.

Run: .venv/bin/python benchmarks/sdk_bench.py [--quick] [--flush async|sync]
Prints one JSON object on its last line.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import resource
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from servers import SluiceProcess, wait_for_route  # noqa: E402

from sluice import AsyncProducer, Message, MessageQueue, Producer, PullConsumer, PullStatus  # noqa: E402
from sluice.client.encoding import build_send_request, prepare_batch, prepare_message  # noqa: E402


def bench_prepare(n: int) -> float:
    mq = MessageQueue(topic="T", broker_name="b", queue_id=0)
    msgs = [Message("T", b"x" * 256, tags="TagA", keys=f"k{i}", properties={"a": str(i)}) for i in range(n)]
    t0 = time.perf_counter()
    for m in msgs:
        build_send_request(prepare_message(m), mq, group="G")
    return n / (time.perf_counter() - t0)


_REGIONS = ("eu", "us", "ap", "sa", "af", "me", "oc", "na", "ca", "in")
_BODY = b"0" * 20 + b"x" * 1004  # 1 KiB, as sluice bench's body_with_stamp makes it


def _common_batch(topic: str, first: int, size: int = 32) -> list[Message]:
    """The common workload's messages ``first``.. (properties region and a, tags TagA-TagJ)."""
    return [Message(topic, _BODY, tags=f"Tag{'ABCDEFGHIJ'[i % 10]}",
                    properties={"region": _REGIONS[i % 10], "a": str(i % 100)}) for i in range(first, first + size)]


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def bench_batch_prepare(n: int) -> float:
    """CPU microseconds per message to build the common workload's batches of 32 (messages made beforehand)."""
    batches = [_common_batch("BenchCommon", i) for i in range(0, n, 32)]
    c0 = _cpu()
    for b in batches:
        prepare_batch(b)
    return (_cpu() - c0) / (len(batches) * 32) * 1e6


def bench_common_produce(ns: str, topic: str, n: int, threads: int = 4) -> tuple[float, float]:
    """(msgs/s, client CPU us per message) for send_batch of 32 from ``threads`` threads sharing one Producer."""
    with Producer("BenchCommonProduce", ns) as p:
        p.send(Message(topic, b"warm-up"))
        per = n // threads // 32 * 32

        def work(k: int) -> None:
            for i in range(k * per, (k + 1) * per, 32):
                p.send_batch(_common_batch(topic, i))

        workers = [threading.Thread(target=work, args=(k,)) for k in range(threads)]
        c0, t0 = _cpu(), time.perf_counter()
        for t in workers:
            t.start()
        for t in workers:
            t.join()
        seconds, cpu = time.perf_counter() - t0, _cpu() - c0
        return per * threads / seconds, cpu / (per * threads) * 1e6


def bench_sync_send(ns: str, topic: str, n: int) -> float:
    with Producer("BenchSync", ns) as p:
        p.send(Message(topic, b"warm-up"))
        t0 = time.perf_counter()
        for i in range(n):
            p.send(Message(topic, b"x" * 256, tags="TagA", keys=f"k{i}"))
        return n / (time.perf_counter() - t0)


def bench_async_send(ns: str, topic: str, n: int, in_flight: int) -> float:
    async def main() -> float:
        async with AsyncProducer("BenchAsync", ns) as p:
            await p.send(Message(topic, b"warm-up"))
            sem = asyncio.Semaphore(in_flight)

            async def one(i: int) -> None:
                async with sem:
                    await p.send(Message(topic, b"x" * 256, tags="TagB", keys=f"k{i}"))

            t0 = time.perf_counter()
            await asyncio.gather(*(one(i) for i in range(n)))
            return n / (time.perf_counter() - t0)
    return asyncio.run(main())


def bench_batch_send(ns: str, topic: str, batches: int, size: int) -> float:
    with Producer("BenchBatch", ns) as p:
        t0 = time.perf_counter()
        for b in range(batches):
            p.send_batch([Message(topic, b"x" * 256, keys=f"b{b}-{i}") for i in range(size)])
        return batches * size / (time.perf_counter() - t0)


def bench_pull(ns: str, topic: str, expect: int) -> tuple[float, int]:
    with PullConsumer("BenchPull", ns) as c:
        queues = c.fetch_message_queues(topic)
        deadline = time.monotonic() + 30
        while sum(c.max_offset(q) for q in queues) < expect and time.monotonic() < deadline:
            time.sleep(0.1)
        got = 0
        t0 = time.perf_counter()
        for q in queues:
            offset = 0
            while True:
                r = c.pull(q, "*", offset, 32)
                if r.status is not PullStatus.FOUND:
                    break
                got += len(r.msg_found_list)
                offset = r.next_begin_offset
        return got / (time.perf_counter() - t0), got


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--flush", choices=("async", "sync"), default="async", help="the broker's --flush")
    args = ap.parse_args()
    n_sync, n_async, batches = (500, 2000, 20) if args.quick else (3000, 20000, 200)
    out: dict[str, object] = {"benchmark": "sdk", "quick": args.quick, "flush": args.flush}
    out["prepare_per_s"] = round(bench_prepare(20000 if args.quick else 100000))
    out["batch_prepare_cpu_us_per_msg"] = round(bench_batch_prepare(32000 if args.quick else 160000), 2)
    with tempfile.TemporaryDirectory(prefix="sluice-sdk-bench-") as tmp_dir, \
            SluiceProcess.start(["namesrv"], Path(tmp_dir), name="namesrv") as ns:
        tmp = Path(tmp_dir)
        broker_argv = ["broker", "--namesrv", ns.addr, "--store", str(tmp / "store"), "--flush", args.flush]
        with SluiceProcess.start(broker_argv, tmp, name="broker"):
            wait_for_route(ns.addr, "TBW102", timeout=20)  # the broker registered
            rate, cpu = bench_common_produce(ns.addr, "BenchCommon", 32000 if args.quick else 128000)
            out["common_produce_msgs_per_s"] = round(rate)
            out["common_produce_client_cpu_us_per_msg"] = round(cpu, 2)
            out["sync_send_per_s"] = round(bench_sync_send(ns.addr, "BenchSync", n_sync))
            out["async_send_per_s"] = round(bench_async_send(ns.addr, "BenchAsync", n_async, 64))
            out["batch_send_msgs_per_s"] = round(bench_batch_send(ns.addr, "BenchBatch", batches, 64))
            rate, got = bench_pull(ns.addr, "BenchAsync", n_async + 1)
            out["pull_msgs_per_s"] = round(rate)
            out["pulled"] = got
    print(json.dumps(out))


if __name__ == "__main__":
    main()
