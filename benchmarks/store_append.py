"""Append throughput of the store against the raw sequential write rate of the same disk.

Cases (1 KiB bodies): single puts and 32-message batches with asynchronous flush;
synchronous flush with 1 and with 64 writer threads. The raw baselines write
the same bytes with plain os.write, fsynced at the same cadence (every flush
interval for async, after every write for sync).

    .venv/bin/python benchmarks/store_append.py [--quick] [--profile CASE]

The last line is one JSON object.
"""
from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

from sluice.store import MessageStore, StoreConfig, StoreMessage

BODY = bytes(range(256)) * 4  # 1 KiB
PROPS = {"TAGS": "TagA", "KEYS": "order-1"}


def config(flush_mode: str) -> StoreConfig:
    return StoreConfig(commitlog_file_size=256 * 1024 * 1024, flush_mode=flush_mode, index_max_hash_slots=500_000,
                       index_max_index_num=2_000_000)


def record_size() -> int:
    from sluice.protocol.properties import encode_properties
    from sluice.protocol.record import encode_record
    return len(encode_record(topic="Bench", body=BODY, properties=encode_properties(PROPS)))


def raw_rate(root: Path, seconds: float, batch: int, fsync_every_s: float | None) -> dict[str, float]:
    """Write record-sized chunks to one file; fsync every ``fsync_every_s`` (None: after every write)."""
    size = record_size()
    chunk = bytes(size * batch)
    path = root / "raw.bin"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    n = 0
    start = last_sync = time.perf_counter()
    try:
        while (now := time.perf_counter()) - start < seconds:
            os.write(fd, chunk)
            n += batch
            if fsync_every_s is None or now - last_sync >= fsync_every_s:
                os.fsync(fd)
                last_sync = now
        os.fsync(fd)
    finally:
        os.close(fd)
        path.unlink()
    dt = time.perf_counter() - start
    return {"msgs_per_s": n / dt, "mb_per_s": n * size / dt / 1e6}


def store_rate(root: Path, seconds: float, *, flush_mode: str, batch: int, threads: int) -> dict[str, float]:
    d = root / f"store-{flush_mode}-{batch}-{threads}"
    counts = [0] * threads
    stop = threading.Event()
    with MessageStore(d, config(flush_mode)) as s:
        def work(i: int) -> None:
            msgs = [StoreMessage("Bench", BODY, i % 8, dict(PROPS)) for _ in range(batch)]
            while not stop.is_set():
                if batch == 1:
                    s.put_message(msgs[0])
                else:
                    s.put_messages(msgs)
                counts[i] += batch

        ts = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
        start = time.perf_counter()
        for t in ts:
            t.start()
        time.sleep(seconds)
        stop.set()
        for t in ts:
            t.join()
        dt = time.perf_counter() - start
        n = sum(counts)
        size = s.stats()["put_bytes"] / max(1, s.stats()["put_messages"])
        fsyncs = s.flusher.fsyncs
    shutil.rmtree(d, ignore_errors=True)
    return {"msgs_per_s": n / dt, "mb_per_s": n * size / dt / 1e6, "fsyncs": fsyncs, "messages": n}


CASES = {
    "async_single": dict(flush_mode="async", batch=1, threads=1),
    "async_batch32": dict(flush_mode="async", batch=32, threads=1),
    "sync_1_writer": dict(flush_mode="sync", batch=1, threads=1),
    "sync_64_writers": dict(flush_mode="sync", batch=1, threads=64),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="about 2 s per case")
    ap.add_argument("--profile", choices=sorted(CASES), help="profile one case with cProfile and print the top")
    ap.add_argument("--dir", help="where to write (default: a temp dir under /tmp)")
    args = ap.parse_args()
    seconds = 2.0 if args.quick else 6.0
    root = Path(tempfile.mkdtemp(prefix="sluice-bench-", dir=args.dir))
    try:
        if args.profile:
            prof = cProfile.Profile()
            prof.enable()
            r = store_rate(root, seconds, **CASES[args.profile])
            prof.disable()
            pstats.Stats(prof, stream=sys.stderr).sort_stats("tottime").print_stats(18)
            print(json.dumps({args.profile: r}))
            return
        raw_async = raw_rate(root, seconds, 32, 0.5)
        raw_sync = raw_rate(root, seconds, 1, None)
        out: dict[str, object] = {"raw_async_cadence": raw_async, "raw_fsync_each_write": raw_sync}
        for name, kw in CASES.items():
            r = store_rate(root, seconds, **kw)
            base = raw_async if kw["flush_mode"] == "async" else raw_sync
            r["ratio_to_raw"] = round(r["msgs_per_s"] / base["msgs_per_s"], 3)
            out[name] = r
            print(f"{name:16s} {r['msgs_per_s']:>10.0f} msg/s {r['mb_per_s']:>8.1f} MB/s "
                  f"ratio to raw {r['ratio_to_raw']:.3f}", file=sys.stderr)
        out["goal_batch_async_vs_raw"] = round(out["async_batch32"]["msgs_per_s"] / raw_async["msgs_per_s"], 3)
        out["goal_sync64_vs_async_single"] = round(
            out["sync_64_writers"]["msgs_per_s"] / out["async_single"]["msgs_per_s"], 3)
        out["quick"] = args.quick
        print(json.dumps(out))
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
