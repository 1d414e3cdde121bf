"""What this host charges a message that arrives after an idle gap: the two costs under issue 15's latency row
that no broker or client code removes.

1. **A wake-up on the other processor.** Two processes ping-pong one byte over pipes, first free to run on
   either processor, then pinned to one. The difference is what waking a sleeping process on another
   processor costs (an inter-processor interrupt; dear on a virtual machine). A message crosses two such
   wake-ups (producer to broker, broker to consumer) in every system the bench compares.
2. **Cold caches after an idle gap.** One piece of Python work with a large code and data footprint (``--classes``
   distinct classes and methods, a few hundred kilobytes of buffers), timed back to back and after a
   ``--gap-ms`` sleep. The ratio is how much slower the same code runs when the processor was idle (or ran
   something else) meanwhile. A broker in Python runs a wide path per message, so at 1,000 msgs/s, where
   every message comes after a gap, it pays this factor on all of it (benchmarks/broker_stages.py shows the
   broker's CPU per message at 1,000 and 10,000 msgs/s).

Run: .venv/bin/python benchmarks/cold_wake.py [--quick] [--classes N] [--gap-ms MS]
Prints one JSON object on its last line.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from typing import Any


def ping_pong(rounds: int, cpu: int | None) -> float:
    """Median one-way time, in microseconds, of a byte bounced between this process and a child."""
    a_r, a_w = os.pipe()
    b_r, b_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child echoes until its pipe closes
        try:
            os.close(a_w)
            os.close(b_r)
            if cpu is not None:
                os.sched_setaffinity(0, {cpu})
            while os.read(a_r, 1):
                os.write(b_w, b"x")
        finally:
            os._exit(0)
    os.close(a_r)
    os.close(b_w)
    old = os.sched_getaffinity(0)
    try:
        if cpu is not None:
            os.sched_setaffinity(0, {cpu})
        times = []
        for _ in range(rounds):
            t = time.perf_counter_ns()
            os.write(a_w, b"x")
            os.read(b_r, 1)
            times.append(time.perf_counter_ns() - t)
    finally:
        os.sched_setaffinity(0, old)
        os.close(a_w)  # the child reads the end of its input and leaves
        os.close(b_r)
        os.waitpid(pid, 0)
    return round(statistics.median(times) / 2 / 1000, 1)


def footprint(classes: int) -> Any:
    """A callable whose one run touches ``classes`` distinct methods and objects and 200 buffers of 4 KiB."""
    src = "".join(f"""
class C{i}:
    def __init__(self):
        self.a{i} = {i}
        self.d = {{'k{i}': [{i}, {i + 1}]}}
    def f(self, x):
        y = self.d.get('k{i}')
        return x + self.a{i} + len(y) + (y[0] if x > 3 else {i})
""" for i in range(classes))
    ns: dict[str, Any] = {}
    exec(compile(src, "<footprint>", "exec"), ns)  # generated code: the point is many distinct functions
    objs = [ns[f"C{i}"]() for i in range(classes)]
    bufs = [bytearray(4096) for _ in range(200)]

    def work() -> int:
        x = 1
        for o in objs:
            x = o.f(x) & 0xFFFF
        for b in bufs:
            b[x % 4096] = 1
        return x
    return work


def timed(work: Any, runs: int, gap_s: float) -> float:
    times = []
    for _ in range(runs):
        if gap_s:
            time.sleep(gap_s)
        t = time.perf_counter_ns()
        work()
        times.append(time.perf_counter_ns() - t)
    return round(statistics.median(times) / 1000, 1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer rounds")
    ap.add_argument("--classes", type=int, default=2000, help="distinct classes in the footprint")
    ap.add_argument("--gap-ms", type=float, default=1.0, help="idle gap before each cold run (1 ms: 1,000 msgs/s)")
    args = ap.parse_args()
    rounds, runs = (3000, 400) if args.quick else (20000, 1500)
    cpus = sorted(os.sched_getaffinity(0))
    free = ping_pong(rounds, None)
    pinned = ping_pong(rounds, cpus[0])
    work = footprint(args.classes)
    work()
    hot = timed(work, runs, 0.0)
    cold = timed(work, runs, args.gap_ms / 1000)
    hot_again = timed(work, runs, 0.0)
    hot = min(hot, hot_again)
    out = {"quick": args.quick, "cpus": len(cpus),
           "one_way_wake_us": free, "one_way_wake_same_cpu_us": pinned,
           "cross_cpu_wake_extra_us": round(free - pinned, 1),
           "classes": args.classes, "gap_ms": args.gap_ms, "hot_us": hot, "after_gap_us": cold,
           "cold_factor": round(cold / hot, 2) if hot else None}
    print(f"wake one way {free} us ({pinned} us on one cpu); {args.classes} classes: {hot} us back to back, "
          f"{cold} us after {args.gap_ms:g} ms idle (x{out['cold_factor']})")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
