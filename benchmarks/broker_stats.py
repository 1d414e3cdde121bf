"""CPU cost of the broker's put/get counters (broker/stats.py) per request, in process.

The counters run once per append and once per answered pull (never per message), so their cost per
message is this figure divided by the request's message count. Measured as CPU time (time.process_time)
over many calls, alternating the counted call with an empty one of the same shape, several rounds.

    .venv/bin/python benchmarks/broker_stats.py [--quick]

The last line is one JSON object: microseconds per on_put and on_get call, over the empty call.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

from sluice.broker.stats import BrokerStats


def per_call(fn, n: int) -> float:
    t0 = time.process_time()
    for _ in range(n):
        fn("TopicA", 1, 1024)
    return (time.process_time() - t0) / n * 1e6


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    n, rounds = (50_000, 3) if args.quick else (500_000, 7)
    stats = BrokerStats("DefaultCluster")

    def empty(topic: str, messages: int, size: int) -> None:
        pass

    def get(topic: str, messages: int, size: int) -> None:
        stats.on_get(topic, "GroupA", messages, size)
    put_us, get_us, empty_us = [], [], []
    for _ in range(rounds):
        empty_us.append(per_call(empty, n))
        put_us.append(per_call(stats.on_put, n))
        empty_us.append(per_call(empty, n))
        get_us.append(per_call(get, n))
    base = statistics.median(empty_us)
    out = {"calls": n, "rounds": rounds, "empty_call_us": round(base, 3),
           "on_put_us": round(statistics.median(put_us) - base, 3),
           "on_get_us": round(statistics.median(get_us) - base, 3)}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
