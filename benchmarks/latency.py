"""Send→listener latency alone: the latency row of ``sluice bench`` (issue 15) without the produce and drain rows.

A namesrv and an async-flush broker (``sluice`` subprocesses); in this process a push consumer on
``region = 'eu'`` and a producer ``send_async``-ing single 1 KiB messages paced at each rate, the send time
stamped in the body (``sluice.bench.sluice_runner.latency``). Per rate: p50 / p99 in ms, and the CPU seconds per
sent message of this process (producer + consumer) and of the broker, so a change that buys latency with CPU
shows it.

Run: .venv/bin/python benchmarks/latency.py [--quick] [--rates 1000,10000] [--seconds S] [--repeat N] [--inline]
Prints one JSON object on its last line.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from sluice.bench.sluice_runner import cluster, create_topic, latency  # noqa: E402
from sluice.bench.workload import Workload  # noqa: E402

TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process, from /proc."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICKS


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="2 s per rate instead of 5 s")
    ap.add_argument("--rates", default="1000,10000", help="comma-separated msgs/s")
    ap.add_argument("--seconds", type=float, default=None, help="seconds per rate")
    ap.add_argument("--repeat", type=int, default=1, help="measure every rate this many times (same broker)")
    ap.add_argument("--warmup", type=float, default=1.0,
                    help="seconds at the first rate first, not reported: sluice bench measures latency after the "
                         "drains, on a warm broker and client")
    ap.add_argument("--inline", action="store_true",
                    help="the consumer's listener on its I/O thread (PushConsumer consume_inline)")
    ap.add_argument("--auto-batch", action="store_true",
                    help="the producer's sends made while one is in flight go together (ProducerOptions.auto_batch)")
    args = ap.parse_args()
    wl = Workload.quick() if args.quick else Workload()
    rates = tuple(int(r) for r in args.rates.split(",") if r.strip())
    wl = replace(wl, latency_rates=rates * args.repeat,
                 latency_seconds=args.seconds if args.seconds is not None else wl.latency_seconds)
    out: dict = {"quick": args.quick, "inline": args.inline, "auto_batch": args.auto_batch,
                 "seconds_per_rate": wl.latency_seconds, "runs": []}
    with tempfile.TemporaryDirectory(prefix="sluice-latency-") as tmp:
        ns, broker = cluster(Path(tmp), "async")
        try:
            create_topic(ns.addr)

            def measured() -> tuple[float, float]:
                return time.process_time(), cpu_seconds(broker.pid)

            marks: list[tuple[float, float]] = []

            def step(what: str) -> None:
                marks.append(measured())
                print(what, file=sys.stderr, flush=True)

            results = latency(ns.addr, wl, step, warmup_seconds=args.warmup, inline=args.inline,
                              auto_batch=args.auto_batch)
            marks.append(measured())
            for i, res in enumerate(results):
                (c0, b0), (c1, b1) = marks[i], marks[i + 1]
                sent = max(1, res["sent"])
                out["runs"].append({**res,
                                    "client_cpu_us_per_msg": round((c1 - c0) / sent * 1e6, 1),
                                    "broker_cpu_us_per_msg": round((b1 - b0) / sent * 1e6, 1)})
        finally:
            broker.stop()
            ns.stop()
    for r in out["runs"]:
        print(f"{r['rate']:>6} msgs/s  p50 {r['p50_ms']:.3f} ms  p99 {r['p99_ms']:.3f} ms  "
              f"client {r['client_cpu_us_per_msg']} us/msg  broker {r['broker_cpu_us_per_msg']} us/msg",
              file=sys.stderr)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
