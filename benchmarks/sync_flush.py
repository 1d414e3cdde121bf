"""The broker's synchronous-flush path in one process: the Appender on an event loop, over a real store.

``--senders`` coroutines (4) each put a 32-message batch of 1 KiB messages (encoded as the broker encodes
a SEND_BATCH body), wait for its durable reply and put the next, as the SDK's ``send_batch`` threads do,
without the network and the client in between. What is left is the broker's part: appends, dispatch, the
durable wait (store/background_flush.py, broker/durable.py) and the replies' futures.

Reported per case: msgs/s (wall), CPU per message of the whole process (user and system, which includes
the fsyncs' kernel time), fsync rounds, messages per round, the mean time a round spent in fdatasync
(``fsync_ms``: the disk's part of a wait) and the share of the run the fsync thread spent there
(``fsync_busy``), and the latency of a put from the call to its reply (p50, p99). Cases: ``c`` (the C extension's fsync thread), ``python`` (store.background_flush's
PySyncer: the reference, a Python thread), and ``async`` (asynchronous flush: the same appends, no wait).
Run alternately (``--rounds``), since the disk is shared: each case's figures are the medians of its rounds.

    .venv/bin/python benchmarks/sync_flush.py [--quick] [--rounds N] [--cases c,python,async] [--dir DIR]
        [--warm-ahead BYTES]

The last line is one JSON object.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import resource
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from sluice.broker.appender import Appender, stored
from sluice.speedups import C
from sluice.store import MessageStore, StoreConfig, StoreMessage
from sluice.store.encode import encode_batch

BODY = bytes(range(256)) * 4  # 1 KiB
BATCH = 32
TOPIC = "Bench"


def _cpu() -> tuple[float, float]:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime, r.ru_stime


def _messages(sender: int, n: int) -> list[StoreMessage]:
    return [StoreMessage(TOPIC, BODY, sender % 4, {"TAGS": "TagA", "KEYS": f"k{sender}-{i}",
                                                   "UNIQ_KEY": f"7F000001{sender:04X}{i:020X}"}) for i in range(n)]


async def _drive(store: MessageStore, senders: int, batches: int) -> tuple[float, list[float]]:
    appender = Appender(store)
    host, limit = store.config.store_host, store.config.max_message_size
    pools = [_messages(s, BATCH) for s in range(senders)]
    latencies: list[float] = []

    async def sender(s: int) -> None:
        msgs = pools[s]
        for _ in range(batches):
            t = time.perf_counter()
            enc = encode_batch(msgs, store_host=host, max_body=limit)  # as SendProcessor encodes a batch body
            await stored(appender.put(TOPIC, s % 4, enc))
            latencies.append(time.perf_counter() - t)

    t0 = time.perf_counter()
    try:
        await asyncio.gather(*(sender(s) for s in range(senders)))
    finally:
        await asyncio.get_running_loop().run_in_executor(None, appender.close)
    return time.perf_counter() - t0, latencies


def run_case(case: str, root: Path, senders: int, batches: int, warm_ahead: int | None = None) -> dict[str, Any]:
    config = StoreConfig(flush_mode="async" if case == "async" else "sync", commitlog_file_size=256 << 20,
                         commitlog_warm_ahead=warm_ahead)
    store = MessageStore(root, config)
    made: list[Any] = []  # the BackgroundFlush the appender's waiter made: its time in fdatasync
    try:
        from sluice.store.background_flush import BackgroundFlush
    except ImportError:  # (an older tree, measured for comparison: no fsync time)
        pass
    else:
        def background_flush() -> BackgroundFlush:
            made.append(BackgroundFlush(store.flusher, use_c=case == "c"))  # python: the reference thread
            return made[-1]
        store.background_flush = background_flush  # type: ignore[method-assign]
    store.start()
    store.dispatch.drive_externally()
    try:
        fsyncs0 = store.flusher.fsyncs
        u0, s0 = _cpu()
        seconds, lat = asyncio.run(_drive(store, senders, batches))
        u1, s1 = _cpu()
        rounds = store.flusher.fsyncs - fsyncs0
    finally:
        store.close()
    n = senders * batches * BATCH
    lat.sort()
    sync_s = sum(b.sync_ns for b in made) / 1e9
    return {"msgs_per_s": n / seconds, "user_us": (u1 - u0) / n * 1e6, "sys_us": (s1 - s0) / n * 1e6,
            "cpu_us": (u1 - u0 + s1 - s0) / n * 1e6, "fsyncs": rounds, "msgs_per_fsync": n / rounds if rounds else 0,
            "fsync_ms": sync_s / rounds * 1e3 if rounds else 0, "fsync_busy": sync_s / seconds,
            "put_p50_ms": lat[len(lat) // 2] * 1e3, "put_p99_ms": lat[min(len(lat) - 1, len(lat) * 99 // 100)] * 1e3}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer messages and rounds")
    ap.add_argument("--rounds", type=int, help="alternating rounds per case (default 3, 1 with --quick)")
    ap.add_argument("--cases", default="c,python,async", help="comma-separated: c, python, async")
    ap.add_argument("--senders", type=int, default=4)
    ap.add_argument("--messages", type=int, help="per round (default 100000, 20000 with --quick)")
    ap.add_argument("--dir", help="where the stores go (default: a temporary directory under /tmp)")
    ap.add_argument("--warm-ahead", type=int, help="the store's commitlog_warm_ahead (default: its own; 0: off)")
    args = ap.parse_args()
    cases = [c for c in args.cases.split(",") if c]
    unknown = set(cases) - {"c", "python", "async"}
    if unknown:
        ap.error(f"unknown cases {sorted(unknown)}")
    if "c" in cases and C is None:
        print("the C extension is not built (or SLUICE_NO_EXTENSIONS is set): skipping case c", flush=True)
        cases.remove("c")
    rounds = args.rounds or (1 if args.quick else 3)
    messages = args.messages or (20_000 if args.quick else 100_000)
    batches = max(1, messages // (BATCH * args.senders))
    runs: dict[str, list[dict[str, Any]]] = {c: [] for c in cases}
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        for r in range(rounds):
            for case in cases:
                res = run_case(case, Path(tmp) / f"{case}-{r}", args.senders, batches, args.warm_ahead)
                runs[case].append(res)
                print(f"round {r} {case:6s} " + " ".join(f"{k}={v:,.2f}" for k, v in res.items()), flush=True)
    out: dict[str, Any] = {"quick": args.quick, "senders": args.senders, "batch": BATCH, "body_bytes": len(BODY),
                           "messages_per_round": batches * BATCH * args.senders, "rounds": rounds}
    for case, results in runs.items():
        out[case] = {k: round(statistics.median(r[k] for r in results), 2) for k in results[0]}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
