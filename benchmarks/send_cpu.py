"""Client CPU per single-message send (issue 15): what one ``send_async`` / ``send`` costs the SDK's process.

A namesrv and an async-flush broker (``sluice`` subprocesses on 127.0.0.1); in this process a blocking
``Producer`` sends the common workload's single messages (1 KiB body, a tag, properties ``region`` and ``a``):

* ``async_burst``: ``send_async`` as fast as the caller can, then wait for every result;
* ``async_paced``: ``send_async`` paced at ``--rate`` msgs/s (the latency row's sender, without its consumer),
  with the p50 / p99 from the call to the result's callback;
* ``sync``: ``send`` one at a time (the light-load case), with its p50 / p99 call latency;
* ``asyncio``: ``AsyncProducer.send`` with 64 in flight on the caller's own loop.

CPU is the process's (every thread: the caller and the client's loop thread), from getrusage, per message;
wall-clock latencies are only indicative on a shared machine.

Run: .venv/bin/python benchmarks/send_cpu.py [--quick] [--rate 10000] [--repeat N]
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

from sluice import AsyncProducer, Message, Producer  # noqa: E402

TOPIC = "BenchSendCpu"
_REGIONS = ("eu", "us", "ap", "sa", "af", "me", "oc", "na", "ca", "in")
_BODY = b"0" * 20 + b"x" * 1004


def _msg(i: int) -> Message:
    return Message(TOPIC, _BODY, tags=f"Tag{'ABCDEFGHIJ'[i % 10]}",
                   properties={"region": _REGIONS[i % 10], "a": str(i % 100)})


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, max(0, int(len(s) * q / 100 + 0.5) - 1))]


def async_burst(p: Producer, n: int) -> dict[str, float]:
    msgs = [_msg(i) for i in range(n)]
    c0, t0 = _cpu(), time.perf_counter()
    futs = [p.send_async(m) for m in msgs]
    for f in futs:
        f.result(60)
    seconds, cpu = time.perf_counter() - t0, _cpu() - c0
    return {"cpu_us_per_msg": round(cpu / n * 1e6, 1), "msgs_per_s": round(n / seconds)}


def async_paced(p: Producer, rate: int, seconds: float) -> dict[str, float]:
    n = int(rate * seconds)
    msgs = [_msg(i) for i in range(n)]
    lat: list[float] = []
    lock = threading.Lock()

    def done_cb(t: float):  # noqa: ANN202
        def cb(result: object, exc: BaseException | None) -> None:
            d = time.perf_counter() - t
            with lock:
                lat.append(d)
        return cb

    c0 = _cpu()
    start = time.perf_counter() + 0.02
    futs = []
    for i, m in enumerate(msgs):
        left = start + i / rate - time.perf_counter()
        if left > 0:
            time.sleep(left)
        futs.append(p.send_async(m, callback=done_cb(time.perf_counter())))
    sent_s = time.perf_counter() - start
    for f in futs:
        f.result(60)
    cpu = _cpu() - c0
    return {"cpu_us_per_msg": round(cpu / n * 1e6, 1), "rate_reached": round(n / sent_s),
            "p50_ms": round(_pct(lat, 50) * 1e3, 3), "p99_ms": round(_pct(lat, 99) * 1e3, 3)}


def sync_sends(p: Producer, n: int) -> dict[str, float]:
    msgs = [_msg(i) for i in range(n)]
    lat = []
    c0 = _cpu()
    for m in msgs:
        t = time.perf_counter()
        p.send(m)
        lat.append(time.perf_counter() - t)
    cpu = _cpu() - c0
    return {"cpu_us_per_msg": round(cpu / n * 1e6, 1), "p50_ms": round(_pct(lat, 50) * 1e3, 3),
            "p99_ms": round(_pct(lat, 99) * 1e3, 3)}


def asyncio_sends(ns: str, n: int, in_flight: int = 64) -> dict[str, float]:
    async def main() -> dict[str, float]:
        async with AsyncProducer("BenchSendCpuAsyncio", ns) as p:
            await p.send(_msg(0))
            msgs = [_msg(i) for i in range(n)]
            sem = asyncio.Semaphore(in_flight)

            async def one(m: Message) -> None:
                async with sem:
                    await p.send(m)

            c0 = _cpu()
            await asyncio.gather(*(one(m) for m in msgs))
            return {"cpu_us_per_msg": round((_cpu() - c0) / n * 1e6, 1)}
    return asyncio.run(main())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--rate", type=int, default=10000, help="msgs/s of the paced send_async run")
    ap.add_argument("--repeat", type=int, default=1, help="measure every case this many times")
    args = ap.parse_args()
    n_burst, n_sync, paced_s, n_asyncio = (5000, 1000, 1.0, 5000) if args.quick else (20000, 3000, 3.0, 20000)
    out: dict[str, object] = {"benchmark": "send_cpu", "quick": args.quick, "rate": args.rate, "runs": []}
    with tempfile.TemporaryDirectory(prefix="sluice-send-cpu-") as tmp_dir, \
            SluiceProcess.start(["namesrv"], Path(tmp_dir), name="namesrv") as ns:
        tmp = Path(tmp_dir)
        broker_argv = ["broker", "--namesrv", ns.addr, "--store", str(tmp / "store"), "--flush", "async"]
        with SluiceProcess.start(broker_argv, tmp, name="broker"):
            wait_for_route(ns.addr, "TBW102", timeout=20)  # the broker registered
            with Producer("BenchSendCpu", ns.addr) as p:
                p.send(_msg(0))
                async_burst(p, 2000)  # warm-up
                for _ in range(args.repeat):
                    run = {"async_burst": async_burst(p, n_burst),
                           "async_paced": async_paced(p, args.rate, paced_s),
                           "sync": sync_sends(p, n_sync)}
                    run["asyncio"] = asyncio_sends(ns.addr, n_asyncio)
                    out["runs"].append(run)  # type: ignore[union-attr]
                    print(json.dumps(run), file=sys.stderr, flush=True)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
