"""Push consumer end to end: msgs/s and send→listener latency for 1, 2 and 4 consumers of one group on an
8-queue topic, against a real namesrv + broker (subprocesses; each consumer is its own process).

Two runs per consumer count:

* ``live``: an asyncio producer sends ``n`` messages (256-byte bodies, 64 in flight) while the group
  consumes; throughput = n / (first send → last message at a listener); latency = listener time − the
  message's born timestamp (ms clock of the same host), p50/p99 over every message;
* ``drain``: ``n`` messages are stored first, then the group starts from the first offset; throughput =
  n / (first → last message at a listener) — the consumers' own ceiling, including the members' joins
  (rebalances and the 1.5 s concurrent hand-off pause) while they start one after another.

CPU seconds of the broker and the consumer processes are read from /proc, so the result says what bounds
the rate (per-message CPU of each process against the machine's cores).

Run: .venv/bin/python benchmarks/push_consume.py [--quick]
Prints one JSON object on its last line.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from servers import SluiceProcess, wait_for_route  # noqa: E402

from sluice import AsyncProducer, ConsumeResult, Message, Producer, PushConsumer  # noqa: E402

QUEUES = 8
TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process (and its reaped children), from /proc."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return sum(int(x) for x in fields[11:15]) / TICKS


# ------------------------------------------------------------------------------------------ consumer role

def consumer_main(args: argparse.Namespace) -> None:
    lat: list[int] = []
    lock = threading.Lock()
    last = [0.0]
    first = [0.0]
    cpu0 = [0.0]  # CPU spent before the first message (start-up, imports) is not the consumer's per-message cost

    def listener(msgs):  # type: ignore[no-untyped-def]
        now = int(time.time() * 1000)
        with lock:
            lat.extend(now - m.born_timestamp for m in msgs)
            last[0] = time.time()
            if not first[0]:
                first[0] = last[0]
                t = os.times()
                cpu0[0] = t.user + t.system
        return ConsumeResult.SUCCESS

    # The handler comes first: in a drain the other consumers may finish the topic while this one is still
    # starting, and the driver's SIGTERM must then still end it with a result file, not kill it.
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    c = PushConsumer(args.group, namesrv=args.namesrv, consume_from_where=args.from_where,
                     instance_name=args.name)
    c.subscribe(args.topic)
    c.register_listener(listener)
    c.start()
    progress = Path(args.progress)
    while not stop.is_set():
        owned = len([q for q in c.owned_queues() if q.topic == args.topic])
        with lock:
            n, t = len(lat), last[0]
        tmp = progress.with_suffix(".tmp")
        tmp.write_text(json.dumps({"owned": owned, "count": n, "last": t}))
        os.replace(tmp, progress)
        stop.wait(0.1)
    c.shutdown()
    cpu = os.times()
    with lock:
        Path(args.result).write_text(json.dumps({"lat": lat, "first": first[0], "last": last[0],
                                                  "cpu": cpu.user + cpu.system - cpu0[0]}))


# ------------------------------------------------------------------------------------------ driver

class Group:
    def __init__(self, tmp: Path, ns: str, topic: str, group: str, k: int, from_where: str) -> None:
        self.files = [(tmp / f"{group}-{i}.progress", tmp / f"{group}-{i}.result") for i in range(k)]
        self.procs = [subprocess.Popen(
            [sys.executable, __file__, "--role", "consumer", "--namesrv", ns, "--topic", topic, "--group", group,
             "--name", f"{group}-{i}", "--from-where", from_where, "--progress", str(p), "--result", str(r)],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=open(tmp / f"{group}-{i}.err", "wb"),
            env={**os.environ, "PYTHONPATH": str(ROOT / "src")}) for i, (p, r) in enumerate(self.files)]

    def progress(self) -> list[dict]:
        out = []
        for p, _ in self.files:
            try:
                out.append(json.loads(p.read_text()))
            except (OSError, ValueError):
                out.append({"owned": 0, "count": 0, "last": 0.0})
        return out

    def wait(self, pred, timeout: float, what: str) -> None:  # type: ignore[no-untyped-def]
        deadline = time.monotonic() + timeout
        while not pred(self.progress()):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what} not reached in {timeout:g} s: {self.progress()}")
            time.sleep(0.05)

    def settled(self) -> None:
        self.wait(lambda ps: all(p["owned"] > 0 for p in ps) and sum(p["owned"] for p in ps) == QUEUES, 60,
                  "rebalance")

    def stop(self) -> tuple[list[int], float, float, float]:
        # A consumer still importing or starting when the others have drained the topic dies of SIGTERM without
        # a result: wait until each has written progress (its handler is installed by then).
        deadline = time.monotonic() + 60
        while not all(p.exists() for p, _ in self.files) and time.monotonic() < deadline:
            if any(proc.poll() is not None for proc in self.procs):
                break
            time.sleep(0.05)
        for p in self.procs:
            p.send_signal(signal.SIGTERM)
        for p in self.procs:
            p.wait(60)
        lat: list[int] = []
        first, last, cpu = float("inf"), 0.0, 0.0
        for (_, r), p in zip(self.files, self.procs):
            if not r.exists():
                err = r.with_suffix(".err").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"consumer {r.stem} ended with code {p.returncode} and no result: {err}")
            doc = json.loads(r.read_text())
            lat += doc["lat"]
            if doc["first"]:
                first = min(first, doc["first"])
            last = max(last, doc["last"])
            cpu += doc["cpu"]
        return lat, first, last, cpu


def pct(values: list[int], q: float) -> float:
    s = sorted(values)
    return float(s[min(len(s) - 1, int(q * len(s)))]) if s else float("nan")


async def send_all(ns: str, topic: str, n: int, in_flight: int = 64) -> None:
    async with AsyncProducer("BenchPushProducer", ns, default_topic_queue_nums=QUEUES) as p:
        sem = asyncio.Semaphore(in_flight)
        body = b"x" * 256

        async def one(i: int) -> None:
            async with sem:
                await p.send(Message(topic, body, tags="TagA", keys=f"k{i}"))
        await asyncio.gather(*(one(i) for i in range(n)))


def make_topic(ns: str, topic: str) -> None:
    with Producer("BenchPushCreate", ns, default_topic_queue_nums=QUEUES) as p:
        p.send(Message(topic, b"create"))
        deadline = time.monotonic() + 20
        while len(p.fetch_publish_queues(topic)) < QUEUES:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{topic} has no {QUEUES} queues")
            time.sleep(0.1)


def run_one(tmp: Path, ns: str, broker_pid: int, k: int, n: int, mode: str) -> dict:
    topic, group = f"PushBench{mode}{k}", f"PushBench{mode}{k}Group"
    make_topic(ns, topic)
    if mode == "drain":
        asyncio.run(send_all(ns, topic, n))
    b0 = cpu_seconds(broker_pid)
    t0 = time.time()
    g = Group(tmp, ns, topic, group, k, "CONSUME_FROM_FIRST_OFFSET" if mode == "drain" else "CONSUME_FROM_LAST_OFFSET")
    try:
        if mode == "live":
            g.settled()
            b0 = cpu_seconds(broker_pid)
            t0 = time.time()
            asyncio.run(send_all(ns, topic, n))
        want = n + (1 if mode == "drain" else 0)  # the drain group also gets the topic's "create" message
        g.wait(lambda ps: sum(p["count"] for p in ps) >= want, 120, "all messages consumed")
    finally:
        lat, first, last, cpu = g.stop()
    broker_cpu = cpu_seconds(broker_pid) - b0
    # live: from the first send; drain: from the first message at a listener (process start-up excluded)
    elapsed = max(1e-6, last - (t0 if mode == "live" else first))
    out = {"consumers": k, "msgs_per_s": round(n / elapsed), "consumed": len(lat), "duplicates": len(lat) - n - (1 if mode == "drain" else 0),
           "consumer_cpu_us_per_msg": round(cpu / n * 1e6, 1), "broker_cpu_us_per_msg": round(broker_cpu / n * 1e6, 1)}
    if mode == "live":
        out["latency_ms_p50"] = pct(lat, 0.50)
        out["latency_ms_p99"] = pct(lat, 0.99)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--role", default="driver")
    ap.add_argument("--namesrv")
    ap.add_argument("--topic")
    ap.add_argument("--group")
    ap.add_argument("--name")
    ap.add_argument("--from-where", default="CONSUME_FROM_LAST_OFFSET")
    ap.add_argument("--progress")
    ap.add_argument("--result")
    args = ap.parse_args()
    if args.role == "consumer":
        consumer_main(args)
        return
    n = 3000 if args.quick else 20000
    results: dict[str, object] = {"bench": "push_consume", "messages": n, "queues": QUEUES, "body_bytes": 256,
                                  "cpus": os.cpu_count()}
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        with SluiceProcess.start(["namesrv"], tmp, name="namesrv") as ns:
            with SluiceProcess.start(["broker", "--namesrv", ns.addr, "--store", str(tmp / "store")], tmp,
                                     name="broker") as broker:
                wait_for_route(ns.addr, "TBW102", timeout=20)  # the broker registered
                for mode in ("live", "drain"):
                    rows = []
                    for k in (1, 2, 4):
                        row = run_one(tmp, ns.addr, broker.pid, k, n, mode)
                        print(mode, json.dumps(row), flush=True)
                        rows.append(row)
                    results[mode] = rows
    results["bound_by"] = (
        "CPU: two cores shared by the producer, the broker and the consumer processes; per message the "
        "consumer spends consumer_cpu_us_per_msg (pull decode in C, the listener call, one thread-pool "
        "hand-off and one offset update per pull when the listener is fast, consume_message_batch_max_size=1) "
        "and the broker broker_cpu_us_per_msg, so more "
        "consumer processes than cores add no throughput; live latency includes the producer's queueing")
    print(json.dumps(results))


if __name__ == "__main__":
    main()
