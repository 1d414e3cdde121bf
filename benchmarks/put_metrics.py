"""CPU cost of the put latency histogram (broker/metrics.py PutLatency) on the broker's append path, in process.

With ``--metrics-listen`` the appender reads the clock twice and observes once per store call
(Appender._write), never per message; without it, it tests ``latency is None`` twice. Measured as CPU
time (time.process_time) per store call of two 1 KiB messages, through a real Appender over a real
MessageStore (async flush, dispatch on the loop as in the broker), alternating rounds with the histogram
off and on (medians); plus the bare ``observe`` call.

    .venv/bin/python benchmarks/put_metrics.py [--quick]

The last line is one JSON object: microseconds per store call off and on, their difference, and the
bare observe's microseconds.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path

from sluice.broker.appender import Appender
from sluice.broker.metrics import PutLatency
from sluice.store import MessageStore, StoreConfig, StoreMessage

BODY = bytes(range(256)) * 4  # 1 KiB
TOPIC = "Bench"


async def run_round(app: Appender, msgs: list[list[StoreMessage]], on: bool) -> float:
    app.latency = PutLatency() if on else None
    t0 = time.process_time()
    for i, m in enumerate(msgs):
        app.put(TOPIC, 0, m, sync=False)  # two messages without sync: appended before put returns
        if i % 64 == 63:
            await asyncio.sleep(0)  # let the loop dispatch, as between the broker's iterations
    await asyncio.sleep(0)
    return (time.process_time() - t0) / len(msgs) * 1e6


def bare_observe(n: int) -> float:
    h = PutLatency()
    t0 = time.process_time()
    for _ in range(n):
        h.observe(0.00012)
    return (time.process_time() - t0) / n * 1e6


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    n, rounds = (5_000, 4) if args.quick else (10_000, 16)
    with tempfile.TemporaryDirectory() as d:
        store = MessageStore(Path(d) / "store", StoreConfig(commitlog_file_size=1024 * 1024 * 1024))
        store.start()
        store.dispatch.drive_externally()
        try:
            app = Appender(store)
            msgs = [[StoreMessage(TOPIC, BODY, 0, {"UNIQ_KEY": f"{i:032X}"}),
                     StoreMessage(TOPIC, BODY, 0, {"UNIQ_KEY": f"{i:031X}F"})] for i in range(n)]

            async def all_rounds() -> tuple[list[float], list[float]]:
                off, on = [], []
                await run_round(app, msgs[: n // 10], False)  # warm the pages and the code
                for r in range(rounds):  # alternating which goes first: the log's new pages cost both alike
                    for flag in ((False, True) if r % 2 == 0 else (True, False)):
                        (on if flag else off).append(await run_round(app, msgs, flag))
                return off, on
            off, on = asyncio.run(all_rounds())
        finally:
            store.close()
    off_us, on_us = statistics.median(off), statistics.median(on)
    print(json.dumps({"store_calls": n, "messages_per_call": 2, "rounds": rounds,
                      "off_us_per_call": round(off_us, 3), "on_us_per_call": round(on_us, 3),
                      "histogram_us_per_call": round(on_us - off_us, 3),
                      # the fastest round of each: the least disturbed by other processes on a shared machine
                      "off_us_min": round(min(off), 3), "on_us_min": round(min(on), 3),
                      "histogram_us_per_call_min": round(min(on) - min(off), 3),
                      "bare_observe_us": round(bare_observe(200_000), 3)}))


if __name__ == "__main__":
    main()
